#!/usr/bin/env bash
# Builds Horovod 0.28.1 (CPU, gloo, torch) into a side virtualenv, as the peer that
# bench/elastic.py measures beside kolo when it is present. Bench only: never run in CI.
#
#   bench/peers/horovod.sh [--spark]   # idempotent; the last line printed is the venv's python
#
# The venv is ${KOLO_BENCH_CACHE:-~/.cache/kolo-bench}/horovod-venv: Python 3.11 (PYTHON311,
# default python3.11), torch 2.1.2, numpy 1.x, setuptools<70, cffi, Horovod 0.28.1 from its
# PyPI sdist built with --no-build-isolation, and this checkout's kolo (a .pth file naming
# python/, whose _native.abi3.so runs on any CPython >= 3.9), so kolo's ranks can run on the
# same torch as Horovod's. The build runs under `nice` with MAKEFLAGS=-j2 (default) and logs to
# the cache's horovod-build.log. A second run only checks that both import.
#
# --spark also installs what Horovod's Spark estimator (horovod.spark.torch.TorchEstimator, for
# bench/spark_estimator.py) needs, with Horovod 0.28.1's own pins from its "spark" extra:
# petastorm>=0.12.0, pyarrow>=0.15.0,<11.0, fsspec>=2021.07.0, pyspark>=3.0.0. They fit in this
# venv, though not beside kolo's own pyspark: pyspark 4.x's sql extra needs pyarrow>=15 (4.1.4,
# kolo's venv), so Horovod's pyarrow<11 leaves pyspark 3.x (3.5.9, pyarrow 10.0.1, petastorm
# 0.13.1 when this was written); pandas<3 because pyspark 3.5 predates pandas 3; tensorboard
# because horovod.spark.torch imports torch.utils.tensorboard.
#
# What each failure taught (kept so nobody has to find it again):
# - Stock 0.28.1 does not compile against torch >= 2.1: it forces C++14 while torch 2.1's
#   headers need C++17 (Horovod issues #3996, #4014; its torch sources compiled with the build's
#   own flags and -std=c++14 stop at "#error C++17 or later compatible compiler is required to
#   use PyTorch"). Fixed by horovod-pr3998.patch beside this script: the CMake-only change of
#   Horovod PR #3998 (merged upstream in 2024, never released), which builds the torch library
#   and a copy of gloo as C++17 for torch >= 2.1. With it the build passes (about 12 minutes
#   at -j2 on a busy 2-core machine).
# - torch 2.1's cpp_extension helpers import pkg_resources, which setuptools >= 70 dropped:
#   setuptools<70, and --no-build-isolation so the build sees this venv's torch and setuptools.
# - setup.py builds with make -j8 unless MAKEFLAGS is set: eight C++ compiles of torch
#   headers need several GiB on a shared 2-core machine; MAKEFLAGS=-j2.
# - PyPI's torch 2.1.2 for Linux is the CUDA 12.1 build and brings its nvidia-* wheels (the
#   venv is about 5 GB; PyPI is the one index this machine reaches); Horovod itself is built
#   without CUDA, and `import torch` works on a machine without a GPU.
# - An elastic horovodrun on one machine needs `--network-interface lo` (else it waits for two
#   hosts to compare their interfaces), and the worker that is killed must be alone on its
#   host (Horovod blacklists a failed worker's host): bench/peers/_horovod.py does both.
set -euo pipefail

spark=0
for arg in "$@"; do
  case "$arg" in
    --spark) spark=1 ;;
    *) echo "usage: bench/peers/horovod.sh [--spark]" >&2; exit 2 ;;
  esac
done

repo="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${KOLO_BENCH_CACHE:-$HOME/.cache/kolo-bench}"
venv="$cache/horovod-venv"
python="$venv/bin/python"
log="$cache/horovod-build.log"
version=0.28.1
# The sha256 of the sdist PyPI served when this script was written (pip checks it against the
# index too): the patch and the build run on exactly this file.
sdist_sha256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0

check_horovod() {
  "$python" - <<'PY' 2>/dev/null
import horovod, horovod.torch
from horovod.common.util import gloo_built
assert horovod.__version__ == "0.28.1" and gloo_built(), horovod.__version__
PY
}

# The build's tools (on the dev machine's image; dev/system-deps.sh does not install them
# because CI never builds this peer).
for tool in "${PYTHON311:-python3.11}" cmake c++ patch; do
  command -v "$tool" >/dev/null ||
    { echo "bench/peers/horovod.sh: needs $tool (e.g. apt-get install cmake g++ patch)" >&2; exit 1; }
done

mkdir -p "$cache"
if [ ! -x "$python" ]; then
  "${PYTHON311:-python3.11}" -m venv "$venv"
fi
# pkg_resources for torch 2.1's build helpers; Horovod's own runtime requirements (the build
# runs without isolation and so without them otherwise).
"$python" -m pip install --quiet 'torch==2.1.2' 'numpy<2' 'setuptools<70' cffi wheel packaging \
  cloudpickle psutil pyyaml

if check_horovod; then
  echo "horovod $version already built in $venv" >&2
else
  src="$cache/horovod-src"
  rm -rf "$src"
  mkdir -p "$src"
  "$python" -m pip download --quiet --no-deps --no-binary :all: "horovod==$version" -d "$src"
  echo "$sdist_sha256  $src/horovod-$version.tar.gz" | sha256sum --check --quiet ||
    { echo "bench/peers/horovod.sh: horovod-$version.tar.gz is not the expected file" >&2; exit 1; }
  tar -xzf "$src/horovod-$version.tar.gz" -C "$src"
  patch -p1 -d "$src/horovod-$version" <"$repo/bench/peers/horovod-pr3998.patch"
  echo "building horovod $version (CPU, gloo, torch) in $src; log: $log" >&2
  if ! env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=GLOO \
    MAKEFLAGS="${MAKEFLAGS:--j2}" \
    nice -n 19 "$python" -m pip install --no-build-isolation --no-cache-dir -v \
    "$src/horovod-$version" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "bench/peers/horovod.sh: the build failed; whole log in $log" >&2
    exit 1
  fi
  check_horovod || { echo "bench/peers/horovod.sh: horovod built but does not import" >&2; exit 1; }
fi

if [ "$spark" = 1 ]; then
  "$python" -m pip install --quiet 'petastorm>=0.12.0' 'pyarrow>=0.15.0,<11.0' \
    'fsspec>=2021.07.0' 'pyspark>=3.0.0,<4' 'pandas<3' 'numpy<2' tensorboard
  "$python" -c 'import horovod.spark.torch, petastorm, pyarrow, pyspark' ||
    { echo "bench/peers/horovod.sh: Horovod's Spark estimator does not import" >&2; exit 1; }
fi

# This checkout's kolo on the venv's path (abi3: one native library for every CPython >= 3.9).
site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$repo/python" >"$site/kolo-checkout.pth"
"$python" -c 'import kolo.torch, kolo._native' ||
  { echo "bench/peers/horovod.sh: kolo does not import from $repo/python (build kolo._native first)" >&2; exit 1; }
echo "$python"
