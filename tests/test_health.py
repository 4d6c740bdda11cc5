"""Run health (DESIGN.md section 7): the counters recorded every evaluated round, non-finite
uploads stopping a run as diverged, and the verdict in the summary, the manifest and the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import algorithm_scenario, small_scenario
from wirelessfl.cli import main
from wirelessfl.engine.context import RunContext
from wirelessfl.engine.network import VectorNetwork
from wirelessfl.engine.recorder import Diverged
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.problems.classifier import BatchedEvaluator
from wirelessfl.results.health import NOT_RECORDED, assess
from wirelessfl.results.summary import summarize
from wirelessfl.scenario.loader import load_scenario
from wirelessfl.scenario.schema import HealthConfig

ALL_DELIVERED = ["channel=seed002-pinned", "channel.uplink.delivery_probability=1.0"]


def _spy_collects(monkeypatch) -> list[tuple[np.ndarray, np.ndarray]]:
    """(active, delivered) of every upload phase, as the network reports them."""
    seen = []
    original = VectorNetwork.collect

    def collect(self, cost, payload, active=None):
        result = yield from original(self, cost, payload, active)
        seen.append((np.array(result.active), np.array(result.delivered)))
        return result

    monkeypatch.setattr(VectorNetwork, "collect", collect)
    return seen


def _frame(run) -> pd.DataFrame:
    return pd.DataFrame(run.rows)


def test_seed002_digits28_at_alpha0_400_is_flagged_with_a_hand_counted_clipped_share(
        monkeypatch):
    """The audit's case on the old fixed range [-1, 1] (``scalar_format: fixed``), shortened to
    10 iterations (50 devices: the aggregate's N / |S| factor
    is what makes the steps blow up; with 20 devices nothing clips in 10 iterations). The
    uploaded differences Delta f_i are re-derived from the evaluator's own losses, and the
    clipped count recomputed in numpy: |Delta f_i| > r = 1 over the delivered uploads."""
    sc = load_scenario("seed002-digits28", ["algorithms.DZOFL.rounds=10",
                                            "algorithms.DZOFL.eval_every=5",
                                            "algorithms.DZOFL.scalar_format=fixed",
                                            "algorithms.DZOFL.alpha0=400"])
    assert sc.algorithms[0].alpha0 == 400.0 and sc.population.num_devices == 50
    losses = []
    original = BatchedEvaluator.device_losses

    def device_losses(self, theta, idx):
        out = original(self, theta, idx)
        losses.append(out.double().cpu().numpy())
        return out

    monkeypatch.setattr(BatchedEvaluator, "device_losses", device_losses)
    collects = _spy_collects(monkeypatch)
    run = run_algorithm(build_world(sc), sc.algorithms[0])
    assert run.status == "complete"
    diffs = [plus - minus for plus, minus in zip(losses[::2], losses[1::2], strict=True)]
    # the differences are computed for the delivered devices only (nothing else is aggregated)
    nonempty = [d for _, d in collects if d.any()]
    assert len(collects) == 10 and len(diffs) == len(nonempty)
    assert [len(diff) for diff in diffs] == [int(d.sum()) for d in nonempty]
    sent_up = sum(int(d.sum()) for _, d in collects)
    clipped_up = sum(int((np.abs(diff) > 1.0).sum()) for diff in diffs)
    broadcasts = sum(1 for _, d in collects if d.any())  # one aggregate per non-empty iteration
    rows = _frame(run)
    last = rows.iloc[-1]
    assert (last.quantized_up, last.clipped_up) == (sent_up, clipped_up)
    # |aggregate| <= (N / |S|) |S| r = N r, the broadcast's range: it cannot clip
    assert (last.quantized_down, last.clipped_down) == (broadcasts, 0)
    verdict = assess(rows, run.status, HealthConfig(), type(sc.algorithms[0]).model_fields)
    share = clipped_up / (sent_up + broadcasts)
    assert share > 0.3  # what the audit saw: most uploads clip early on
    assert verdict["clipped_share"] == pytest.approx(share)
    loss = rows.test_loss.to_numpy()
    assert verdict["loss_growth"] == pytest.approx(loss.max() / loss[0]) and loss.max() > 1e6
    assert rows.param_norm.iloc[-1] > 1000 * rows.param_norm.iloc[0]
    assert not verdict["healthy"]
    text = verdict["health"]
    assert f"{100 * share:.1f} % of the quantised values sent clipped" in text
    assert "lower alpha0 (with scalar_format: fixed, or widen scalar_range)" in text
    assert f"test loss grew from {loss[0]:.3g} to {loss.max():.3g} (limit 10x" in text


@pytest.mark.parametrize("bits", [16, 32])
def test_a_diverging_fedavg_stops_at_the_non_finite_upload(bits):
    sc = algorithm_scenario({"name": "fedavg", "rounds": 4, "eval_every": 2, "lr": 1e38,
                             "bits": bits})
    run = run_algorithm(build_world(sc), sc.algorithms[0])
    assert run.status == "diverged"
    assert "uploads became NaN/inf" in run.message and "by round 1" in run.message
    assert "(lr)" in run.message
    rows = _frame(run)
    stop = rows.iloc[-1]  # the stop row: counters up to the stop, no learning metrics
    assert stop["round"] == 1 and np.isnan(stop.test_loss) and stop.nonfinite_uploads > 0
    assert list(rows["round"]) == [0, 1] and np.isfinite(rows.test_loss.iloc[0])
    verdict = assess(rows, run.status)
    assert not verdict["healthy"] and verdict["health"].startswith("diverged (")
    # without the status, the stop row alone marks the divergence
    assert not assess(rows)["healthy"]


def _context_for_checks():
    """A run context with only what ``check_finite`` reads (its counters and rows)."""
    return RunContext("check", None, None, None, None, torch.zeros(1), 0, 1, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_check_finite_finds_exactly_the_non_finite_rows_sent(dtype):
    """Against numpy's elementwise isfinite per row: a NaN or an infinity in a sent row stops
    the run and is counted, in an unsent row it is ignored, and finite values whose sum
    overflows (the check's fast path sums them) or +inf beside -inf (a NaN sum) are told
    apart correctly."""
    big = torch.finfo(dtype).max
    values = torch.ones(6, 5, dtype=dtype)
    values[0, :] = big  # finite, but the sum overflows
    values[1, 2] = math.nan
    values[2, 0], values[2, 1] = math.inf, -math.inf  # the row sums to NaN
    values[4, 4] = -math.inf
    truth = ~np.isfinite(values.numpy()).all(axis=1)
    assert truth.tolist() == [False, True, True, False, True, False]
    for sent in (None, torch.tensor([True, True, False, True, True, True]),
                 torch.tensor([True, False, False, True, False, True])):
        ctx = _context_for_checks()
        expected = truth if sent is None else truth & sent.numpy()
        if not expected.any():
            ctx.check_finite(values, "up", 3, sent)
        else:
            with pytest.raises(Diverged, match=f"uploads became NaN/inf \\({expected.sum()} "):
                ctx.check_finite(values, "up", 3, sent)
        assert ctx.health.nonfinite_uploads == expected.sum()
    ctx = _context_for_checks()
    ctx.check_finite(values[[0, 3, 5]], "down", 3)  # finite (overflowing sum): passes
    for bad in (values[1], values[2:3], torch.tensor(math.nan, dtype=dtype)):
        with pytest.raises(Diverged, match="broadcast aggregate became NaN/inf"):
            ctx.check_finite(bad, "down", 3)
    assert ctx.health.nonfinite_uploads == 0


@pytest.mark.parametrize("algorithm", [
    {"name": "fedprox", "lr": 1e38},  # ended "complete" with a frozen model before
    {"name": "scaffold", "lr": 1e38},
    {"name": "fgdro-kl", "lr": 1e38},  # ended "complete" before
    {"name": "fedmsa", "alpha": 1e30, "beta": 1e30},  # ended "complete" before
])
def test_other_diverging_methods_stop_at_16_bits(algorithm):
    sc = algorithm_scenario({**algorithm, "rounds": 4, "eval_every": 2, "bits": 16})
    run = run_algorithm(build_world(sc), sc.algorithms[0])
    assert run.status == "diverged" and "uploads became NaN/inf" in run.message
    assert _frame(run).nonfinite_uploads.iloc[-1] > 0


def test_a_healthy_quickstart_is_ok_everywhere(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "quickstart", "--out", str(out), "--quiet", "--no-report",
                 "--set", "population.num_devices=10", "--set", "algorithms.DZOFL.rounds=500",
                 "--set", "algorithms.FedSGD.rounds=20", "--set", "algorithms.FedAvg.rounds=6"])
    _, err = capsys.readouterr()
    assert code == 0 and "warning:" not in err
    summary = pd.read_csv(out / "summary.csv")
    assert summary.healthy.all() and (summary.health == "ok").all()
    assert (summary.clipped_share == 0).all() and (summary.final_loss_ratio < 1).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert all(a["health"]["healthy"] and a["health"]["health"] == "ok"
               for a in manifest["algorithms"].values())
    assert main(["report", str(out)]) == 0
    assert "DZOFL: healthy: ok" in capsys.readouterr().out


@pytest.mark.parametrize("bits", [16, 32])
def test_quantised_counts_equal_the_payload_sizes(bits):
    """All uploads delivered: DZOFL sends N scalars up and 1 down per iteration, FedAvg N d
    values up and d down per round, SCAFFOLD twice that; at 32 bits nothing is quantised. The
    ledger's bits (values x M plus a 32-bit scale per vector) confirm the counts."""
    n, rounds = 8, 3
    for name, vectors in (("dzofl", 0), ("fedavg", 1), ("scaffold", 2)):
        sc = algorithm_scenario({"name": name, "rounds": rounds, "eval_every": rounds,
                                 "bits": bits}, ALL_DELIVERED)
        world = build_world(sc)
        run = run_algorithm(world, sc.algorithms[0])
        last = _frame(run).iloc[-1]
        per_round = vectors * world.evaluator.d if vectors else 1
        expected = (n * per_round * rounds, per_round * rounds) if bits < 32 else (0, 0)
        assert (last.quantized_up, last.quantized_down) == expected, name
        assert last.empty_rounds == 0 and last.nonfinite_uploads == 0
        if bits < 32:
            headers = 32 * vectors * n * rounds
            assert last.bits_up == last.quantized_up * bits + headers


def test_every_value_clips_on_a_tiny_range_and_the_health_section_sets_the_limit():
    doc_overrides = [*ALL_DELIVERED, "algorithms.0.scalar_format=fixed",
                     "algorithms.0.scalar_range=1e-9"]
    sc = small_scenario(doc_overrides, algorithms=[{"name": "dzofl", "rounds": 5,
                                                    "eval_every": 5}])
    run = run_algorithm(build_world(sc), sc.algorithms[0])
    last = _frame(run).iloc[-1]
    assert last.clipped_up == last.quantized_up == 8 * 5
    fields = type(sc.algorithms[0]).model_fields
    default = assess(_frame(run), run.status, sc.health, fields)
    assert not default["healthy"] and "clipped" in default["health"]
    relaxed = small_scenario([*doc_overrides, "health.max_clipped_share=1.0",
                              "health.loss_must_fall=false"],
                             algorithms=[{"name": "dzofl", "rounds": 5, "eval_every": 5}])
    assert relaxed.health.max_clipped_share == 1.0
    verdict = assess(_frame(run), run.status, relaxed.health, fields)
    assert verdict["healthy"] and verdict["health"] == "ok"


def test_float_scalars_clip_only_beyond_the_format_s_largest_level(monkeypatch):
    """DZOFL's default scalar format at M = 8 (largest level (2 - 2^-1) 2^31 = 3221225472):
    uploads of +-5e9 and -4e9 clip and are counted, 3.2e9 and small values do not; the
    broadcast aggregate, 8/8 (-3221225472 + Q(3.2e9) + ~6) ~ -2e7, does not. The devices'
    loss differences are set by hand: the + pass returns them, the - pass returns zeros."""
    diffs = [5e9, -5e9, 3.2e9, 1.0, 0.0, -4e9, 2.0, 3.0]
    calls = []

    def device_losses_many(self, thetas, idx):  # DZOFL's passes, one theta each here
        calls.append(None)
        values = diffs if len(calls) % 2 else [0.0] * len(diffs)
        return [torch.tensor(values, dtype=theta.dtype, device=theta.device) for theta in thetas]

    monkeypatch.setattr(BatchedEvaluator, "device_losses_many", device_losses_many)
    rounds = 3
    sc = small_scenario(ALL_DELIVERED, algorithms=[{"name": "dzofl", "rounds": rounds,
                                                    "eval_every": rounds, "bits": 8,
                                                    "alpha0": 1e-12}])
    assert sc.algorithms[0].scalar_format == "float"
    run = run_algorithm(build_world(sc), sc.algorithms[0])
    assert run.status == "complete" and len(calls) == 2 * rounds
    last = _frame(run).iloc[-1]
    largest = (2 - 2**-1) * 2.0**31
    per_round = sum(abs(d) > largest for d in diffs)
    assert per_round == 3
    assert (last.quantized_up, last.clipped_up) == (8 * rounds, per_round * rounds)
    assert (last.quantized_down, last.clipped_down) == (rounds, 0)


def test_loss_limits_from_the_health_section():
    rows = pd.DataFrame({"algorithm": "A", "round": [0, 1, 2], "test_loss": [1.0, 5.0, 0.5],
                         "param_norm": [2.0, 4.0, 6.0]})
    ok = assess(rows, "complete", HealthConfig())
    assert ok["healthy"] and ok["loss_growth"] == 5.0 and ok["final_loss_ratio"] == 0.5
    assert ok["param_norm_growth"] == 3.0 and NOT_RECORDED in ok["health"]
    tight = assess(rows, "complete", HealthConfig(max_loss_growth=4, max_param_norm_growth=2))
    assert "test loss grew from 1 to 5 (limit 4x its start)" in tight["health"]
    assert "the parameter norm grew 3x (limit 2x)" in tight["health"]
    flat = rows.assign(test_loss=[1.0, 0.9, 1.2])
    assert "test loss did not fall (1 at the start, 1.2 at the end)" in assess(flat)["health"]
    assert assess(flat, limits=HealthConfig(loss_must_fall=False))["healthy"]
    # a problem whose loss starts at 0 (a quadratic's f) is judged on f - f*
    quad = rows.assign(test_loss=[0.0, -1.0, -2.0], suboptimality=[3.0, 2.0, 40.0])
    assert "f - f* grew from 3 to 40" in assess(quad)["health"]


def test_a_bad_health_limit_is_one_error_line(capsys):
    assert main(["validate", "quickstart", "--set", "health.max_clipped_share=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "max_clipped_share" in err[0]


def test_empty_rounds_are_counted(monkeypatch):
    sc = small_scenario(["channel=seed002-pinned", "channel.uplink.delivery_probability=0.1",
                         "population.num_devices=2"],
                        algorithms=[{"name": "dzofl", "rounds": 40, "eval_every": 40}])
    collects = _spy_collects(monkeypatch)
    run = run_algorithm(build_world(sc), sc.algorithms[0])
    empty = sum(1 for active, delivered in collects if active.any() and not delivered.any())
    assert 20 < empty < 40  # P(empty) = 0.81
    last = _frame(run).iloc[-1]
    assert last.empty_rounds == empty
    verdict = assess(_frame(run), run.status)
    assert verdict["empty_round_share"] == empty / 40
    assert f"{100 * empty / 40:.1f} % of the rounds delivered no upload (limit 50 %)" in \
        verdict["health"]


def test_summaries_of_old_runs_and_of_diverged_statuses():
    sc = small_scenario(ALL_DELIVERED, algorithms=[{"name": "fedavg", "rounds": 4,
                                                    "eval_every": 2, "local_steps": 2}])
    rows = _frame(run_algorithm(build_world(sc), sc.algorithms[0]))
    old = rows.drop(columns=["param_norm", "quantized_up", "clipped_up", "quantized_down",
                             "clipped_down", "empty_rounds", "nonfinite_uploads"])
    table = summarize(old, 0.5, 8)
    assert table.healthy.all() and table.health.iloc[0] == f"ok ({NOT_RECORDED})"
    assert np.isnan(table.clipped_share.iloc[0])
    manifest = {"algorithms": {"fedavg": {"status": "diverged", "params": {"lr": 0.1}}},
                "scenario": {"health": {"max_clipped_share": 0.5}}}
    flagged = summarize(rows, 0.5, 8, manifest=manifest)
    assert not flagged.healthy.iloc[0] and "lower lr" in flagged.health.iloc[0]
    assert np.isfinite(flagged.final_accuracy).all()


def test_run_warns_once_per_unhealthy_algorithm_and_report_and_compare_show_it(
        tmp_path, scenario_file, capsys):
    from tests.conftest import small_doc
    from wirelessfl.results.compare import compare_records, comparison_cells
    from wirelessfl.results.records import read_run

    algos = [{"name": "fedavg", "rounds": 2, "eval_every": 1, "lr": 1e38, "label": "blows up"},
             {"name": "dzofl", "rounds": 4, "eval_every": 2, "scalar_format": "fixed",
              "scalar_range": 1e-9, "label": "clips"},
             {"name": "fedavg", "rounds": 2, "eval_every": 1, "local_steps": 2, "label": "fine"}]
    out = tmp_path / "run"
    assert main(["run", str(scenario_file(small_doc(algorithms=algos))), "--out", str(out),
                 "--quiet", "--no-report"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("warning: ") and "unhealthy" in line]
    assert len(warnings) == 2
    assert warnings[0].startswith("warning: blows up: unhealthy: diverged (")
    # every upload clips; the broadcast aggregate, on N times the range, does not
    last = pd.read_parquet(out / "rounds.parquet").query("algorithm == 'clips'").iloc[-1]
    share = last.clipped_up / (last.quantized_up + last.quantized_down)
    assert last.clipped_up == last.quantized_up > 0 and last.clipped_down == 0
    assert warnings[1].startswith(f"warning: clips: unhealthy: {100 * share:.1f} % of the "
                                  "quantised values sent clipped")
    assert "lower alpha0 (with scalar_format: fixed, or widen scalar_range)" in warnings[1]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [manifest["algorithms"][a]["health"]["healthy"] for a in ("blows up", "clips", "fine")
            ] == [False, False, True]
    assert main(["report", str(out), "--html"]) == 0
    page = (out / "report.html").read_text()
    assert "<h2>Health</h2>" in page and "clipped at the quantiser&#x27;s range ends" in page
    record = read_run(out)
    other = type(record)(record.path, record.rounds, record.devices,
                         {**record.manifest, "seed": 4,
                          "algorithms": {**record.manifest["algorithms"],
                                         "fine": {**record.manifest["algorithms"]["fine"],
                                                  "status": "diverged"}}})
    table = compare_records([record, other]).table.set_index("algorithm")
    assert table.loc["fine", "unhealthy"] == 1 and table.loc["clips", "unhealthy"] == 2
    cells = comparison_cells(compare_records([record, other]))
    column = cells[0].index("unhealthy")
    assert sorted(row[column] for row in cells[1:]) == ["1/2", "2/2", "2/2"]
