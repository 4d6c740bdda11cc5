"""Run every algorithm of a scenario in its own SimPy world and hand back what was recorded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simpy

from wirelessfl.algorithms.base import AlgorithmParams, algorithm_class
from wirelessfl.engine.build import World
from wirelessfl.engine.checkpoint import restore_algorithm, save_checkpoint
from wirelessfl.engine.context import BecameUnhealthy, Diverged, ReachedTarget, RunContext
from wirelessfl.engine.ledger import KIND_INDEX, Ledger
from wirelessfl.engine.network import ENGINES
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_rng
from wirelessfl.results.health import step_size_name


@dataclass
class AlgorithmRun:
    """One algorithm's results: evaluated rounds, the final ledger, and how it ended."""

    label: str
    params: AlgorithmParams
    rows: list[dict]
    ledger: Ledger
    status: str = "complete"  # or "diverged", "interrupted"
    message: str = ""
    # Merged into the algorithm's manifest entry: "resolved" (Algorithm.resolved) when not empty.
    extra: dict = field(default_factory=dict)

    def device_rows(self, world: World) -> list[dict]:
        """One ``devices.parquet`` row per device."""
        led, cell = self.ledger, world.cell
        k = KIND_INDEX
        compute = led.energy_j[:, k["compute_forward"]] + led.energy_j[:, k["compute_backward"]]
        compute_s = led.busy_s[:, k["compute_forward"]] + led.busy_s[:, k["compute_backward"]]
        snr_db = 10 * np.log10(cell.uplink_mean_snr)
        classes = world.device_class_names()
        return [
            {
                "algorithm": self.label,
                "device": i,
                "device_class": classes[i],
                "distance_m": float(cell.distances_m[i]),
                "mean_snr_db": float(snr_db[i]),
                "energy_j": float(led.energy_j[i].sum()),
                "energy_compute_j": float(compute[i]),
                "energy_uplink_j": float(led.energy_j[i, k["uplink"]]),
                "energy_downlink_j": float(led.energy_j[i, k["downlink"]]),
                "energy_idle_j": float(led.energy_j[i, k["idle"]]),
                "compute_s": float(compute_s[i]),
                "uplink_s": float(led.busy_s[i, k["uplink"]]),
                "downlink_s": float(led.busy_s[i, k["downlink"]]),
                "idle_s": float(led.busy_s[i, k["idle"]]),
                "depleted_at_s": float(led.depleted_at_s[i]),
                "bits_up": float(led.bits_up[i]),
                "packets_sent": int(led.packets_sent[i]),
                "packets_delivered": int(led.packets_delivered[i]),
                "transmissions": int(led.transmissions[i]),
                "late_uploads": int(led.late_uploads[i]),
                "queue_wait_s": float(led.queue_wait_s[i]),
                "broadcasts_missed": int(led.broadcasts_missed[i]),
            }
            for i in range(led.num_devices)
        ]


def run_algorithm(world: World, params: AlgorithmParams,
                  on_round: Callable[[int], None] | None = None, checkpoint_every: int = 0,
                  checkpoint_path: Path | None = None, resume: dict | None = None
                  ) -> AlgorithmRun:
    """Simulate one algorithm from theta_0 (or from a checkpoint's state, ``resume``) to its last
    round in a fresh SimPy environment; with ``checkpoint_every`` > 0, save the run's state to
    ``checkpoint_path`` every that many rounds."""
    sc = world.scenario
    save = None
    if checkpoint_every:
        if sc.engine.mode != "vectorized":
            raise UserError("checkpoints need engine.mode: vectorized (the processes engine keeps "
                            "per-device SimPy processes, which cannot be saved); drop "
                            "--checkpoint-every or set --set engine.mode=vectorized")

        def save(completed: int) -> None:
            if completed % checkpoint_every == 0 and completed < params.rounds:
                save_checkpoint(checkpoint_path, algorithm, completed)

    if resume is not None:
        algorithm, env = restore_algorithm(resume, world.evaluator, on_round, save)
        ctx = algorithm.ctx
        if on_round is not None:
            on_round(resume["completed"])
        start = resume["completed"]
    else:
        env = simpy.Environment()
        ledger = Ledger(world.num_devices)
        # Every algorithm draws fading from the same stream: common random numbers across methods.
        uplink = world.uplink()
        network = ENGINES[sc.engine.mode](env, ledger, uplink, world.downlink(),
                                          world.compute_model(params.bits),
                                          world.device_power(uplink),
                                          keyed_rng(sc.seed, "fading"),
                                          keyed_rng(sc.seed, "downlink"),
                                          accounting=sc.energy_accounting)
        ctx = RunContext(params.display_name, env, network, ledger, world.evaluator,
                         world.initial(), sc.seed, params.rounds,
                         params.eval_every, on_round, worst_fraction=sc.worst_fraction,
                         on_checkpoint=save,
                         stop_targets=((sc.target_accuracy, sc.target_suboptimality)
                                       if sc.stop_at_target else None),
                         stop_loss_growth=(sc.health.max_loss_growth if sc.stop_when_unhealthy
                                           else None))
        algorithm = algorithm_class(params.name)(params, ctx)
        start = 0
    run = AlgorithmRun(params.display_name, params, ctx.rows, ctx.ledger)
    env.process(algorithm.process(start))
    try:
        env.run()
    except ReachedTarget as stop:
        run.message = f"{params.display_name}: stopped at the target after round {stop.round_index}"
    except BecameUnhealthy as stop:
        run.message = (f"{params.display_name}: stopped unhealthy after round {stop.round_index}: "
                       f"{stop.reason} (stop_when_unhealthy)")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep the rounds evaluated so far
        run.status = "interrupted"
        run.message = f"{params.display_name}: interrupted at round {algorithm.round_index}"
    except Diverged as stop:
        last = stop.last_row
        metrics = (f"last finite metrics at round {last['round']}: accuracy "
                   f"{last['test_accuracy']:.4f}, loss {last['test_loss']:.4g}") if last else ""
        run.status = "diverged"
        run.message = (f"{params.display_name}: {stop.reason} by round {stop.round_index}; "
                       f"{metrics}; lower its learning rate / step size "
                       f"({step_size_name(type(params).model_fields)})")
        ctx.rows.append(ctx.stop_row(stop.round_index, algorithm.theta))
    resolved = algorithm.resolved()
    if resolved:  # the parameters' values after the defaults' rules (manifest entry)
        run.extra["resolved"] = resolved
    return run

