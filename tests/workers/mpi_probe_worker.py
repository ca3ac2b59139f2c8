"""Lightning's MPI probe, as ``Trainer(strategy="kolo")`` runs it in a rank a kolo launcher
started: ``MPIEnvironment.detect()`` after ``import kolo.lightning``. Prints what it detected
and the names of this process's children (Open MPI's singleton daemon, ``orted``, would be one).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lightning.fabric.plugins.environments import MPIEnvironment

import kolo.lightning  # noqa: F401 - what a training script imports for strategy="kolo"

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.processes import children

if __name__ == "__main__":
    detected = MPIEnvironment.detect()
    print(f"detected {detected}; children {sorted(children(os.getpid()).values())}", flush=True)
