"""Old import paths that keep working for one release after a move (issue 33), with a warning.

A module that moved leaves a stub at its old path whose only content is
``__getattr__ = moved(__name__, "wirelessfl.new.path", {...})``: a name read from it is looked
up, on first use, in the module that now holds it (by text, so the stub imports nothing and
sits in no import cycle), and a ``DeprecationWarning`` names the new path. The stubs go in
0.3.0 (``REMOVED_IN``)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

REMOVED_IN = "0.3.0"


def moved(old: str, new: str, names: Mapping[str, str] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the stub at ``old``: names are found in ``new`` (or, for a
    name listed in ``names``, in the module it maps to)."""
    names = dict(names or {})

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        home = names.get(name, new)
        warnings.warn(f"{old} moved: import {name} from {home} ({old} goes in {REMOVED_IN})",
                      DeprecationWarning, stacklevel=2)
        try:
            return getattr(importlib.import_module(home), name)
        except AttributeError:
            raise AttributeError(f"module {old!r} has no attribute {name!r}") from None

    return __getattr__
