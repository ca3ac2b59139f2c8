"""Lightning's MPI probe, as ``Trainer(strategy="kolo")`` runs it in a rank a kolo launcher
started: ``MPIEnvironment.detect()`` after ``import kolo.lightning``. Prints what it detected
and the names of this process's children (Open MPI's singleton daemon, ``orted``, would be one).
"""

from __future__ import annotations

import os

from lightning.fabric.plugins.environments import MPIEnvironment

import kolo.lightning  # noqa: F401 - what a training script imports for strategy="kolo"


def children() -> list[str]:
    names = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        if parent == os.getpid():
            names.append(stat[stat.index("(") + 1 : stat.rindex(")")])
    return names


if __name__ == "__main__":
    print(f"detected {MPIEnvironment.detect()}; children {children()}", flush=True)
