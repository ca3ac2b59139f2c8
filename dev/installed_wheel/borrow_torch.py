"""Lends .venv's torch (with the CUDA wheels it pulls in: triton, nvidia-*, cuda-*) to the fresh
virtualenv of dev/test-installed-wheel.sh, so the check does not download ~3 GB of torch and
CUDA libraries on every CI run.

Usage (with .venv's python): ``borrow_torch.py DIR``. Symlinks the top-level entries (packages
and ``.dist-info``) of those distributions into DIR, which the fresh virtualenv puts on its path
with a ``.pth`` file; pip there then sees torch as installed (so ``kolo[torch]``'s version floor
is still checked against it). Prints torch's other requirements, one a line, for pip to install
in the fresh virtualenv: only torch and its CUDA libraries are lent, never a package kolo itself
or its extras depend on (numpy, cloudpickle, pyspark, ... all come from pip's resolution).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import sys

from packaging.requirements import Requirement

LENT = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(target: str) -> None:
    os.makedirs(target, exist_ok=True)
    lent = [d for d in md.distributions() if LENT.match(_canonical(d.metadata["Name"]))]
    for dist in lent:
        for top in {str(f).split("/")[0] for f in dist.files or [] if not str(f).startswith("..")}:
            source = os.path.join(str(dist.locate_file(top)))
            link = os.path.join(target, top)
            if os.path.exists(source) and not os.path.lexists(link):
                os.symlink(source, link)
    lent_names = {_canonical(d.metadata["Name"]) for d in lent}
    for text in md.requires("torch") or []:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if _canonical(requirement.name) not in lent_names:
            print(str(requirement))


if __name__ == "__main__":
    main(sys.argv[1])
