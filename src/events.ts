/**
 * Events: every step of a lifecycle reaches the caller's sink and a
 * diagnostics_channel named `custody:<type>`. Warnings are never dropped: a
 * supervisor opened without a sink turns them into process warnings, and a
 * sink that throws does not lose the event (it is re-emitted as a warning).
 */
import { channel } from 'node:diagnostics_channel';

export type CustodyEventType =
  | 'launch'
  | 'spawn'
  | 'confirm'
  | 'ready'
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
  | 'sweep';

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

export type EventSink = (event: CustodyEvent) => void;

const channels = new Map<string, ReturnType<typeof channel>>();

export function emitter(sink: EventSink | undefined): (type: CustodyEventType, fields?: Omit<CustodyEvent, 'type' | 'time'>) => void {
  return (type, fields = {}) => {
    const event: CustodyEvent = { type, time: Date.now(), ...fields };
    let ch = channels.get(type);
    if (!ch) channels.set(type, (ch = channel(`custody:${type}`)));
    if (ch.hasSubscribers) ch.publish(event);
    if (sink) {
      try {
        sink(event);
        return;
      } catch (err) {
        process.emitWarning(`custody: the onEvent sink threw on a ${type} event: ${(err as Error)?.message ?? err}`, {
          code: 'CUSTODY_EVENT_SINK',
          detail: JSON.stringify(event),
        });
        return;
      }
    }
    if (type === 'warning' || type === 'escalate' || type === 'quarantine') {
      process.emitWarning(`custody: ${event.message ?? type}${event.id ? ` (${event.id})` : ''}`, { code: `CUSTODY_${type.toUpperCase()}` });
    }
  };
}

export type Emit = ReturnType<typeof emitter>;
