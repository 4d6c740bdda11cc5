"""wirelessfl: federated learning over simulated wireless cells, timed in seconds and costed in joules.

The Python API (docs/api.md) is the names in ``__all__``: load a scenario, run it (in memory or
into a run folder), load runs, sweeps, tuning studies and reproductions, register plugins, allow
``module:attribute`` references in scenarios (``allow_references``: refused otherwise, since
resolving one runs its module's code). Each name is imported on first use (PEP 562 ``__getattr__``), so that ``import wirelessfl`` stays fast
and imports neither torch nor pandas until a name that needs them is used. The plugin functions
``register_<kind>`` are made for every registry in wirelessfl/plugins.py, so a new kind of
plugin gets its own without an edit here.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Stable name -> the module that defines it.
_NAMES = {
    "load_scenario": "wirelessfl.api",
    "run": "wirelessfl.api",
    "Result": "wirelessfl.api",
    "load_run": "wirelessfl.api",
    "load_sweep": "wirelessfl.api",
    "load_tuning": "wirelessfl.api",
    "load_reproduction": "wirelessfl.api",
    "UserError": "wirelessfl.errors",
    "Scenario": "wirelessfl.scenario.schema",
    "Algorithm": "wirelessfl.algorithms.base",
    "AlgorithmParams": "wirelessfl.algorithms.base",
    "allow_references": "wirelessfl.plugins",
}
_REGISTER = "register_"


def _register_functions() -> dict:
    """``register_<kind, singular>`` -> that registry's ``register``, for every kind there is
    (``algorithms`` -> ``register_algorithm``)."""
    from wirelessfl.plugins import registries

    return {_REGISTER + (kind.removesuffix("s")): registry.register
            for kind, registry in registries().items()}


def _public() -> list[str]:
    return ["__version__", *_NAMES, *_register_functions()]


def __getattr__(name: str):
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value  # found directly from now on
        return value
    if name == "__all__":  # computed each time: a kind registered later appears
        return _public()
    if name.startswith(_REGISTER):
        functions = _register_functions()
        if name in functions:
            return functions[name]
    raise AttributeError(f"module 'wirelessfl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_public()))
