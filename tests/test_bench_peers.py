"""benchmarks/bench_peers.py (wirelessfl against pfl-research): its cases, scenarios, timing
arithmetic, failure handling and result file, without pfl; the equivalence of the two FedAvg
simulations where pfl is installed (pytest.importorskip).

Truths: the issue's table (issue 22) for the cases; hand-computed index sets, per-round times,
medians and ratios; the scenario schema's resolved values for "perfect channel, float32, E = 5,
b = 10"; a child that sleeps past its limit or fails with a known last line.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "benchmarks" / "bench_peers.py")
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)


def test_the_cases_are_the_issues_table_plus_the_cross_device_populations():
    specs = peers.case_specs()
    names = [s["case"] for s in specs]
    assert len(names) == len(set(names))
    table = {(s["registered"], s["sampled"], s["model"]["name"], s["data"]["name"])
             for s in specs}
    assert table == {
        (50, 50, "mlp", "digits"), (50, 50, "logistic", "digits"),
        (10, 10, "seed002-cnn", "digits28"),
        (100, 100, "mlp", "synthetic"), (1_000, 100, "mlp", "synthetic"),
        (10_000, 100, "mlp", "synthetic"), (100_000, 100, "mlp", "synthetic"),
        (100_000, 1_000, "mlp", "synthetic"), (1_000_000, 100, "mlp", "synthetic"),
        (1_000_000, 1_000, "mlp", "synthetic")}
    assert all(s["rounds"] >= 3 for s in specs)  # round 1 is a warm-up; at least 2 timed
    quick = peers.case_specs(quick=True)
    assert [s["case"] for s in quick] == [
        s["case"] for s in specs if s["registered"] <= peers.QUICK_MAX_DEVICES
        and s.get("d", 0) <= peers.QUICK_MAX_PARAMETERS]
    assert len(quick) == 8


def test_the_model_size_axis_spans_a_thousand_to_ten_million_parameters():
    """d of 64-[hidden]-10 by hand: 64*16+16 + 16*10+10 = 1,210; 64*2048+2048 + 2*(2048*2048+
    2048) + 2048*10+10 = 8,546,314. With mlp_synthetic_n100_k100 (64-64-10, d = 4,810) the axis
    has a point in every decade from 10^3 to 10^7, every one 100 clients all taking part."""
    sizes = [s for s in peers.case_specs() if s["case"].startswith("mlp_size_")]
    assert [s["d"] for s in sizes] == [1_210, 19_210, 76_810, 1_126_410, 8_546_314]
    assert all((s["registered"], s["sampled"]) == (100, 100) for s in sizes)
    assert peers.mlp_parameters(64, (64,), 10) == 4_810
    built = peers.scenario_doc(sizes[0])["model"]
    assert built == {"name": "mlp", "hidden": [16]}


def test_synthetic_data_holds_20_samples_a_device_up_to_the_shared_cap():
    small = peers.synthetic_data(100)
    assert small["max_train_samples"] == 2_000
    assert small["synthetic"]["num_samples"] == math.ceil(2_000 / 0.75) + 4
    large = peers.synthetic_data(1_000_000)
    assert large["max_train_samples"] == 200_000  # shared by the population
    assert large["synthetic"]["num_features"] == 64 and large["synthetic"]["num_classes"] == 10


@pytest.mark.parametrize("spec", peers.case_specs() + [peers.equivalence_spec()],
                         ids=lambda s: s["case"])
def test_every_scenario_is_fedavg_e5_b10_float32_on_a_perfect_channel(spec):
    import wirelessfl as wf

    scenario = wf.load_scenario(peers.scenario_doc(spec))
    params = scenario.algorithms[0]
    assert (params.name, params.local_steps, params.batch_size) == ("fedavg", 5, 10)
    assert (params.server_lr, params.average, params.bits) == (1.0, "uniform", 32)
    assert params.eval_every > params.rounds  # evaluated at rounds 0 and R only
    n = scenario.population.num_devices
    assert max(1, round(params.participation * n)) == spec["sampled"]
    channel = scenario.channel
    assert channel.uplink.mode == "adaptive" and channel.uplink.arq.max_attempts == 1
    assert channel.fading.model == "none" and channel.downlink.loss is False
    assert channel.uplink.deadline_s is None and scenario.energy.battery_j is None


def test_prepare_saves_the_worlds_devices_and_the_wirelessfl_round_is_timed_and_lossless(tmp_path):
    spec = {**peers.equivalence_spec(), "registered": 100, "sampled": 100,
            "data": peers.synthetic_data(100)}
    facts = peers.child_prepare(spec, tmp_path)
    assert facts["samples_per_device"] == [20, 20] and facts["train_samples"] == 2_000
    order, sizes = np.load(tmp_path / "order.npy"), np.load(tmp_path / "sizes.npy")
    assert len(sizes) == 100 and len(order) == 2_000
    assert sorted(order.tolist()) == list(range(2_000))  # disjoint, the whole training set
    assert np.load(tmp_path / "theta0.npy").shape == (facts["d"],)
    assert facts["d"] == 64 * 64 + 64 + 64 * 10 + 10
    # 100 devices x E x (forward + backward = 3 forward MACs) x b x MACs per sample
    assert facts["gflop_per_round"] == pytest.approx(2 * 100 * 5 * 3 * 10 * (64 * 64 + 64 * 10)
                                                     / 1e9)
    result = peers.child_wirelessfl({**spec, "rounds": 3}, threads=1)
    assert result["delivered_fraction"] == 1.0
    assert len(result["round_ms"]) == 2 and result["ms_per_round"] > 0
    assert math.isfinite(result["final_test_loss"])


def test_a_user_with_few_samples_repeats_them_cyclically_up_to_e_times_b():
    order, sizes = np.array([5, 6, 7, 8, 9]), np.array([3, 2])
    offsets = np.cumsum(sizes) - sizes
    assert peers.user_indices(order, offsets, sizes, 0, least=7).tolist() == [5, 6, 7, 5, 6, 7, 5]
    assert peers.user_indices(order, offsets, sizes, 1, least=7).tolist() == [8, 9, 8, 9, 8, 9, 8]
    assert peers.user_indices(order, offsets, sizes, 0, least=2).tolist() == [5, 6, 7]


def test_time_per_round_leaves_round_one_out():
    mean, each = peers.per_round_ms([1.0, 1.5, 2.5])
    assert mean == pytest.approx(750.0) and each == pytest.approx([500.0, 1000.0])
    with pytest.raises(ValueError):
        peers.per_round_ms([1.0])


def test_a_child_past_its_limit_or_failing_is_a_reason_not_a_crash(tmp_path):
    result = tmp_path / "r.json"
    slow = [sys.executable, "-c", "import time; time.sleep(30)"]
    assert peers.run_child(slow, result, timeout_s=1) == (None, "timeout 1 s")
    code = "import sys; print('x', file=sys.stderr); sys.exit('UserError: the last line')"
    failing = [sys.executable, "-c", code]
    assert peers.run_child(failing, result, timeout_s=30) == (None, "UserError: the last line")
    writing = [sys.executable, "-c", f"open({str(result)!r}, 'w').write('{{\"a\": 1}}')"]
    assert peers.run_child(writing, result, timeout_s=30) == ({"a": 1}, None)


def _run(ms, rss, initial=2.3, final=1.0, norm=5.0):
    return {"ms_per_round": ms, "round_ms": [ms], "peak_rss_mb": rss,
            "initial_test_loss": initial, "final_test_loss": final, "final_param_norm": norm,
            "threads": 1}


def test_the_result_file_has_medians_ratio_rates_checks_and_nulls_for_failures():
    spec = peers.case_specs()[0]
    facts = {"gflop_per_round": 0.5}
    ok = peers.compare(spec, facts, {
        "wirelessfl": ([_run(4.0, 400), _run(2.0, 420), _run(3.0, 410)], None),
        "pfl": ([_run(60.0, 300, final=1.1), _run(50.0, 310, final=1.1)], None)})
    assert ok["wirelessfl"]["ms_per_round"] == 3.0 and ok["wirelessfl"]["peak_rss_mb"] == 410
    assert ok["pfl"]["ms_per_round"] == 55.0 and ok["pfl_over_wirelessfl"] == pytest.approx(55 / 3)
    assert ok["achieved_gflops"]["wirelessfl"] == pytest.approx(0.5 / 0.003)
    assert ok["rounds_timed"] == spec["rounds"] - 1
    assert ok["checks"]["initial_loss_match"] and ok["checks"]["final_losses_close"]
    assert ok["checks"]["final_loss_diff_over_initial"] == pytest.approx(0.1 / 2.3)
    far = peers.compare(spec, facts, {"wirelessfl": ([_run(3.0, 400)], None),
                                      "pfl": ([_run(50.0, 300, initial=2.4, final=2.0)], None)})
    assert not far["checks"]["initial_loss_match"] and not far["checks"]["final_losses_close"]
    failed = peers.compare(spec, None, {"wirelessfl": ([], "timeout 600 s"),
                                        "pfl": ([], "no data: prepare: MemoryError")})
    assert failed["wirelessfl"] == {"ms_per_round": None, "peak_rss_mb": None,
                                    "error": "timeout 600 s"}
    assert failed["pfl_over_wirelessfl"] is None and failed["checks"] is None
    assert failed["achieved_gflops"] == {"wirelessfl": None, "pfl": None}

    class Args:
        threads, pfl_threads, repeats, case_timeout, quick = 2, 2, 3, 600.0, False
        simulators = peers.SIMULATORS

    out = peers.summary([ok, failed], None, peak=100.0, args=Args, load_before=0.5)
    json.dumps(out)  # serialisable
    assert set(out) == {"date", "command", "machine", "settings", "matmul_peak_gflops",
                        "equivalence", "cases"}
    assert {"platform", "torch", "pfl", "cpu_count", "threads"} <= set(out["machine"])
    assert out["settings"]["quantization_bits"] == 32 and out["settings"]["local_steps"] == 5
    assert out["cases"][0]["peak_fraction"]["wirelessfl"] == pytest.approx(0.5 / 0.003 / 100)
    assert out["cases"][1]["peak_fraction"] == {"wirelessfl": None, "pfl": None}


def test_equivalence_verdict_needs_all_three_quantities_to_agree():
    row = {"wirelessfl": {**_run(1, 1), "error": None},
           "pfl": {**_run(1, 1, final=1.0 + 1e-6), "error": None}}
    assert peers.equivalence_verdict(row)["passed"]
    row["pfl"]["final_param_norm"] = 5.01
    verdict = peers.equivalence_verdict(row)
    assert not verdict["passed"] and verdict["rel_diffs"]["final_param_norm"] > 1e-3


def test_pfl_and_wirelessfl_compute_the_same_fedavg_on_deterministic_minibatches(tmp_path):
    """With every device holding exactly b samples, all taking part, the two simulators' models
    agree to float32 rounding after 3 rounds (the benchmark's own equivalence check)."""
    pytest.importorskip("pfl")
    spec = peers.equivalence_spec()
    facts = peers.child_prepare(spec, tmp_path)
    (tmp_path / "facts.json").write_text(json.dumps(facts))
    ours = peers.child_wirelessfl(spec, threads=1)
    theirs = peers.child_pfl(spec, tmp_path, threads=1)
    row = {"wirelessfl": {**ours, "error": None}, "pfl": {**theirs, "error": None}}
    verdict = peers.equivalence_verdict(row)
    assert verdict["passed"], verdict
    # and they trained: the loss moved (relative) by over 100 times the tolerance
    moved = abs(ours["final_test_loss"] / ours["initial_test_loss"] - 1)
    assert moved > 100 * peers.EQUIVALENCE_RTOL
