"""The engine's side of the run port (contract/port.py ``RunPort``): ``RunContext`` gives an
algorithm the network, its problem, the seed and streams and the health log, and records its
run (rows, snapshots, stop rules) as the rounds end."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy
import torch

from wirelessfl.contract.port import Air
from wirelessfl.contract.problem import Problem
from wirelessfl.engine.ledger import Ledger
from wirelessfl.engine.recorder import (
    Diverged,
    HealthCounter,
    RunRecorder,
)


@dataclass
class RunContext(RunRecorder):
    """One algorithm's run: simulated world + learning problem + what gets recorded. It
    implements ``RunPort`` (what an algorithm may call) and is the run's recorder (``rows``,
    ``snapshot``, the stop rules), which the pipeline reads and algorithms do not."""

    algorithm: str
    env: simpy.Environment
    net: Air  # a wirelessfl.engine.network.Network
    ledger: Ledger
    evaluator: Problem  # the learning problem (a BatchedEvaluator, a QuadraticProblem, ...)
    theta0: torch.Tensor
    seed: int
    rounds: int
    eval_every: int
    on_round: Callable[[int], None] | None = None
    rows: list[dict] = field(default_factory=list)
    # Local iterations so far (the algorithm's count: E per FedAvg round, N_k per FedRed round).
    local_steps: float = 0.0
    # Share of devices averaged in worst_k_device_accuracy (the scenario's worst_fraction).
    worst_fraction: float = 0.1
    # Called with the rounds completed after each round (checkpointing); None: no checkpoints.
    on_checkpoint: Callable[[int], None] | None = None
    # (target accuracy, target f - f*, target test loss, target ||grad f||^2, target worst-device
    # accuracy) at which the algorithm ends (stop_at_target), or None.
    stop_targets: tuple[float | None, float | None, float | None, float | None,
                        float | None] | None = None
    # health.max_loss_growth when the algorithm ends once its loss grew past it
    # (stop_when_unhealthy), or None.
    stop_loss_growth: float | None = None
    # Clipped and quantised values, empty rounds, non-finite uploads (the health columns).
    health: HealthCounter = field(default_factory=HealthCounter)
    # Random draws keyed per (round, device) (population.random_streams per-device): a round
    # draws only for the devices it asks; False: one stream per round over all devices.
    per_device_streams: bool = False
    # Devices whose accuracies the rows' device_accuracy lists (a large population's sample,
    # results/records.py ``accuracy_sample``); None: every device.
    accuracy_devices: np.ndarray | None = None

    @property
    def num_devices(self) -> int:
        return self.ledger.num_devices

    def check_finite(self, values: torch.Tensor, direction: str, round_index: int,
                     sent: torch.Tensor | None = None) -> None:
        """Raise ``Diverged`` when ``values`` about to be sent ``direction`` hold a NaN or an
        infinity (checked before quantisation, which would hide them). Uploads: [n, ...], one
        row per device, of which the rows ``sent`` ([n] bool, default all) reach the base
        station; each non-finite one is counted in ``nonfinite_uploads``.

        Runs on every upload and broadcast, so it first sums all values (one pass, nothing
        allocated): a NaN or an infinity anywhere makes the sum NaN or infinite (inf - inf is
        NaN), so a finite sum proves every value finite. Only a non-finite sum (a bad value, or
        finite values whose sum overflowed) pays for the elementwise test below."""
        if bool(torch.isfinite(values.sum())):
            return
        finite = torch.isfinite(values)
        rows = finite.reshape(finite.shape[0], -1).all(1) if values.dim() else finite.reshape(1)
        bad = ~rows if sent is None else ~rows & sent.to(rows.device)
        if not bool(bad.any()):
            return
        if direction == "up":
            count = int(bad.sum())
            self.health.nonfinite_uploads += count
            reason = f"uploads became NaN/inf ({count} device{'s' if count > 1 else ''})"
        else:
            reason = "the broadcast aggregate became NaN/inf"
        raise Diverged(round_index + 1, self.rows[-1] if self.rows else None, reason)

