"""What a run records as its rounds end: the rows of rounds.parquet (``snapshot``), the
evaluation and stop rules at each round's end (``RunRecorder.end_round``), the health counts an
algorithm reports (``HealthCounter``, the run port's ``HealthLog``) and the exceptions that end
a run early (diverged, reached its target, became unhealthy). The pipeline reads what is
recorded; an algorithm only calls ``end_round`` and reports to the health log."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from wirelessfl.results.health import loss_growth_violation


class Diverged(Exception):
    """An algorithm's loss, parameters or transmitted values became NaN or infinite.

    ``round_index``: the round that did not complete (or the evaluation point that failed);
    ``reason``: what was found (default: the model or its test loss)."""

    def __init__(self, round_index: int, last_row: dict | None,
                 reason: str = "loss or parameters became NaN/inf"):
        self.round_index = round_index
        self.last_row = last_row
        self.reason = reason
        # args are the constructor's: SimPy re-raises a failed process's exception as
        # type(e)(*e.args).
        super().__init__(round_index, last_row, reason)

    def __str__(self) -> str:
        return f"diverged at round {self.round_index}: {self.reason}"


# The health columns of rounds.parquet kept by the counter (cumulative); ``param_norm`` is
# measured at each evaluation. docs/results.md, "How to read the health columns".
HEALTH_COUNTS = ("quantized_up", "clipped_up", "quantized_down", "clipped_down", "empty_rounds",
                 "nonfinite_uploads")


@dataclass
class HealthCounter:
    """What shows a run left its valid regime, counted as it runs (one per algorithm's run; it
    travels with the run context into checkpoints).

    Every quantised payload reports here (``Algorithm.quantize`` and
    ``Algorithm.quantize_scalars``): uplink values count once per delivered upload, a broadcast
    once; values sent at full precision (>= 32 bits) are not quantised and not counted. A
    per-vector-scaled vector never clips; a scalar on a fixed range clips where |x| > range.
    """

    quantized_up: int = 0
    clipped_up: int = 0
    quantized_down: int = 0
    clipped_down: int = 0
    empty_rounds: int = 0  # rounds in which devices were asked to upload and nothing arrived
    nonfinite_uploads: int = 0  # delivered uploads holding a NaN or an infinity
    asked: bool = False  # this round: some device was asked to upload
    arrived: bool = False  # this round: some upload arrived

    def quantized(self, direction: str, values: int, clipped: int = 0) -> None:
        """``values`` quantised values sent ``direction`` ("up" or "down"), ``clipped`` of them
        at the quantiser's range ends."""
        if direction == "up":
            self.quantized_up += values
            self.clipped_up += clipped
        else:
            self.quantized_down += values
            self.clipped_down += clipped

    def begin_round(self) -> None:
        self.asked = self.arrived = False

    def collected(self, active: np.ndarray, delivered: np.ndarray) -> None:
        """One upload phase (or retransmission phase) of the round: who was asked, what came."""
        self.asked |= bool(np.any(active))
        self.arrived |= bool(np.any(delivered))

    def end_round(self) -> None:
        if self.asked and not self.arrived:
            self.empty_rounds += 1

    def columns(self) -> dict:
        return {name: int(getattr(self, name)) for name in HEALTH_COUNTS}


class BecameUnhealthy(Exception):
    """An algorithm's loss grew past the health limit with ``stop_when_unhealthy`` set: its
    verdict can no longer be healthy (results/health.py reads the largest loss of the run), so
    it ends here instead of spending the rest of its rounds."""

    def __init__(self, round_index: int, reason: str):
        self.round_index = round_index
        self.reason = reason
        super().__init__(round_index, reason)  # SimPy re-raises as type(e)(*e.args)


class ReachedTarget(Exception):
    """An algorithm reached the scenario's target with ``stop_at_target`` set: it ends here."""

    def __init__(self, round_index: int):
        self.round_index = round_index
        super().__init__(round_index)  # SimPy re-raises as type(e)(*e.args)


def target_reached(row: dict, target: float | None, target_suboptimality: float | None,
                   target_loss: float | None = None,
                   target_grad_norm_sq: float | None = None,
                   target_worst_device_accuracy: float | None = None) -> bool:
    """Every given target holds at this rounds row (the summary's rule, results/summary.py)."""
    if target is None and target_suboptimality is None and target_loss is None \
            and target_grad_norm_sq is None and target_worst_device_accuracy is None:
        return False
    return ((target is None or row["test_accuracy"] >= target)
            and (target_suboptimality is None or row["suboptimality"] <= target_suboptimality)
            and (target_loss is None or row["test_loss"] <= target_loss)
            and (target_grad_norm_sq is None or row["grad_norm_sq"] <= target_grad_norm_sq)
            and (target_worst_device_accuracy is None
                 or row["worst_device_accuracy"] >= target_worst_device_accuracy))


def device_accuracy_columns(accuracy, worst_fraction: float,
                            listed: np.ndarray | None = None) -> dict:
    """The per-device accuracy columns of a rounds row from [N] accuracies (None: a problem
    without accuracy): their mean, the worst, the mean of the k = max(1, ceil(worst_fraction
    N)) worst, over every device, and the list itself, of the devices ``listed`` (None: all;
    a large population's sample, results/records.py ``accuracy_sample``). Devices whose
    accuracy is NaN are left out."""
    if accuracy is None:
        return {"mean_device_accuracy": math.nan, "worst_device_accuracy": math.nan,
                "worst_k_device_accuracy": math.nan, "device_accuracy": None}
    values = np.asarray(accuracy, dtype=float)
    known = np.sort(values[np.isfinite(values)])
    k = max(1, math.ceil(worst_fraction * len(values)))
    return {"mean_device_accuracy": float(known.mean()) if len(known) else math.nan,
            "worst_device_accuracy": float(known[0]) if len(known) else math.nan,
            "worst_k_device_accuracy": float(known[:k].mean()) if len(known) else math.nan,
            "device_accuracy": (values if listed is None else values[listed]).tolist()}



def worst_class_accuracy(accuracy) -> float:
    """The lowest of the per-class test accuracies (None, or none known: NaN)."""
    if accuracy is None:
        return math.nan
    values = np.asarray(accuracy, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.min()) if len(values) else math.nan


class RunRecorder:
    """The recorder half of the run context (engine/context.py ``RunContext`` inherits it and
    holds its state: ``rows``, ``health``, the stop settings, ``net``/``ledger``/``env`` to read
    time and energy from)."""

    def end_round(self, completed: int, theta: torch.Tensor,
                  objective: Callable[[torch.Tensor], float] | None = None) -> None:
        """Called by the round loop after ``completed`` rounds: evaluate when due, report."""
        if completed and self.on_round is not None:
            self.on_round(1)
        if completed % self.eval_every and completed != self.rounds:
            return
        if not bool(torch.isfinite(theta).all()):
            raise Diverged(completed, self.rows[-1] if self.rows else None)
        metrics = self.evaluator.metrics(theta)
        if objective is not None:
            metrics["objective"] = float(objective(theta))
        if not math.isfinite(metrics["test_loss"]):
            raise Diverged(completed, self.rows[-1] if self.rows else None)
        self.rows.append(self.snapshot(completed, metrics, theta))
        if self.stop_targets is not None and target_reached(self.rows[-1], *self.stop_targets):
            raise ReachedTarget(completed)
        if self.stop_loss_growth is not None:
            reason = loss_growth_violation(self.rows, self.stop_loss_growth)
            if reason:
                raise BecameUnhealthy(completed, reason)

    def stop_row(self, completed: int, theta: torch.Tensor) -> dict:
        """The row recorded where a run diverged: time, energy and health counters up to the
        stop, learning metrics NaN (the model is not evaluated)."""
        nan = {"test_accuracy": math.nan, "test_loss": math.nan, "suboptimality": math.nan,
               "grad_norm_sq": math.nan}
        return self.snapshot(completed, nan, theta)

    def snapshot(self, completed: int, metrics: dict, theta: torch.Tensor | None = None) -> dict:
        """One ``rounds.parquet`` row: cumulative time, energy, bits and gradient evaluations at
        this point, the problem's ``metrics`` of the global model, the parameter norm of
        ``theta`` and the health counters."""
        settle = getattr(self.net, "settle", None)
        if settle is not None:  # idle time up to now (time spent outside a phase, if any)
            settle()
        by_kind = self.ledger.energy_by_kind()
        compute = by_kind["compute_forward"] + by_kind["compute_backward"]
        devices = compute + by_kind["uplink"] + by_kind["downlink"] + by_kind["idle"]
        # the base station: on air (the ledger's), + its sleep draw for the rest of the
        # simulated time under an EARTH power model (channel/link.py Downlink.energy_j)
        downlink = getattr(self.net, "downlink", None)
        base_station = float(self.ledger.bs_energy_j) if downlink is None else \
            downlink.energy_j(self.ledger.bs_energy_j, self.ledger.bs_airtime_s, self.env.now)
        return {
            "algorithm": self.algorithm,
            "round": completed,
            "sim_time_s": float(self.env.now),
            "energy_j": devices,
            "energy_compute_j": compute,
            "energy_compute_forward_j": by_kind["compute_forward"],
            "energy_compute_backward_j": by_kind["compute_backward"],
            "energy_uplink_j": by_kind["uplink"],
            "energy_downlink_j": by_kind["downlink"],
            "energy_idle_j": by_kind["idle"],
            "energy_bs_j": base_station,
            "energy_system_j": devices + base_station,
            "bs_airtime_s": float(self.ledger.bs_airtime_s),
            "bits_up": float(self.ledger.bits_up.sum()),
            "bits_down": float(self.ledger.bits_down.sum()),
            "delivered_fraction": self.ledger.delivered_fraction(),
            "transmissions": int(self.ledger.transmissions.sum()),
            "late_uploads": int(self.ledger.late_uploads.sum()),
            "queue_wait_s": float(self.ledger.queue_wait_s.sum()),
            "broadcasts_missed": int(self.ledger.broadcasts_missed.sum()),
            "alive_devices": int(self.ledger.alive.sum()),
            "gradient_evaluations": self.ledger.gradient_evaluations(),
            "hessian_vector_products": self.ledger.hessian_vector_products(),
            "local_steps": float(self.local_steps),
            "exchanges": int(self.ledger.exchanges),
            "test_accuracy": float(metrics["test_accuracy"]),
            "test_loss": float(metrics["test_loss"]),
            "suboptimality": float(metrics["suboptimality"]),
            "grad_norm_sq": float(metrics["grad_norm_sq"]),
            "objective": float(metrics.get("objective", math.nan)),
            **device_accuracy_columns(metrics.get("device_accuracy"), self.worst_fraction,
                                      self.accuracy_devices),
            "worst_class_accuracy": worst_class_accuracy(metrics.get("class_accuracy")),
            "param_norm": float(theta.double().norm()) if theta is not None else math.nan,
            **self.health.columns(),
        }
