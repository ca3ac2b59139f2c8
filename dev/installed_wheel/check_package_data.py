"""Checks that the INSTALLED kolo package (not the source tree) holds every file the source
tree's package has, byte for byte, and its native module.

Usage (with the fresh virtualenv's python, from outside the clone): ``check_package_data.py
REPO``. The expected files are found from the source tree, so a new one cannot be forgotten:
every file git tracks under ``python/kolo/`` (modules, ``.pyi`` stubs, ``py.typed``, data files)
plus every built file the ``include`` globs of ``[tool.maturin]`` in pyproject.toml name for the
wheel (kolo's Spark plugin jar); a glob that matches nothing in the source tree is an error too
(the wheel would ship without it). Exits 1 naming each missing or differing file.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys

import tomllib


def expected_files(repo: str) -> list[str]:
    """Paths relative to ``python/`` (``kolo/...``) the installed package must hold."""
    tracked = subprocess.run(
        ["git", "-C", repo, "ls-files", "-z", "--", "python/kolo"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    files = {os.path.relpath(p, "python") for p in tracked if p}
    with open(os.path.join(repo, "pyproject.toml"), "rb") as f:
        maturin = tomllib.load(f)["tool"]["maturin"]
    source = os.path.join(repo, maturin.get("python-source", "."))
    for entry in maturin.get("include", []):
        pattern, formats = (
            (entry, ["sdist", "wheel"])
            if isinstance(entry, str)
            else (
                entry["path"],
                entry.get("format", ["sdist", "wheel"]),
            )
        )
        if "wheel" not in ([formats] if isinstance(formats, str) else formats):
            continue
        matches = glob.glob(os.path.join(source, pattern), recursive=True)
        if not matches:
            raise SystemExit(
                f"pyproject.toml [tool.maturin] include {pattern!r} matches nothing in "
                f"{source}: build it first (kolo/spark/jars: dev/build-jvm.sh)"
            )
        files.update(os.path.relpath(m, source) for m in matches)
    return sorted(files)


def main(repo: str) -> int:
    repo = os.path.realpath(repo)
    # Found, not imported: this runs right after `pip install --no-deps WHEEL`, before kolo's
    # dependencies are installed (kolorun --check-build imports the native module later).
    spec = importlib.util.find_spec("kolo")
    if spec is None or not spec.submodule_search_locations:
        print("no kolo package is installed")
        return 1
    package = os.path.realpath(spec.submodule_search_locations[0])
    if package.startswith(repo + os.sep):
        print(f"kolo was imported from the source tree ({package}), not the installed wheel")
        return 1
    site = os.path.dirname(package)
    problems = []
    expected = expected_files(repo)
    for rel in expected:
        installed = os.path.join(site, rel)
        if not os.path.isfile(installed):
            problems.append(f"missing: {rel}")
            continue
        with open(installed, "rb") as a, open(os.path.join(repo, "python", rel), "rb") as b:
            if a.read() != b.read():
                problems.append(f"differs from the source tree's: {rel}")
    natives = glob.glob(os.path.join(package, "_native*.so"))
    if len(natives) != 1:
        problems.append(f"expected one native module kolo/_native*.so, found {natives}")
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} of {len(expected)} package files wrong in {package}")
        return 1
    print(f"all {len(expected)} package files present in {package}, and {natives[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
