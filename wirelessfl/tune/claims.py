"""A paper's claims as checkable statements, and their verdicts from evaluation runs.

A claim is one of three kinds:

* **a comparison** of one metric between two methods ("DZOFL reaches the target with less energy
  than FedSGD"; with ``times: k``, "... at least k times less"). Every method runs on the same
  evaluation seeds, so the verdict is read from the **per-seed paired ratio** (the loser's value
  over the winner's for a lower-is-better metric): its geometric mean and the 95 % t interval of
  the log ratios, and "k of n seeds" beside it. It **holds** when the whole interval is above
  ``times`` (default 1), **does not hold** when it is below, and is **inconclusive** otherwise:
  written **not reproduced (inconclusive)** when the paired estimate itself goes against the paper.
* **within** (``within: t``): "the winner is not worse than the loser by more than t" (a paper's
  "competitive with"), read from the per-seed paired difference and its 95 % interval: holds
  when the whole interval is above -t, does not hold when it is below.
* **against a constant** ("DZOFL's energy is mostly computation": compute share above 0.5): the
  95 % interval of the method's values against the constant.

For a to-target metric a method that reached the target on every seed beats one that never
reached it (no interval needed); a mixture is inconclusive. A comparison on a to-target metric
whose loser reached the target at its first evaluation on every scored seed is marked **decided
by per-round cost alone**: the loser could not have needed fewer rounds, so the verdict says
nothing about convergence, only about what one round costs.

A claim may name its own ``target`` (an accuracy, a test loss, a squared gradient norm or the
worst device's accuracy), read from the same evaluation runs as the study's own target
(tune/reproduce.py): one study answers several targets.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from wirelessfl.results.compare import mean_ci
from wirelessfl.tune.objectives import OBJECTIVES

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
UNHEALTHY = "unhealthy runs of"
NOT_REPRODUCED = "not reproduced (inconclusive)"
PER_ROUND_COST = "decided by per-round cost alone"
VERDICTS = (HOLDS, FAILS, INCONCLUSIVE, NOT_REPRODUCED)
# Summary columns (results/summary.py) a claim may name beside the objectives, with their
# natural direction when the claim does not give one.
SUMMARY_METRICS = {"compute_share": "higher", "radio_share": "higher", "idle_share": "higher",
                   "energy_j": "lower", "sim_time_s": "lower", "final_accuracy": "higher",
                   "final_worst_device_accuracy": "higher",
                   "final_worst_class_accuracy": "higher", "final_suboptimality": "lower",
                   "uplink_bits_per_device_round": "lower"}


class ClaimTarget(BaseModel):
    """The target a to-target claim is read at, when it is not the study's own: the first
    evaluated round where every given bound holds."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    accuracy: float | None = Field(None, gt=0, le=1, description="test accuracy at least this")
    loss: float | None = Field(None, gt=0, description="test loss at most this")
    grad_norm_sq: float | None = Field(
        None, gt=0, description="||grad f||^2 (the rounds column grad_norm_sq) at most this: "
                                "for problems without a known optimum (fedred.md A14)")
    worst_device_accuracy: float | None = Field(
        None, gt=0, le=1, description="the worst device's accuracy (the rounds column "
                                      "worst_device_accuracy) at least this: seed 003's "
                                      "worst-client target (fgdro.md Sec. 5)")

    @model_validator(mode="after")
    def _one_bound(self):
        if self.accuracy is None and self.loss is None and self.grad_norm_sq is None \
                and self.worst_device_accuracy is None:
            raise ValueError("a claim's target needs 'accuracy', 'loss', 'grad_norm_sq' or "
                             "'worst_device_accuracy'")
        return self

    @property
    def bounds(self) -> tuple[float | None, None, float | None, float | None, float | None]:
        """(accuracy, f - f*, test loss, ||grad f||^2, worst-device accuracy): the arguments of
        tune/objectives.py ``score`` after the rounds (a claim has no gap target)."""
        return self.accuracy, None, self.loss, self.grad_norm_sq, self.worst_device_accuracy

    def describe(self) -> str:
        parts = ([f"accuracy {self.accuracy:g}"] if self.accuracy is not None else []) + \
            ([f"test loss {self.loss:g}"] if self.loss is not None else []) + \
            ([f"grad_norm_sq {self.grad_norm_sq:g}"] if self.grad_norm_sq is not None else []) + \
            ([f"worst-device accuracy {self.worst_device_accuracy:g}"]
             if self.worst_device_accuracy is not None else [])
        return " and ".join(parts)


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
    times: float | None = Field(
        None, gt=0, description="the winner is at least this many times better (paired ratio; "
                                "default 1: better at all)")
    within: float | None = Field(
        None, ge=0, description="instead: the winner is not worse than the loser by more than "
                                "this (paired difference, the metric's units)")
    algorithm: str | None = Field(None, description="for a claim against a constant")
    above: float | None = None
    below: float | None = None
    target: ClaimTarget | None = Field(
        None, description="to-target metrics: read at this target instead of the study's")
    regimes: list[str] | None = Field(
        None, min_length=1, description="a reproduction with regimes: judge it only in these "
                                        "(default: every regime)")
    across: list[str] | None = Field(
        None, min_length=2, max_length=2,
        description="two regimes [A, B]: the claim is on how much the metric worsens from A to "
                    "B (the winner loses less than the loser; with 'within', not more than "
                    "that much more), per seed, paired")

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
        if not pair and (self.times is not None or self.within is not None):
            raise ValueError("'times' and 'within' compare two methods: give 'winner' and "
                             "'loser'")
        if self.times is not None and self.within is not None:
            raise ValueError("give one of 'times' (a ratio) and 'within' (a difference)")
        if self.target is not None and not self.to_target:
            raise ValueError(f"'target' is read by to-target metrics only, not '{self.metric}'")
        if self.across is not None:
            if not pair or self.times is not None:
                raise ValueError("'across' compares two methods' losses as a difference: give "
                                 "'winner' and 'loser', and no 'times'")
            if self.regimes is not None or self.across[0] == self.across[1]:
                raise ValueError("'across' names two different regimes and replaces 'regimes'")
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

    def judged_in(self, regime: str) -> bool:
        """Whether the claim reads the runs of the reproduction's regime ``regime`` ("" for one
        without regimes); an ``across`` claim reads both its regimes' and is judged once."""
        if self.across is not None:
            return regime in self.across
        return self.regimes is None or regime in self.regimes

    @property
    def column(self) -> str:
        """The runs-table column of this claim's metric (one per metric and target)."""
        return self.metric if self.target is None else f"{self.metric}@{self.target.describe()}"


def _interval(values: list[float]) -> tuple[float, float, int]:
    mean, half, n = mean_ci(values)
    return mean, (half if math.isfinite(half) else math.inf), n


def _pairs(claim: Claim, runs: dict[str, list[dict]]) -> list[tuple[float, float]]:
    """(winner's, loser's) values of the seeds both scored, matched by seed (by position for
    runs without one)."""
    def keyed(method):
        return {g.get("seed", i): g for i, g in enumerate(runs.get(method, []))}
    won, lost = keyed(claim.winner), keyed(claim.loser)
    return [(won[s]["value"], lost[s]["value"]) for s in won if s in lost
            and won[s]["reached"] and lost[s]["reached"]
            and math.isfinite(won[s]["value"]) and math.isfinite(lost[s]["value"])]


def paired_ratio(claim: Claim, pairs: list[tuple[float, float]]) -> dict | None:
    """The per-seed ratio in the paper's favour (loser / winner when lower is better): its
    geometric mean, the 95 % t interval of the mean log ratio taken back to ratios, and how
    many seeds are past ``times``. None when a value is not positive (no ratio)."""
    if not pairs or any(w <= 0 or l <= 0 for w, l in pairs):
        return None
    logs = [math.log(l / w) if claim.direction == "lower" else math.log(w / l) for w, l in pairs]
    mean, half, n = _interval(logs)
    k = claim.times or 1.0
    return {"estimate": math.exp(mean), "low": math.exp(mean - half) if n > 1 else math.nan,
            "high": math.exp(mean + half) if n > 1 else math.nan, "seeds": n,
            "seeds_past": sum(r > math.log(k) for r in logs), "times": k}


def paired_difference(claim: Claim, pairs: list[tuple[float, float]]) -> dict | None:
    """The per-seed difference in the paper's favour (loser - winner when lower is better),
    its mean and 95 % t interval, and how many seeds are past ``-within``."""
    if not pairs:
        return None
    diffs = [(l - w) if claim.direction == "lower" else (w - l) for w, l in pairs]
    mean, half, n = _interval(diffs)
    t = claim.within or 0.0
    return {"estimate": mean, "low": mean - half if n > 1 else math.nan,
            "high": mean + half if n > 1 else math.nan, "seeds": n,
            "seeds_past": sum(d > -t for d in diffs), "within": t}


def judge(claim: Claim, runs: dict[str, list[dict]]) -> dict:
    """The verdict of ``claim`` from ``runs``: method -> one dict per evaluation seed with the
    metric's ``value`` (NaN when not reached), ``reached``, ``healthy`` and optionally ``seed``
    (pairs the methods' runs) and ``first`` (the target was reached at the run's first
    evaluation). Returns the verdict, a reason, per method the mean, the 95 % half-width,
    seeds scored and in all, and for a comparison the paired estimate (``paired``) and, where
    it applies, the regime note (``note``)."""
    out = {"claim": claim.id, "statement": claim.statement, "where": claim.where,
           "metric": claim.metric, "target": claim.target.describe() if claim.target else None}
    measured = out["measured"] = _measure(claim, runs)
    unhealthy = [m for m, r in measured.items() if r["healthy"] < r["seeds"]]
    missing = [m for m, r in measured.items() if r["seeds"] == 0]
    if missing:
        return {**out, "verdict": INCONCLUSIVE, "reason": f"no runs of {', '.join(missing)}"}
    if unhealthy:
        sick = "; ".join(f"{m} (seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))})"
                         for m in unhealthy if (s := _unhealthy_seeds(runs.get(m, []))))
        verdict = {**out, "verdict": INCONCLUSIVE, "reason": f"{UNHEALTHY} {sick}"}
        if claim.algorithm is None:  # what the seeds on which every run was healthy say
            healthy = _healthy_seeds(claim, runs)
            if len(healthy) >= 2:
                kept = {m: [g for i, g in enumerate(runs.get(m, []))
                            if g.get("seed", i) in healthy] for m in claim.methods}
                alone = _comparison(claim, kept, _measure(claim, kept))
                verdict["reason"] += (f"{_HEALTHY_SEEDS[0]}{len(healthy)}{_HEALTHY_SEEDS[1]}"
                                      f"{alone['verdict']} ({alone['reason']})")
                for key in ("paired", "note"):  # the estimate, the per-round-cost mark
                    if key in alone:
                        verdict[key] = alone[key]
        return verdict
    if claim.algorithm is not None:
        return {**out, **_against_constant(claim, measured[claim.algorithm])}
    return {**out, **_comparison(claim, runs, measured)}


def judge_across(claim: Claim, before: dict[str, list[dict]], after: dict[str, list[dict]]
                 ) -> dict:
    """The verdict of an ``across`` claim: per method and seed, how much the metric worsens
    from the first regime (``before``: method -> runs, as ``judge`` takes them) to the second
    (``after``), A - B when higher is better (B - A when lower is); each seed's loss is scored
    when both runs reached a value, healthy when both were. The winner losing less is then a
    lower-is-better difference claim on those losses (``paired_difference``: the loser's minus
    the winner's, past -within, default 0), judged by ``judge``."""
    higher = claim.direction == "higher"
    losses = {}
    for method in claim.methods:
        first = {g.get("seed", i): g for i, g in enumerate(before.get(method, []))}
        second = {g.get("seed", i): g for i, g in enumerate(after.get(method, []))}
        rows = []
        for seed in (s for s in first if s in second):
            a, b = first[seed], second[seed]
            reached = a["reached"] and b["reached"]
            rows.append({"value": (a["value"] - b["value"] if higher
                                   else b["value"] - a["value"]) if reached else math.nan,
                         "reached": reached, "healthy": a["healthy"] and b["healthy"],
                         "seed": seed, "first": False})
        losses[method] = rows
    loss = claim.model_copy(update={"better": "lower", "within": claim.within or 0.0,
                                    "target": None})
    verdict = judge(loss, losses)
    start, end = claim.across
    return {**verdict, "metric": f"loss of {claim.column} from {start} to {end}",
            "target": claim.target.describe() if claim.target else None, "against": start}


# How an unhealthy verdict's reason names what the healthy seeds give (read back below).
_HEALTHY_SEEDS = ("; on the ", " seeds where every compared run was healthy: ")


def unhealthy_part(verdict: dict) -> str | None:
    """The methods and seeds of a verdict's unhealthy runs ("DZOFL (seed 2)"), or None."""
    reason = str(verdict.get("reason", ""))
    if not reason.startswith(UNHEALTHY):
        return None
    return reason.partition(_HEALTHY_SEEDS[0])[0].removeprefix(UNHEALTHY).strip()


def healthy_seeds_verdict(verdict: dict) -> str | None:
    """For a verdict left inconclusive by an unhealthy run: the verdict of the seeds on which
    every compared run was healthy, or None when there is none (or nothing was unhealthy)."""
    if unhealthy_part(verdict) is None:
        return None
    said = str(verdict["reason"]).partition(_HEALTHY_SEEDS[1])[2]
    return next((v for v in (NOT_REPRODUCED, FAILS, HOLDS, INCONCLUSIVE) if said.startswith(v)),
                None)


def decided_by_round_cost(verdict: dict) -> bool:
    """Whether the verdict carries the per-round-cost mark (its loser reached the target at its
    first evaluation)."""
    return str(verdict.get("note", "")).startswith(PER_ROUND_COST)


def _measure(claim: Claim, runs: dict[str, list[dict]]) -> dict:
    """Per method: the mean and 95 % half-width of its values, seeds scored, seeds in all and
    seeds healthy."""
    measured = {}
    for method in claim.methods:
        got = runs.get(method, [])
        values = [g["value"] for g in got if g["reached"] and math.isfinite(g["value"])]
        mean, half, n = _interval(values)
        measured[method] = {"mean": mean, "ci95": half, "scored": n, "seeds": len(got),
                            "healthy": sum(bool(g["healthy"]) for g in got)}
    return measured


def _unhealthy_seeds(got: list[dict]) -> list:
    return [g.get("seed", i) for i, g in enumerate(got) if not g["healthy"]]


def _healthy_seeds(claim: Claim, runs: dict[str, list[dict]]) -> set:
    """The seeds on which every compared method ran, and ran healthy."""
    seeds = None
    for method in claim.methods:
        mine = {g.get("seed", i) for i, g in enumerate(runs.get(method, [])) if g["healthy"]}
        seeds = mine if seeds is None else seeds & mine
    return seeds or set()


def _against_constant(claim: Claim, r: dict) -> dict:
    if r["scored"] < 2:
        return {"verdict": INCONCLUSIVE, "reason": "fewer than 2 seeds scored"}
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
    return {"verdict": verdict, "reason": reason}


def _regime_note(claim: Claim, runs: dict[str, list[dict]]) -> str | None:
    """The per-round-cost note: on a to-target comparison, the loser reached the target at its
    first evaluation on every seed it reached it."""
    if not claim.to_target or claim.within is not None:
        return None
    lost = [g for g in runs.get(claim.loser, []) if g["reached"]]
    if lost and all(g.get("first") for g in lost):
        return (f"{PER_ROUND_COST}: {claim.loser} reached the target at its first evaluation "
                f"on every seed")
    return None


def _comparison(claim: Claim, runs: dict[str, list[dict]], measured: dict) -> dict:
    w, l = measured[claim.winner], measured[claim.loser]
    note = _regime_note(claim, runs)
    extra = {"note": note} if note else {}
    if claim.to_target and (w["scored"] < w["seeds"] or l["scored"] < l["seeds"]):
        if w["scored"] == w["seeds"] and l["scored"] == 0:
            return {"verdict": HOLDS, "reason": f"{claim.loser} never reached the target",
                    **extra}
        if l["scored"] == l["seeds"] and w["scored"] == 0:
            return {"verdict": FAILS, "reason": f"{claim.winner} never reached the target",
                    **extra}
        return {"verdict": INCONCLUSIVE, "reason": "the target was reached on some seeds only",
                **extra}
    pairs = _pairs(claim, runs)
    if len(pairs) < 2:
        return {"verdict": INCONCLUSIVE, "reason": "fewer than 2 seeds scored by both", **extra}
    ratio = l["mean"] / w["mean"] if w["mean"] else math.nan
    if claim.within is not None:
        paired = paired_difference(claim, pairs)
        bound, shown = -paired["within"], f"-{paired['within']:g}"
        what = "the paired difference"
    else:
        paired = paired_ratio(claim, pairs)
        if paired is None:
            return {"verdict": INCONCLUSIVE, "reason": "a value is not positive: no ratio",
                    "ratio": ratio, **extra}
        bound, shown = paired["times"], f"{paired['times']:g}"
        what = "the paired ratio"
    lo, hi, estimate = paired["low"], paired["high"], paired["estimate"]
    past = f"{paired['seeds_past']} of {paired['seeds']} seeds past {shown}"
    if lo > bound:
        verdict, reason = HOLDS, f"{what}'s 95 % interval is above {shown} ({past})"
    elif hi < bound:
        verdict, reason = FAILS, f"{what}'s 95 % interval is below {shown} ({past})"
    elif estimate < bound:
        verdict, reason = NOT_REPRODUCED, (f"{what}'s 95 % interval contains {shown} and its "
                                           f"estimate goes against the paper ({past})")
    else:
        verdict, reason = INCONCLUSIVE, f"{what}'s 95 % interval contains {shown} ({past})"
    return {"verdict": verdict, "reason": reason, "ratio": ratio, "paired": paired, **extra}
