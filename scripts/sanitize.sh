#!/usr/bin/env bash
# The whole test suite (npx vitest run: both backends) on an addon built with
# AddressSanitizer and UndefinedBehaviorSanitizer by cmake-js (CMakeLists.txt).
# Passes only if the suite passes and no sanitizer wrote a report.
#
# Node itself is not instrumented, so:
#   LD_PRELOAD=libasan.so   ASan's runtime must be the first library loaded
#                           (else "ASan runtime does not come first"); preloading
#                           also reaches every child the tests start.
#   detect_leaks=0          LeakSanitizer would report at every exit what V8,
#                           Node and the helper processes never free by design.
#                           Leaks in the addon are valgrind's job (scripts/valgrind.sh).
#   log_path=...            every report from every process goes to a file here;
#                           an empty folder at the end means zero reports.
# Needs g++, cmake (and ninja or make); uses Node's own headers where they sit
# beside node, else cmake-js downloads them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$(mktemp -d "${TMPDIR:-/tmp}/custody-sanitize.XXXXXX")
logs="$out/reports"
mkdir -p "$logs"
trap 'rm -rf "$out"' EXIT

prefix=$(cd "$(dirname "$(command -v node)")/.." && pwd)
if [ -z "${npm_config_nodedir:-}" ] && [ -f "$prefix/include/node/node_api.h" ]; then
  export npm_config_nodedir=$prefix
fi

t0=$SECONDS
node node_modules/cmake-js/bin/cmake-js build --log-level warn -O "$out/build" --CDCUSTODY_SANITIZE="address;undefined"
addon="$out/build/Release/custody.node"
readelf -d "$addon" | grep -q 'libasan' || { echo "sanitize: $addon is not built with ASan"; exit 1; }
echo "sanitize: built $addon in $((SECONDS - t0)) s"

libasan=$(${CXX:-g++} -print-file-name=libasan.so)
[ -f "$libasan" ] || { echo "sanitize: libasan.so not found (${CXX:-g++} -print-file-name=libasan.so)"; exit 1; }

# procps's ps deadlocks at its start under a preloaded libasan (glibc's
# _nl_state_lock, taken again in textdomain()); nothing of ours runs in ps,
# so the tests get a ps that drops the preload.
mkdir -p "$out/bin"
printf '#!/bin/sh\nunset LD_PRELOAD\nexec %s "$@"\n' "$(command -v ps)" >"$out/bin/ps"
chmod +x "$out/bin/ps"
export PATH="$out/bin:$PATH"

export LD_PRELOAD=$libasan
export ASAN_OPTIONS="detect_leaks=0:log_path=$logs/asan:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$logs/ubsan"
export CUSTODY_ADDON_PATH=$addon

# The suite must really run on the instrumented addon.
node --input-type=module -e "
  const { capabilities } = await import('$root/dist/index.js');
  const maps = (await import('node:fs')).readFileSync('/proc/self/maps', 'utf8');
  if (capabilities().backend !== 'native' || !maps.includes('$addon')) {
    console.error('sanitize: the instrumented addon is not in use:', capabilities().reason);
    process.exit(1);
  }"

t1=$SECONDS
status=0
node node_modules/vitest/vitest.mjs run "$@" || status=$?
echo "sanitize: test suite exited $status in $((SECONDS - t1)) s"

reports=$(find "$logs" -type f | wc -l)
if [ "$reports" -gt 0 ]; then
  for f in "$logs"/*; do
    echo "---- $f"
    head -60 "$f"
  done
  echo "sanitize: $reports sanitizer report(s)"
  exit 1
fi
echo "sanitize: ASan + UBSan: 0 reports"
exit "$status"
