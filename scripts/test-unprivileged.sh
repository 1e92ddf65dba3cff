#!/usr/bin/env bash
# Runs test suites as an unprivileged user, as most users run custody: uid
# and gid 65534 (nobody) with no supplementary groups, on a copy of this tree
# (the checkout may sit in root's home, which nobody can enter), with HOME
# and TMPDIR in a fresh temp dir and the caller's PATH (entries nobody cannot
# search included, as on a real machine). Tests that need root skip and say
# why (the verbose reporter prints each skip with its reason).
#
#   bash scripts/test-unprivileged.sh [SUITE...]      (as root; default: the suites below)
#
# The tree must be installed and built first (npm ci). Vitest runs both
# projects, native and js, as `npm test` does.
set -euo pipefail
cd "$(dirname "$0")/.."

# What depends on who runs it: identities and signals of our own processes,
# another uid's processes left alone, the state dir's modes and ownership,
# PATH search, the CLI, who sent an sd_notify datagram (root's systemd-notify
# sends as the pid it names, another uid's as itself: notify-handoff).
# proc/properties parse text and do not care; load is the same work at
# volume; reuse, crash and faults need root almost throughout.
suites=("$@")
if [ ${#suites[@]} -eq 0 ]; then
  suites=(test/process/identity.test.ts test/process/handle.test.ts test/backend/spawn-types.test.ts test/supervisor.test.ts
    test/process/sweep.test.ts test/recovery/recover.test.ts test/backend/backend.test.ts test/cli/cli.test.ts test/process/subreaper.test.ts
    test/unprovable.test.ts test/reliability/hostile.test.ts test/lifecycle/notify-handoff.test.ts
    test/process/exec-attrs.test.ts)
fi

uid=${CUSTODY_TEST_UID:-65534}
if [ "$(id -u)" != 0 ]; then
  echo "test-unprivileged: run this as root; it drops to uid $uid itself" >&2
  exit 2
fi
[ -d node_modules ] && [ -f dist/index.js ] || {
  echo "test-unprivileged: run npm ci first" >&2
  exit 2
}

work=$(mktemp -d "${TMPDIR:-/tmp}/custody-unprivileged.XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
mkdir "$work/tree" "$work/home" "$work/tmp"
# Everything but .git: sources, node_modules, the built addon and dist/.
tar -C . --exclude=./.git -cf - . | tar -C "$work/tree" -xf -
chown -R "$uid:$uid" "$work/tree" "$work/home" "$work/tmp"

as_user() { setpriv --reuid="$uid" --regid="$uid" --clear-groups -- "$@"; }
# This Node, or a copy of it where it lives out of the user's reach (nvm under /root).
node=$(command -v node)
if ! (cd / && as_user "$node" -e 0) 2>/dev/null; then
  mkdir "$work/bin"
  cp "$(readlink -f "$node")" "$work/bin/node"
  chmod 755 "$work/bin" "$work/bin/node"
  node="$work/bin/node"
  export PATH="$work/bin:$PATH"
fi

cd "$work/tree"
echo "test-unprivileged: ${#suites[@]} suites as uid $uid in $work/tree"
as_user env HOME="$work/home" TMPDIR="$work/tmp" USER=nobody LOGNAME=nobody \
  "$node" node_modules/vitest/vitest.mjs run --reporter=verbose "${suites[@]}"
