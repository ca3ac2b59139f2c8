"""Writes docs/troubleshooting.md from the classes of ``kolo.exceptions`` and the guides.

Every class in ``kolo.exceptions.__all__`` gets a section: its bases as Python sees them (the
builtin ones too, e.g. ``ValueError``), the ``except`` clauses that catch it, its docstring
(meaning, attributes, example) and links to the sections of ``docs/*.md`` that mention it.
A last section lists the guides' sections about failures. The classes are read, not listed
here, so a change to the hierarchy shows up on the next run; ``python/tests/
test_troubleshooting_page.py`` fails while the committed page differs from this output.

Example::

    PYTHONPATH=python python dev/gen_troubleshooting.py          # rewrite the page
    PYTHONPATH=python python dev/gen_troubleshooting.py --check  # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path
from typing import NamedTuple

import yaml
from markdown.extensions.toc import slugify

import kolo.exceptions

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGE = DOCS / "troubleshooting.md"
REGENERATE = "PYTHONPATH=python python dev/gen_troubleshooting.py"
# Pages that are not guides: this page itself and the generated migration table.
_NOT_GUIDES = {"troubleshooting.md", "migrating-from-horovod.md", "index.md"}
# Sections about the project's own tests, not about using kolo.
_TESTS_HEADING = re.compile(r"^Tests\b")
# A guide section about failures: its heading says so.
_FAILURE_HEADING = re.compile(r"error|fail|abort|timeout|stall|hang|limit|mismatch", re.I)
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj):`~?(?:[\w.]*\.)?([^`]+)`")
_DOUBLE_BACKTICKS = re.compile(r"``([^`]+)``")


def exception_classes() -> dict[type, list[str]]:
    """Each exception class of ``kolo.exceptions.__all__`` and the names it is exported as.

    Example::

        names = exception_classes()[kolo.exceptions.InternalError]  # [..., "InternalError"]
    """
    classes: dict[type, list[str]] = {}
    for name in kolo.exceptions.__all__:
        obj = getattr(kolo.exceptions, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            classes.setdefault(obj, []).append(name)
    return classes


def hierarchy_order(classes: list[type]) -> list[type]:
    """The classes depth first from their roots, siblings by name (a parent before its children).

    Example::

        hierarchy_order([MismatchError, KoloError])  # [KoloError, MismatchError]
    """
    known = set(classes)

    def children(parent: type | None) -> list[type]:
        found = []
        for cls in classes:
            kolo_bases = [b for b in cls.__bases__ if b in known]
            if (parent is None and not kolo_bases) or (kolo_bases and kolo_bases[0] is parent):
                found.append(cls)
        return sorted(found, key=lambda c: c.__name__)

    ordered: list[type] = []

    def walk(parent: type | None) -> None:
        for cls in children(parent):
            ordered.append(cls)
            walk(cls)

    walk(None)
    return ordered


def _type_name(cls: type, kolo_names: set[str]) -> str:
    """A class as a reader types it: ``ValueError``, or ``builtins.TimeoutError`` where kolo
    has a class of the same name."""
    if cls.__module__ == "builtins" and cls.__name__ in kolo_names:
        return f"builtins.{cls.__name__}"
    return cls.__name__


def _type_ref(cls: type, known: set[type], kolo_names: set[str]) -> str:
    """A class as Markdown: a link to its section when this page has one, else code."""
    if cls in known:
        return f"[`{cls.__name__}`](#{slugify(cls.__name__, '-')})"
    return f"`{_type_name(cls, kolo_names)}`"


def docstring_markdown(doc: str | None) -> str:
    """A reST-flavoured docstring as Markdown: ``::`` literal blocks become fenced Python,
    Sphinx roles and double backticks become code.

    Example::

        docstring_markdown(kolo.exceptions.RankFailedError.__doc__)  # with a python fence
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            out.append(_inline(line.rstrip()[:-1]))
            i += 1
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            out += ["", "```python", *inspect.cleandoc("\n".join(block)).splitlines(), "```"]
            if i < len(lines):
                out.append("")
        else:
            out.append(_inline(line))
            i += 1
    return "\n".join(out).strip()


def _inline(text: str) -> str:
    return _DOUBLE_BACKTICKS.sub(r"`\1`", _ROLE.sub(r"`\1`", text))


class Section(NamedTuple):
    """A section of a guide: its file under docs/, heading level, heading, anchor and text."""

    file: str
    level: int
    heading: str
    anchor: str
    body: str


def guide_sections() -> list[Section]:
    """Every section of the guides in docs/ but those about the project's own tests.

    Example::

        guide_sections()[0].file  # 'architecture.md'
    """
    sections = []
    for path in sorted(DOCS.glob("*.md")):
        if path.name in _NOT_GUIDES:
            continue
        heading, body, in_fence = None, [], False
        for line in [*path.read_text().splitlines(), "# end of file"]:
            if line.startswith("```"):
                in_fence = not in_fence
            match = None if in_fence else re.match(r"(#{1,6}) (.+)", line)
            if not match:
                body.append(line)
                continue
            if heading is not None and not _TESTS_HEADING.match(heading[1]):
                level, text = heading
                sections.append(
                    Section(path.name, level, text, slugify(text, "-"), "\n".join(body))
                )
            heading, body = (len(match.group(1)), match.group(2).strip()), []
    return sections


def nav_titles() -> dict[str, str]:
    """The title of each page in mkdocs.yml's nav, by file name under docs/.

    Example::

        nav_titles()["spark.md"]  # 'Spark'
    """
    titles: dict[str, str] = {}

    def walk(items: list) -> None:
        for item in items:
            for title, target in item.items():
                if isinstance(target, list):
                    walk(target)
                else:
                    titles[target] = title

    walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    return titles


def _section_link(section: Section, titles: dict[str, str]) -> str:
    title = titles[section.file]
    label = title if section.level == 1 else f"{title}: {section.heading.replace('`', '')}"
    return f"[{label}]({section.file}#{section.anchor})"


def render() -> str:
    """The whole troubleshooting page, as dev/gen_troubleshooting.py writes it.

    Example::

        assert render().startswith("<!--")
    """
    classes = exception_classes()
    known = set(classes)
    kolo_names = {cls.__name__ for cls in known}
    sections = guide_sections()
    titles = nav_titles()
    ordered = hierarchy_order(list(classes))
    out = [
        f"<!-- Generated by dev/gen_troubleshooting.py from kolo.exceptions and docs/*.md; "
        f"do not edit. Regenerate: {REGENERATE} -->",
        "",
        "# Troubleshooting",
        "",
        "Every error kolo raises is a class of `kolo.exceptions`; its message names what was "
        "wrong and how to fix it, so read the message first. Bad input is reported at the "
        "driver, where you made the call; a failure on one rank stops every rank and is "
        "reported with that rank's traceback. Below: each class, what catches it, what it "
        "means (from its docstring, also in the [API reference](reference/exceptions.md)) and "
        "where the guides say more; then the guides' sections about failures.",
        "",
        "| class | bases | meaning |",
        "|---|---|---|",
    ]
    for cls in ordered:
        bases = ", ".join(_type_ref(b, known, kolo_names) for b in cls.__bases__)
        summary = docstring_markdown(cls.__doc__).split("\n\n")[0].replace("\n", " ")
        out.append(f"| {_type_ref(cls, known, kolo_names)} | {bases} | {summary} |")
    for cls in ordered:
        out += ["", f"## {cls.__name__}", ""]
        bases = ", ".join(_type_ref(b, known, kolo_names) for b in cls.__bases__)
        catchers = [
            f"`except {_type_name(c, kolo_names)}`"
            for c in cls.__mro__
            if c not in (object, BaseException)
        ]
        out.append(f"Bases: {bases}. Caught by {', '.join(catchers)}.")
        aliases = [name for name in classes[cls] if name != cls.__name__]
        if aliases:
            also = ", ".join(f"`kolo.exceptions.{name}`" for name in aliases)
            out += ["", f"Also exported as {also}."]
        out += ["", docstring_markdown(cls.__doc__)]
        names = [cls.__name__, *aliases]
        mentions = [
            _section_link(section, titles)
            for section in sections
            if any(re.search(rf"\b{name}\b", section.body) for name in names)
        ]
        if mentions:
            out += ["", f"In the guides: {', '.join(mentions)}."]
    out += [
        "",
        "## Failures in the guides",
        "",
        "The guides' sections on how a job fails, times out or stalls, and what kolo reports:",
        "",
    ]
    out += [
        f"- {_section_link(section, titles)}"
        for section in sections
        if _FAILURE_HEADING.search(section.heading)
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the page, or with ``--check`` exit 1 when the committed page is stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        if PAGE.read_text() != page:
            print(f"{PAGE} is stale; regenerate it: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
