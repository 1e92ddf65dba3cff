// Types for examples/qmp.js (the TypeScript tests import it).
export interface QmpOptions {
  signal?: AbortSignal;
  /** Bound of opening the session (connect, greeting, qmp_capabilities). Default 5000. */
  timeoutMs?: number;
}
export interface QmpSession {
  execute(command: string, args?: Record<string, unknown>): Promise<unknown>;
  close(): void;
}
export function qmpSession(socketPath: string, options?: QmpOptions): Promise<QmpSession>;
export function qmpStatus(socketPath: string, options?: QmpOptions): Promise<string>;
export function qmpReady(socketPath: string, signal?: AbortSignal): Promise<string>;
export function qmpQuit(socketPath: string, options?: QmpOptions): Promise<void>;
