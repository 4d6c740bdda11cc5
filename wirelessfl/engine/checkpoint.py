"""Checkpoints of one algorithm's run at a round boundary, and the run resumed from one.

What a checkpoint holds: the algorithm object with everything it reaches (theta and its own
state: models, control variates, momenta, trackers, participation and resync bookkeeping), the
run context (rows recorded so far, counters), the ledger, the network (random streams, fading
and scheduler state, its accounting clock) and the simulated time. What it does not hold, and
how the resumed run gets it back: the SimPy environment (generators cannot be pickled; a new one
starts at the saved time, and the base-station process restarts at the next round, which is
exact because between rounds no other event is pending in the vectorized engine), the learning
problem (rebuilt from the scenario, it holds data, not run state) and the progress callback.
Files are written atomically, so a run killed while writing keeps the previous checkpoint.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import simpy

from wirelessfl.errors import UserError

CHECKPOINT_NAME = "checkpoint.pkl"
FORMAT = 4  # 2: the run context holds the health counters; 3: the ledger the base station's;
# 4: algorithms' resolved parameters, ZO-HFL/FGDRO/FedNest state, stop_when_unhealthy


class _Pickler(pickle.Pickler):
    """Pickles a run, leaving the environment, the problem and the callback as references."""

    def __init__(self, file, external: dict[str, object]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._ids = {id(obj): key for key, obj in external.items() if obj is not None}

    def persistent_id(self, obj):
        return self._ids.get(id(obj))


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, external: dict[str, object]):
        super().__init__(file)
        self._external = external

    def persistent_load(self, key):
        return self._external[key]


def save_checkpoint(path: Path, algorithm, completed: int) -> None:
    """Write ``algorithm``'s run after ``completed`` rounds to ``path`` (atomically)."""
    from wirelessfl.results.records import atomic_write

    ctx = algorithm.ctx
    buffer = io.BytesIO()
    external = {"env": ctx.env, "evaluator": ctx.evaluator, "on_round": ctx.on_round,
                "on_checkpoint": ctx.on_checkpoint}
    _Pickler(buffer, external).dump({"algorithm": algorithm})
    state = {"format": FORMAT, "label": ctx.algorithm, "completed": completed,
             "now_s": float(ctx.env.now), "blob": buffer.getvalue()}
    atomic_write(Path(path), lambda tmp: Path(tmp).write_bytes(pickle.dumps(state)))


def read_checkpoint(path: Path) -> dict | None:
    """The checkpoint's header and state, or None when there is none."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        state = pickle.loads(path.read_bytes())
    except Exception as err:  # noqa: BLE001 - a damaged file is the user's to remove
        raise UserError(f"{path}: unreadable checkpoint ({type(err).__name__}); delete it to "
                        "rerun the interrupted algorithm from its start") from None
    if state.get("format") != FORMAT:
        raise UserError(f"{path}: checkpoint format {state.get('format')} is not {FORMAT} "
                        "(written by another version); delete it to rerun from the start")
    return state


def restore_algorithm(state: dict, evaluator, on_round, on_checkpoint):
    """(algorithm, env): the checkpointed run in a new environment at the saved time."""
    env = simpy.Environment(initial_time=state["now_s"])
    external = {"env": env, "evaluator": evaluator, "on_round": on_round,
                "on_checkpoint": on_checkpoint}
    algorithm = _Unpickler(io.BytesIO(state["blob"]), external).load()["algorithm"]
    return algorithm, env
