/**
 * Caller-supplied hooks (a graceful stop, a ready check, a pid function, a
 * readiness probe, an event sink) may be plain or async functions. Every
 * caller goes through callHook, so a hook's shape never breaks its caller:
 * a value, a promise, a throw and a thenable that throws all become one
 * promise, settled the way the hook meant.
 */
export function callHook<A extends unknown[], T>(
  fn: (...args: A) => T | PromiseLike<T>,
  ...args: A
): Promise<Awaited<T>> {
  try {
    return Promise.resolve(fn(...args)) as Promise<Awaited<T>>;
  } catch (err) {
    return Promise.reject(err);
  }
}
