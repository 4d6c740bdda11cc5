"""A tune file: a base scenario, a search space per algorithm, an objective, and two disjoint
seed lists (tuning and evaluation).

Papers grid-search every method before comparing them, so the grid is the search strategy: every
combination of the listed values is one configuration. Loading validates the file and the scenario
of every configuration before anything runs, so a typo is one ``error:`` line naming the tune file
and the key (docs/tuning.md).
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from wirelessfl.errors import UserError
from wirelessfl.scenario import catalog
from wirelessfl.scenario.loader import (
    check_shape,
    format_validation_error,
    is_sweep_document,
    is_tune_document,
    refuse_other_kind,
    resolved_document,
    scenario_from_document,
    set_key,
)
from wirelessfl.scenario.names import safe_name, validated_name
from wirelessfl.sweep.spec import check_run_count, count_text
from wirelessfl.tune.objectives import OBJECTIVES

if TYPE_CHECKING:
    from wirelessfl.scenario.schema import Scenario

# Keys of an algorithm entry that identify it rather than tune it.
NOT_TUNABLE = ("name", "label")
UNTUNED_SUFFIX = " (untuned)"
# A search key that ties parameters into one axis of the grid joins their names with this:
# ``beta1=beta2=beta3: [0.01, 0.1, 0.2, 0.5]`` sets all three to each value in turn (seed 003
# tunes "the beta parameters" so, fgdro.md Sec. 2.5). [D] '=' rather than ',': it reads as the
# equation the paper writes (b1 = b2 = b3), and a comma would read as a tuple of values per
# configuration, which a tie is not.
TIE = "="


def tied(axis: str, info: dict | None = None) -> list[str]:
    """The parameters one search key (an axis of the grid) sets: ``['lr']`` for ``lr``,
    ``['beta1', 'beta2']`` for ``beta1=beta2`` (from its space's ``parameters`` when given)."""
    if info is not None and info.get("parameters"):
        return list(info["parameters"])
    return [name.strip() for name in axis.split(TIE)] if TIE in axis else [axis]


def axis_value(values: dict, axis: str, info: dict | None = None):
    """The value of the grid axis ``axis`` in ``values``: keyed by the axis (a configuration's
    ``axes``, a tuning.csv row) or by the parameters it sets (a configuration's ``values``, a
    choice)."""
    return values[axis] if axis in values else values[tied(axis, info)[0]]


class Range(BaseModel):
    """``{log: [lo, hi], num: n}`` (geometric) or ``{linear: [lo, hi], num: n}`` (even steps);
    ``integer: true`` rounds to whole numbers (duplicates dropped)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    log: tuple[float, float] | None = None
    linear: tuple[float, float] | None = None
    num: int = Field(ge=2, le=1000, description="values in the range, both ends included")
    integer: bool = False

    @model_validator(mode="after")
    def _one_kind(self):
        if (self.log is None) == (self.linear is None):
            raise ValueError("give exactly one of 'log: [lo, hi]' and 'linear: [lo, hi]'")
        lo, hi = self.log or self.linear
        if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
            raise ValueError(f"the range needs finite lo < hi (got [{lo}, {hi}])")
        if self.log is not None and lo <= 0:
            raise ValueError(f"a log range needs lo > 0 (got {lo})")
        return self

    def values(self) -> list[float | int]:
        lo, hi = self.log or self.linear
        grid = np.geomspace(lo, hi, self.num) if self.log else np.linspace(lo, hi, self.num)
        if self.integer:
            return list(dict.fromkeys(int(np.rint(v)) for v in grid))
        # Three significant digits: the values a reader can type back into a scenario.
        return list(dict.fromkeys(float(f"{v:.3g}") for v in grid))


class TuneFile(BaseModel):
    """The keys of a tune file (docs/tuning.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = Field(None, description="the study's name (default: the file's stem)")
    description: str | None = None
    scenario: str = Field(description="base scenario: a catalog name or a YAML file, relative to "
                                      "the tune file")
    set: dict[str, Any] = Field(default_factory=dict,
                                description="key.path: value applied to the base first")
    objective: str = Field(description="what the best configuration minimises or maximises")
    tuning_seeds: list[int] = Field(min_length=1, description="seeds every configuration runs on")
    evaluation_seeds: list[int] = Field(
        min_length=2, description="fresh seeds the chosen configurations run on (>= 2 for a "
                                  "confidence interval); disjoint from tuning_seeds")
    search: dict[str, dict[str, list[Any] | Range]] = Field(
        description="algorithm label: {parameter: [values] or {log|linear: [lo, hi], num: n}}")
    stop_at_target: bool | None = Field(
        None, description="tuning runs end at the target (default: yes for a to-target "
                          "objective, whose score is read there; evaluation runs go on to "
                          "their last round)")
    stop_when_unhealthy: bool = Field(
        True, description="tuning runs end as soon as their loss has grown past the health "
                          "limit (they rank below every healthy configuration whatever follows); "
                          "evaluation runs go on to their last round")
    stability_margin: bool = Field(
        False, description="choose only among configurations whose grid neighbours (one step "
                           "along one numeric parameter) were healthy on every tuning seed too, "
                           "when any is: a step one grid point from divergence on the tuning "
                           "seeds may diverge on a fresh seed [D]")
    compare_untuned: bool = Field(
        True, description="also evaluate every algorithm at the scenario's own (untuned) "
                          "setting, beside the tuned one")

    # The name becomes the study's folder: no '/', no '..' (scenario/names.py).
    _safe_name = field_validator("name")(validated_name)


@dataclass(frozen=True)
class Configuration:
    """One point of an algorithm's grid, in grid order: its label, the value of each parameter
    its runs set (``values``: a tied key's value on every parameter it names) and the value of
    each search key (``axes``: a tied key once, named as in ``Tune.spaces``). Without tied
    keys the two are the same."""

    algorithm: str
    index: int
    values: dict[str, Any]
    axes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not self.axes:  # built without tied keys: every parameter is its own axis
            object.__setattr__(self, "axes", dict(self.values))

    @property
    def key(self) -> str:
        return f"{self.algorithm}#{self.index}"


@dataclass
class Tune:
    """A validated tune file: the base scenario document (with ``set`` applied), the search
    grids and the objective."""

    path: Path
    name: str
    spec: TuneFile
    document: dict = field(repr=False)
    base: dict = field(repr=False)  # the base scenario document, ``set`` applied
    base_path: Path = field(repr=False)
    labels: list[str] = field(default_factory=list)  # the scenario's algorithms, in order
    grids: dict[str, list[Configuration]] = field(default_factory=dict)
    # label -> search key -> info (values tried, how given, ``parameters``: the names a tied
    # key sets, else the key alone); a tied key as 'beta1=beta2', whitespace dropped
    spaces: dict[str, dict[str, dict]] = field(default_factory=dict)

    @property
    def objective(self):
        return OBJECTIVES[self.spec.objective]

    @property
    def stop_tuning_at_target(self) -> bool:
        stop = self.spec.stop_at_target
        return self.objective.to_target if stop is None else stop

    def entry(self, label: str) -> dict:
        """The scenario's own entry of the algorithm ``label`` (a copy)."""
        for entry in self.base["algorithms"]:
            entry = {"name": entry} if isinstance(entry, str) else entry
            if (entry.get("label") or entry.get("name")) == label:
                return copy.deepcopy(entry)
        raise KeyError(label)

    def base_scenario(self) -> Scenario:
        """The base scenario (``set`` applied), validated: what every run of the file shares."""
        return scenario_from_document(copy.deepcopy(self.base), str(self.base_path), [],
                                      self.base_path.parent)

    def scenario(self, label: str, values: dict, seed: int, shown: str | None = None,
                 where: str = "", stop_at_target: bool = False,
                 stop_when_unhealthy: bool = False) -> dict:
        """The resolved scenario of one run: the base with only ``label``'s algorithm, its
        parameters set to ``values``, shown as ``shown`` (default: its label)."""
        doc = copy.deepcopy(self.base)
        if stop_at_target:
            doc["stop_at_target"] = True
        if stop_when_unhealthy:
            doc["stop_when_unhealthy"] = True
        entry = self.entry(label)
        entry.update(values)
        entry["label"] = shown or label
        doc["algorithms"] = [entry]
        doc["seed"] = seed
        try:
            return resolved_document(scenario_from_document(doc, str(self.base_path), [],
                                                            self.base_path.parent))
        except UserError as err:
            raise UserError(f"{self.path}: {where or f'search.{label}'}: not accepted by the "
                            f"scenario ({_one_line(err)})") from None


def _one_line(text) -> str:
    return "; ".join(line for line in str(text).splitlines() if line.strip())


def _fail(source: str, where: str, what: str):
    raise UserError(f"{source}: {where}: {what}")


def _space(values: list | Range, source: str, where: str) -> tuple[list, dict]:
    """(the values to try, how they were given) for one parameter."""
    if isinstance(values, Range):
        kind = "log" if values.log is not None else "linear"
        return values.values(), {"kind": kind, "range": list(values.log or values.linear)}
    if not values:
        _fail(source, where, "empty list of values; give at least one")
    unique = []
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):
            _fail(source, where, f"{v} is not a finite number")
        if v in unique:
            _fail(source, where, f"the value {v!r} is listed twice")
        unique.append(v)
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    return unique, {"kind": "list", "numeric": numeric}


def _tied_names(key: str, source: str, where: str) -> list[str]:
    """The parameters a search key names: itself, or those a tied key joins with '='."""
    if "," in key:
        fixed = TIE.join(n.strip() for n in key.replace(",", TIE).split(TIE))
        _fail(source, where, f"join tied parameters with '{TIE}', not ',': write '{fixed}' (one "
                             "grid axis whose value each of them takes)")
    if TIE not in key:
        return [key]
    names = [name.strip() for name in key.split(TIE)]
    if not all(names):
        _fail(source, where, f"an empty parameter name; a tied key names each parameter once, "
                             f"joined by '{TIE}' (e.g. 'beta1=beta2=beta3')")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        _fail(source, where, f"'{twice[0]}' is named twice; name each tied parameter once")
    return names


def load_tune(name_or_path: str) -> Tune:
    """Read, validate and expand a tune file (a path, or a name in the scenarios catalog)."""
    path = catalog.find("scenarios", name_or_path, "tune file")
    source = str(path)
    doc = catalog.read_yaml(path, "tune file")
    if isinstance(doc, dict):
        check_shape(doc, source)
    refuse_other_kind(path, doc, name_or_path, "tune")
    if not is_tune_document(doc):
        raise UserError(f"{source}: not a tune file: a tune file has 'scenario', 'objective' and "
                        "'search' (docs/tuning.md)")
    try:
        spec = TuneFile.model_validate(doc)
    except ValidationError as err:
        raise UserError(_one_line(format_validation_error(err, source, model=TuneFile,
                                                          raw=doc))) from None
    if spec.objective not in OBJECTIVES:
        _fail(source, "objective", f"unknown objective '{spec.objective}'; choose one of "
                                   f"{', '.join(OBJECTIVES)}")
    for where, seeds in (("tuning_seeds", spec.tuning_seeds),
                         ("evaluation_seeds", spec.evaluation_seeds)):
        if min(seeds) < 0:
            _fail(source, where, "seeds must be non-negative integers")
        if len(set(seeds)) != len(seeds):
            _fail(source, where, "a seed is listed twice")
    shared = sorted(set(spec.tuning_seeds) & set(spec.evaluation_seeds))
    if shared:
        _fail(source, "evaluation_seeds", f"seeds {shared} are also tuning seeds; evaluation "
                                          "seeds must be fresh (disjoint from tuning_seeds)")
    if "seed" in spec.set:
        _fail(source, "set.seed", "seeds come from tuning_seeds and evaluation_seeds")
    if not spec.search:
        _fail(source, "search", "empty; give at least one algorithm label with its parameters")

    base_path = catalog.find("scenarios", spec.scenario, f"{source}: scenario", path.parent)
    base = catalog.read_yaml(base_path, "scenario")
    if is_sweep_document(base) or is_tune_document(base):
        _fail(source, "scenario", f"'{spec.scenario}' is a sweep or tune file; name a scenario")
    if not isinstance(base, dict):
        _fail(source, "scenario", f"'{spec.scenario}' is not a scenario mapping")
    base = copy.deepcopy(base)
    for key, value in spec.set.items():
        set_key(base, key, value, origin=f"{source}: set.")
    try:
        resolved = scenario_from_document(base, str(base_path), [], base_path.parent)
    except UserError as err:
        raise UserError(f"{source}: set: the base scenario is not valid with these values "
                        f"({_one_line(err)})") from None
    labels = [p.display_name for p in resolved.algorithms]
    objective = OBJECTIVES[spec.objective]
    if objective.to_target and resolved.target_accuracy is None \
            and resolved.target_suboptimality is None and resolved.target_loss is None \
            and resolved.target_grad_norm_sq is None \
            and resolved.target_worst_device_accuracy is None:
        _fail(source, "objective", f"'{spec.objective}' needs a target: the scenario sets "
                                   "none of target_accuracy, target_suboptimality, "
                                   "target_loss, target_grad_norm_sq and "
                                   "target_worst_device_accuracy (add one under 'set')")
    if objective.column in ("worst_device_accuracy", "worst_class_accuracy") \
            and resolved.problem is not None \
            and resolved.problem.name != "classification":
        _fail(source, "objective", f"'{spec.objective}' needs a classification problem")

    tune = Tune(path, spec.name or safe_name(path.stem, "tune"), spec, doc, base, base_path, labels)
    so_far = 0  # configurations of the labels searched so far
    for label, params in spec.search.items():
        if label not in labels:
            _fail(source, f"search.{label}", f"no algorithm labelled '{label}' in the scenario; "
                                             f"its algorithms are {', '.join(labels)}")
        if not params:
            _fail(source, f"search.{label}", "no parameters to tune; give at least one")
        grids, spaces = [], {}
        searched: dict[str, str] = {}  # parameter -> the search key that sets it
        for param, values in params.items():
            where = f"search.{label}.{param}"
            names = _tied_names(param, source, where)
            for name in names:
                if name in NOT_TUNABLE or name == "seed":
                    _fail(source, where, f"'{name}' names the algorithm; it cannot be tuned")
                if name in searched:
                    _fail(source, where, f"'{name}' is also searched by search.{label}."
                                         f"{searched[name]}; search each parameter in one key "
                                         "(tie it there with '=' to move it with the others)")
                searched[name] = param
            tried, info = _space(values, source, where)
            info["values"] = tried
            info["parameters"] = names
            info["given"] = param
            spaces[TIE.join(names)] = info
            grids.append(tried)
        # counted from the lists' lengths before the grid is built (sweep/spec.py MAX_RUNS); a
        # tied key is one axis
        configurations = math.prod(len(tried) for tried in grids)
        so_far += configurations
        before = f" (with the labels before, {count_text(so_far)})" if so_far > configurations \
            else ""
        lengths = " x ".join(str(len(tried)) for tried in grids)
        check_run_count(so_far * len(spec.tuning_seeds), source, f"search.{label}",
                        f"{lengths} values = {count_text(configurations)} configurations"
                        f"{before} x {len(spec.tuning_seeds)} tuning seeds",
                        "use fewer values (num) per parameter or fewer tuning seeds")
        for info in spaces.values():  # each parameter alone first: errors name its key
            for name in info["parameters"]:
                for value in info["values"]:
                    tune.scenario(label, {name: value}, spec.tuning_seeds[0],
                                  where=f"search.{label}.{info['given']} (value {value!r})")
        grid = []
        for index, combo in enumerate(itertools.product(*grids)):
            axes = dict(zip(spaces, combo))
            values = {name: value for value, info in zip(combo, spaces.values())
                      for name in info["parameters"]}
            grid.append(Configuration(label, index, values, axes))
        tune.grids[label] = grid
        tune.spaces[label] = spaces
    return tune
