"""The wheel's extras (pyproject.toml ``[project.optional-dependencies]``): one per framework
(Horovod's ``horovod[spark]``, ``[ray]``, ``[pytorch]``, ``[keras]``, ``[tensorflow]``), each
floor no newer than what the suite runs with and equal to the code's own version checks, no
upper pins without a documented break, and ``kolo[all]`` covering every framework; and the sdist,
which must carry every file a source build needs (the license and the Spark plugin jar too)."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
FRAMEWORKS = ["torch", "spark", "ray", "keras", "lightning", "tensorflow"]
# Extras beside the frameworks: Horovod's tensorflow-cpu (TensorFlow's CPU-only build).
VARIANTS = ["tensorflow-cpu"]
# Upper pins allowed only with the known break they avoid (docs/install.md lists them); none now.
DOCUMENTED_UPPER_PINS: dict[str, str] = {}
# Extras' floors raised above the code's own version check, with the break found at the check's
# version by dev/test-floors.sh (docs/install.md says the same).
RAISED_FLOORS = {
    # lightning 2.0.x imports lightning.app, which fails with today's lightning-cloud; 2.1 lacks
    # lightning.pytorch.plugins.precision.Precision, which kolo.lightning imports.
    "lightning": "2.2",
}


def extras() -> dict[str, list[Requirement]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {
        name: [Requirement(r) for r in reqs]
        for name, reqs in project["optional-dependencies"].items()
    }


def floor(requirement: Requirement) -> Version:
    floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    assert len(floors) == 1, f"{requirement}: one >= floor expected"
    return floors[0]


def suite_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "tensorflow":
            raise
        # The suite runs TensorFlow's CPU build (dev/requirements.txt), the same release.
        return importlib.metadata.version("tensorflow-cpu")


def test_every_framework_has_an_extra_and_all_covers_them() -> None:
    found = extras()
    assert set(FRAMEWORKS) <= set(found), sorted(found)
    (everything,) = found["all"]
    assert everything.name == "kolo" and everything.extras == set(FRAMEWORKS), everything


def test_framework_requirements_have_floors_and_no_undocumented_upper_pins() -> None:
    for extra in FRAMEWORKS + VARIANTS:
        for requirement in extras()[extra]:
            floor(requirement)
            upper = [s for s in requirement.specifier if s.operator not in (">=", "!=")]
            assert not upper or requirement.name in DOCUMENTED_UPPER_PINS, (
                f"kolo[{extra}]: {requirement} pins an upper bound without a documented break"
            )


def test_the_versions_the_suite_runs_satisfy_every_extra() -> None:
    """A floor above the tested version would make the extra claim an untested range."""
    for extra in FRAMEWORKS + VARIANTS:
        for requirement in extras()[extra]:
            installed = suite_version(requirement.name)
            assert requirement.specifier.contains(installed, prereleases=True), (
                f"kolo[{extra}]: {requirement} excludes the suite's {requirement.name} {installed}"
            )


def test_floors_match_the_code_own_version_checks() -> None:
    from kolo.spark.lightning._version import MIN_PL_VERSION

    by_name = {r.name: r for extra in FRAMEWORKS for r in extras()[extra]}
    # The extra's floor may sit above the estimator's check, never below it; above only for
    # the documented reason (a fresh install of Lightning 2.0.x fails at `import lightning`).
    assert floor(by_name["lightning"]) >= Version(MIN_PL_VERSION)
    assert floor(by_name["lightning"]) == Version(RAISED_FLOORS.get("lightning", MIN_PL_VERSION))
    # kolo.spark.run's message when PySpark is missing names the oldest PySpark it runs on.
    runner = (REPO / "python" / "kolo" / "spark" / "_session.py").read_text()
    oldest = re.search(r"pip install pyspark \((\d+\.\d+) or", runner)
    assert oldest, "kolo.spark's missing-PySpark message names no version"
    assert floor(by_name["pyspark"]) == Version(oldest.group(1))
    # kolo.keras and kolo.tensorflow are written for Keras 3 (TensorFlow ships it from 2.16).
    assert floor(by_name["keras"]) == Version("3.0")
    assert floor(by_name["tensorflow"]) >= Version("2.16")
    (cpu,) = extras()["tensorflow-cpu"]
    assert cpu.name == "tensorflow-cpu" and floor(cpu) == floor(by_name["tensorflow"])


# The sdist: what `pip install kolo-<v>.tar.gz` builds from (dev/build-release.sh sdist).
SDIST_MAX_BYTES = 2_000_000  # ~0.9 MB today: sources, Cargo.lock and the Spark plugin jar
# Tracked files an sdist leaves out on purpose: the fuzz crates (workspaces of their own, not
# built) and python/tests (pyproject.toml [tool.maturin] exclude; the suite is not shipped).
SDIST_LEFT_OUT = re.compile(r"^((collective|store)/fuzz|python/tests)/")


def test_the_sdist_holds_every_file_the_build_needs_and_nothing_else(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import tarfile

    # The venv's own maturin first: the suite may run without the venv's bin on PATH.
    maturin = shutil.which("maturin", path=str(Path(sys.executable).parent)) or shutil.which(
        "maturin"
    )
    assert maturin, "maturin (dev/requirements.txt) is neither beside this Python nor on PATH"
    subprocess.run(
        [maturin, "sdist", "--out", str(tmp_path)], cwd=REPO, check=True, capture_output=True
    )
    (sdist,) = tmp_path.glob("kolo-*.tar.gz")
    assert sdist.stat().st_size < SDIST_MAX_BYTES, f"{sdist.name}: {sdist.stat().st_size} bytes"
    with tarfile.open(sdist) as tar:
        shipped = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    workspace = tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["members"]
    tracked = subprocess.run(
        ["git", "ls-files", "Cargo.toml", "Cargo.lock", "pyproject.toml", "README.md", "LICENSE"]
        + [member for member in workspace if "/" not in member],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    needed = {path for path in tracked if not SDIST_LEFT_OUT.match(path)}
    # The license and the built Spark plugin jar (git ignores it; dev/build-jvm.sh): a wheel
    # built from the sdist ships the jar only if the sdist carries it.
    needed.add("LICENSE")
    if (REPO / "python/kolo/spark/jars/kolo-spark.jar").is_file():
        needed.add("python/kolo/spark/jars/kolo-spark.jar")
    assert not needed - shipped, f"missing from {sdist.name}: {sorted(needed - shipped)}"
    extra = shipped - needed - {"PKG-INFO"}
    assert not extra, f"{sdist.name} ships files the build does not need: {sorted(extra)}"


def test_horovods_extra_names_install_the_same_frameworks() -> None:
    """``pip install horovod[pytorch]`` → ``kolo[pytorch]`` must work unchanged (Horovod's
    setup.py extras; MXNet aside, which kolo does not support)."""
    aliases = {
        "pytorch": {"kolo[torch]"},
        "pytorch-spark": {"kolo[spark,torch]"},
        "tensorflow-gpu": {"kolo[tensorflow]"},
        "all-frameworks": {"kolo[keras,tensorflow,torch]"},
    }
    found = extras()
    for name, wanted in aliases.items():
        assert name in found, f"Horovod's extra {name!r} is missing"
        got = {f"{r.name}[{','.join(sorted(r.extras))}]" for r in found[name]}
        assert got == wanted, f"{name}: {got} != {wanted}"
    for name in ("tensorflow", "tensorflow-cpu", "keras", "spark", "ray", "test"):
        assert name in found, f"Horovod's extra {name!r} is missing"
