/**
 * Pure parsers for /proc text. No I/O here, so each is tested on fixture
 * strings (a comm of `a) (b c`, a zombie's empty cmdline...).
 */

export interface StatFields {
  pid: number;
  comm: string;
  state: string;
  ppid: number;
  pgrp: number;
  session: number;
  startTicks: number;
}

/**
 * Parses /proc/<pid>/stat. comm is free text that may hold spaces and
 * parentheses, so fields are counted from the last ')'. Returns null for text
 * of another shape.
 */
export function parseStat(text: string): StatFields | null {
  const open = text.indexOf('(');
  const close = text.lastIndexOf(')');
  if (open < 0 || close < open) return null;
  const pid = Number(text.slice(0, open).trim());
  if (!Number.isSafeInteger(pid)) return null;
  const rest = text
    .slice(close + 1)
    .trim()
    .split(/ +/);
  // rest[0] state, [1] ppid, [2] pgrp, [3] session, ..., [19] starttime (field 22).
  if (rest.length < 20) return null;
  const state = rest[0];
  if (state === undefined || state.length !== 1) return null;
  const nums = [rest[1], rest[2], rest[3], rest[19]].map((s) =>
    s !== undefined && /^-?\d+$/.test(s) ? Number(s) : NaN,
  );
  if (nums.some((n) => !Number.isSafeInteger(n))) return null;
  const [ppid, pgrp, session, startTicks] = nums as [number, number, number, number];
  return { pid, comm: text.slice(open + 1, close), state, ppid, pgrp, session, startTicks };
}

/** The flag (field 9 of /proc/<pid>/stat) of a kernel thread: include/linux/sched.h. */
export const PF_KTHREAD = 0x00200000;

/** The fields after comm (the last ')') of a /proc/<pid>/stat line: [0] is field 3, the state. */
const fieldsAfterComm = (text: string) =>
  text
    .slice(text.lastIndexOf(')') + 1)
    .trim()
    .split(/ +/);

/**
 * From one /proc/<pid>/stat line: the address-space layout it shows, as
 * "startcode:start_brk:startstack" (fields 26, 47 and 28), and whether it is
 * a kernel thread's (PF_KTHREAD in field 9). A fork shares or copies its
 * parent's memory, so until it execs it shows exactly its parent's layout;
 * every exec draws a new one (where addresses are randomized). image is null
 * where the line shows none: no memory (a zombie, a kernel thread, a process
 * inside execve), a reader the kernel hides it from (zeros), a kernel before 3.3.
 */
export function parseLayout(text: string): { image: string | null; kernelThread: boolean } {
  const rest = fieldsAfterComm(text);
  const flags = Number(rest[6]);
  const fields = [rest[23], rest[44], rest[25]];
  const shown = fields.every((f) => f !== undefined && /^\d{1,20}$/.test(f) && !/^0+$/.test(f));
  return {
    image: shown ? fields.join(':') : null,
    kernelThread: Number.isSafeInteger(flags) && (flags & PF_KTHREAD) !== 0,
  };
}

/** The address-space layout of a /proc/<pid>/stat line (parseLayout), or null. */
export function parseImage(text: string): string | null {
  return parseLayout(text).image;
}

/**
 * Splits /proc/<pid>/cmdline on NUL. A trailing NUL ends the last argument;
 * a process that rewrote its argv may leave none, and its last piece still
 * counts. A zombie or kernel thread has an empty cmdline: [].
 */
export function splitCmdline(raw: string): string[] {
  if (raw.length === 0) return [];
  const parts = raw.split('\0');
  if (raw.endsWith('\0')) parts.pop();
  return parts;
}

/** A numeric field of /proc/<pid>/status ("Tgid:\t123"), or null. */
export function parseStatusField(text: string, name: string): number | null {
  const m = new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(text);
  return m ? Number(m[1]) : null;
}

/** The real uid from /proc/<pid>/status ("Uid:\treal\teffective\tsaved\tfs"), or -1. */
export function parseStatusUid(text: string): number {
  const m = /^Uid:\s+(\d+)/m.exec(text);
  return m ? Number(m[1]) : -1;
}

/** Clock ticks per second of /proc's start times (USER_HZ): 100 wherever Linux exports it to user space. */
const USER_HZ = 100;

/** When a process that started `startTicks` after boot began, in ms since the epoch (to a second or two). */
export function startedAtMs(startTicks: number, bootMs: number): number {
  return bootMs + (startTicks * 1000) / USER_HZ;
}
