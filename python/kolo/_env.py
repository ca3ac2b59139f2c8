"""Settings read from the environment by the Python side of kolo."""

from __future__ import annotations

import os

from kolo.exceptions import ConfigError


def seconds_from_env(name: str, default: float) -> float:
    """The positive number of seconds in the variable ``name`` (``default`` when unset or
    empty); anything else is a ConfigError naming the variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < 1e9:
        raise ConfigError(f"{name}={text!r} must be a positive number of seconds")
    return seconds
