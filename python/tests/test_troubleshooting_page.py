"""docs/troubleshooting.md is what dev/gen_troubleshooting.py makes of ``kolo.exceptions``
and the guides: the committed page is current, and the generator reads the classes (their
bases, builtin ones included) instead of a list of its own.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import kolo.exceptions

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_troubleshooting", ROOT / "dev" / "gen_troubleshooting.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_committed_page_is_current():
    committed = (ROOT / "docs" / "troubleshooting.md").read_text()
    assert committed == gen.render(), (
        f"docs/troubleshooting.md is stale (kolo.exceptions or a guide in docs/ changed); "
        f"regenerate it: {gen.REGENERATE}"
    )


def test_every_exported_error_has_a_section_with_its_bases():
    page = gen.render()
    for name in kolo.exceptions.__all__:
        cls = getattr(kolo.exceptions, name)
        assert f"{name}`" in page, name
        section = page.split(f"\n## {cls.__name__}\n", 1)[1].split("\n## ", 1)[0]
        bases_line = section.strip().splitlines()[0]
        for base in cls.__bases__:
            assert f"`{base.__name__}`" in bases_line or f".{base.__name__}`" in bases_line, (
                name,
                base,
                bases_line,
            )


def test_a_new_runtime_error_subclass_is_documented_as_one(monkeypatch):
    class CollectiveError(kolo.exceptions.KoloError, RuntimeError):
        """A collective failed.

        Example::

            except RuntimeError: ...
        """

    monkeypatch.setattr(kolo.exceptions, "CollectiveError", CollectiveError, raising=False)
    monkeypatch.setattr(kolo.exceptions, "__all__", [*kolo.exceptions.__all__, "CollectiveError"])
    page = gen.render()
    section = page.split("\n## CollectiveError\n", 1)[1].split("\n## ", 1)[0]
    assert "Bases: [`KoloError`](#koloerror), `RuntimeError`." in section
    assert "`except RuntimeError`" in section
    assert "```python\nexcept RuntimeError: ...\n```" in section
    assert (
        "| [`CollectiveError`](#collectiveerror) | [`KoloError`](#koloerror), `RuntimeError` |"
        in page
    )


@pytest.mark.parametrize(
    ("docstring", "markdown"),
    [
        ("Use :class:`~kolo.torch.ProcessSet`, ``x``.", "Use `ProcessSet`, `x`."),
        (
            "Raised here::\n\n    f(1)\n\n    g(2)\n\nThen more.",
            "Raised here:\n\n```python\nf(1)\n\ng(2)\n```\n\nThen more.",
        ),
    ],
)
def test_docstrings_become_markdown(docstring, markdown):
    assert gen.docstring_markdown(docstring) == markdown
