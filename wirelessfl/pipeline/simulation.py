"""Run every algorithm of a scenario in its own SimPy world and hand back what was recorded."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import simpy

from wirelessfl.algorithms.base import AlgorithmParams
from wirelessfl.engine.context import RunContext
from wirelessfl.engine.ledger import KIND_INDEX, Ledger
from wirelessfl.engine.network import ENGINES
from wirelessfl.engine.recorder import BecameUnhealthy, Diverged, ReachedTarget
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_rng
from wirelessfl.pipeline.build import World
from wirelessfl.pipeline.checkpoint import (
    Checkpoint,
    check_belongs,
    restore_state,
    save_checkpoint,
)
from wirelessfl.pipeline.fingerprint import algorithm_fingerprint
from wirelessfl.pipeline.state_tree import StateError, kept_ids, skeleton
from wirelessfl.plugins import algorithm_class
from wirelessfl.results.health import step_size_name
from wirelessfl.results.records import device_frame


@dataclass
class AlgorithmRun:
    """One algorithm's results: evaluated rounds, the final ledger, and how it ended."""

    label: str
    params: AlgorithmParams
    rows: list[dict]
    ledger: Ledger
    status: str = "complete"  # or "diverged", "interrupted", "failed" (an exception: ``error``)
    message: str = ""
    error: BaseException | None = None
    # Merged into the algorithm's manifest entry: "resolved" (Algorithm.resolved) when not empty.
    extra: dict = field(default_factory=dict)

    def device_columns(self, world: World) -> dict[str, np.ndarray]:
        """Every devices.parquet column but ``algorithm``, one value per device [N] (vectorised:
        a million devices are arrays, not a million dicts)."""
        led, cell = self.ledger, world.cell
        k = KIND_INDEX
        energy, busy = led.energy_j, led.busy_s
        return {
            "device": np.arange(led.num_devices, dtype=np.int64),
            "device_class": world.device_class_array(),
            "distance_m": np.asarray(cell.distances_m, dtype=float),
            "mean_snr_db": 10 * np.log10(cell.uplink_mean_snr),
            "energy_j": energy.sum(axis=1),
            "energy_compute_j": energy[:, k["compute_forward"]] + energy[:, k["compute_backward"]],
            "energy_uplink_j": energy[:, k["uplink"]],
            "energy_downlink_j": energy[:, k["downlink"]],
            "energy_idle_j": energy[:, k["idle"]],
            "compute_s": busy[:, k["compute_forward"]] + busy[:, k["compute_backward"]],
            "uplink_s": busy[:, k["uplink"]],
            "downlink_s": busy[:, k["downlink"]],
            "idle_s": busy[:, k["idle"]],
            "depleted_at_s": np.asarray(led.depleted_at_s, dtype=float),
            "bits_up": np.asarray(led.bits_up, dtype=float),
            "packets_sent": np.asarray(led.packets_sent, dtype=np.int64),
            "packets_delivered": np.asarray(led.packets_delivered, dtype=np.int64),
            "transmissions": np.asarray(led.transmissions, dtype=np.int64),
            "late_uploads": np.asarray(led.late_uploads, dtype=np.int64),
            "queue_wait_s": np.asarray(led.queue_wait_s, dtype=float),
            "broadcasts_missed": np.asarray(led.broadcasts_missed, dtype=np.int64),
        }

    def device_rows(self, world: World) -> pd.DataFrame:
        """One ``devices.parquet`` row per device (all N; the run writer keeps what
        ``device_records`` says at large N)."""
        return device_frame(self.label, self.device_columns(world))


def run_algorithm(world: World, params: AlgorithmParams,
                  on_round: Callable[[int], None] | None = None, checkpoint_every: int = 0,
                  checkpoint_path: Path | None = None, resume: Checkpoint | None = None
                  ) -> AlgorithmRun:
    """Simulate one algorithm from theta_0 (or from a checkpoint, ``resume``: the header that
    pipeline/checkpoint.read_checkpoint returns) to its last round in a fresh SimPy environment;
    with ``checkpoint_every`` > 0, save the run's state to ``checkpoint_path`` every that many
    rounds.

    A resumed run is built exactly as a fresh one (same constructors, ``setup`` included), in an
    environment at the checkpoint's time, and the checkpoint's state is then put into it
    (pipeline/checkpoint.py): nothing in the file builds objects or chooses code."""
    sc = world.scenario
    if checkpoint_every and sc.engine.mode != "vectorized":
        raise UserError("checkpoints need engine.mode: vectorized (the processes engine keeps "
                        "per-device SimPy processes, which cannot be saved); drop "
                        "--checkpoint-every or set --set engine.mode=vectorized")
    fingerprint = algorithm_fingerprint(sc, params) if checkpoint_every or resume else None
    if resume is not None:
        check_belongs(resume, params.display_name, fingerprint, params.rounds)
    env = simpy.Environment(initial_time=resume.now_s if resume is not None else 0)
    save = None
    if checkpoint_every:
        def save(completed: int) -> None:
            if completed % checkpoint_every == 0 and completed < params.rounds:
                save_checkpoint(checkpoint_path, algorithm, completed, kept, start_graph,
                                fingerprint)

    try:
        algorithm = build_algorithm(world, params, env, on_round, save)
    except UserError:
        raise  # bad input, not this algorithm's failure: one error line (cli.main)
    except Exception as err:  # noqa: BLE001 - this algorithm's failure: the others run on
        run = AlgorithmRun(params.display_name, params, [], Ledger(world.num_devices))
        return _failed(run, err, 0)
    ctx = algorithm.ctx
    kept = _given(world, algorithm)
    start_graph = None
    if checkpoint_every:  # what every checkpoint is checked against (pipeline/state_tree.py)
        try:
            start_graph = skeleton(algorithm, kept)
        except StateError as err:
            raise UserError(f"cannot checkpoint {params.display_name}: {err}; run it without "
                            "--checkpoint-every") from None
    start = 0
    if resume is not None:
        restore_state(resume, algorithm, kept)
        if on_round is not None:
            on_round(resume.completed)
        start = resume.completed
    run = AlgorithmRun(params.display_name, params, ctx.rows, ctx.ledger)
    env.process(algorithm.process(start))
    try:
        env.run()
    except (ReachedTarget, BecameUnhealthy) as stop:
        stopped(run, stop)
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
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - this algorithm's failure: the others run on
        ctx.net.close()
        return _failed(run, err, algorithm.round_index)
    ctx.net.close()  # lazily charged accounts written in, whatever ended the run
    return note_resolved(run, algorithm)


def note_resolved(run: AlgorithmRun, algorithm) -> AlgorithmRun:
    """``run`` with the parameters' values after the defaults' rules (``resolved``, for its
    manifest entry) when there are any."""
    resolved = algorithm.resolved()
    if resolved:
        run.extra["resolved"] = resolved
    return run


def stopped(run: AlgorithmRun, stop: ReachedTarget | BecameUnhealthy) -> None:
    """``run`` ended at an evaluation by a stop rule (stop_at_target, stop_when_unhealthy):
    complete, with the message saying where and why."""
    if isinstance(stop, ReachedTarget):
        run.message = f"{run.label}: stopped at the target after round {stop.round_index}"
    else:
        run.message = (f"{run.label}: stopped unhealthy after round {stop.round_index}: "
                       f"{stop.reason} (stop_when_unhealthy)")


def _failed(run: AlgorithmRun, err: Exception, round_index: int) -> AlgorithmRun:
    """``run`` ended by the exception ``err`` (a bug, a library's error, memory): status
    ``failed``, its rows so far kept, the message (type and text, on one line) and the traceback
    for its manifest entry; pipeline/runner.py records it and runs the other algorithms."""
    said = " ".join(str(err).split())
    run.status, run.error = "failed", err
    run.message = (f"{run.label}: failed at round {round_index}: {type(err).__name__}"
                   + (f": {said[:500]}" if said else ""))
    run.extra["traceback"] = traceback.format_exc()
    return run


def restore_algorithm(world: World, params: AlgorithmParams, saved: Checkpoint):
    """The algorithm of checkpoint ``saved`` as it was after ``saved.completed`` rounds (built
    as a run starts, its state restored), for inspection: ``run_algorithm(resume=...)`` runs
    it on."""
    check_belongs(saved, params.display_name, algorithm_fingerprint(world.scenario, params),
                  params.rounds)
    algorithm = build_algorithm(world, params, simpy.Environment(initial_time=saved.now_s),
                                None, None)
    restore_state(saved, algorithm, _given(world, algorithm))
    return algorithm


def _given(world: World, algorithm) -> set[int]:
    """What a run is given rather than evolves (its environment, problem, callbacks and what
    the World shares between algorithms): neither saved nor restored."""
    ctx = algorithm.ctx
    return kept_ids(ctx.env, ctx.evaluator, ctx.on_round, ctx.on_checkpoint,
                    shared=vars(world).values())


def build_algorithm(world: World, params: AlgorithmParams, env: simpy.Environment,
                    on_round: Callable[[int], None] | None, save: Callable[[int], None] | None,
                    air: RunContext | None = None):
    """The algorithm as a run starts it: a new ledger, network and run context in ``env``, and
    the algorithm's ``setup`` done (also what a resumed run is built as). ``air``: a lane of a
    lockstep group (pipeline/lockstep.py) shares that context's network and ledger."""
    sc = world.scenario
    if air is not None:
        network, ledger = air.net, air.ledger
    else:
        ledger = Ledger(world.num_devices)
        # Every algorithm draws fading from the same stream: common random numbers across
        # methods.
        uplink = world.uplink()
        network = ENGINES[sc.engine.mode](env, ledger, uplink, world.downlink(),
                                          world.compute_model(params.bits),
                                          world.device_power(uplink),
                                          keyed_rng(sc.seed, "fading"),
                                          keyed_rng(sc.seed, "downlink"),
                                          accounting=sc.energy_accounting,
                                          per_device=sc.population.per_device_streams,
                                          seed=sc.seed)
    ctx = RunContext(params.display_name, env, network, ledger, world.evaluator,
                     world.initial(), sc.seed, params.rounds,
                     params.eval_every, on_round, worst_fraction=sc.worst_fraction,
                     on_checkpoint=save,
                     stop_targets=((sc.target_accuracy, sc.target_suboptimality,
                                    sc.target_loss, sc.target_grad_norm_sq,
                                    sc.target_worst_device_accuracy)
                                   if sc.stop_at_target else None),
                     stop_loss_growth=(sc.health.max_loss_growth if sc.stop_when_unhealthy
                                       else None),
                     per_device_streams=sc.population.per_device_streams,
                     accuracy_devices=world.accuracy_devices)
    algorithm = algorithm_class(params.name)(params, ctx)
    algorithm.setup()
    return algorithm

