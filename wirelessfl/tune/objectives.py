"""Selection objectives: what one run of one algorithm scored, read from its evaluated rounds.

A to-target objective is the value of a cumulative column (energy, time, rounds, exchanges) at the
first evaluated round where every target holds; a run that never got there scores NaN and is ranked
by how close it came (its best test accuracy, or its smallest f - f*). A final objective is a
column's value at the last evaluated round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from wirelessfl.results.summary import reached_mask


@dataclass(frozen=True)
class Objective:
    name: str
    column: str  # the rounds.parquet column it reads
    goal: str  # "min" or "max"
    to_target: bool
    title: str  # axis label and table header

    @property
    def sign(self) -> int:
        """+1 when smaller is better, -1 when larger is better (sorting key factor)."""
        return 1 if self.goal == "min" else -1


OBJECTIVES = {o.name: o for o in (
    Objective("energy_to_target", "energy_j", "min", True, "energy to target [J]"),
    Objective("system_energy_to_target", "energy_system_j", "min", True,
              "system energy (devices + base station) to target [J]"),
    Objective("time_to_target", "sim_time_s", "min", True, "time to target [s]"),
    Objective("rounds_to_target", "round", "min", True, "rounds to target"),
    Objective("exchanges_to_target", "exchanges", "min", True, "exchanges to target"),
    Objective("final_accuracy", "test_accuracy", "max", False, "final accuracy"),
    Objective("final_worst_device_accuracy", "worst_device_accuracy", "max", False,
              "final worst-device accuracy"),
    Objective("final_suboptimality", "suboptimality", "min", False, "final f - f*"),
    Objective("final_loss", "test_loss", "min", False, "final test loss"),
)}


def closeness(rounds: pd.DataFrame, target: float | None,
              target_suboptimality: float | None) -> float:
    """How close a run came to its target, larger is closer: the best test accuracy when an
    accuracy target is set, else -log10 of the smallest f - f*; NaN without rows."""
    if rounds.empty:
        return math.nan
    if target is not None:
        return float(rounds.test_accuracy.max())
    if target_suboptimality is not None:
        best = float(rounds.suboptimality.min())
        return -math.log10(best) if best > 0 else math.inf
    return math.nan


def score(objective: Objective, rounds: pd.DataFrame, target: float | None,
          target_suboptimality: float | None) -> dict:
    """``{value, reached, closeness}`` of one algorithm's evaluated rounds (sorted or not)."""
    rounds = rounds.sort_values("round")
    near = closeness(rounds, target, target_suboptimality)
    if rounds.empty:
        return {"value": math.nan, "reached": False, "closeness": near}
    if objective.to_target:
        hit = rounds[reached_mask(rounds, target, target_suboptimality)]
        if hit.empty:
            return {"value": math.nan, "reached": False, "closeness": near}
        return {"value": float(hit.iloc[0][objective.column]), "reached": True,
                "closeness": near}
    value = float(rounds.iloc[-1][objective.column])
    return {"value": value, "reached": math.isfinite(value), "closeness": near}
