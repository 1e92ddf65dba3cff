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

export type CustodyEventType =
  | 'launch'
  | 'spawn'
  | 'confirm'
  | 'ready'
  | 'status'
  | 'running'
  | 'abandon'
  | 'retry'
  | 'escalate'
  | 'stop'
  | 'exit'
  | 'warning'
  | 'adopt'
  | 'repair'
  | 'clean'
  | 'quarantine'
  | 'release'
  | 'sweep'
  | 'freeze'
  | 'thaw';

export interface CustodyEvent {
  type: CustodyEventType;
  /** The instance, where the event concerns one. */
  id?: string;
  pid?: number;
  /** Milliseconds since the epoch. */
  time: number;
  message?: string;
  [key: string]: unknown;
}

/** Sync or async: what it returns is not awaited, but a promise it returns that rejects is caught and reported. */
export type EventSink = (event: CustodyEvent) => unknown;

const channels = new Map<string, ReturnType<typeof channel>>();

export function emitter(
  sink: EventSink | undefined,
): (type: CustodyEventType, fields?: Omit<CustodyEvent, 'type' | 'time'>) => void {
  return (type, fields = {}) => {
    const event: CustodyEvent = { type, time: Date.now(), ...fields };
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

export type Emit = ReturnType<typeof emitter>;

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
