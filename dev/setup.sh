#!/usr/bin/env bash
# Sets up the project's Python environment in .venv/ and builds + installs kolo into it
# (release profile, the only one the project builds). Safe to re-run; fast when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin="${PYTHON:-}"
if [ -z "$python_bin" ]; then
  for candidate in python3.11 python3.12 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python_bin="$candidate"; break; fi
  done
fi
command -v cargo >/dev/null 2>&1 || { echo "dev/setup.sh: cargo not found; install Rust (rustup)" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv with $python_bin"
  "$python_bin" -m venv .venv
fi
echo "== installing Python dependencies (dev/requirements.txt, with uv)"
# uv (from PyPI, into the venv) downloads, unpacks and compiles to bytecode in parallel: about
# 125 s for the ~5 GB of wheels where pip takes 210 s. The bytecode must be compiled at install,
# as pip does: with PYTHONDONTWRITEBYTECODE set (as on CI hosts) nothing is cached at import,
# and every rank process would compile torch's modules again.
pin() { sed -n "s/^\($1==[^ ]*\).*/\1/p" dev/requirements.txt; }  # "torch==2.15.0"
.venv/bin/python -m pip install --quiet --upgrade pip "$(pin uv)"
uv_install() { .venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python "$@"; }
# torch (with its ~3.5 GB of CUDA wheels) first and on its own, so its downloaded wheels are
# gone before the rest download: a lower peak on a small disk.
uv_install "$(pin torch)"
uv_install -r dev/requirements.txt

# kolo's Spark plugin jar goes into the package before it is installed (the wheel ships it).
if command -v mvn >/dev/null 2>&1; then
  PYTHON=.venv/bin/python dev/build-jvm.sh --skip-tests
else
  echo "== no mvn: kolo is installed without its Spark plugin (dev/system-deps.sh installs Maven)"
fi

echo "== building kolo (cargo release profile) and installing it into .venv"
VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin develop --release --quiet
.venv/bin/python -c "import kolo, kolo.torch; print('kolo', kolo.__version__, 'ready in .venv')"
