"""Did you mean: the valid key closest to an unknown one, for the loader's "unknown key" errors.

docs/scenarios.md promises the closest valid name for a typo; catalog and plugin names get it
from difflib (scenario/catalog.py, plugins.py), and keys get it here the same way, from the
fields the schema accepts at the key's place. difflib cannot see synonyms (``learning_rate`` for
``lr`` shares two letters), so a short table of the names other tools use comes first.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Iterable

from pydantic import BaseModel

# Names other tools (or habits) use for a key of ours -> our key [D]: the ones difflib misses
# (learning_rate vs lr) or ranks below another key; each is offered only where the target is a
# valid key at that place.
SYNONYMS = {
    "learning_rate": "lr",
    "step_size": "lr",
    "stepsize": "lr",
    "num_clients": "num_devices",
    "n_clients": "num_devices",
    "clients": "num_devices",
    "num_users": "num_devices",
    "devices": "num_devices",
    "num_rounds": "rounds",
    "iterations": "rounds",
    "quantisation_bits": "quantization_bits",
    "tx_power": "tx_power_dbm",
    "power_dbm": "tx_power_dbm",
    "bandwidth": "bandwidth_hz",
    "deadline": "deadline_s",
    "battery": "battery_j",
}


def suggest_key(key: str, valid: Iterable[str]) -> str | None:
    """The valid key ``key`` was most likely meant to be (a synonym, else the closest spelling
    by difflib's default cutoff), or None."""
    valid = list(valid)
    target = SYNONYMS.get(key.lower())
    if target in valid:
        return target
    close = difflib.get_close_matches(key, valid, n=1) or \
        difflib.get_close_matches(key.lower(), valid, n=1)
    return close[0] if close else None


def keys_at(model: type[BaseModel], loc: tuple, raw: object,
            specialise: Callable[[type[BaseModel], object], list[type[BaseModel]]]
            | None = None) -> set[str]:
    """The field names accepted in the mapping at ``loc`` of a document ``raw`` validated as
    ``model``: the schema walked along ``loc`` (models by field, lists by position, dicts by
    key; an optional or union field gives each of its models). ``specialise(cls, raw)``: the
    classes a mapping validates as where its own content picks them (a problem section by its
    name, an energy profile by its compute model); without it, the class itself."""
    classes: list = [model]
    for part in loc:
        raw = _child(raw, part)
        found = []
        for cls in classes:
            found += _step(cls, part)
        classes = []
        for cls in found:
            if isinstance(cls, type) and issubclass(cls, BaseModel) and specialise is not None:
                classes += specialise(cls, raw)
            else:
                classes.append(cls)
        if not classes:
            return set()
    return {name for cls in classes if isinstance(cls, type) and issubclass(cls, BaseModel)
            for name in cls.model_fields}


def _child(raw: object, part) -> object:
    if isinstance(raw, dict):
        return raw.get(part)
    if isinstance(raw, list) and isinstance(part, int) and -len(raw) <= part < len(raw):
        return raw[part]
    return None


def _step(cls, part) -> list:
    """The types found one step down from ``cls`` at ``part``."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        field = cls.model_fields.get(part) if isinstance(part, str) else None
        return _unwrap(field.annotation) if field is not None else []
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if origin in (list, tuple, set) and isinstance(part, int) and args:
        return _unwrap(args[0])
    if origin is dict and len(args) == 2:
        return _unwrap(args[1])
    return []


def _unwrap(annotation) -> list:
    """The types an annotation holds: Annotated, Optional and unions opened up."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _unwrap(arg)]
    return [annotation]
