#!/usr/bin/env bash
# Provisions the storage servers the test suite starts on 127.0.0.1 (tests/support/emulators.py)
# into .tools/ at pinned versions: fake-gcs-server (Go proxy; wrapped by tests/support/fake-gcs),
# Azurite (npm; tests/support/azurite) and a MiniDFSCluster launcher (Maven Central;
# tests/support/minidfs). moto_server (S3) comes from dev/requirements.txt via dev/setup.sh, so
# this script needs no .venv: dev/test.sh runs it beside dev/setup.sh.
# Every step runs on a fresh clone; a stamp in .tools/ holding a hash of the step's pinned inputs
# only skips a step whose exact output is already there. Caches outside the clone (GOMODCACHE /
# GOCACHE, the npm cache, ~/.m2) make a cold run faster. A missing toolchain (go, npm/node,
# mvn/java) is reported and its tests skip; a failing install fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."

FAKE_GCS_SERVER_VERSION=$(sed -n 's/^require github.com\/fsouza\/fake-gcs-server \(v.*\)/\1/p' tests/support/fake-gcs/go.mod)
# Azurite is pinned in tests/support/azurite/package.json (+ lockfile); 3.36+ needs Node >= 21.
AZURITE_VERSION=$(sed -n 's/.*"azurite": "\(.*\)".*/\1/p' tests/support/azurite/package.json)
TOOLS="$PWD/.tools"
mkdir -p "$TOOLS/bin"

start_all=$(date +%s)
missing=()

# stamp_ok NAME VALUE: true when .tools/NAME.stamp holds VALUE.
stamp_ok() { [ -f "$TOOLS/$1.stamp" ] && [ "$(cat "$TOOLS/$1.stamp")" = "$2" ]; }

step() {
  local name=$1
  shift
  local t0
  t0=$(date +%s)
  "$@"
  echo "   $name: $(($(date +%s) - t0)) s"
}

install_fake_gcs_server() {
  # tests/support/fake-gcs wraps fake-gcs-server (pinned in its go.mod/go.sum) with the XML API
  # object PUT and multipart upload calls object_store's GCS client makes.
  local src=tests/support/fake-gcs
  local hash
  hash=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -d' ' -f1)
  if stamp_ok fake-gcs "$hash" && [ -x "$TOOLS/bin/kolo-fake-gcs" ]; then
    echo "   kolo-fake-gcs (fake-gcs-server $FAKE_GCS_SERVER_VERSION) already in .tools/bin"
    return
  fi
  rm -f "$TOOLS/fake-gcs.stamp"
  (cd "$src" && go build -buildvcs=false -mod=readonly -o "$TOOLS/bin/kolo-fake-gcs" .)
  echo "$hash" >"$TOOLS/fake-gcs.stamp"
}

install_azurite() {
  # tests/support/azurite pins Azurite and, through its lockfile, every transitive package.
  local src=tests/support/azurite
  local main="$TOOLS/azurite/node_modules/azurite/dist/src/blob/main.js"
  local hash
  hash=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -d' ' -f1)
  if stamp_ok azurite "$hash" && [ -f "$main" ]; then
    echo "   azurite $AZURITE_VERSION already in .tools/azurite"
    return
  fi
  rm -rf "$TOOLS/azurite" "$TOOLS/azurite.stamp"
  mkdir -p "$TOOLS/azurite"
  cp "$src/package.json" "$src/package-lock.json" "$TOOLS/azurite/"
  npm ci --prefix "$TOOLS/azurite" --prefer-offline --no-audit --no-fund --loglevel=error
  [ -f "$main" ] || { echo "dev/emulators.sh: azurite installed but $main is missing" >&2; exit 1; }
  echo "$hash" >"$TOOLS/azurite.stamp"
}

install_minidfs() {
  local src=tests/support/minidfs
  local hash
  hash=$(find "$src/pom.xml" "$src/src" -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  if stamp_ok minidfs "$hash" && [ -f "$TOOLS/minidfs/build/minidfs-launcher.jar" ]; then
    echo "   minidfs launcher already built in .tools/minidfs"
    return
  fi
  # Start clean so jars of an older Hadoop pin never linger on the classpath.
  rm -rf "$TOOLS/minidfs" "$TOOLS/minidfs.stamp"
  mkdir -p "$TOOLS"
  if ! mvn -q -B -f "$src/pom.xml" "-Dkolo.tools=$TOOLS" package >"$TOOLS/minidfs-build.log" 2>&1; then
    cat "$TOOLS/minidfs-build.log" >&2
    echo "dev/emulators.sh: building the MiniDFS launcher failed (log above)" >&2
    exit 1
  fi
  echo "$hash" >"$TOOLS/minidfs.stamp"
}

echo "== provisioning storage emulators into .tools/"
if command -v go >/dev/null 2>&1; then
  step fake-gcs install_fake_gcs_server
else
  missing+=("kolo-fake-gcs (needs go)")
fi
if command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1; then
  step azurite install_azurite
else
  missing+=("azurite (needs node and npm)")
fi
if command -v mvn >/dev/null 2>&1 && command -v java >/dev/null 2>&1; then
  step minidfs install_minidfs
else
  missing+=("minidfs (needs java and mvn)")
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "dev/emulators.sh: not provisioned, their tests will skip: ${missing[*]}" >&2
fi
echo "== storage emulators ready in $(($(date +%s) - start_all)) s"
