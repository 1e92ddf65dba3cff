/**
 * Events: every step of a lifecycle reaches the caller's sink and a
 * diagnostics_channel named `custody:<type>`. Warnings are never dropped: a
 * supervisor opened without a sink turns them into process warnings, and a
 * sink that throws, or returns a promise that rejects, does not lose the
 * event nor crash the process: the failure is a process warning
 * (CUSTODY_EVENT_SINK) carrying the event.
 */
import { channel } from 'node:diagnostics_channel';
import { callHook } from './lifecycle/hooks.js';
import type { ExitResult, ExitStatus, InstanceStopResult, OutputTails, ProcessIdentity } from './types.js';

/** What every event carries. */
export interface EventBase<T extends string> {
  /** What happened: the event's kind (CustodyEventType). */
  type: T;
  /** Milliseconds since the epoch. */
  time: number;
  /** A sentence for people; code branches on `type` and the fields. */
  message: string;
}

/** An event about one process of one instance. */
export interface InstanceEvent<T extends string> extends EventBase<T> {
  /** The instance's id. */
  id: string;
  /** The process concerned. */
  pid: number;
}

/** An event about an instance as a whole, or a launch attempt, rather than one process of it. */
export interface WholeInstanceEvent<T extends string> extends EventBase<T> {
  /** The instance's id. */
  id: string;
  /** Never set: the event is about the instance, not one process. */
  pid?: undefined;
}

/** An attempt began: its starting manifest is written, its process about to be spawned. */
export interface LaunchEvent extends WholeInstanceEvent<'launch'> {
  /** 1 for the first try. */
  attempt: number;
  /** The launch token this attempt carries (in argv or CUSTODY_TOKEN). */
  token: string;
}
/** The attempt's child was spawned: the target itself, or a launcher the target's pid comes from. */
export type SpawnEvent = InstanceEvent<'spawn'>;
/** The pid exec'd into the expected program; its identity is recorded from that inspection. */
export interface ConfirmEvent extends InstanceEvent<'confirm'> {
  /** The identity recorded from the confirming inspection; null where none could be read. */
  identity: ProcessIdentity | null;
}
/** The instance is ready (its socket accepted, its probe or check resolved, or READY=1). */
export type ReadyEvent = InstanceEvent<'ready'>;
/** An sd_notify STATUS= line from the instance. */
export interface StatusEvent extends InstanceEvent<'status'> {
  /** The STATUS= text. */
  status: string;
}
/** Launched: the running manifest is written. */
export type RunningEvent = InstanceEvent<'running'>;
/** A failed attempt was undone: every process it made proven gone, its state removed. */
export interface AbandonEvent extends WholeInstanceEvent<'abandon'> {
  /** The attempt that failed (1 for the first). */
  attempt: number;
  /** The processes the attempt ended. */
  pids: number[];
  /** Why the attempt failed. */
  error: unknown;
}
/** Another attempt follows a failed one. */
export interface RetryEvent extends WholeInstanceEvent<'retry'> {
  /** The attempt about to start. */
  attempt: number;
}
/** A process outlived its grace after SIGTERM: SIGKILL follows. */
export type EscalateEvent = InstanceEvent<'escalate'>;
/** stop() ended the instance; its state is gone. */
export interface StopEvent extends EventBase<'stop'>, InstanceStopResult {
  /** The instance's id. */
  id: string;
  /** Absent where nothing ran: a pending restart cancelled, a failed instance stopped. */
  pid?: number;
}
/** The main process exited on its own; the tails are of its instance logs (none with `logs: false`). */
export interface ExitEvent extends InstanceEvent<'exit'>, ExitStatus, OutputTails {
  /** Why it ended (systemd's Result=): see ExitResult. */
  result: ExitResult;
}
/** An instance ended and its policy restarts it: the restart is due in `delayMs`. */
export interface RestartEvent extends WholeInstanceEvent<'restart'> {
  /** The restart's number since launch() (Instance.restarts once it runs). */
  attempt: number;
  /** How long until the restart begins, in ms. */
  delayMs: number;
  /** Why the run that ended ended. */
  result: ExitResult;
}
/** An instance ended more often than its restart limit allows: it is `failed` until launch() or remove(). */
export interface GaveUpEvent extends WholeInstanceEvent<'gave-up'> {
  /** Why the last run ended. */
  result: ExitResult;
  /** The restarts it had. */
  restarts: number;
}
/** Something worth an operator's look; custody carried on. */
export interface WarningEvent extends EventBase<'warning'> {
  /** The instance concerned, where there is one. */
  id?: string;
  /** The process concerned, where there is one. */
  pid?: number;
  /** The processes concerned, where there are several. */
  pids?: number[];
  /** The file or directory concerned. */
  path?: string;
  /** Names found in a state directory that custody did not write. */
  left?: string[];
  /** The cgroup concerned. */
  cgroup?: string;
  /** Why, in the terms of the ownership rule (recovery's rejections). */
  reason?: string;
}
/** Recovery found the recorded process alive and proven: it is supervised again. */
export type AdoptEvent = InstanceEvent<'adopt'>;
/** Recovery re-proved a process whose recorded `field` disagreed, and rewrote its manifest. */
export interface RepairEvent extends InstanceEvent<'repair'> {
  /** The recorded field that disagreed (exe, argv). */
  field: string;
  /**
   * 'renamed': the kernel proves it the very process launched (its pidfs id,
   * or its instance cgroup) and it rewrote its own title; 'mismatch': re-proved
   * by its token and declared paths.
   */
  reason: 'renamed' | 'mismatch';
}
/** State of an instance that is over was removed (recovery), or its old logs were (nobody signalled). */
export interface CleanEvent extends EventBase<'clean'> {
  /** The instance's id. */
  id: string;
  /** The recorded pid, where there was one. */
  pid?: number;
  /** Why it is over: 'gone', 'rebooted', 'incomplete'. */
  reason?: string;
}
/** Recovery could not prove whose the recorded pid is: it will not be signalled. */
export interface QuarantineEvent extends EventBase<'quarantine'> {
  /** The instance's id (or the entry's name, for a bad manifest). */
  id: string;
  /** The recorded pid, where there was one; never signalled. */
  pid?: number;
  /** Why: 'reused', 'mismatch', 'unrecorded', 'unprovable', 'bad-manifest', ... */
  reason?: string;
  /** The field that decided, where one did. */
  field?: string;
}
/** The operator released a quarantined instance: its state is gone, nothing was signalled. */
export interface ReleaseEvent extends EventBase<'release'> {
  /** The instance's id. */
  id: string;
  /** The recorded pid, where there was one; not signalled. */
  pid?: number;
  /** Why it was quarantined. */
  reason: string;
}
/** A periodic sweep found orphans matching one of its patterns. */
export interface SweepEvent extends EventBase<'sweep'> {
  /** Never set: a sweep is about no instance. */
  id?: undefined;
  /** Never set: see the pid lists. */
  pid?: undefined;
  /** The pattern's argv, in custody's lossless form. */
  argv: string[];
  /** Whether the sweep only reported (signalled nothing). */
  dryRun: boolean;
  /** The pids whose argv matched the pattern. */
  matched: number[];
  /** Those that ended at SIGTERM. */
  terminated: number[];
  /** Those that needed SIGKILL. */
  killed: number[];
  /** Those still alive at the deadline. */
  survivors: number[];
}
/** The instance's cgroup is frozen (`supervisor.freeze(id)`). */
export type FreezeEvent = WholeInstanceEvent<'freeze'>;
/** The instance's cgroup is thawed (`supervisor.thaw(id)`). */
export type ThawEvent = WholeInstanceEvent<'thaw'>;

/** Every event custody emits, told apart by `type`: `if (e.type === 'stop') e.outcome` type-checks. */
export type CustodyEvent =
  | LaunchEvent
  | SpawnEvent
  | ConfirmEvent
  | ReadyEvent
  | StatusEvent
  | RunningEvent
  | AbandonEvent
  | RetryEvent
  | EscalateEvent
  | StopEvent
  | ExitEvent
  | RestartEvent
  | GaveUpEvent
  | WarningEvent
  | AdoptEvent
  | RepairEvent
  | CleanEvent
  | QuarantineEvent
  | ReleaseEvent
  | SweepEvent
  | FreezeEvent
  | ThawEvent;

/** The `type` of every event: also the diagnostics_channel's name, `custody:<type>`. */
export type CustodyEventType = CustodyEvent['type'];

/** The event of one type, as a sink receives it. */
export type CustodyEventOf<T extends CustodyEventType> = Extract<CustodyEvent, { type: T }>;

/** What an emitter is given for an event of type T: all of it but the type and the time. */
export type EventFields<T extends CustodyEventType> = Omit<CustodyEventOf<T>, 'type' | 'time'>;

/** Sync or async: what it returns is not awaited, but a promise it returns that rejects is caught and reported. */
export type EventSink = (event: CustodyEvent) => unknown;

const channels = new Map<string, ReturnType<typeof channel>>();

export type Emit = <T extends CustodyEventType>(type: T, fields: EventFields<T>) => void;

export function emitter(sink: EventSink | undefined): Emit {
  return (type, fields) => {
    // The fields are those of `type` (EventFields<T>); the compiler cannot see that the two together make one event.
    const event = { type, time: Date.now(), ...fields } as CustodyEvent;
    let ch = channels.get(type);
    if (!ch) {
      ch = channel(`custody:${type}`);
      channels.set(type, ch);
    }
    if (ch.hasSubscribers) ch.publish(event);
    if (sink) {
      callHook(sink, event).catch((err: unknown) => {
        const why = (err as Error)?.message ?? String(err);
        process.emitWarning(`custody: the onEvent sink failed on a ${type} event: ${why}`, {
          code: 'CUSTODY_EVENT_SINK',
          detail: describeEvent(event),
        });
      });
      return;
    }
    if (type === 'warning' || type === 'escalate' || type === 'quarantine') {
      process.emitWarning(`custody: ${event.message ?? type}${event.id ? ` (${event.id})` : ''}`, {
        code: `CUSTODY_${type.toUpperCase()}`,
      });
    }
  };
}

/** The event as JSON for a warning's detail; never throws (errors become their messages, bigints strings). */
function describeEvent(event: CustodyEvent): string {
  try {
    return JSON.stringify(event, (_k, v: unknown) =>
      v instanceof Error ? { name: v.name, message: v.message } : typeof v === 'bigint' ? String(v) : v,
    );
  } catch {
    return `{"type":${JSON.stringify(event.type)}}`;
  }
}
