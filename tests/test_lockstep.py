"""Runs in lockstep (pipeline/lockstep.py, algorithms/lanes.py): every lane of a group records
exactly what its run alone records, whichever way it ends (complete, target reached, unhealthy,
diverged), on every engine and random-stream setting; a sweep gives the same run folders with
and without groups; tasks are grouped only where only step sizes differ."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from tests.conftest import runs_in_this_process, small_doc
from wirelessfl.algorithms.lanes import Alone, quantize_each
from wirelessfl.cli import main
from wirelessfl.learning.quantize import quantize_scalars
from wirelessfl.pipeline.lockstep import lanes_per_group, lockstep_key
from wirelessfl.pipeline.runner import run_in_lockstep, run_to_record
from wirelessfl.scenario.loader import resolved_document, scenario_from_document
from wirelessfl.sweep.study import _member_results, lockstep_groups

# (alpha0, gamma0) of the lanes: a healthy one, one that reaches the target (stop_at_target),
# one whose loss grows past the health limit (stop_when_unhealthy: it stops at an evaluation),
# one that diverges to NaN mid-round (runs alone) and the quickstart's own.
LANES = [(2.0, 0.05), (20.0, 0.25), (3e3, 1.0), (1e38, 1.0), (20.0, 0.05)]


def _scenario(alpha0: float, gamma0: float, *overrides: str, **changes):
    dzofl = {"name": "dzofl", "label": f"DZOFL {alpha0:g}/{gamma0:g}", "rounds": 400,
             "eval_every": 20, "alpha0": alpha0, "gamma0": gamma0, "batch_size": 10}
    doc = small_doc(algorithms=[dzofl], population={"num_devices": 12},
                    target_accuracy=0.45, stop_at_target=True, **changes)
    return scenario_from_document(doc, "lockstep.yaml", list(overrides))


def _records(results):
    return [(status, record.rounds, record.devices,
             {k: {f: v for f, v in entry.items() if f != "traceback"}
              for k, entry in record.manifest["algorithms"].items()})
            for status, _, record in results]


def _quiet(_text: str) -> None:
    pass


@pytest.mark.parametrize("overrides", [
    (),
    ("engine.mode=processes",),
    ("population.random_streams=per-device", "algorithms.0.participation=0.5"),
    ("channel.downlink.loss=true", "algorithms.0.scalar_format=fixed",
     "algorithms.0.scalar_range=5"),
], ids=["vectorized", "processes", "per-device-streams", "downlink-loss-fixed-format"])
def test_every_lane_records_what_its_run_alone_records(overrides):
    scenarios = [_scenario(a, g, *overrides, stop_when_unhealthy=True) for a, g in LANES]
    alone = _records([run_to_record(s, None, warn=_quiet) for s in scenarios])
    group = run_in_lockstep(scenarios, [None] * len(scenarios), warns=[_quiet] * len(LANES),
                            extras=[None] * len(LANES))
    grouped = _records(group)
    ended = set()
    for (status, rounds, devices, entry), (g_status, g_rounds, g_devices, g_entry) in zip(
            alone, grouped, strict=True):
        assert g_status == status
        pd.testing.assert_frame_equal(g_rounds, rounds, check_exact=True)
        pd.testing.assert_frame_equal(g_devices, devices, check_exact=True)
        assert g_entry == entry
        (info,) = entry.values()
        ended.add(info["message"].split(": ")[1][:12] if info["status"] == "complete"
                  and info["message"] else info["status"])
    # the lanes end every way a run can: complete, at the target, unhealthy, diverged
    assert {"complete", "stopped at t", "stopped unhe", "diverged"} <= ended, ended


def test_a_lane_that_diverges_leaves_the_others_running():
    """The NaN lane is handed back and run alone; the lanes after it in the group still
    complete their rounds."""
    scenarios = [_scenario(a, g) for a, g in [(1e38, 1.0), (2.0, 0.05)]]
    (bad, _, bad_record), (good, _, good_record) = run_in_lockstep(
        scenarios, [None, None], warns=[_quiet, _quiet], extras=[None, None])
    assert bad == "partial" and good == "complete"
    assert bad_record.rounds["round"].max() < 400 <= good_record.rounds["round"].max()


def test_quantising_lanes_together_gives_each_lanes_own_bits():
    """``quantize_each`` against ``quantize_scalars`` called lane by lane (the float format
    at 8 and 16 bits, the fixed format with clipping), with the health counts."""
    class Health:
        def __init__(self):
            self.counts = []

        def quantized(self, direction, values, clipped=0):
            self.counts.append((direction, values, clipped))

    class Lane:
        def __init__(self, bits):
            self.bits, self.round_index = bits, 0
            self.ctx = type("Ctx", (), {})()
            self.ctx.health = Health()

    generator = torch.Generator().manual_seed(5)
    values = torch.randn(6, 9, generator=generator) * torch.logspace(-3, 3, 9)
    noise = torch.rand(9, generator=generator)
    for bits, scale in [(8, None), (16, None), (6, 10.0)]:
        lanes = [Lane(bits) for _ in range(6)]
        group = type("Group", (), {"lead": lanes[0], "live": lanes})()
        out = quantize_each(group, {id(lane): values[i] for i, lane in enumerate(lanes)},
                            scale, noise)
        for i, lane in enumerate(lanes):
            q, clipped = quantize_scalars(values[i], bits, scale, noise)
            assert torch.equal(out[id(lane)], q)
            assert lane.ctx.health.counts == [("up", 9, int(clipped.sum()))]
        if scale is not None:
            assert any(lane.ctx.health.counts[0][2] for lane in lanes)  # clipping was counted


def test_alone_is_one_lane_that_raises():
    """A run alone lets the exception of its work propagate, as ``round`` did."""
    class Stop(Exception):
        pass

    def fail(_lane):
        raise Stop

    with pytest.raises(Stop):
        Alone(object()).each(fail)


def _document(alpha0: float, seed: int = 0, **changes) -> dict:
    scenario = _scenario(alpha0, 0.05)
    doc = resolved_document(scenario)
    doc["seed"] = seed
    doc["algorithms"][0].update(changes)
    return doc


def test_only_step_sizes_may_differ_within_a_group():
    base = lockstep_key(_document(2.0))
    assert base is not None
    assert lockstep_key(_document(20.0, label="other")) == base  # step size and label
    assert lockstep_key(_document(2.0, v1=0.3, v2=0.3)) == base
    assert lockstep_key(_document(2.0, seed=1)) != base  # another seed: another air
    assert lockstep_key(_document(2.0, batch_size=5)) != base  # other draws and costs
    assert lockstep_key(_document(2.0, rounds=30)) != base
    two = _document(2.0)
    two["algorithms"].append({**two["algorithms"][0], "label": "second"})
    assert lockstep_key(two) is None  # several algorithms: each runs in its own world
    fedsgd = _document(2.0)
    fedsgd["algorithms"] = [{"name": "fedsgd", "lr": 0.1}]
    assert lockstep_key(fedsgd) is None  # no lockstep parameters
    gpu = _document(2.0)
    gpu["device"] = "cuda"
    assert lockstep_key(gpu) is None


def test_tasks_are_grouped_by_key_and_split_for_the_workers():
    tasks = [{"run_id": f"a{a}-s{s}", "scenario": _document(a, s)}
             for s in (0, 1) for a in (1.0, 2.0, 3.0, 4.0)]
    tasks.append({"run_id": "fedsgd", "scenario": {**_document(1.0),
                                                  "algorithms": [{"name": "fedsgd"}]}})
    grouped = lockstep_groups(tasks, workers=2)
    groups = [t for t in grouped if "members" in t]
    assert [len(t["members"]) for t in groups] == [4, 4]  # one a seed: two workers busy
    assert grouped[-1]["run_id"] == "fedsgd" and "members" not in grouped[-1]
    split = lockstep_groups(tasks, workers=4)
    assert sorted(len(t["members"]) for t in split if "members" in t) == [2, 2, 2, 2]
    members = sorted(m["run_id"] for t in split if "members" in t for m in t["members"])
    assert members == sorted(t["run_id"] for t in tasks[:-1])  # each run once
    lone = lockstep_groups(tasks[:1] + tasks[4:5], workers=2)  # one run per seed: no group
    assert all("members" not in t for t in lone)


def test_a_group_lost_whole_is_a_failure_of_each_member():
    members = {"a": [{"run_id": "a"}, {"run_id": "b"}]}
    lost = {"run_id": "a", "status": "failed", "files": {}, "wall_s": 4.0, "cpu_s": 2.0,
            "message": "worker lost"}
    out = list(_member_results(lost, members))
    assert [r["run_id"] for r in out] == ["a", "b"]
    assert all(r["status"] == "failed" and r["wall_s"] == 2.0 for r in out)
    assert list(_member_results({"run_id": "c", "status": "complete"}, members)) == [
        {"run_id": "c", "status": "complete"}]


def test_lanes_per_group_bounds_the_lanes_memory():
    assert lanes_per_group(650) > 1000
    assert lanes_per_group(11_000_000) == 2
    assert lanes_per_group(1_000_000) * 3 * 4 * 1_000_000 <= 256 * 2**20


def test_a_sweep_gives_the_same_run_folders_in_lockstep(tmp_path):
    """The same sweep (4 step sizes x 2 seeds, the lanes ending in every way) with and
    without lockstep groups: the same runs table statuses and the same run folders."""
    import yaml

    doc = small_doc(algorithms=[{"name": "dzofl", "label": "DZOFL", "rounds": 200,
                                 "eval_every": 20, "gamma0": 0.25}],
                    population={"num_devices": 12}, target_accuracy=0.45, stop_at_target=True)
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(doc))
    sweep = {"scenario": "base.yaml", "grid": {"algorithms.DZOFL.alpha0": [2.0, 20.0, 1e38]},
             "seeds": [0, 1]}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(sweep))
    outs = {}
    for lockstep in (False, True):
        out = tmp_path / f"out-{lockstep}"
        with runs_in_this_process():
            assert main(["sweep", str(tmp_path / "study.yaml"), "--out", str(out),
                         "--workers", "2", "--quiet", "--no-compare"]
                        + ([] if lockstep else ["--no-lockstep"])) in (0, 1)
        outs[lockstep] = out
    tables = [pd.read_csv(out / "runs.csv").set_index("run").sort_index() for out in outs.values()]
    assert tables[0]["status"].equals(tables[1]["status"])
    assert set(tables[0]["status"]) == {"complete", "partial"}  # the NaN lane diverged
    for run in tables[0].index:
        for name in ("rounds.parquet", "devices.parquet"):
            frames = [pd.read_parquet(out / "runs" / run / name) for out in outs.values()]
            pd.testing.assert_frame_equal(*frames, check_exact=True)
    # a group's wall time is shared equally by its runs (one group a seed here)
    grouped = tables[1]
    assert (grouped.groupby("seed")["wall_s"].nunique() == 1).all()
    assert (tables[0].groupby("seed")["wall_s"].nunique() > 1).all()
