"""The health verdict of one algorithm's run, from its recorded rows and its status
(docs/results.md, "How to read the health columns").

A run is unhealthy when it diverged or failed (an exception stopped it), when more than
``max_clipped_share`` of the quantised values it sent clipped at a fixed quantiser range's ends,
when its test loss grew above ``max_loss_growth`` times its starting value or did not fall by the
end, when more than ``max_empty_round_share`` of its rounds delivered no upload, or (where set)
when its parameter norm grew more than ``max_param_norm_growth`` times. The limits are the
scenario's ``health:`` section (``HealthConfig`` below).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field


class HealthConfig(BaseModel):
    """Limits beyond which a run counts as unhealthy in the summary (docs/results.md, "How to
    read the health columns"); defaults [D] that every shipped scenario's healthy runs pass.
    The scenario's ``health:`` section; it lives with the rules that read it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_clipped_share: float = Field(
        0.01, ge=0, le=1, allow_inf_nan=False,
        description="largest share of the quantised values sent (up and down) that may clip at "
                    "a quantiser range's ends (scalars beyond the float format's largest level "
                    "or a fixed format's [-r, r])")
    max_loss_growth: float = Field(
        10.0, gt=1, allow_inf_nan=False,
        description="largest test loss over the run, as a multiple of its starting value")
    loss_must_fall: bool = Field(
        True, description="the final test loss must be below the starting one")
    max_empty_round_share: float = Field(
        0.5, ge=0, le=1, allow_inf_nan=False,
        description="largest share of rounds in which devices were asked to upload and "
                    "nothing arrived")
    max_param_norm_growth: float | None = Field(
        None, gt=1, allow_inf_nan=False,
        description="largest final / initial parameter norm ||theta||_2 (default: not checked, "
                    "only reported)")


# The summary's health columns, in order (docs/results.md).
HEALTH_FIELDS = ["healthy", "health", "clipped_share", "loss_growth", "final_loss_ratio",
                 "empty_round_share", "param_norm_growth"]
# Step-size parameters, in the order a hint names the first one an algorithm has.
STEP_SIZE_PARAMS = ("lr", "alpha0", "gamma0", "alpha", "eta")
# Written where the rows predate the counters (run folders recorded before these columns).
NOT_RECORDED = "clipping and empty rounds not recorded: the run predates the health columns"


def failed_reason(when: str) -> str:
    """Why an algorithm that raised an exception (status ``failed``, pipeline/simulation.py) is
    unhealthy; ``when``: "after round R" or "before its first evaluation"."""
    return (f"failed: an error stopped it {when} (its message and traceback are in the "
            "manifest's algorithms entry)")


def step_size_name(fields: Iterable[str] | None) -> str:
    """The algorithm's own step-size parameter among its parameter names ``fields`` ("lr",
    "alpha0", ...), or a generic phrase when they are unknown."""
    names = set(fields or ())
    return next((name for name in STEP_SIZE_PARAMS if name in names), "the step size")


def manifest_health(manifest: dict | None) -> tuple[HealthConfig, dict[str, tuple[str, list]]]:
    """The limits of a run's manifest (its scenario's ``health:``, defaults for runs recorded
    before the section existed) and, per algorithm label, (status, parameter names)."""
    manifest = manifest or {}
    limits = HealthConfig.model_validate(manifest.get("scenario", {}).get("health") or {})
    algorithms = {label: (entry.get("status"), list(entry.get("params", {})))
                  for label, entry in manifest.get("algorithms", {}).items()}
    return limits, algorithms


def _ratio(top: float, bottom: float) -> float:
    return top / bottom if bottom > 0 and math.isfinite(bottom) else math.nan


def _loss_series(group: pd.DataFrame) -> tuple[str | None, np.ndarray]:
    """(name, finite values in round order) of the loss the checks read: the test loss when its
    starting value is positive, else f - f* when known and positive at the start (a quadratic's
    f(theta) can start at 0 or below), else (None, empty)."""
    for column, name in (("test_loss", "test loss"), ("suboptimality", "f - f*")):
        if column not in group:
            continue
        values = group[column].to_numpy(dtype=float)
        if len(values) and math.isfinite(values[0]) and values[0] > 0:
            return name, values[np.isfinite(values)]
    return None, np.empty(0)


def loss_growth_violation(rows: list[dict], limit: float) -> str:
    """Why the evaluated ``rows`` so far already break the loss-growth limit (the check of
    ``assess``, which reads the run's largest loss, so the verdict cannot recover), or ''."""
    name, loss = _loss_series(pd.DataFrame(rows))
    if name is None or not loss.max() > limit * loss[0]:
        return ""
    return _growth_text(name, loss, limit)


def _growth_text(name: str, loss: np.ndarray, limit: float) -> str:
    return f"{name} grew from {loss[0]:.3g} to {loss.max():.3g} (limit {limit:g}x its start)"


def assess(group: pd.DataFrame, status: str | None = None, limits: HealthConfig | None = None,
           fields: Iterable[str] | None = None) -> dict:
    """The health fields (HEALTH_FIELDS) of one algorithm's rows ``group`` (rounds.parquet rows,
    any order), its ``status`` (None: unknown, then a final row with a NaN test loss, the row a
    diverged run ends with, marks divergence) and its parameter names ``fields`` (for hints)."""
    limits = limits or HealthConfig()
    group = group.sort_values("round")
    last = group.iloc[-1]
    step = step_size_name(fields)
    recorded = "quantized_up" in group and not pd.isna(last.get("quantized_up"))
    reasons = []

    nonfinite = int(last.get("nonfinite_uploads", 0) or 0) if recorded else 0
    diverged = status == "diverged" if status is not None else bool(
        pd.isna(last.get("test_loss", 0.0)))
    if diverged or nonfinite:
        what = f"{nonfinite} non-finite upload(s)" if nonfinite else "NaN/inf in its model or loss"
        reasons.append(f"diverged ({what}; the run stopped at round {int(last['round'])}): "
                       f"lower {step}")
    if status == "failed":
        reasons.append(failed_reason(f"after round {int(last['round'])}"))

    clipped_share = empty_share = math.nan
    if recorded:
        sent = float(last.quantized_up + last.quantized_down)
        clipped = float(last.clipped_up + last.clipped_down)
        clipped_share = clipped / sent if sent else math.nan
        empty_share = float(last.empty_rounds) / max(int(last["round"]), 1)
    if clipped_share > limits.max_clipped_share:
        widen = (" (with scalar_format: fixed, or widen scalar_range)"
                 if fields is None or "scalar_range" in set(fields) else "")
        reasons.append(f"{100 * clipped_share:.1f} % of the quantised values sent clipped at the "
                       f"quantiser's range ends (limit {100 * limits.max_clipped_share:g} %): "
                       f"lower {step}{widen}")

    name, loss = _loss_series(group)
    loss_growth = final_ratio = math.nan
    if name is not None:
        loss_growth = float(loss.max() / loss[0])
        final_ratio = float(loss[-1] / loss[0]) if len(loss) > 1 else math.nan
    exploded = loss_growth > limits.max_loss_growth
    if exploded:
        reasons.append(f"{_growth_text(name, loss, limits.max_loss_growth)}: lower {step}")
    if limits.loss_must_fall and final_ratio >= 1 and not exploded:
        reasons.append(f"{name} did not fall ({loss[0]:.3g} at the start, {loss[-1]:.3g} at the "
                       f"end): tune {step} (too large or too small) or run more rounds")

    if empty_share > limits.max_empty_round_share:
        reasons.append(f"{100 * empty_share:.1f} % of the rounds delivered no upload (limit "
                       f"{100 * limits.max_empty_round_share:g} %): strengthen the uplink "
                       "(channel.uplink: tx_power_dbm, deadline_s) or send fewer bits")

    norm_growth = math.nan
    if "param_norm" in group:
        norms = group.param_norm.to_numpy(dtype=float)
        final = norms[~np.isnan(norms)]
        norm_growth = float(_ratio(final[-1], final[0])) if len(final) else math.nan
    cap = limits.max_param_norm_growth
    if cap is not None and norm_growth > cap:
        reasons.append(f"the parameter norm grew {norm_growth:.3g}x (limit {cap:g}x): "
                       f"lower {step}")

    text = "; ".join(reasons) if reasons else "ok"
    if not recorded:
        text += f" ({NOT_RECORDED})"
    return {"healthy": not reasons, "health": text, "clipped_share": clipped_share,
            "loss_growth": loss_growth, "final_loss_ratio": final_ratio,
            "empty_round_share": empty_share, "param_norm_growth": norm_growth}


def manifest_entry(rows: list[dict], status: str, limits: HealthConfig,
                   fields: Iterable[str]) -> dict:
    """The manifest's ``health`` entry of one algorithm: the verdict, the numbers behind it and
    the final counters (JSON-safe: NaN as null)."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        return {"healthy": status not in ("diverged", "failed"),
                "health": (failed_reason("before its first evaluation") if status == "failed"
                           else "no rows recorded")}
    verdict = assess(frame, status, limits, fields)
    last = frame.sort_values("round").iloc[-1]
    counts = {k: int(last[k]) for k in ("quantized_up", "clipped_up", "quantized_down",
                                        "clipped_down", "empty_rounds", "nonfinite_uploads")}
    return {k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in {**verdict, **counts}.items()}
