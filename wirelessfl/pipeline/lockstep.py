"""Runs in lockstep: the scenarios of a study that differ only in one algorithm's
``lockstep_parameters`` (step sizes; algorithms/lanes.py), simulated as one group in one world,
and each recorded as the run it would have been alone.

Why: a tuning grid of DZOFL step sizes on one seed repeats the same radio simulation, the same
participants, minibatches, Phi_k and quantiser noise for every configuration; in lockstep they
are simulated once and only each lane's own arithmetic runs per lane (measured:
benchmarks/bench_lockstep.py, benchmarks/README.md).

Same records: a lane's learning arithmetic is its run's alone, and the air, clock and ledger
it shares do not depend on theta. A lane that ends at an evaluation (target reached, loss grown
past the health limit) leaves with a copy of the ledger as it stood, as a run alone stops
there; a lane ended by anything else (diverged mid-round, failed), or every lane left when the
shared work fails, is returned as None: its caller runs it alone, so its record is exactly the
run's (tests/test_lockstep.py compares every lane with its run alone).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import simpy

from wirelessfl.algorithms.base import Algorithm
from wirelessfl.engine.recorder import BecameUnhealthy, ReachedTarget
from wirelessfl.pipeline.build import World
from wirelessfl.pipeline.simulation import AlgorithmRun, build_algorithm, note_resolved, stopped
from wirelessfl.plugins import algorithm_class
from wirelessfl.scenario.schema import Scenario

# What a group's lanes may hold beyond one run's memory (checked alone, pipeline/memory.py):
# each lane's theta and, during an iteration, its two perturbed copies, float32 [D].
LANE_BYTES = 256 * 2**20
LANE_COPIES = 3


def lanes_per_group(d: int) -> int:
    """The most lanes one group runs for a model of ``d`` parameters (at least two: a group of
    two already shares the air once instead of twice)."""
    return max(2, LANE_BYTES // (LANE_COPIES * 4 * max(d, 1)))


def lockstep_key(document: dict) -> str | None:
    """What runs that may share a group have in common: the resolved scenario ``document``
    with its one algorithm's ``lockstep_parameters`` and label left out (JSON text); None when
    the scenario cannot run in lockstep (several algorithms, one without lockstep parameters,
    a run on a GPU)."""
    algorithms = document.get("algorithms") or []
    if len(algorithms) != 1 or not isinstance(algorithms[0], dict):
        return None
    try:
        cls = algorithm_class(algorithms[0].get("name", ""))
    except Exception:  # noqa: BLE001 - an unknown name: the run alone says what is wrong
        return None
    if not cls.lockstep_parameters or str(document.get("device", "cpu")) != "cpu":
        return None
    shared = {k: v for k, v in algorithms[0].items()
              if k not in cls.lockstep_parameters and k != "label"}
    return json.dumps({**document, "algorithms": [shared]}, sort_keys=True, default=str)


class Lockstep:
    """The lanes of one group as ``lanes_round`` sees them (algorithms/lanes.py ``Lanes``) and
    their driver: the round loop of ``Algorithm.process`` for every live lane, with the lead's
    air. ``runs``: each lane's finished run by index (None: to be run alone)."""

    def __init__(self, lanes: list[Algorithm]):
        self.lanes = lanes
        self.lead = lanes[0]
        self.live = list(lanes)
        self.runs: list[AlgorithmRun | None] = [None] * len(lanes)

    def each(self, work: Callable[[Algorithm], None]) -> None:
        for lane in list(self.live):
            try:
                work(lane)
            except (ReachedTarget, BecameUnhealthy) as stop:
                self.live.remove(lane)
                self.lead.ctx.net.close()  # accounts up to now (a no-op after the snapshot)
                run = self._run(lane, copy.deepcopy(self.lead.ctx.ledger))
                stopped(run, stop)
                self.runs[self.lanes.index(lane)] = run
            except Exception:  # noqa: BLE001 - diverged or failed: run alone, recorded exactly
                self.live.remove(lane)

    def collect(self, cost, payload):
        result = yield from self.lead.collect(cost, payload)
        for lane in self.live:
            if lane is not self.lead:
                lane.ctx.health.collected(result.active, result.delivered)
        return result

    def broadcast(self, payload):
        return (yield from self.lead.broadcast(payload))

    def process(self):
        """``Algorithm.process`` from round 0 for every live lane (no checkpoints)."""
        self.each(lambda lane: lane.ctx.end_round(0, lane.theta))
        for k in range(self.lead.params.rounds):
            if not self.live:
                return
            # the lead drives the air even after its own run ended (its log is no longer read)
            for lane in {id(a): a for a in [self.lead, *self.live]}.values():
                lane.begin_round(k)
            yield from self.lead.resync()
            yield from self.lead.lanes_round(self, k)
            self.each(lambda lane, k=k: lane.finish_round(k))

    @staticmethod
    def _run(lane: Algorithm, ledger) -> AlgorithmRun:
        return note_resolved(AlgorithmRun(lane.params.display_name, lane.params, lane.ctx.rows,
                                          ledger), lane)


def run_lockstep(worlds: list[World], on_round: Callable[[int], None] | None = None
                 ) -> list[AlgorithmRun | None]:
    """Each world's one algorithm, in lockstep (the worlds: one built world, its scenario
    swapped for each lane's; ``lockstep_key`` equal); a lane returned as None is to be run
    alone (``run_algorithm``). ``on_round``: the lead's rounds, for a progress bar."""
    env = simpy.Environment()
    lead = build_algorithm(worlds[0], worlds[0].scenario.algorithms[0], env, on_round, None)
    lanes = [lead] + [build_algorithm(world, world.scenario.algorithms[0], env, None, None,
                                      air=lead.ctx) for world in worlds[1:]]
    group = Lockstep(lanes)
    env.process(group.process())
    try:
        env.run()
    except Exception:  # noqa: BLE001 - the shared work failed: every live lane runs alone
        return group.runs
    lead.ctx.net.close()
    for lane in group.live:
        group.runs[lanes.index(lane)] = group._run(lane, lead.ctx.ledger)
    return group.runs


def lane_world(world: World, scenario: Scenario) -> World:
    """``world`` for another lane of its group: the same cell, data and problem, with that
    lane's scenario (its algorithm's parameters and label)."""
    other = copy.copy(world)
    other.scenario = scenario
    return other
