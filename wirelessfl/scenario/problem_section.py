"""The ``problem:`` section of a scenario: the base of every problem's own section schema.

The section belongs to the scenario (it is validated with the rest of the file); each problem
subclasses ``ProblemConfig`` with its own keys (wirelessfl/problems/), and the registry
(wirelessfl/plugins.py) says which problem reads a key, so a key of another problem is refused
by name.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from wirelessfl.plugins import PROBLEMS


class ProblemConfig(BaseModel):
    """The ``problem:`` section of one problem: subclass it with the problem's keys and their
    defaults. Unknown keys are typos (refused); NaN and inf never a meaningful setting. A key
    given as null counts as not given (its default applies), as it always has."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(description="the problem: a built-in name (wirelessfl list), a registered "
                                  "or installed plugin, or a 'module:attribute' reference")

    @model_validator(mode="before")
    @classmethod
    def _keys_of_other_problems(cls, data):
        """Drop null keys; refuse a key only another problem reads, naming that problem (a
        plain unknown key is left to ``extra="forbid"``)."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if v is not None or k == "name"}
        for key in data:
            if key in cls.model_fields:
                continue
            readers = problems_reading(key)
            if readers:
                names = " or ".join(map(repr, readers))
                raise ValueError(f"'{key}' is only read by problem {names} but name is "
                                 f"{data.get('name')!r}; remove it or set name: {readers[0]}")
        return data

    @model_serializer(mode="wrap")
    def _only_given(self, handler):
        """Leave out what is None (not given, no default): the dump validates again as is."""
        return {k: v for k, v in handler(self).items() if v is not None}


def default_field(defaults: dict, key: str, description: str, **constraints):
    """``Field(defaults[key], ...)`` of a problem's key: the default comes from the problem's
    cited defaults table and ``{default}`` in the description shows it."""
    value = defaults[key]
    shown = f"{value:g}" if isinstance(value, float) else value
    return Field(value, description=description.format(default=shown), **constraints)


def problems_reading(key: str) -> list[str]:
    """The problems whose section has ``key`` (built-ins in registry order, then those loaded
    in this process): what the "only read by problem" message names."""
    return [name for name, spec in PROBLEMS.loaded().items() if key in spec.Config.model_fields]
