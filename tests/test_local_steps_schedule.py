"""FedAvg, FedProx and SCAFFOLD under ``local_steps_schedule: zo-hfl`` run ZO-HFL's local steps:
2 min(max_local_steps, ceil(tau sqrt(r+1))) in round r, the same total as ZO-HFL's two solves of
H_r (zo_hfl.md 4.3 and A12). Checked against counts worked out by hand, the rounds table's
``local_steps``, the energy model's per-step compute time, and the default fixed schedule's
tables and resolved document, which the schedule leaves as they were."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import cli, record_collects, small_doc, small_scenario, write_yaml
from wirelessfl.algorithms.fedavg import FedAvgParams
from wirelessfl.engine.ledger import KIND_INDEX
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.scenario.loader import resolved_document, scenario_from_document

RELIABLE = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}}
# tau = 2, R = 5 by hand: 2 sqrt(r+1) = 2, 2.83, 3.46, 4, 4.47, so H = 2, 3, 4, 4, 5 (sum 18)
# and two solves a round: 36 local steps. With the cap 3: H = 2, 3, 3, 3, 3 (sum 14): 28.
HAND = {None: ([2, 3, 4, 4, 5], 36), 3: ([2, 3, 3, 3, 3], 28)}
BASELINES = ("fedavg", "fedprox", "scaffold")


def _schedule(cap):
    extra = {} if cap is None else {"max_local_steps": cap}
    return {"local_steps_schedule": "zo-hfl", "tau": 2, **extra}


def _last_local_steps(run) -> float:
    return run.rows[-1]["local_steps"]


@pytest.mark.parametrize("cap", list(HAND))
def test_the_schedule_is_zo_hfls_two_solves_worked_out_by_hand(cap):
    h, total = HAND[cap]
    params = FedAvgParams(name="fedavg", rounds=5, **_schedule(cap))
    assert [params.round_steps(r) for r in range(5)] == [2 * x for x in h]
    assert sum(params.round_steps(r) for r in range(5)) == total


@pytest.mark.parametrize("cap", list(HAND))
def test_every_baseline_runs_zo_hfls_total_local_steps(cap):
    """The rounds table's cumulative ``local_steps`` after R = 5 rounds: ZO-HFL's 2 sum_r H_r
    and each baseline's sum_r E_r are the hand-computed total."""
    total = HAND[cap][1]
    zo = {"name": "zo-hfl", "rounds": 5, "eval_every": 5, "tau": 2,
          **({} if cap is None else {"max_local_steps": cap})}
    algorithms = [zo] + [{"name": name, "rounds": 5, "eval_every": 5, **_schedule(cap)}
                         for name in BASELINES]
    sc = small_scenario(["data.server_fraction=0.3"], algorithms=algorithms)  # ZO-HFL's f_1
    for params in sc.algorithms:
        run = run_algorithm(build_world(sc), params)
        assert run.status == "complete", run.message
        assert _last_local_steps(run) == total, params.name


@pytest.mark.parametrize("name", BASELINES)
def test_compute_time_follows_the_schedule_round_by_round(monkeypatch, name):
    """Every device computes every round (full delivery): its compute time in round r is
    E_r (forward + backward) passes at the energy model's per-pass time, so the rounds' times
    are in the ratio of the E_r."""
    sc = scenario_from_document(
        small_doc(channel=RELIABLE, algorithms=[{"name": name, "rounds": 5, "eval_every": 1,
                                                 **_schedule(None)}]), "small.yaml")
    world = build_world(sc)
    passes = record_collects(monkeypatch, lambda alg, result: alg.cost().forward_passes)
    busy = record_collects(monkeypatch, lambda alg, result: (
        alg.ctx.ledger.busy_s[:, KIND_INDEX["compute_forward"]]
        + alg.ctx.ledger.busy_s[:, KIND_INDEX["compute_backward"]]).copy())
    run = run_algorithm(world, sc.algorithms[0])
    steps = [2 * x for x in HAND[None][0]]
    assert passes == steps
    per_round = np.diff(np.vstack([np.zeros_like(busy[0])] + busy), axis=0)  # [R, N]
    cm = world.compute_model(sc.quantization_bits)
    batch = world.evaluator.minibatch_sizes(sc.algorithms[0].batch_size)
    step_s = np.array([cm.forward_time_s(int(b)) + cm.backward_time_s(int(b)) for b in batch])
    np.testing.assert_allclose(per_round, np.outer(steps, step_s), rtol=1e-12)
    ratio = np.divide(steps, steps[0])[:, None] * np.ones(len(batch))
    np.testing.assert_allclose(per_round / per_round[0], ratio, rtol=1e-12)
    assert [row["local_steps"] for row in run.rows[1:]] == list(np.cumsum(steps))


def test_the_fixed_schedule_is_the_run_it_was(tmp_path, capsys):
    """The default key written out changes nothing: the same resolved document (the manifest,
    its fingerprint) and the same rounds table, bit for bit."""
    import pandas as pd

    fedavg = {"name": "fedavg", "rounds": 4, "eval_every": 2, "local_steps": 3}
    plain = small_doc(algorithms=[fedavg])
    keyed = small_doc(algorithms=[{**fedavg, "local_steps_schedule": "fixed"}])
    assert resolved_document(scenario_from_document(plain, "a.yaml")) \
        == resolved_document(scenario_from_document(keyed, "b.yaml"))
    assert "local_steps_schedule" not in resolved_document(
        scenario_from_document(plain, "a.yaml"))["algorithms"][0]
    tables = []
    for label, doc in (("plain", plain), ("keyed", keyed)):
        path = write_yaml(tmp_path, doc, f"{label}.yaml")
        code, _, err = cli(capsys, "run", path, "--out", tmp_path / label, "--quiet",
                           "--no-report")
        assert code == 0, err
        tables.append(pd.read_parquet(tmp_path / label / "rounds.parquet"))
    pd.testing.assert_frame_equal(tables[0], tables[1], check_exact=True)
    assert tables[0]["local_steps"].iloc[-1] == 4 * 3


def test_a_resolved_zo_hfl_schedule_reads_back_as_the_same_run():
    """The manifest records the schedule with ZO-HFL's defaults filled in, and reads back."""
    sc = small_scenario(algorithms=[{"name": "fedprox", "local_steps_schedule": "zo-hfl"}])
    entry = resolved_document(sc)["algorithms"][0]
    assert (entry["local_steps_schedule"], entry["tau"], entry["max_local_steps"]) \
        == ("zo-hfl", 20.0, 1000)
    again = scenario_from_document(resolved_document(sc), "manifest.json").algorithms[0]
    assert [again.round_steps(r) for r in range(3)] == [40, 2 * 29, 2 * 35]


def _one_error(code, err) -> str:
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize(("override", "words"), [
    ("algorithms.FedAvg.tau=2", "tau belongs to local_steps_schedule: zo-hfl"),
    ("algorithms.FedAvg.max_local_steps=9", "max_local_steps belongs to local_steps_schedule"),
    ("algorithms.FedAvg.local_steps_schedule=growing", "'fixed' or 'zo-hfl'"),
])
def test_a_bad_schedule_is_one_error_line(capsys, tmp_path, override, words):
    doc = small_doc(algorithms=[{"name": "fedavg", "label": "FedAvg", "local_steps": 3}])
    path = write_yaml(tmp_path, doc)
    message = _one_error(*cli(capsys, "validate", path, "--set", override)[::2])
    assert words in message, message


@pytest.mark.parametrize(("entry", "words"), [
    ({"local_steps": 3}, "local_steps = 3 is the fixed schedule's E"),
    ({"tau": 0}, "greater than 0"),
    ({"max_local_steps": 0}, "greater than 0"),
])
def test_a_bad_zo_hfl_schedule_is_one_error_line(capsys, tmp_path, entry, words):
    doc = small_doc(algorithms=[{"name": "scaffold", "local_steps_schedule": "zo-hfl", **entry}])
    message = _one_error(*cli(capsys, "validate", write_yaml(tmp_path, doc))[::2])
    assert words in message, message
