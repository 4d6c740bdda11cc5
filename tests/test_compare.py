"""Comparison across seeds: the t-based 95 % interval against hand-computed values, seeds that
never reach the target counted (not averaged in), configurations told apart by their keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wirelessfl.report.compare_plots import draw_comparison, pareto_indices
from wirelessfl.results.compare import compare_records, format_comparison, mean_ci
from wirelessfl.results.records import RunRecord

# Student t quantiles t_{0.975, dof} from a printed table (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
T975 = {1: 12.706, 3: 3.182}


def test_mean_ci_matches_the_hand_computed_interval():
    mean, half, n = mean_ci([0.2, 0.4, 0.3, 0.5])
    # mean 0.35; s^2 = (0.0225 + 0.0025 + 0.0025 + 0.0225) / 3 = 0.05 / 3; s = 0.129099
    assert n == 4 and mean == pytest.approx(0.35)
    assert half == pytest.approx(T975[3] * 0.129099 / 2, rel=2e-4)  # 0.20542
    assert mean_ci([3.0])[1] != mean_ci([3.0])[1]  # one seed: no interval (NaN)
    assert mean_ci([np.nan, 2.0, 2.0]) == (2.0, 0.0, 2)  # NaN (not reached) is left out


def _record(seed: int, power: float, accuracies: list[float], energies: list[float]) -> RunRecord:
    n = len(accuracies)
    rounds = pd.DataFrame({
        "algorithm": "FedAvg", "round": range(n), "sim_time_s": np.arange(n) * 0.5,
        "energy_j": energies, "energy_compute_j": np.array(energies) / 2,
        "energy_uplink_j": np.array(energies) / 2, "energy_downlink_j": 0.0,
        "energy_idle_j": 0.0, "bits_up": 100.0, "delivered_fraction": 1.0,
        "test_accuracy": accuracies})
    scenario = {"name": "toy", "seed": seed, "target_accuracy": 0.8,
                "population": {"num_devices": 2}, "channel": {"uplink": {"tx_power_dbm": power}},
                "algorithms": [{"name": "fedavg", "label": "FedAvg", "lr": 0.1}]}
    return RunRecord(Path(f"/runs/{power}-{seed}"), rounds, pd.DataFrame(),
                     {"seed": seed, "scenario": scenario, "status": "complete"})


def _comparison():
    return compare_records([
        # power 10: seeds 0 and 1 reach 0.8 at 1 J and 2 J; seed 2 never does (ends at 0.7)
        _record(0, 10, [0.1, 0.85, 0.9], [0.0, 1.0, 3.0]),
        _record(1, 10, [0.1, 0.5, 0.8], [0.0, 1.0, 2.0]),
        _record(2, 10, [0.1, 0.5, 0.7], [0.0, 1.0, 2.0]),
        # power 20: both seeds reach it, at 4 J and 6 J
        _record(0, 20, [0.1, 0.8, 0.9], [0.0, 4.0, 8.0]),
        _record(1, 20, [0.1, 0.5, 0.8], [0.0, 3.0, 6.0]),
    ])


def test_configurations_count_the_seeds_that_reached_the_target():
    comp = _comparison()
    assert comp.keys == ["channel.uplink.tx_power_dbm"]
    table = comp.table.set_index("channel.uplink.tx_power_dbm")
    low, high = table.loc[10], table.loc[20]
    assert (low.seeds, low.reached) == (3, 2)
    assert low.energy_to_target_j == pytest.approx(1.5)  # (1 + 2) / 2: seed 2 is not averaged
    # s = 0.7071, n = 2: half-width t_{0.975,1} * 0.7071 / sqrt(2) = 12.706 * 0.5
    assert low.energy_to_target_j_ci95 == pytest.approx(T975[1] * 0.5, rel=1e-4)
    assert low.time_to_target_s == pytest.approx(0.75)  # 0.5 s and 1.0 s
    assert low.final_accuracy == pytest.approx((0.9 + 0.8 + 0.7) / 3)  # over all seeds
    assert (high.seeds, high.reached, high.energy_to_target_j) == (2, 2, pytest.approx(5.0))
    text = format_comparison(comp)
    assert "2/3" in text and "2/2" in text and "1.5 ± 6.353" in text


def test_comparison_figures_are_drawn(tmp_path):
    paths = draw_comparison(_comparison(), tmp_path)
    assert [p.name for p in paths] == ["compare_accuracy_vs_energy.png",
                                       "compare_accuracy_vs_time.png",
                                       "compare_energy_to_target.png", "compare_pareto.png"]
    assert all(p.stat().st_size > 5000 for p in paths)


def test_runs_without_accuracy_or_target_get_no_empty_figures(tmp_path):
    """A multi-sequence problem records no accuracy and may reach no target: none of the four
    figures has anything to draw, so none is written (they were drawn as empty axes)."""
    records = [_record(seed, 10, [np.nan] * 3, [0.0, 1.0, 2.0]) for seed in (0, 1)]
    assert draw_comparison(compare_records(records), tmp_path) == []
    assert not list(tmp_path.glob("*.png"))
    # accuracy recorded but the target never reached: the accuracy figures, no energy one
    records = [_record(seed, 10, [0.1, 0.5, 0.6], [0.0, 1.0, 2.0]) for seed in (0, 1)]
    names = [p.name for p in draw_comparison(compare_records(records), tmp_path)]
    assert names == ["compare_accuracy_vs_energy.png", "compare_accuracy_vs_time.png",
                     "compare_pareto.png"]


def test_pareto_front_keeps_only_undominated_points():
    energy = np.array([1.0, 2.0, 3.0, 4.0, 2.0, np.nan])
    accuracy = np.array([0.5, 0.7, 0.6, 0.9, 0.7, 0.99])
    # 2 (3 J, 0.6) is beaten by 1 (2 J, 0.7); 1 and 4 tie (neither beats the other); NaN is out
    assert pareto_indices(energy, accuracy) == [0, 1, 4, 3]


def test_a_repeated_scenario_and_seed_counts_once():
    """A copy of seed 0's run at power 10 (another folder, another scenario name: the same
    simulation) is left out with a warning: the configuration keeps its 3 seeds and the
    hand-computed interval of test_configurations_count_the_seeds_that_reached_the_target."""
    copy = _record(0, 10, [0.1, 0.85, 0.9], [0.0, 1.0, 3.0])
    copy.path = Path("/elsewhere/copy")
    copy.manifest["scenario"]["name"] = "toy-copy"
    comp = compare_records([*_comparison().records, copy])
    low = comp.table.set_index("channel.uplink.tx_power_dbm").loc[10]
    assert (low.seeds, low.reached) == (3, 2)
    assert low.energy_to_target_j_ci95 == pytest.approx(T975[1] * 0.5, rel=1e-4)
    assert len(comp.runs) == 5 and "/elsewhere/copy" not in set(comp.runs.run)
    assert comp.warnings == [("/elsewhere/copy: FedAvg with seed 0 repeats /runs/10-0 (the "
                              "same scenario and seed); counted once")]
    # two identical seeds alone: one seed, no interval (before: n = 2 and a zero-width one)
    alone = compare_records([_record(0, 10, [0.1, 0.9], [0.0, 1.0]),
                             _record(0, 10, [0.1, 0.9], [0.0, 1.0])])
    assert alone.table.seeds.tolist() == [1]
    assert np.isnan(alone.table.energy_j_ci95.iloc[0])


def test_a_folder_given_twice_is_refused(tmp_path):
    from wirelessfl.errors import UserError
    from wirelessfl.results.compare import run_folders

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    assert run_folders([run]) == [run]
    with pytest.raises(UserError, match="this run folder is given twice; give each folder once"):
        run_folders([run, tmp_path / "." / "run"])


@pytest.mark.parametrize("manifest", ["[]", '{"runs": [1]}', '{"runs": [{"status": "complete"}]}'])
def test_a_damaged_sweep_manifest_is_one_error(tmp_path, manifest):
    from wirelessfl.errors import UserError
    from wirelessfl.results.compare import run_folders

    (tmp_path / "sweep.json").write_text(manifest)
    with pytest.raises(UserError, match="sweep.json: cannot read the sweep manifest"):
        run_folders([tmp_path])
