import { AbortError } from './errors.js';

export const TIMED_OUT = Symbol('timed out');

/**
 * Races a promise against a deadline and an AbortSignal. Resolves with the
 * promise's value or TIMED_OUT; rejects with AbortError on abort. The timer
 * and the abort listener are always removed, so nothing keeps the loop alive.
 */
export function within<T>(promise: Promise<T>, ms: number, signal?: AbortSignal): Promise<T | typeof TIMED_OUT> {
  if (signal?.aborted) return Promise.reject(new AbortError(signal.reason));
  return new Promise((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      cleanup();
      reject(new AbortError(signal!.reason));
    };
    const cleanup = () => {
      if (timer) clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    };
    if (Number.isFinite(ms)) timer = setTimeout(() => (cleanup(), resolve(TIMED_OUT)), Math.max(0, ms));
    signal?.addEventListener('abort', onAbort, { once: true });
    promise.then(
      (v) => (cleanup(), resolve(v)),
      (e) => (cleanup(), reject(e)),
    );
  });
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return within(new Promise<never>(() => {}), ms, signal).then(() => undefined);
}
