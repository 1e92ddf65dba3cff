/**
 * The environment for programs that are not under test (QEMU, a node child
 * running as another uid): without what scripts/sanitize.sh adds for the
 * addon's sake. Preloaded into QEMU, libasan reports on QEMU's own
 * coroutines (makecontext/swapcontext); a node child that cannot read the
 * instrumented addon's dir, or runs without the preload, must load the
 * regular build instead.
 */
export function plainEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const name of ['LD_PRELOAD', 'ASAN_OPTIONS', 'UBSAN_OPTIONS', 'CUSTODY_ADDON_PATH']) delete env[name];
  return env;
}
