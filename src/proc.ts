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
