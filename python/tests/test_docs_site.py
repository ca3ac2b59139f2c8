"""The docs site builds with ``mkdocs build --strict`` (a broken link or anchor, a page left out
of the nav, a docstring Griffe cannot parse: any warning fails), and its API reference has an
entry for every name in the ``__all__`` of every public top-level module of kolo.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "kolo"
REFERENCE = ROOT / "docs" / "reference"


def _module_file(module: str) -> Path:
    path = ROOT / "python" / Path(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _public_names(module: str) -> list[str]:
    """``module.__all__``, read from its source (importing kolo.keras would load TensorFlow)."""
    tree = ast.parse(_module_file(module).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(target, "id", None) == "__all__" for target in node.targets
        ):
            return ast.literal_eval(node.value)
    return []


def _directives() -> list[tuple[str, str, bool]]:
    """(page, module, whether its members are listed) for each ``::: module`` of the reference."""
    found = []
    for page in sorted(REFERENCE.glob("*.md")):
        for block in re.split(r"\n(?=::: )", page.read_text()):
            match = re.match(r"::: (\S+)", block)
            if match:
                found.append((page.stem, match.group(1), "members: false" not in block))
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr}"
    return site_dir


def test_every_public_top_level_module_has_a_reference_page():
    top_level = {"kolo"} | {
        f"kolo.{path.stem if path.suffix else path.name}"
        for path in PACKAGE.iterdir()
        if not path.name.startswith("_")
        and (path.suffix == ".py" or (path / "__init__.py").exists())
    }
    documented = {module for _, module, _ in _directives()}
    assert top_level <= documented, (
        f"no `::: module` in docs/reference/*.md for {sorted(top_level - documented)}: add a "
        f"page there with that line and list it under 'API reference' in mkdocs.yml's nav"
    )


def test_the_reference_has_an_entry_for_every_public_name(site):
    missing = []
    for page, module, lists_members in _directives():
        html = (site / "reference" / page / "index.html").read_text()
        anchors = set(re.findall(r'id="([^"]+)"', html))
        if lists_members:
            missing += [
                f"{module}.{name} ({page}.md)"
                for name in _public_names(module)
                if f"{module}.{name}" not in anchors
            ]
    assert not missing, (
        f"public names without an entry in the API reference: {missing}. A name is left out "
        f"when it has no docstring (give it one, or a '#:' comment above an attribute); a "
        f"submodule needs its own `::: module.submodule` line on that page"
    )


def test_sphinx_markup_in_docstrings_is_rewritten(site):
    """dev/mkdocs_hooks.py drops the roles (``:class:``) and ``::`` markers Markdown leaves."""
    for page in (site / "reference").glob("*/index.html"):
        html = page.read_text()
        assert not re.search(r":(class|func|meth|mod|attr|data):<code>", html), page
        assert "::</p>" not in html, page
