"""Writes pip constraints that pin kolo's dependencies and the given extras to their floors (the
``>=`` versions in pyproject.toml), for dev/test-floors.sh.

Usage: ``floor_constraints.py [--lent NAME==VERSION]... EXTRA...`` (prints the constraints).

Each requirement of ``[project] dependencies`` and of the extras becomes ``NAME==FLOOR``, the
oldest release the extra lets pip install (requirements whose environment marker excludes the
running Python are skipped: cloudpickle's per-Python floors), except:

- a package lent to the test's virtualenv (``--lent torch==2.1.2``: dev/test-floors.sh lends
  the bench environment's torch instead of downloading ~3 GB) is pinned to the lent version,
  which must be a release of the floor's own minor series (2.1.x for ``torch>=2.1``);
- a floor that has no wheel for the running Python is raised to the first release that has one
  (``FIRST_WHEEL_FOR_PYTHON`` below, e.g. numpy 1.22 has no CPython 3.11 wheel): on an older
  Python the declared floor itself installs.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]

# (package, Python minor) -> the first release with a binary wheel for that Python, where the
# declared floor predates it (pip would otherwise compile the floor from source, or fail).
FIRST_WHEEL_FOR_PYTHON: dict[tuple[str, tuple[int, int]], str] = {
    ("numpy", (3, 11)): "1.23.2",
}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _floor(requirement: Requirement) -> Version:
    floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    if len(floors) != 1:
        sys.exit(f"floor_constraints: {requirement} has no single >= floor")
    return floors[0]


def requirements(extras: list[str]) -> list[Requirement]:
    """kolo's own requirements and those of ``extras`` (``kolo[all]`` expanded)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["optional-dependencies"]
    found = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        if extra not in declared:
            sys.exit(f"floor_constraints: pyproject.toml declares no extra {extra!r}")
        for text in declared[extra]:
            requirement = Requirement(text)
            if _canonical(requirement.name) == "kolo":  # kolo[all]: its extras' requirements
                found += requirements(sorted(requirement.extras))
            else:
                found.append(requirement)
    return found


def main() -> None:
    """Prints the constraints for the extras on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lent", action="append", default=[], metavar="NAME==VERSION")
    parser.add_argument("extras", nargs="*")
    args = parser.parse_args()
    lent = {}
    for text in args.lent:
        name, _, version = text.partition("==")
        lent[_canonical(name)] = Version(version)
    python = sys.version_info[:2]
    pins: dict[str, str] = {}
    for requirement in requirements(args.extras):
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # for another Python (cloudpickle's per-Python floors)
        name = _canonical(requirement.name)
        floor = _floor(requirement)
        if name in lent:
            if lent[name].release[:2] != floor.release[:2] or lent[name] < floor:
                sys.exit(f"floor_constraints: lent {name} {lent[name]} is not a {floor} release")
            version = str(lent[name])
        else:
            raised = FIRST_WHEEL_FOR_PYTHON.get((name, python))
            version = raised if raised and Version(raised) > floor else str(floor)
        if pins.setdefault(name, version) != version:  # two extras, two floors: the higher one
            pins[name] = str(max(Version(pins[name]), Version(version)))
    for name, version in sorted(pins.items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
