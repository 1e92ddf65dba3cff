// A small client for QMP, the QEMU Machine Protocol (JSON lines over a unix
// socket): what a custody recipe needs to prove a QEMU is serving and to ask
// it to stop. No dependencies; every call is bounded and takes an AbortSignal.
//
//   const status = await qmpStatus('/run/vm-1.qmp');   // 'running', 'paused', 'prelaunch'...
//   await qmpQuit('/run/vm-1.qmp');                     // QEMU exits (the graceful stop)
//
// The protocol (docs/interop/qmp-spec in QEMU): on connect QEMU sends a
// greeting {"QMP": {...}}; the client must send qmp_capabilities before any
// other command; each command gets {"return": ...} or {"error": {class,
// desc}}; asynchronous {"event": ...} lines may come in between.
import { connect } from 'node:net';

const DEFAULT_TIMEOUT_MS = 5000;

/**
 * Opens a QMP session: connects, reads the greeting, negotiates capabilities.
 * Resolves { execute(command, args?), close() }; rejects on a socket error, a
 * malformed line, an abort, or timeoutMs (default 5 s) for the whole opening.
 */
export function qmpSession(socketPath, { signal, timeoutMs = DEFAULT_TIMEOUT_MS } = {}) {
  return new Promise((resolve, reject) => {
    const sock = connect({ path: socketPath });
    const waiting = []; // resolvers of commands in flight, in order
    let buffer = '';
    let greeted = false;
    let closed = false;
    const fail = (err) => {
      if (closed) return;
      closed = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      sock.destroy();
      for (const w of waiting.splice(0)) w.reject(err);
      reject(err);
    };
    const onAbort = () => fail(signal.reason ?? new Error('aborted'));
    if (signal?.aborted) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    const timer = setTimeout(
      () => fail(new Error(`QMP on ${socketPath}: no session within ${timeoutMs} ms`)),
      timeoutMs,
    );

    const session = {
      /** Runs one command; resolves its "return" value, rejects with its "error". */
      execute(command, args) {
        if (closed) return Promise.reject(new Error(`QMP on ${socketPath} is closed`));
        return new Promise((res, rej) => {
          waiting.push({ resolve: res, reject: rej, command });
          sock.write(`${JSON.stringify(args ? { execute: command, arguments: args } : { execute: command })}\n`);
        });
      },
      close() {
        if (closed) return;
        closed = true;
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        sock.destroy();
        for (const w of waiting.splice(0))
          w.reject(new Error(`QMP on ${socketPath} closed before ${w.command} returned`));
      },
    };

    sock.setEncoding('utf8');
    sock.on('error', fail);
    sock.on('close', () => {
      for (const w of waiting.splice(0))
        w.reject(Object.assign(new Error(`QMP on ${socketPath} closed`), { code: 'QMP_CLOSED' }));
      if (!greeted) fail(new Error(`QMP on ${socketPath} closed before its greeting`));
    });
    sock.on('data', (chunk) => {
      buffer += chunk;
      if (buffer.length > 1 << 20) return fail(new Error(`QMP on ${socketPath}: a line over 1 MiB`));
      for (let nl = buffer.indexOf('\n'); nl !== -1; nl = buffer.indexOf('\n')) {
        const line = buffer.slice(0, nl).trim();
        buffer = buffer.slice(nl + 1);
        if (!line) continue;
        let msg;
        try {
          msg = JSON.parse(line);
        } catch {
          return fail(new Error(`QMP on ${socketPath}: not JSON: ${line.slice(0, 100)}`));
        }
        if (!greeted) {
          if (!msg.QMP) return fail(new Error(`QMP on ${socketPath}: no greeting, got ${line.slice(0, 100)}`));
          greeted = true;
          session.execute('qmp_capabilities').then(() => {
            clearTimeout(timer);
            signal?.removeEventListener('abort', onAbort);
            resolve(session);
          }, fail);
          continue;
        }
        if (msg.event) continue;
        const w = waiting.shift();
        if (!w) continue;
        if (msg.error)
          w.reject(
            Object.assign(new Error(`QMP ${w.command}: ${msg.error.class}: ${msg.error.desc}`), { qmp: msg.error }),
          );
        else w.resolve(msg.return);
      }
    });
  });
}

/**
 * The VM's run state from query-status ('running', 'paused', 'prelaunch'...).
 * A connect alone proves the socket is bound; this proves QEMU serves it.
 */
export async function qmpStatus(socketPath, options = {}) {
  const s = await qmpSession(socketPath, options);
  try {
    return (await s.execute('query-status')).status;
  } finally {
    s.close();
  }
}

/**
 * A ready probe for custody (`ready: { socket, probe: qmpReady }`): resolves
 * once QEMU answers query-status with a state that is not 'prelaunch' or
 * 'inmigrate'; rejects otherwise (custody retries until the ready deadline).
 */
export async function qmpReady(socketPath, signal) {
  const status = await qmpStatus(socketPath, { signal });
  if (status === 'prelaunch' || status === 'inmigrate') throw new Error(`QEMU is ${status}`);
  return status;
}

/**
 * Asks QEMU to exit (the QMP quit command): a graceful stop hook for custody
 * (`stop(id, { graceful: (inst, signal) => qmpQuit(socket, { signal }) })`).
 * QEMU may close the socket before it answers; both mean the request was taken.
 */
export async function qmpQuit(socketPath, options = {}) {
  const s = await qmpSession(socketPath, options);
  try {
    await s.execute('quit').catch((err) => {
      if (err.code !== 'QMP_CLOSED') throw err;
    });
  } finally {
    s.close();
  }
}
