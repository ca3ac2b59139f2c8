#!/usr/bin/env bash
# Builds kolo's release artifacts into dist/ (KOLO_DIST overrides):
#   kolo-<v>-cp39-abi3-manylinux2014_<arch>.manylinux_2_17_<arch>.whl  for x86_64 and aarch64,
#   linked with maturin's zig linker against glibc 2.17 (RHEL 7+, Ubuntu 14.04+, Debian 8+),
#   the debug info of each wheel's native module split out beside it (dev/split_debuginfo.py),
#   `auditwheel show` of each wheel in <wheel>.auditwheel.txt, and the sdist kolo-<v>.tar.gz
#   (the Spark plugin jar included: a wheel built from it with `pip install` ships it too).
# Same features and the same [profile.release] as the dev build ([tool.maturin] in
# pyproject.toml). Each architecture builds in its own cargo target dir under
# ~/.cache/kolo-release (KOLO_RELEASE_CACHE): the zig linker is part of every crate's
# fingerprint, so sharing the dev build's dir would rebuild both back and forth. A first build
# compiles the whole dependency tree (~20-40 min per architecture on 2 idle cores, over an hour
# on a loaded machine); later ones only what changed (kolo's own crates: minutes). Too slow for
# CI, which builds and tests the dev wheel instead (dev/build-wheel.sh, dev/test-installed-
# wheel.sh). The aarch64 wheel is cross-compiled; it cannot be run on an x86_64 machine;
# splitting its debug info needs binutils-aarch64-linux-gnu (or llvm-objcopy).
# Each wheel must come out manylinux_2_17 per `auditwheel show` (checked) and its native module
# must carry a GNU build-id (dev/split_debuginfo.py checks).
#
# Usage: dev/build-release.sh [x86_64] [aarch64] [sdist]   (default: all three)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=${KOLO_DIST:-dist}
cache=${KOLO_RELEASE_CACHE:-$HOME/.cache/kolo-release}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(x86_64 aarch64 sdist)
mkdir -p "$out" "$cache"
out=$(cd "$out" && pwd)

# The tools' virtualenv (KOLO_RELEASE_TOOLS overrides): keep it, since the path of its zig is
# part of the linker wrapper cargo sees, so a new one rebuilds everything.
tools=${KOLO_RELEASE_TOOLS:-$cache/tools-venv}
if ! cmp -s dev/release-requirements.txt "$tools/release-requirements.txt"; then
  echo "== release tools (dev/release-requirements.txt) into $tools"
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r dev/release-requirements.txt
  cp dev/release-requirements.txt "$tools/release-requirements.txt"
fi
export PATH="$tools/bin:$PATH"

if [ ! -f python/kolo/spark/jars/kolo-spark.jar ]; then
  echo "== kolo's Spark plugin jar (dev/build-jvm.sh)"
  dev/build-jvm.sh --skip-tests
fi

host=$(uname -m)
for part in "${parts[@]}"; do
  case "$part" in
    x86_64 | aarch64)
      echo "== manylinux2014 $part wheel (maturin --zig)"
      target_args=()
      # (maturin --zig passes cargo --target even for the host's own triple: the artifacts are
      # in <cache>/cargo-target-<arch>/<arch>-unknown-linux-gnu/release either way.)
      [ "$part" = "$host" ] || target_args=(--target "$part-unknown-linux-gnu")
      rm -f "$out"/kolo-*manylinux*_"$part".whl
      rm -rf "$out"/kolo-*manylinux*_"$part".debug
      # The GNU build-id that matches a crash report to its debug file (docs/install.md): GNU
      # ld adds one by default, zig's linker only when asked. A flag for the final link of
      # kolo._native alone (maturin passes it to rustc for that crate), so the dependencies'
      # fingerprints, and the cached build, stay as they are.
      CARGO_TARGET_DIR="$cache/cargo-target-$part" CARGO_INCREMENTAL=0 \
        maturin build --release --zig --compatibility manylinux2014 "${target_args[@]}" \
        --out "$out" -- -C link-arg=-Wl,--build-id=sha1
      for wheel in "$out"/kolo-*manylinux*_"$part".whl; do
        python3 "$repo/dev/split_debuginfo.py" "$wheel"
        auditwheel show "$wheel" | tee "$wheel.auditwheel.txt"
        # The point of the build: no symbol newer than glibc 2.17 (say, from a C dependency
        # compiled for the host), no external library beyond the manylinux2014 set.
        # (auditwheel wraps its lines: joined first.)
        tr -s ' \n' ' ' <"$wheel.auditwheel.txt" |
          grep -q "consistent with the following platform tag: \"manylinux_2_17_$part\"" || {
          echo "dev/build-release.sh: $wheel is not manylinux_2_17 (above)" >&2
          exit 1
        }
      done
      ;;
    sdist)
      echo "== sdist"
      rm -f "$out"/kolo-*.tar.gz
      maturin sdist --out "$out"
      ;;
    *)
      echo "dev/build-release.sh: unknown part $part (x86_64, aarch64 or sdist)" >&2
      exit 2
      ;;
  esac
done
ls -l "$out"
