"""A sweep file: a base scenario, a grid (or a list of points) over scenario keys, and seeds.

Loading validates the file with pydantic and then every point's scenario, before anything runs,
so that a typo in a key path is one ``error:`` line naming the sweep file and the key.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from wirelessfl.errors import UserError
from wirelessfl.scenario import catalog
from wirelessfl.scenario.loader import (
    check_shape,
    format_validation_error,
    is_sweep_document,
    refuse_other_kind,
    resolved_document,
    scenario_from_document,
    set_key,
)
from wirelessfl.scenario.names import safe_name, validated_name

# [D] The most runs one study file may expand to, sweep and tune files alike (tune/spec.py reads
# it): far beyond any study in docs/ (the largest shipped holds 30 runs), and still small enough
# that validating every run's scenario before anything runs stays within minutes and a few
# hundred MB (a resolved scenario is about 15 KB held per run). A larger grid is almost always a
# typo (a value list pasted twice, one key too many); it is refused from the file's counts,
# before a single point is built, so a 10^8-point grid costs nothing (issue 34).
MAX_RUNS = 20_000


def count_text(count: int) -> str:
    """A run count for an error line: digits with separators, or a power of ten past 10^15 (a
    product of many lists can have hundreds of digits)."""
    return f"{count:,}" if count < 10**15 else f"about 10^{len(str(count)) - 1}"


def check_run_count(runs: int, source: str, where: str, how: str, fix: str) -> None:
    """Refuse (UserError naming ``source`` and ``where``) a study of more than MAX_RUNS runs;
    ``how`` says how the count arose (e.g. '1,000 points x 3 seeds'), ``fix`` what to cut."""
    if runs > MAX_RUNS:
        raise UserError(f"{source}: {where}: {how} = {count_text(runs)} runs, more than the "
                        f"{MAX_RUNS:,} a study file may hold; {fix}")


class SweepFile(BaseModel):
    """The keys of a sweep file (docs/sweeps.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = Field(None, description="the sweep's name (default: the file's stem)")
    description: str | None = None
    scenario: str = Field(description="base scenario: a catalog name or a YAML file, relative "
                                      "to the sweep file")
    set: dict[str, Any] = Field(default_factory=dict,
                                description="key.path: value applied to the base before the grid")
    grid: dict[str, list[Any]] | None = Field(
        None, description="key.path: [values]; every combination is one point")
    points: list[dict[str, Any]] | None = Field(
        None, description="an explicit list of points, each {key.path: value, ...}")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1,
                             description="every point runs once per seed (the scenario's seed)")

    @model_validator(mode="after")
    def _one_kind_of_points(self):
        if (self.grid is None) == (self.points is None):
            raise ValueError("give exactly one of 'grid' (key.path: [values]) or 'points' "
                             "(a list of {key.path: value})")
        return self

    # The name becomes the study's folder: no '/', no '..' (scenario/names.py).
    _safe_name = field_validator("name")(validated_name)


def _check_shape(spec: SweepFile, source: str) -> None:
    """What pydantic's types do not say: nothing empty, no duplicate seeds, seeds via 'seeds'."""
    def fail(where: str, what: str):
        raise UserError(f"{source}: {where}: {what}")

    if spec.grid is not None and not spec.grid:
        fail("grid", "empty; give at least one key.path with a list of values, e.g. "
                     "'channel.uplink.tx_power_dbm: [0, 10, 23]'")
    for key, values in (spec.grid or {}).items():
        if not values:
            fail(f"grid.{key}", "empty list of values; give at least one value")
    if spec.points is not None and not spec.points:
        fail("points", "empty; give at least one point {key.path: value}")
    for i, point in enumerate(spec.points or []):
        if not point:
            fail(f"points[{i}]", "empty point; give at least one key.path: value")
    for where, keys in [("set", spec.set), ("grid", spec.grid or {}),
                        *((f"points[{i}]", p) for i, p in enumerate(spec.points or []))]:
        if "seed" in keys:
            fail(f"{where}.seed", "the seed is swept by the 'seeds' list; move it there")
    if min(spec.seeds) < 0:
        fail("seeds", f"seeds must be non-negative integers (got {min(spec.seeds)})")
    if len(set(spec.seeds)) != len(spec.seeds):
        fail("seeds", "a seed is listed twice; each seed runs once per point")


def _check_size(spec: SweepFile, source: str) -> None:
    """At most MAX_RUNS runs (points x seeds), counted from the lists' lengths: the product of
    the grid's lengths is computed, never the grid."""
    seeds = len(spec.seeds)
    if spec.grid is not None:
        points = math.prod(len(values) for values in spec.grid.values())
        longest = max(spec.grid, key=lambda k: len(spec.grid[k]))
        lengths = " x ".join(str(len(values)) for values in spec.grid.values())
        how = f"{lengths} values = {count_text(points)} points x {seeds} seeds"
        fix = (f"use fewer values per key (the longest list: grid.{longest}, "
               f"{len(spec.grid[longest])} values), fewer keys or fewer seeds, or split the "
               "study into several sweep files")
        check_run_count(points * seeds, source, "grid", how, fix)
    else:
        how = f"{len(spec.points):,} points x {seeds} seeds"
        check_run_count(len(spec.points) * seeds, source, "points", how,
                        "list fewer points or seeds, or split the study into several sweep "
                        "files")


@dataclass(frozen=True)
class SweepPoint:
    """One run of the sweep: the swept values, the seed and the fully resolved scenario."""

    run_id: str
    seed: int
    values: dict[str, Any]
    scenario: dict = field(repr=False)


@dataclass
class Sweep:
    """A validated sweep file and its points (every point's scenario already validated)."""

    path: Path
    name: str
    spec: SweepFile
    keys: list[str]
    points: list[SweepPoint]
    document: dict = field(repr=False)


def _fmt_value(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str | int | bool):
        return str(value)
    return json.dumps(value, sort_keys=True)


def _short_names(keys: list[str]) -> dict[str, str]:
    """Each key's last segment, or the whole key where two keys share a last segment."""
    last = [k.split(".")[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def run_id(values: dict, seed: int, short: dict[str, str]) -> str:
    """A folder name that a reader understands and that two points can never share:
    ``tx_power_dbm=10_num_devices=20_seed=3-1a2b3c`` (the suffix hashes the exact values)."""
    text = "_".join(f"{short[k]}={_fmt_value(v)}" for k, v in values.items()) + f"_seed={seed}"
    text = re.sub(r"[^A-Za-z0-9.=_+-]", "-", text)[:100]
    digest = hashlib.sha1(json.dumps([sorted(values.items()), seed], sort_keys=True,
                                     default=str).encode()).hexdigest()[:6]
    return f"{text}-{digest}"


def _one_line(text: str) -> str:
    return "; ".join(line for line in str(text).splitlines() if line.strip())


def load_sweep(name_or_path: str) -> Sweep:
    """Read, validate and expand a sweep file (a path, or a name in the scenarios catalog)."""
    path = catalog.find("scenarios", name_or_path, "sweep")
    source = str(path)
    doc = catalog.read_yaml(path, "sweep file")
    if isinstance(doc, dict):
        check_shape(doc, source)
    refuse_other_kind(path, doc, name_or_path, "sweep")
    if not isinstance(doc, dict):
        raise UserError(f"{source}: a sweep file must be a mapping with 'scenario', 'grid' (or "
                        f"'points') and 'seeds', got {type(doc).__name__}")
    try:
        spec = SweepFile.model_validate(doc)
    except ValidationError as err:
        raise UserError(_one_line(format_validation_error(err, source, model=SweepFile,
                                                          raw=doc))) from None
    _check_shape(spec, source)
    _check_size(spec, source)  # from the counts alone, before any point is built
    base_path = catalog.find("scenarios", spec.scenario, f"{source}: scenario", path.parent)
    base_doc = catalog.read_yaml(base_path, "scenario")
    if is_sweep_document(base_doc):
        raise UserError(f"{source}: scenario: '{spec.scenario}' is a sweep file; name a scenario")

    def scenario_for(assignments: list[tuple[str, str, Any]], label: str) -> dict:
        """The resolved scenario for the base with (section, key, value) assignments applied
        (a bad path is reported as section + key); a validation error is reported at ``label``."""
        doc = copy.deepcopy(base_doc)
        for section, key, value in assignments:
            set_key(doc, key, value, origin=f"{source}: {section}")
        try:
            return resolved_document(scenario_from_document(doc, str(base_path), [],
                                                            base_path.parent))
        except UserError as err:
            raise UserError(f"{source}: {label}: not accepted by the scenario "
                            f"({_one_line(err)})") from None

    fixed = [("set.", k, v) for k, v in spec.set.items()]
    scenario_for(fixed, "set" if fixed else "scenario")  # errors in the base or 'set' first
    if spec.grid is not None:
        keys = list(spec.grid)
        for key, values in spec.grid.items():  # each key alone first: errors name the key
            for value in values:
                scenario_for([*fixed, ("grid.", key, value)], f"grid.{key} (value {value!r})")
        combos = [dict(zip(keys, combo)) for combo in itertools.product(*spec.grid.values())]
        wheres = [f"grid point {combo}" for combo in combos]
        sections = ["grid."] * len(combos)
    else:
        keys = list(dict.fromkeys(k for point in spec.points for k in point))
        combos = [dict(point) for point in spec.points]
        wheres = [f"points[{i}]" for i in range(len(combos))]
        sections = [f"{w}." for w in wheres]
    short = _short_names(keys)
    points, seen = [], set()
    for combo, where, section in zip(combos, wheres, sections):
        for seed in spec.seeds:
            assign = [*fixed, *((section, k, v) for k, v in combo.items()), ("", "seed", seed)]
            rid = run_id(combo, seed, short)
            if rid in seen:
                raise UserError(f"{source}: {where}: this point is listed twice")
            seen.add(rid)
            points.append(SweepPoint(rid, seed, combo, scenario_for(assign, where)))
    return Sweep(path, spec.name or safe_name(path.stem, "sweep"), spec, keys, points, doc)
