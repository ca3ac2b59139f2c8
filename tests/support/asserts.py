"""Assertions shared by the test modules."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def raises_exactly(
    error: type[BaseException], match: str | None = None
) -> Iterator[pytest.ExceptionInfo]:
    """``pytest.raises`` that also refuses a subclass of ``error``."""
    with pytest.raises(error, match=match) as info:
        yield info
    assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
