"""Selection objectives: what one run of one algorithm scored, read from its evaluated rounds.

A to-target objective is the value of a cumulative column (energy, time, rounds, exchanges) at the
first evaluated round where every target holds; a run that never got there scores NaN and is ranked
by how close it came (its best test accuracy, its smallest f - f*, its smallest ||grad f||^2, or
its worst device's best accuracy). A final objective is a column's value at the last evaluated
round.
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
    Objective("gradients_to_target", "gradient_evaluations", "min", True,
              "gradient evaluations to target (per device)"),
    Objective("bits_to_target", "bits_up", "min", True, "uplink bits to target (all devices)"),
    Objective("final_accuracy", "test_accuracy", "max", False, "final accuracy"),
    Objective("final_worst_device_accuracy", "worst_device_accuracy", "max", False,
              "final worst-device accuracy"),
    Objective("final_worst_class_accuracy", "worst_class_accuracy", "max", False,
              "final worst-class accuracy"),
    Objective("final_suboptimality", "suboptimality", "min", False, "final f - f*"),
    Objective("final_loss", "test_loss", "min", False, "final test loss"),
    Objective("final_objective", "objective", "min", False,
              "final objective (the method's own, e.g. ZO-HFL's global loss)"),
)}


def closeness(rounds: pd.DataFrame, target: float | None,
              target_suboptimality: float | None, target_loss: float | None = None,
              target_grad_norm_sq: float | None = None,
              target_worst_device_accuracy: float | None = None) -> float:
    """How close a run came to its target, larger is closer: the smallest test loss (negated)
    when a loss target is set, else the best worst-device accuracy (the largest of the rounds'
    ``worst_device_accuracy``) when a worst-device target is set (the stricter of the two
    accuracies: the worst device's is at most the devices' mean), else the best test accuracy
    when an accuracy target is set, else -log10 of the smallest f - f* when a gap target is set,
    else -log10 of the smallest ||grad f||^2 when a gradient-norm target is set; NaN without
    rows."""
    if rounds.empty:
        return math.nan
    if target_loss is not None:
        return -float(rounds.test_loss.min())
    if target_worst_device_accuracy is not None:
        if "worst_device_accuracy" not in rounds:  # recorded before the column existed
            return math.nan
        return float(rounds.worst_device_accuracy.max())
    if target is not None:
        return float(rounds.test_accuracy.max())
    if target_suboptimality is not None:
        best = float(rounds.suboptimality.min())
        return -math.log10(best) if best > 0 else math.inf
    if target_grad_norm_sq is not None:
        best = float(rounds.grad_norm_sq.min())
        return -math.log10(best) if best > 0 else math.inf
    return math.nan


def score(objective: Objective, rounds: pd.DataFrame, target: float | None,
          target_suboptimality: float | None, target_loss: float | None = None,
          target_grad_norm_sq: float | None = None,
          target_worst_device_accuracy: float | None = None) -> dict:
    """``{value, reached, closeness}`` of one algorithm's evaluated rounds (sorted or not); a
    to-target objective also says whether the target held at the first evaluated round
    (``first``: the run could not have reached it in fewer rounds)."""
    rounds = rounds.sort_values("round")
    near = closeness(rounds, target, target_suboptimality, target_loss, target_grad_norm_sq,
                     target_worst_device_accuracy)
    if rounds.empty:
        return {"value": math.nan, "reached": False, "closeness": near}
    if objective.to_target:
        mask = reached_mask(rounds, target, target_suboptimality, target_loss,
                            target_grad_norm_sq, target_worst_device_accuracy)
        hit = rounds[mask]
        if hit.empty:
            return {"value": math.nan, "reached": False, "closeness": near}
        used = [c for c, t in (("test_accuracy", target), ("suboptimality", target_suboptimality),
                               ("test_loss", target_loss), ("grad_norm_sq", target_grad_norm_sq),
                               ("worst_device_accuracy", target_worst_device_accuracy))
                if t is not None]
        # round 0 is the untrained model's evaluation: "first" is the first after training
        evaluated = rounds[rounds[used].notna().all(axis=1) & (rounds["round"] > 0)]
        return {"value": float(hit.iloc[0][objective.column]), "reached": True,
                "closeness": near, "first": bool(hit.index[0] == evaluated.index[0])}
    value = float(rounds.iloc[-1][objective.column])
    return {"value": value, "reached": math.isfinite(value), "closeness": near}
