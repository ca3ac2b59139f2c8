#!/usr/bin/env bash
# Creates (once, cached outside the clone) a virtual environment with another torch version, so
# that tests/test_torch_versions.py can run the SAME built kolo (this checkout's python/kolo,
# _native.abi3.so included, through PYTHONPATH) against it: no rebuild per torch version.
#
# Usage: dev/torch-compat.sh [TORCH_VERSION]
#   TORCH_VERSION: a pip version spec such as 2.13.0 or 2.13.*; default: two minor versions
#   below the torch in .venv (2.15.x -> 2.13.*).
# Prints the environment's python on the last line of stdout. Exit status 5: torch could not be
# downloaded (no route to PyPI); other non-zero statuses are errors.
#
# The environment is ~/.cache/kolo-torch-compat/torch-<version> (KOLO_TORCH_COMPAT_CACHE
# overrides the folder). It gets torch from PyPI without its CUDA dependencies (the torch wheel
# is ~530 MB; the nvidia-* wheels would add ~2.2 GB) plus torch's pure-Python dependencies,
# numpy and cloudpickle; `import torch` still needs the CUDA runtime libraries, so the
# environment borrows .venv's nvidia-* packages (same CUDA major version) through a .pth file
# and installs the one .venv lacks (nvidia-curand, 60 MB). About 600 MB are downloaded.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MAIN_PY="$REPO/.venv/bin/python"
[ -x "$MAIN_PY" ] || { echo "torch-compat: $MAIN_PY is missing; run dev/setup.sh first" >&2; exit 2; }

VERSION=${1:-$("$MAIN_PY" -c '
import torch
major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
print(f"{major}.{max(0, minor - 2)}.*")
')}
CACHE=${KOLO_TORCH_COMPAT_CACHE:-$HOME/.cache/kolo-torch-compat}
ENV="$CACHE/torch-${VERSION//\*/x}"
mkdir -p "$CACHE"

ready() {
    [ -x "$ENV/bin/python" ] && "$ENV/bin/python" -c 'import torch, numpy, cloudpickle' >/dev/null 2>&1
}

# One creator at a time (tests may run concurrently); the others wait for it.
exec 9>"$CACHE/.lock"
flock -w 1800 9 || { echo "torch-compat: timed out waiting for $CACHE/.lock" >&2; exit 3; }

if ! ready; then
    BASE_PY=$("$MAIN_PY" -c 'import sys; print(sys._base_executable)')
    MAIN_SITE=$("$MAIN_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf "$ENV"
    echo "torch-compat: creating $ENV with torch==$VERSION" >&2
    "$BASE_PY" -m venv "$ENV"
    PIP=("$ENV/bin/python" -m pip --disable-pip-version-check --no-cache-dir --timeout 60 --retries 3)
    if ! "${PIP[@]}" install --quiet --no-deps "torch==$VERSION" >&2; then
        rm -rf "$ENV"
        echo "torch-compat: cannot download torch==$VERSION from PyPI" >&2
        exit 5
    fi
    "${PIP[@]}" install --quiet filelock typing_extensions sympy networkx jinja2 fsspec \
        numpy cloudpickle >&2
    # The one CUDA library torch loads at import that .venv's newer torch does not ship (60 MB).
    "${PIP[@]}" install --quiet --no-deps "nvidia-curand>=10.4,<11" >&2
    SITE=$("$ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mkdir -p "$ENV/cuda-libs"
    if [ -d "$MAIN_SITE/nvidia" ]; then
        ln -sfn "$MAIN_SITE/nvidia" "$ENV/cuda-libs/nvidia"
    fi
    echo "$ENV/cuda-libs" >"$SITE/kolo_cuda_libs.pth"
    if ! ready; then
        "$ENV/bin/python" -c 'import torch' >&2 || true
        echo "torch-compat: torch==$VERSION does not import in $ENV" >&2
        exit 4
    fi
fi
echo "torch-compat: $("$ENV/bin/python" -c 'import torch; print("torch", torch.__version__)') in $ENV" >&2
echo "$ENV/bin/python"
