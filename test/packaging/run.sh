#!/usr/bin/env bash
# What ships, tested as it ships: `npm pack` (its prepack builds the prebuilds
# this machine can, and refuses without the host's), the tarball installed
# into an empty folder with no compiler on PATH, then
#   - the prebuild loads (native backend), from ESM and from CommonJS, on this
#     Node and on the library's floor, Node 20.0.0
#   - the arm64 prebuild loads in an arm64 Node (scripts/check-arm64.sh: under
#     qemu-user on other machines; skipped with a note where qemu-user cannot
#     run, unless CUSTODY_REQUIRE_ARM64=1)
#   - with the addon removed, or forced off, the js backend runs and says why:
#     what was looked for, what the install step did, and the fix
#   - a broken prebuild: the install falls back to the js backend without a
#     compiler, and builds from source with one
#   - a simulated non-Linux platform installs and runs on the js backend
#   - `npm install git+file://…` of this commit, without a compiler: require()
#     and import both work (prepare built dist/ and dist/cjs/), on the js
#     backend, saying the source build failed and why
#   - the types resolve for TypeScript consumers (node16 ESM, node16 CJS, bundler)
#     and attw finds no problem in the tarball
# Ends with "packaging: N passed, N failed". Needs a compiler to build the host
# prebuild when prebuilds/ lacks it, and for the build-from-source case.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/custody-pkg.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Traversable (not listable) by others: the consumer's PATH is $work/nocc-bin, and the examples that run
# as root give their program runAs nobody, whose execve walks that path (mktemp's 0700 made it EACCES).
chmod 711 "$work"
# The consumer's environment is its own: none of this repository's switches.
unset CUSTODY_REQUIRE_NATIVE CUSTODY_BACKEND CUSTODY_ADDON_PATH

passed=0
failed=0
check() { # check NAME COMMAND... : runs COMMAND, counts and reports it
  local name=$1
  shift
  local t0=$SECONDS
  if "$@" >"$work/last.log" 2>&1; then
    passed=$((passed + 1))
    echo "ok - $name ($((SECONDS - t0)) s)"
    # The js backend's reason, as a user reads it.
    sed -n 's/^consumer\.[cm]js: .* reason="\(.*\)"$/    reason: \1/p' "$work/last.log"
  else
    failed=$((failed + 1))
    echo "not ok - $name"
    sed 's/^/    /' "$work/last.log" | tail -40
  fi
}

arch=$(node -p process.arch)
libc=$(node -p "process.report.getReport().header.glibcVersionRuntime ? 'glibc' : 'musl'")
host="linux-$arch-$libc"
hostdir="linux-$arch"

# 1-2. Pack. prepack builds every prebuild this machine can that is missing
# or older than native/ (the release workflow puts all four in prebuilds/
# first), and refuses to pack without the host's.
npm pack --pack-destination "$work" >"$work/pack.log" 2>&1 || { cat "$work/pack.log"; exit 1; }
grep '^prepack:' "$work/pack.log" || true
node scripts/check-prebuilds.mjs "--require=$host" --fresh
tgz=$(ls "$work"/custody-*.tgz)
echo "tarball: $(basename "$tgz") $(stat -c %s "$tgz") bytes, $(tar tzf "$tgz" | wc -l) files"

tarball_contents() {
  local list f
  list=$(tar tzf "$tgz")
  grep -qx "package/prebuilds/$hostdir/custody.$libc.node" <<<"$list" || { echo "no host prebuild"; return 1; }
  for f in prebuilds/*/*.node; do
    grep -qx "package/$f" <<<"$list" || { echo "$f is in prebuilds/ but not in the tarball"; return 1; }
  done
  for f in dist/custody.mjs dist/index.d.ts dist/cjs/index.js dist/cjs/index.d.ts dist/cjs/package.json \
    binding.gyp native/addon.cc scripts/install.cjs README.md LICENSE CHANGELOG.md; do
    grep -qx "package/$f" <<<"$list" || { echo "missing $f"; return 1; }
  done
  for f in examples/quickstart.js examples/adopt.js examples/restart.js examples/notify-daemon.js examples/exec-attrs.js \
    examples/commonjs.cjs examples/typescript.ts examples/qemu.js examples/qmp.js; do
    grep -qx "package/$f" <<<"$list" || { echo "missing $f"; return 1; }
  done
  if grep -E '\.map$|^package/(src|test|bench|examples/\.build|\.github|\.ci)/|CMakeLists' <<<"$list"; then
    echo "ships files it does not need"
    return 1
  fi
}
check "tarball holds the prebuild, both builds and the sources to rebuild, nothing else" tarball_contents

# 3. A PATH with everything but compilers and make.
nocc="$work/nocc-bin"
mkdir -p "$nocc"
for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
  [ -d "$d" ] || continue
  for f in "$d"/*; do
    n=${f##*/}
    case "$n" in
      cc | c++ | cpp | gcc | g++ | gcc-* | g++-* | cpp-* | clang* | c89* | c99* | *-linux-gnu-* | *-linux-musl-* | musl-gcc | make | gmake | ld | ld.* | as) continue ;;
    esac
    [ -e "$nocc/$n" ] || ln -s "$f" "$nocc/$n"
  done
done
no_compiler() { ! PATH="$nocc" sh -c 'command -v cc || command -v gcc || command -v g++ || command -v c++ || command -v make'; }
check "the consumer PATH has no compiler and no make" no_compiler

# 4. Install into an empty folder, no compiler.
app="$work/app"
mkdir -p "$app"
echo '{ "name": "consumer", "private": true, "type": "module" }' >"$app/package.json"
cp test/packaging/consumer.mjs test/packaging/consumer.cjs "$app/"
pkg="$app/node_modules/custody"
install_nocc() {
  (cd "$app" && PATH="$nocc" npm install --no-audit --no-fund --foreground-scripts "$tgz")
  [ -f "$pkg/prebuilds/$hostdir/custody.$libc.node" ] || { echo "prebuild not installed"; return 1; }
  [ ! -e "$pkg/build" ] || { echo "the install built from source: $(ls -R "$pkg/build" | head)"; return 1; }
}
check "npm install of the tarball with no compiler on PATH (keeps the prebuild, builds nothing)" install_nocc

run_in() { (cd "$1" && shift && PATH="$nocc" "$@"); } # run_in DIR COMMAND...: as a consumer there
run_app() { run_in "$app" "$@"; }
check "ESM consumer: import loads the prebuild (native)" run_app env EXPECT_BACKEND=native node consumer.mjs
check "CommonJS consumer: require() loads the prebuild (native), inspect() synchronous" run_app env EXPECT_BACKEND=native node consumer.cjs
check "CUSTODY_BACKEND=js: js backend, says it was forced" \
  run_app env CUSTODY_BACKEND=js EXPECT_BACKEND=js EXPECT_REASON='CUSTODY_BACKEND=js' node consumer.mjs

# Every shipped example, run from the installed package as a user runs it (each ends what it starts).
ex="$pkg/examples"
for f in quickstart.js adopt.js restart.js notify-daemon.js exec-attrs.js commonjs.cjs hostagent-sweep.js demo.js; do
  check "example $f runs from the installed package" run_app node "$ex/$f"
done
if command -v qemu-system-x86_64 >/dev/null; then
  check "example qemu.js runs from the installed package (real QEMU, QMP probe shipped beside it)" run_app node "$ex/qemu.js"
else
  echo "skip - example qemu.js: no qemu-system-x86_64 here (.ci/run installs it)"
fi
# The TypeScript one, as a consumer compiles it: strict, its own tsconfig, the package's types.
ts_example() {
  local dir="$app/ts-example"
  mkdir -p "$dir"
  cp "$ex/typescript.ts" "$dir/"
  cat >"$dir/tsconfig.json" <<EOF
{ "compilerOptions": { "module": "NodeNext", "moduleResolution": "NodeNext", "target": "ES2022", "strict": true,
  "skipLibCheck": false, "types": ["node"], "typeRoots": ["$root/node_modules/@types"], "outDir": "out" },
  "files": ["typescript.ts"] }
EOF
  (cd "$dir" && node "$root/node_modules/typescript/bin/tsc" -p .) && run_in "$dir" node out/typescript.js
}
check "example typescript.ts compiles (strict) and runs in the consumer project" ts_example

# The library's floor is Node 20.0.0 (engines); the development floor is higher (devEngines).
floor_node() {
  local node20
  node20=$(bash "$root/scripts/fetch-node.sh" "$arch" 20.0.0) || return 1
  [ "$("$node20" --version)" = v20.0.0 ] || return 1
  run_app env EXPECT_BACKEND=native "$node20" consumer.mjs && run_app env EXPECT_BACKEND=native "$node20" consumer.cjs
}
if [ "$libc" = glibc ]; then
  check "Node 20.0.0 (the engines floor): ESM and CommonJS consumers load the prebuild (native)" floor_node
else
  echo "skip - Node 20.0.0: the npm registry's node-linux-* binaries are glibc builds"
fi

# The arm64 prebuild, loaded from the installed package by an arm64 Node.
if [ -f "$pkg/prebuilds/linux-arm64/custody.glibc.node" ]; then
  check "linux-arm64-glibc prebuild: loads and works in an arm64 Node" bash "$root/scripts/check-arm64.sh" "$pkg"
  grep -h '^check-arm64: \(passed\|skipped\)' "$work/last.log" | sed 's/^/    /' || true
else
  echo "skip - the tarball has no linux-arm64 glibc prebuild (no cross compiler here)"
fi

# 5. The addon removed: js backend, and why.
mv "$pkg/prebuilds" "$work/prebuilds.kept"
# What was looked for, what the install did (nothing: the prebuild loaded then), the fix.
missing="^no native addon for $host \\(node [0-9.]+, abi [0-9]+, napi [0-9]+\\): no prebuild for it in prebuilds/ \\(the package has none\\), and no source build in build/Release .*Fix: .*npm rebuild custody"
check "addon removed, ESM: js backend; reason names the target, the missing builds and the fix" \
  run_app env EXPECT_BACKEND=js EXPECT_REASON="$missing" node consumer.mjs
check "addon removed, CommonJS: js backend; reason names the target, the missing builds and the fix" \
  run_app env EXPECT_BACKEND=js EXPECT_REASON="$missing" node consumer.cjs
mv "$work/prebuilds.kept" "$pkg/prebuilds"

# 6. A broken prebuild (not an ELF file): the install step falls back.
good="$work/good.node"
cp "$pkg/prebuilds/$hostdir/custody.$libc.node" "$good"
echo 'not an ELF shared object' >"$pkg/prebuilds/$hostdir/custody.$libc.node"
broken_nocc() {
  (cd "$app" && PATH="$nocc" npm rebuild custody --foreground-scripts) 2>&1 | tee "$work/rebuild.log"
  grep -q 'no prebuilt addon loads here' "$work/rebuild.log" || return 1
  grep -q 'native addon unavailable' "$work/rebuild.log" || return 1
  [ ! -e "$pkg/build/Release/custody.node" ]
}
check "broken prebuild, no compiler: install succeeds and warns" broken_nocc
check "broken prebuild, no compiler: js backend; reason names the file, its load error, the failed build, the fix" \
  run_app env EXPECT_BACKEND=js \
  EXPECT_REASON="^the native addon did not load from prebuilds/$hostdir/custody.$libc.node: .*, and the install-time source build failed \\(.*not found on PATH: .*make.*\\)\\. Fix: " \
  node consumer.mjs
broken_cc() {
  (cd "$app" && npm rebuild custody --foreground-scripts) 2>&1 | tee "$work/rebuild-cc.log"
  grep -q 'building from source' "$work/rebuild-cc.log" || return 1
  [ -f "$pkg/build/Release/custody.node" ]
}
check "broken prebuild, compiler present: install builds from source" broken_cc
check "built from source: native backend" run_app env EXPECT_BACKEND=native node consumer.cjs
rm -rf "$pkg/build"
cp "$good" "$pkg/prebuilds/$hostdir/custody.$libc.node"

# 7. Not Linux (process.platform faked by a preload): no build attempted, js backend.
darwin="$root/test/fixtures/as-darwin.mjs"
darwin_install() {
  (cd "$pkg" && PATH="$nocc" node --import "$darwin" scripts/install.cjs) 2>&1 | tee "$work/darwin.log"
  grep -q 'darwin is not Linux' "$work/darwin.log" && [ ! -e "$pkg/build" ]
}
check "simulated darwin: install step builds nothing and exits 0" darwin_install
check "simulated darwin, ESM: imports and runs on the js backend" \
  run_app env EXPECT_BACKEND=js EXPECT_REASON='darwin' node --import "$darwin" consumer.mjs
check "simulated darwin, CommonJS: requires and runs on the js backend" \
  run_app env EXPECT_BACKEND=js EXPECT_REASON='darwin' node --import "$darwin" consumer.cjs

# 8. A git install of this commit, no compiler: npm clones it, installs its
# devDependencies and runs prepare there (dist/, dist/cjs/), packs it and
# installs that. prebuilds/ is not in git, so the addon cannot be had: the js
# backend runs and says why.
gitapp="$work/gitapp"
git_install() {
  mkdir -p "$gitapp"
  echo '{ "name": "git-consumer", "private": true, "type": "module" }' >"$gitapp/package.json"
  cp test/packaging/consumer.mjs test/packaging/consumer.cjs "$gitapp/"
  (cd "$gitapp" && PATH="$nocc" npm install --no-audit --no-fund --prefer-offline --foreground-scripts \
    "git+file://$root#$head")
  [ -f "$gitapp/node_modules/custody/dist/cjs/index.js" ] || { echo "dist/cjs not built"; return 1; }
}
if head=$(git -C "$root" rev-parse HEAD 2>/dev/null); then
  check "npm install git+file://… of this commit, no compiler on PATH" git_install
  from_git="^no native addon for $host .*the install-time source build failed \\(.*not found on PATH: .*\\)\\. Fix: "
  check "git install, CommonJS: require('custody') works (js backend, says why)" \
    run_in "$gitapp" env EXPECT_BACKEND=js EXPECT_REASON="$from_git" node consumer.cjs
  check "git install, ESM: import works (js backend, says why)" \
    run_in "$gitapp" env EXPECT_BACKEND=js EXPECT_REASON="$from_git" node consumer.mjs
else
  echo "skip - git install: no git here, or git will not read this checkout (another owner)"
fi

# 9. Types, as a TypeScript consumer sees them (skipLibCheck off: the shipped .d.ts are checked too).
tsc="$root/node_modules/typescript/bin/tsc"
typeroots="$root/node_modules/@types"
cat >"$work/consumer.ts" <<'EOF'
import { capabilities, inspect, verify, spawn, Supervisor, CustodyError } from 'custody';
import type { Capabilities, ProcessIdentity, VerifyResult, LaunchSpec } from 'custody';
const caps: Capabilities = capabilities();
const backend: 'native' | 'js' = caps.backend;
const id: ProcessIdentity = inspect(process.pid);
const v: VerifyResult = verify(id);
const spec: LaunchSpec = { id: 'x', command: '/bin/true', args: (token: string) => [token] };
const h = spawn('/bin/true', [], { stdio: 'ignore' });
export const all = [backend, v.verdict, spec, h.pid, Supervisor.open, CustodyError];
// @ts-expect-error inspect takes a pid
inspect('1');
EOF
types_project() { # NAME TYPE MODULE RESOLUTION EXT EXPECTED_D_TS
  local dir="$app/types-$1"
  mkdir -p "$dir"
  echo "{ \"private\": true, \"type\": \"$2\" }" >"$dir/package.json"
  cp "$work/consumer.ts" "$dir/index.$5"
  cat >"$dir/tsconfig.json" <<EOF
{ "compilerOptions": { "module": "$3", "moduleResolution": "$4", "target": "ES2022", "strict": true,
  "noEmit": true, "skipLibCheck": false, "types": ["node"], "typeRoots": ["$typeroots"] },
  "files": ["index.$5"] }
EOF
  (cd "$dir" && node "$tsc" -p . --traceResolution >"$dir/trace.log") || { grep -v '^=\|^Module\|^File\|^Resolving\|^Loading\|^Found\|^Directory\|^Explicitly\|^Using\|^Saw\|^Matched\|^Exiting\|^Entering' "$dir/trace.log" | head -20; return 1; }
  grep -q "Module name 'custody' was successfully resolved to '$pkg/$6'" "$dir/trace.log" || {
    grep "Module name 'custody'" "$dir/trace.log"
    return 1
  }
}
check "types: moduleResolution node16, ESM consumer -> dist/index.d.ts" types_project node16-esm module Node16 Node16 ts dist/index.d.ts
check "types: moduleResolution node16, CommonJS consumer -> dist/cjs/index.d.ts" types_project node16-cjs commonjs Node16 Node16 ts dist/cjs/index.d.ts
check "types: moduleResolution node16, .cts file -> dist/cjs/index.d.ts" types_project node16-cts module Node16 Node16 cts dist/cjs/index.d.ts
check "types: moduleResolution bundler -> dist/index.d.ts" types_project bundler module ESNext Bundler ts dist/index.d.ts
check "attw: no type resolution problem in the tarball (node10, node16 CJS/ESM, bundler)" \
  node "$root/node_modules/@arethetypeswrong/cli/dist/index.js" --format table-flipped "$tgz"

echo "tarball: $(basename "$tgz") $(stat -c %s "$tgz") bytes packed, $(tar xzf "$tgz" -O | wc -c) bytes unpacked"
echo "packaging: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
