"""A paper's claims as checkable statements, and their verdicts from evaluation runs.

A claim compares one metric either between two methods ("DZOFL reaches the target with less
energy than FedSGD") or against a constant ("DZOFL's energy is mostly computation": compute share
above 0.5). The verdict comes from the 95 % confidence intervals over the evaluation seeds:

* **holds**: the intervals do not overlap (or the whole interval is past the constant) in the
  paper's direction;
* **does not hold**: they do not overlap, the other way;
* **inconclusive**: they overlap, or a compared run was unhealthy, or too few seeds scored.

For a to-target metric, a method that reached the target on every seed beats one that never
reached it (no interval needed); a mixture is inconclusive.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from wirelessfl.results.compare import mean_ci
from wirelessfl.tune.objectives import OBJECTIVES

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
# Summary columns (results/summary.py) a claim may name beside the objectives, with their
# natural direction when the claim does not give one.
SUMMARY_METRICS = {"compute_share": "higher", "radio_share": "higher", "idle_share": "higher",
                   "energy_j": "lower", "sim_time_s": "lower", "final_accuracy": "higher",
                   "final_worst_device_accuracy": "higher", "final_suboptimality": "lower",
                   "uplink_bits_per_device_round": "lower"}


class Claim(BaseModel):
    """One statement of the paper, as a metric comparison with a direction."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="a short name")
    statement: str = Field(description="the paper's statement, in our words")
    where: str = Field("", description="where the paper says it (section, figure)")
    metric: str = Field(description="a tuning objective or a summary column")
    better: Literal["lower", "higher"] | None = Field(
        None, description="which way is better (default: the objective's / the column's)")
    winner: str | None = Field(None, description="the method the paper says does better")
    loser: str | None = Field(None, description="the method it does better than")
    algorithm: str | None = Field(None, description="for a claim against a constant")
    above: float | None = None
    below: float | None = None

    @model_validator(mode="after")
    def _one_kind(self):
        pair = self.winner is not None and self.loser is not None
        single = self.algorithm is not None and ((self.above is None) != (self.below is None))
        if pair == single:
            raise ValueError("give either 'winner' and 'loser' (two methods) or 'algorithm' with "
                             "one of 'above' / 'below' (a constant)")
        if self.metric not in OBJECTIVES and self.metric not in SUMMARY_METRICS:
            raise ValueError(f"unknown metric '{self.metric}'; choose one of "
                             f"{', '.join([*OBJECTIVES, *SUMMARY_METRICS])}")
        return self

    @property
    def direction(self) -> str:
        if self.better is not None:
            return self.better
        objective = OBJECTIVES.get(self.metric)
        if objective is not None:
            return "lower" if objective.goal == "min" else "higher"
        return SUMMARY_METRICS[self.metric]

    @property
    def to_target(self) -> bool:
        objective = OBJECTIVES.get(self.metric)
        return bool(objective and objective.to_target)

    @property
    def methods(self) -> list[str]:
        return [m for m in (self.winner, self.loser, self.algorithm) if m is not None]


def _interval(values: list[float]) -> tuple[float, float, int]:
    mean, half, n = mean_ci(values)
    return mean, (half if math.isfinite(half) else math.inf), n


def judge(claim: Claim, runs: dict[str, list[dict]]) -> dict:
    """The verdict of ``claim`` from ``runs``: method -> one dict per evaluation seed with the
    metric's ``value`` (NaN when not reached), ``reached`` and ``healthy``. Returns the verdict,
    a reason, and per method the mean, the 95 % half-width, seeds scored and seeds in all."""
    out = {"claim": claim.id, "statement": claim.statement, "where": claim.where,
           "metric": claim.metric}
    measured = {}
    for method in claim.methods:
        got = runs.get(method, [])
        values = [g["value"] for g in got if g["reached"] and math.isfinite(g["value"])]
        mean, half, n = _interval(values)
        measured[method] = {"mean": mean, "ci95": half, "scored": n, "seeds": len(got),
                            "healthy": sum(bool(g["healthy"]) for g in got)}
    out["measured"] = measured
    unhealthy = [m for m, r in measured.items() if r["healthy"] < r["seeds"]]
    missing = [m for m, r in measured.items() if r["seeds"] == 0]
    if missing:
        return {**out, "verdict": INCONCLUSIVE, "reason": f"no runs of {', '.join(missing)}"}
    if unhealthy:
        return {**out, "verdict": INCONCLUSIVE,
                "reason": f"unhealthy runs of {', '.join(unhealthy)}"}
    sign = 1.0 if claim.direction == "lower" else -1.0
    if claim.algorithm is not None:
        r = measured[claim.algorithm]
        if r["scored"] < 2:
            return {**out, "verdict": INCONCLUSIVE, "reason": "fewer than 2 seeds scored"}
        lo, hi = r["mean"] - r["ci95"], r["mean"] + r["ci95"]
        if claim.above is not None:
            verdict = HOLDS if lo > claim.above else FAILS if hi < claim.above else INCONCLUSIVE
            bound = f"above {claim.above:g}"
        else:
            verdict = HOLDS if hi < claim.below else FAILS if lo > claim.below else INCONCLUSIVE
            bound = f"below {claim.below:g}"
        reason = {HOLDS: f"the whole interval is {bound}",
                  FAILS: f"the whole interval is on the other side of {bound.split()[1]}",
                  INCONCLUSIVE: f"the interval contains {bound.split()[1]}"}[verdict]
        return {**out, "verdict": verdict, "reason": reason}
    w, l = measured[claim.winner], measured[claim.loser]
    if claim.to_target and (w["scored"] < w["seeds"] or l["scored"] < l["seeds"]):
        if w["scored"] == w["seeds"] and l["scored"] == 0:
            return {**out, "verdict": HOLDS, "reason": f"{claim.loser} never reached the target"}
        if l["scored"] == l["seeds"] and w["scored"] == 0:
            return {**out, "verdict": FAILS, "reason": f"{claim.winner} never reached the target"}
        return {**out, "verdict": INCONCLUSIVE,
                "reason": "the target was reached on some seeds only"}
    if w["scored"] < 2 or l["scored"] < 2:
        return {**out, "verdict": INCONCLUSIVE, "reason": "fewer than 2 seeds scored"}
    gap = sign * (l["mean"] - w["mean"])  # > 0: the winner is better
    if gap > w["ci95"] + l["ci95"]:
        verdict, reason = HOLDS, "the 95 % intervals do not overlap"
    elif -gap > w["ci95"] + l["ci95"]:
        verdict, reason = FAILS, "the 95 % intervals do not overlap, the other way"
    else:
        verdict, reason = INCONCLUSIVE, "the 95 % intervals overlap"
    ratio = l["mean"] / w["mean"] if w["mean"] else math.nan
    return {**out, "verdict": verdict, "reason": reason, "ratio": ratio}
