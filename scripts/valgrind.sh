#!/usr/bin/env bash
# The native addon under valgrind (memcheck): every addon call, success and
# error paths, 20 rounds in one Node process (scripts/valgrind-addon.mjs), on
# a debug build by cmake-js (CMakeLists.txt). Fails on any leak (definite or
# indirect) allocated by the addon and any invalid read/write, uninitialised
# use or bad free whose first frame outside libc is the addon's. Node and V8
# keep memory until exit by design; records whose allocation is theirs are
# not the addon's and are not counted.
#
# Valgrind must know the pidfd syscalls: Debian 12's valgrind 3.19 answers
# ENOSYS to pidfd_open, so where `valgrind` lacks it this script takes
# valgrind 3.24 from Debian trixie (apt-get download into a private folder
# with its own package lists; nothing installed, the system's apt untouched).
# No valgrind yet wraps pidfd_send_signal (424): that call runs only up to the
# refused syscall (its ENOSYS error path), which the driver reports.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/custody-valgrind.XXXXXX")
trap 'rm -rf "$work"' EXIT

prefix=$(cd "$(dirname "$(command -v node)")/.." && pwd)
if [ -z "${npm_config_nodedir:-}" ] && [ -f "$prefix/include/node/node_api.h" ]; then
  export npm_config_nodedir=$prefix
fi
node node_modules/cmake-js/bin/cmake-js build --log-level warn --debug -O "$work/build"
addon="$work/build/Debug/custody.node"
export CUSTODY_ADDON_PATH=$addon

valgrind=${VALGRIND:-valgrind}
knows_pidfd() {
  "$valgrind" -q node -e "require(process.env.CUSTODY_ADDON_PATH).close(require(process.env.CUSTODY_ADDON_PATH).pidfdOpen(process.pid))" >/dev/null 2>&1
}
if ! command -v "$valgrind" >/dev/null || ! knows_pidfd; then
  cache="$root/node_modules/.cache/valgrind-trixie"
  if [ ! -x "$cache/root/usr/bin/valgrind" ]; then
    echo "valgrind: $("$valgrind" --version 2>/dev/null || echo none) does not wrap pidfd_open; fetching Debian trixie's"
    mkdir -p "$cache/lists/partial" "$cache/cache/archives/partial"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg # on Ubuntu: apt-get install debian-archive-keyring
    opts="arch=amd64"
    [ -f "$keyring" ] && opts="$opts signed-by=$keyring"
    echo "deb [$opts] http://deb.debian.org/debian trixie main" >"$cache/sources.list"
    apt=(-o "Dir::Etc::SourceList=$cache/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$cache/lists" -o "Dir::Cache=$cache/cache" -o Dir::State::status=/dev/null
      -o APT::Architectures::=amd64 -o Debug::NoLocking=1)
    apt-get "${apt[@]}" update -qq
    (cd "$cache" && apt-get "${apt[@]}" download valgrind)
    dpkg -x "$cache"/valgrind_*.deb "$cache/root"
  fi
  valgrind="$cache/root/usr/bin/valgrind"
  export VALGRIND_LIB="$cache/root/usr/libexec/valgrind"
fi
echo "valgrind: $("$valgrind" --version), addon $addon"

t0=$SECONDS
"$valgrind" -q --smc-check=all-non-file --leak-check=full --show-leak-kinds=definite,indirect \
  --child-silent-after-fork=yes --track-origins=yes --xml=yes --xml-file="$work/memcheck.xml" \
  node scripts/valgrind-addon.mjs
echo "valgrind: run took $((SECONDS - t0)) s"

node - "$work/memcheck.xml" <<'EOF'
// Counts the errors that are the addon's: the first stack frame outside the
// allocator, libc and valgrind's preload is in custody.node.
const fs = require('node:fs');
const xml = fs.readFileSync(process.argv[2], 'utf8');
const errors = [...xml.matchAll(/<error>([\s\S]*?)<\/error>/g)].map((m) => m[1]);
const notOurs = /vgpreload|\/libc[.-]|\/libstdc\+\+|\/ld-linux|\/libgcc_s/;
const tag = (s, t) => (s.match(new RegExp(`<${t}>([\\s\\S]*?)</${t}>`)) || [])[1];
const ours = [];
const kinds = {};
for (const e of errors) {
  const kind = tag(e, 'kind');
  kinds[kind] = (kinds[kind] || 0) + 1;
  const stack = tag(e, 'stack') || '';
  const frames = [...stack.matchAll(/<frame>([\s\S]*?)<\/frame>/g)].map((m) => ({ obj: tag(m[1], 'obj') || '', fn: tag(m[1], 'fn') || '?' }));
  const first = frames.find((f) => !notOurs.test(f.obj));
  if (first && first.obj.includes('custody.node')) {
    ours.push(`${kind}: ${(tag(e, 'text') || tag(e, 'what') || '').trim().split('\n')[0]}\n    ${frames.slice(0, 8).map((f) => f.fn).join('\n    ')}`);
  }
}
console.log(`valgrind: ${errors.length} records in all (${Object.entries(kinds).map(([k, n]) => `${k} ${n}`).join(', ') || 'none'}), ${ours.length} in the addon`);
for (const o of ours) console.log(o);
process.exit(ours.length ? 1 : 0);
EOF
