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
    return (Promise.resolve(fn(...args)) as Promise<Awaited<T>>).then(undefined, (err: unknown) =>
      Promise.reject(asError(err)),
    );
  } catch (err) {
    return Promise.reject(asError(err));
  }
}

/**
 * A hook may throw or reject with anything (`reject(null)`, a string); what
 * custody passes on, reports in events and keeps as a deferral's cause is an
 * Error, the value its cause.
 */
function asError(value: unknown): Error {
  if (value instanceof Error) return value;
  return new Error(
    `a hook failed with ${value === null ? 'null' : typeof value === 'string' ? JSON.stringify(value) : String(value)}`,
    { cause: value },
  );
}
