"""wirelessfl crossover: the boundary against a hand-solved case, its band over the evaluation
seeds against the seeds' hand-solved boundaries, the rate axis bounded by the MCS table, the
re-costing against the simulator itself (the run's own totals at its own point, and a second run
at another throughput and uplink rate), and the command end to end with its error lines."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from tests.conftest import cli as _cli
from wirelessfl.channel.mcs import carried_rate_range_bps
from wirelessfl.cli import main
from wirelessfl.errors import UserError
from wirelessfl.results.records import read_run
from wirelessfl.results.summary import summarize
from wirelessfl.tune.crossover import (
    Cost,
    _setting,
    compute,
    rate_axis,
    row_cost,
    run_costs,
    seed_means,
)

THETA0, RATE0 = 4e9, 10e6


def _cost(label, rounds, devices, compute_s, bits, energy_compute_j, slot_s=1e-12):
    """``rounds`` rounds of ``devices`` devices, each round ``compute_s`` [s] of compute at
    THETA0 and one upload of ``bits`` bits per device; no downlink."""
    return Cost(label=label, compute_s=rounds * compute_s, phases=rounds,
                transmissions=rounds * devices, payload_bits=bits, downlink_s=0.0,
                energy_fixed_j=rounds * devices * energy_compute_j, energy_bs_j=0.0,
                tx_draw_w=0.2, header_bits=0.0, slot_s=slot_s, theta0=THETA0, rate0=RATE0,
                bandwidth_hz=2e6, rounds=rounds)


def test_boundary_is_where_k_times_the_per_round_times_are_equal():
    """Seed 002's Sec. III example: FedSGD uploads d M = 4e5 x 16 = 64e5 bits a round (640 ms at
    10 Mbit/s), DZOFL 16 bits; DZOFL needs k = 100 times the rounds. Per round at throughput
    Theta, compute takes c Theta0 / Theta (DZOFL 4 ms, FedSGD 12 ms at 4e9 MAC/s). By hand,
    k (c_D s + 16 / r) = c_B s + 64e5 / r with s = Theta0 / Theta gives
    Theta* = Theta0 r (k c_D - c_B) / (64e5 - 16 k): DZOFL is faster above Theta*.
    Energy: k (e_D + w 16 / r) < e_B + w 64e5 / r, i.e. r < w (64e5 - 16 k) / (k e_D - e_B)."""
    k, n, c_d, c_b, e_d, e_b, w = 100, 50, 4e-3, 12e-3, 1e-4, 3e-4, 0.2
    ours = _cost("DZOFL", k * 10, n, c_d, 16, e_d)
    other = _cost("FedSGD", 10, n, c_b, 64e5, e_b)
    rate = np.geomspace(1e5, 1e9, 9)
    theta = np.geomspace(1e7, 1e12, 11)
    result = compute({"DZOFL": ours, "FedSGD": other}, {"DZOFL": 1, "FedSGD": 1}, "DZOFL",
                     theta, rate)
    hand = THETA0 * rate * (k * c_d - c_b) / (64e5 - 16 * k)
    got, side = result.boundary["FedSGD"]
    # 1e-12 s slots: a packet's airtime is rounded up by less than one slot (relative 1e-6 here)
    np.testing.assert_allclose(got, hand, rtol=1e-6)
    assert (side == 1).all()
    # the grid agrees with the hand boundary cell by cell
    expected = theta[:, None] > hand[None, :]
    assert (result.wins["time"]["FedSGD"] == expected).all()
    assert expected.any() and not expected.all()
    r_star = w * (64e5 - 16 * k) / (k * e_d - e_b)  # 0.2 x 6398400 / 0.0097 by hand
    assert r_star == pytest.approx(1.31926e8, rel=1e-5)
    energy = result.wins["energy"]["FedSGD"]
    assert (energy == (rate < r_star)[None, :]).all() and energy.any() and not energy.all()
    # the seconds themselves, at the scenario point: k x (4 ms + 1.6 us) vs 12 ms + 640 ms
    assert float(ours.time_s(THETA0, RATE0)) == pytest.approx(1000 * (4e-3 + 16 / 1e7))
    assert float(other.time_s(THETA0, RATE0)) == pytest.approx(10 * (12e-3 + 0.64))


# the hand-solved case above: per round DZOFL 4 ms and 1e-4 J of compute, FedSGD 12 ms and 3e-4 J
K_CASE = {"n": 50, "c_d": 4e-3, "c_b": 12e-3, "e_d": 1e-4, "e_b": 3e-4, "w": 0.2}


def _hand_theta(k, rate, n, c_d, c_b, e_d, e_b, w):
    """Theta* of the case above for DZOFL taking k times FedSGD's rounds (by hand)."""
    return THETA0 * rate * (k * c_d - c_b) / (64e5 - 16 * k)


def _hand_rate(k, n, c_d, c_b, e_d, e_b, w):
    """The rate below which DZOFL spends less device energy (by hand)."""
    return w * (64e5 - 16 * k) / (k * e_d - e_b)


def _seeds(ks):
    """Per evaluation seed, DZOFL taking k x 10 rounds and FedSGD 10 (the case above)."""
    c = K_CASE
    return {"DZOFL": {s: _cost("DZOFL", k * 10, c["n"], c["c_d"], 16, c["e_d"])
                      for s, k in enumerate(ks)},
            "FedSGD": {s: _cost("FedSGD", 10, c["n"], c["c_b"], 64e5, c["e_b"])
                       for s in range(len(ks))}}


def test_band_is_the_seeds_boundaries_around_the_mean_and_collapses_when_they_agree():
    """Seeds needing k = 90, 100 and 110 times FedSGD's rounds: the band is the three seeds'
    hand-solved boundaries' min and max, the mean (k = 100) inside it; three equal seeds give a
    band that is the mean boundary; a seed on which DZOFL is faster at every throughput (k = 2:
    less compute and less radio) opens the band down to 0, one never faster up to inf, and a seed that crosses where the
    means do not still has its band. Energy: the seeds' counts are how
    many of the hand-solved rates r*_k lie above each rate."""
    # half decades, and two rates between the seeds' r*: 1.20e8, 1.32e8 and 1.47e8 bit/s
    rate = np.sort(np.r_[np.geomspace(1e5, 1e9, 9), 1.25e8, 1.4e8])
    theta = np.geomspace(1e7, 1e12, 5)

    def run(ks, method="DZOFL"):
        per_seed = _seeds(ks)
        means, counts = seed_means(per_seed)
        return compute(means, counts, method, theta, rate, per_seed)

    spread = run([90, 100, 110])
    mean, side = spread.boundary["FedSGD"]
    low, high = spread.band["FedSGD"]
    np.testing.assert_allclose(mean, _hand_theta(100, rate, **K_CASE), rtol=1e-6)
    np.testing.assert_allclose(low, _hand_theta(90, rate, **K_CASE), rtol=1e-6)
    np.testing.assert_allclose(high, _hand_theta(110, rate, **K_CASE), rtol=1e-6)
    assert (side == 1).all() and (low < mean).all() and (mean < high).all()
    assert spread.pairs["FedSGD"] == 3
    # FedSGD as the method is faster below the same lines: the seeds disagree at the same places
    turned = run([90, 100, 110], "FedSGD")
    assert (turned.boundary["DZOFL"][1] == -1).all()
    np.testing.assert_allclose(turned.band["DZOFL"], spread.band["FedSGD"], rtol=1e-12)
    stars = [_hand_rate(k, **K_CASE) for k in (90, 100, 110)]
    wins = sum((rate < r).astype(int) for r in stars)
    assert (spread.seed_wins["energy"]["FedSGD"] == wins).all()
    assert set(wins) == {0, 1, 2, 3}  # rates that split the seeds: the count can fail

    same = run([100, 100, 100])
    for edge in same.band["FedSGD"]:
        np.testing.assert_allclose(edge, same.boundary["FedSGD"][0], rtol=1e-12)
    assert set(same.seed_wins["energy"]["FedSGD"]) <= {0, 3}

    opened = run([2, 100, 110])
    low, high = opened.band["FedSGD"]
    assert (low == 0).all()
    np.testing.assert_allclose(high, _hand_theta(110, rate, **K_CASE), rtol=1e-6)
    assert (opened.boundary["FedSGD"][0] < high).all()

    # a seed on which DZOFL is never faster (k = 5e5: its 16-bit uploads outweigh FedSGD's)
    never = run([100, 110, 5e5])
    low, high = never.band["FedSGD"]
    np.testing.assert_allclose(low, _hand_theta(100, rate, **K_CASE), rtol=1e-6)
    assert (high == np.inf).all() and (never.boundary["FedSGD"][1] == 1).all()
    np.testing.assert_allclose(run([100, 110, 5e5], "FedSGD").band["DZOFL"], (low, high),
                               rtol=1e-12)  # there FedSGD is faster everywhere

    # the means never cross (k = 2: DZOFL faster everywhere), one seed does (k = 4)
    lone = run([1, 1, 4])
    assert (lone.boundary["FedSGD"][1] == 2).all() and np.isnan(lone.boundary["FedSGD"][0]).all()
    low, high = lone.band["FedSGD"]
    assert (low == 0).all()
    np.testing.assert_allclose(high, _hand_theta(4, rate, **K_CASE), rtol=1e-6)


def test_rate_axis_is_bounded_by_what_the_mcs_table_carries():
    """3GPP TS 38.214 Table 5.2.2.1-2 (wirelessfl/channel/mcs.py): CQI 1 is 0.1523 bit/s/Hz and
    CQI 15 5.5547, so 2 MHz carries 304,600 to 11,109,400 bit/s (by hand). A range given beyond
    it is refused; the default (the scenario's / 100 to x 100) is clipped to it."""
    assert carried_rate_range_bps(2e6) == pytest.approx((2e6 * 0.1523, 2e6 * 5.5547), rel=1e-12)
    assert carried_rate_range_bps(2e6) == pytest.approx((304_600, 11_109_400), rel=1e-12)
    ref = _cost("DZOFL", 10, 5, 1e-3, 16, 1e-4)  # 2 MHz, r0 = 10 Mbit/s
    assert rate_axis(None, ref) == pytest.approx((304_600, 11_109_400, True))
    assert rate_axis((1e6, 1e7), ref) == (1e6, 1e7, False)
    assert rate_axis((304_600, 1.11094e7), ref)[:2] == (304_600, 1.11094e7)  # the printed edge
    with pytest.raises(UserError, match=r"--rate 1e\+06 2e\+07 goes beyond .* 304600 to "
                                        r"1\.11094e\+07 bit/s"):
        rate_axis((1e6, 2e7), ref)
    far = replace(ref, rate0=1e10)  # 3 decades above what 2 MHz carries
    assert rate_axis(None, far) == pytest.approx((304_600, 11_109_400, True))


def test_a_method_that_missed_the_target_loses_everywhere():
    ours = _cost("DZOFL", 10, 5, 1e-3, 16, 1e-4)
    theta, rate = np.geomspace(1e8, 1e10, 3), np.geomspace(1e5, 1e7, 3)
    won = compute({"DZOFL": ours, "FedSGD": None}, {}, "DZOFL", theta, rate)
    assert won.wins["time"]["all"].all() and won.wins["system"]["all"].all()
    lost = compute({"DZOFL": None, "FedSGD": ours}, {}, "DZOFL", theta, rate)
    assert not lost.wins["time"]["all"].any() and not lost.wins["energy"]["all"].any()


def _run(out, *extra):
    args = ["run", "quickstart", "--quiet", "--no-report", "--threads", "1", "--out", str(out),
            "--set", "population.num_devices=10", "--set", "target_accuracy=0.5",
            "--set", "algorithms.DZOFL.rounds=300", "--set", "algorithms.DZOFL.eval_every=50",
            "--set", "algorithms.DZOFL.alpha0=150",
            "--set", "algorithms.FedSGD.rounds=6", "--set", "algorithms.FedSGD.eval_every=2",
            "--set", "algorithms.FedAvg.rounds=4", "--set", "algorithms.FedAvg.eval_every=1"]
    for item in extra:
        args += ["--set", item]
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The small quickstart at the scenario's point, and again at 1/10 the throughput and 1/8
    the uplink rate (time and energy per round do not depend on what was delivered)."""
    base = tmp_path_factory.mktemp("crossover")
    here = _run(base / "study" / "evaluation" / "runs" / "s0")
    there = _run(base / "other", "energy.throughput_macs_per_s=4e8",
                 "channel.uplink.rate_bps=5e5")
    return base, here, there


def test_recosting_gives_back_the_run_and_predicts_another_setting(runs):
    _, here, there = runs
    costs = run_costs(here)
    a, b = read_run(here), read_run(there)
    table = summarize(a.rounds, 0.5, 10, manifest=a.manifest).set_index("algorithm")
    assert set(costs) == {"DZOFL", "FedSGD", "FedAvg"}
    for label, cost in costs.items():
        assert cost is not None, label
        row = table.loc[label]
        assert float(cost.time_s(4e9, 4e6)) == pytest.approx(row.time_to_target_s, rel=1e-12)
        assert float(cost.energy_j(4e9, 4e6)) == pytest.approx(row.energy_to_target_j,
                                                                rel=1e-12)
        assert float(cost.system_j(4e9, 4e6)) == pytest.approx(row.system_energy_to_target_j,
                                                                rel=1e-12)
    # every recorded row of the first run, re-costed at (4e8 MAC/s, 5e5 bit/s), is the second
    # run's row at the same round: the simulator, not our formula, is the truth here
    setting = _setting(a.manifest, here)
    per_pass = a.manifest["model"]["per_pass"]
    checked = 0
    for (_, ra), (_, rb) in zip(a.rounds.iterrows(), b.rounds.iterrows()):
        assert (ra.algorithm, ra["round"]) == (rb.algorithm, rb["round"])
        if ra["round"] == 0:
            continue
        cost = row_cost(ra, ra.algorithm, per_pass[ra.algorithm], setting, "test")
        for column, got in (("sim_time_s", cost.time_s(4e8, 5e5)),
                            ("energy_j", cost.energy_j(4e8, 5e5)),
                            ("energy_system_j", cost.system_j(4e8, 5e5))):
            assert float(got) == pytest.approx(float(rb[column]), rel=1e-9), (ra.algorithm,
                                                                                column)
        checked += 1
    assert checked >= 10
    # and the recorded point is not the other: the check can fail
    assert float(costs["FedSGD"].time_s(4e8, 5e5)) > 2 * float(costs["FedSGD"].time_s(4e9, 4e6))



def test_recosting_follows_an_earth_base_station_asleep_between_transmissions(tmp_path):
    """Under the EARTH model the base station draws its sleep power whenever it is off air, so
    its energy grows with the time to the target: re-costed at another throughput and rate,
    every row's system energy is the simulator's own at that setting."""
    earth = ("channel.downlink.tx_power_dbm=43", "channel.downlink.bs_power_model=earth")
    here = _run(tmp_path / "here", *earth)
    there = _run(tmp_path / "there", *earth, "energy.throughput_macs_per_s=4e8",
                 "channel.uplink.rate_bps=5e5")
    a, b = read_run(here), read_run(there)
    setting = _setting(a.manifest, here)
    assert setting["bs_sleep_w"] == a.manifest["base_station"]["sleep_w"] > 0
    per_pass = a.manifest["model"]["per_pass"]
    checked = 0
    for (_, ra), (_, rb) in zip(a.rounds.iterrows(), b.rounds.iterrows()):
        if ra["round"] == 0:
            continue
        cost = row_cost(ra, ra.algorithm, per_pass[ra.algorithm], setting, "test")
        assert float(cost.system_j(4e8, 5e5)) == pytest.approx(float(rb.energy_system_j),
                                                               rel=1e-9)
        # the sleep draw is most of the difference: without it the prediction misses
        awake_only = replace(cost, bs_sleep_w=0.0)
        assert float(awake_only.system_j(4e8, 5e5)) < 0.99 * float(rb.energy_system_j)
        checked += 1
    assert checked >= 10


def test_command_writes_the_table_figure_and_marks_the_scenario(runs, capsys, tmp_path):
    base, _, _ = runs
    out = tmp_path / "x"
    # a second evaluation seed, its runs a copy of the first's: paired by seed, the band is
    # the boundary itself
    study = tmp_path / "study"
    shutil.copytree(base / "study", study)
    runs_dir = study / "evaluation" / "runs"
    shutil.copytree(runs_dir / "s0", runs_dir / "s1")
    manifest = json.loads((runs_dir / "s1" / "manifest.json").read_text())
    manifest["seed"] = manifest["seed"] + 1
    (runs_dir / "s1" / "manifest.json").write_text(json.dumps(manifest))
    code, text, err = _cli(capsys, "crossover", study, "--out", out, "--points", "9")
    assert code == 0, err
    assert "DZOFL against FedSGD, FedAvg" in text and "4e+09 MAC/s" in text
    for name in ("crossover_grid.csv", "crossover_boundary.csv", "crossover.json",
                 "crossover.png"):
        assert (out / name).is_file(), name
    grid = pd.read_csv(out / "crossover_grid.csv")
    assert len(grid) == 81
    assert grid.throughput_macs_per_s.min() == pytest.approx(4e7)
    # the default 4e4 to 4e8 bit/s, clipped to what 2 MHz carries (0.1523 and 5.5547 bit/s/Hz)
    assert grid.uplink_rate_bps.min() == pytest.approx(2e6 * 0.1523)
    assert grid.uplink_rate_bps.max() == pytest.approx(2e6 * 5.5547)
    assert "note: the uplink rate axis is 304600 to 1.11094e+07 bit/s" in err
    info = json.loads((out / "crossover.json").read_text())
    assert info["throughput0_macs_per_s"] == 4e9 and info["uplink_rate0_bps"] == 4e6
    assert info["uplink_rate_clipped"] and info["seeds"]["DZOFL"] == 2
    assert set(info["seed_costs"]["DZOFL"]) == {str(manifest["seed"] - 1), str(manifest["seed"])}
    boundary = pd.read_csv(out / "crossover_boundary.csv")
    assert (boundary.seed_pairs == 2).all()
    crossing = boundary.time_boundary_macs_per_s.notna()
    assert crossing.any()
    for edge in ("time_boundary_low_macs_per_s", "time_boundary_high_macs_per_s"):
        np.testing.assert_allclose(boundary[edge][crossing],
                                   boundary.time_boundary_macs_per_s[crossing], rtol=1e-12)
    assert set(boundary.energy_wins_seeds) <= {0, 2}
    # a reproduce folder (the study under tune/) is found too
    shutil.copytree(base / "study", tmp_path / "repro" / "tune")
    code, _, err = _cli(capsys, "crossover", tmp_path / "repro", "--points", "3")
    assert code == 0, err and (tmp_path / "repro" / "crossover" / "crossover.png").is_file()


@pytest.mark.parametrize("edit, args, expected", [
    (None, ["--throughput", "5", "1"], "--throughput needs 0 < LO < HI"),
    (None, ["--method", "ZOO"], "no tuned method labelled 'ZOO'"),
    (None, ["--points", "1"], "--points must be at least 2"),
    (None, ["--rate", "1e5", "1e7"], ("--rate 100000 1e+07 goes beyond the rates the uplink's "
                                      "MCS table carries on its 2e+06 Hz band, 304600 to "
                                      "1.11094e+07 bit/s")),
    ("adaptive", [], "uplink mode 'adaptive' has no one rate to vary"),
    ("empty", [], "no evaluation runs found"),
])
def test_bad_input_is_one_error_line(runs, capsys, tmp_path, edit, args, expected):
    base, _, _ = runs
    study = base / "study"
    if edit is not None:
        study = tmp_path / "study"
        shutil.copytree(base / "study", study)
        run = study / "evaluation" / "runs" / "s0"
        if edit == "empty":
            shutil.rmtree(run)
        else:
            manifest = json.loads((run / "manifest.json").read_text())
            manifest["scenario"]["channel"]["uplink"]["mode"] = edit
            (run / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = _cli(capsys, "crossover", study, "--out", tmp_path / "o", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and expected in err, err


def test_devices_short_of_a_batch_compute_less_and_the_slowest_sets_the_phase(tmp_path):
    """With 75 training samples over 10 devices (7 or 8 each, below the batch of 10) a device's
    pass costs its own batch (learning/minibatch.py), so devices differ in compute time and a
    phase lasts as long as the slowest: the re-costing still predicts, row by row, a second run
    at 1/10 the throughput and 1/8 the rate."""
    short = ("data.max_train_samples=75", "algorithms.DZOFL.batch_size=10",
             "algorithms.FedSGD.batch_size=10", "algorithms.FedAvg.batch_size=10")
    here = _run(tmp_path / "here", *short)
    there = _run(tmp_path / "there", *short, "energy.throughput_macs_per_s=4e8",
                 "channel.uplink.rate_bps=5e5")
    a, b = read_run(here), read_run(there)
    sizes = [sum(counts) for counts in a.manifest["partition"]["label_counts"]]
    setting, per_pass = _setting(a.manifest, here), a.manifest["model"]["per_pass"]
    checked = 0
    for (_, ra), (_, rb) in zip(a.rounds.iterrows(), b.rounds.iterrows()):
        if ra["round"] == 0:
            continue
        cost = row_cost(ra, ra.algorithm, per_pass[ra.algorithm], setting, "test")
        assert float(cost.time_s(4e8, 5e5)) == pytest.approx(float(rb.sim_time_s), rel=1e-9)
        assert float(cost.system_j(4e8, 5e5)) == pytest.approx(float(rb.energy_system_j),
                                                                rel=1e-9)
        checked += 1
    assert checked >= 10
    assert max(sizes) < 10 and len(set(sizes)) > 1  # every device short, and not alike


def test_the_runs_of_an_earlier_choice_set_aside_by_a_retuned_study_are_not_read(tmp_path):
    """A re-tuned study sets the evaluation runs of its earlier choice aside
    (``<run>.replaced-<time>``); the crossover reads the runs the evaluation sweep lists, and
    without a readable sweep.json it still leaves the set-aside folders out."""
    import json

    from wirelessfl.tune.crossover import study_runs

    runs = tmp_path / "evaluation" / "runs"
    for name in ("algorithm=FedAvg_seed=0-aaa", "algorithm=FedAvg_seed=0-bbb.replaced-1",
                 "algorithm=DZOFL_seed=0-ccc"):
        (runs / name).mkdir(parents=True)
        (runs / name / "manifest.json").write_text("{}")
    listed = [{"run": n, "folder": f"runs/{n}"} for n in
              ("algorithm=FedAvg_seed=0-aaa", "algorithm=DZOFL_seed=0-ccc")]
    (tmp_path / "evaluation" / "sweep.json").write_text(json.dumps({"runs": listed[:1]}))
    assert [p.name for p in study_runs(tmp_path)] == ["algorithm=FedAvg_seed=0-aaa"]
    (tmp_path / "evaluation" / "sweep.json").unlink()
    assert [p.name for p in study_runs(tmp_path)] == ["algorithm=DZOFL_seed=0-ccc",
                                                      "algorithm=FedAvg_seed=0-aaa"]
