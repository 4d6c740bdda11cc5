"""wirelessfl tune: search spaces, ranking against a recomputation by hand, edge-of-grid warnings,
bad tune files as one error line, and the shipped quickstart tune file end to end on the local
executor and on a Dask LocalCluster with identical results."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.conftest import cli as _cli
from tests.conftest import small_doc, tiny_tune_file
from wirelessfl.tune.objectives import OBJECTIVES
from wirelessfl.tune.select import (
    choice_warnings,
    edge_warnings,
    grid_neighbours,
    summarize_configurations,
)
from wirelessfl.tune.spec import Range

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"



def test_ranges_expand_to_the_grids_a_reader_expects():
    assert Range(log=(1.0, 100.0), num=3).values() == [1.0, 10.0, 100.0]
    assert Range(linear=(0.0, 1.0), num=5).values() == [0.0, 0.25, 0.5, 0.75, 1.0]
    # geomspace(1, 10, 4) = 1, 2.154, 4.642, 10 -> whole numbers 1, 2, 5, 10
    assert Range(log=(1, 10), num=4, integer=True).values() == [1, 2, 5, 10]
    # three significant digits: 10^(-1/2) = 0.316...
    assert Range(log=(0.1, 1.0), num=3).values() == [0.1, 0.316, 1.0]


def _outcomes(rows):
    return pd.DataFrame(rows, columns=["algorithm", "config", "seed", "value", "reached",
                                       "closeness", "healthy", "health"])


def test_ranking_matches_the_rules_worked_by_hand():
    """Six configurations on two seeds, energy to target (smaller is better):
    B (reached both, mean 3) < A (both, mean 5) < C (1 of 2) < E (none, closest 0.8)
    < F (none, 0.7) < D (unhealthy on one seed though cheapest)."""
    nan = math.nan
    rows = []
    spec = {"A": ([5, 5], [True, True], [0.9, 0.9], [True, True]),
            "B": ([2, 4], [True, True], [0.9, 0.9], [True, True]),
            "C": ([1, nan], [True, False], [0.9, 0.5], [True, True]),
            "D": ([1, 1], [True, True], [0.9, 0.9], [True, False]),
            "E": ([nan, nan], [False, False], [0.8, 0.8], [True, True]),
            "F": ([nan, nan], [False, False], [0.7, 0.7], [True, True])}
    for index, (name, (values, reached, near, healthy)) in enumerate(spec.items()):
        for seed in range(2):
            rows.append(["X", index, seed, values[seed], reached[seed], near[seed],
                         healthy[seed], "ok" if healthy[seed] else f"{name} loss grew"])
    table = summarize_configurations(_outcomes(rows), OBJECTIVES["energy_to_target"])
    ranks = dict(zip("ABCDEF", table.sort_values("config")["rank"]))
    assert ranks == {"B": 1, "A": 2, "C": 3, "E": 4, "F": 5, "D": 6}
    best = table[table.chosen].iloc[0]
    assert best.config == 1 and best.value_mean == 3.0
    # a to-target mean over the lucky seeds is not reported (C reached 1 of 2)
    assert math.isnan(table[table.config == 2].value_mean.iloc[0])
    assert table[table.config == 3].health.iloc[0] == "D loss grew"


def test_grid_neighbours_are_one_numeric_step_along_one_parameter():
    """A 3 x 2 grid (alpha0 x gamma0, grid order alpha0-major) and a categorical axis that makes
    no neighbours: worked by hand."""
    spaces = {"alpha0": {"values": [10.0, 20.0, 40.0]}, "gamma0": {"values": [0.1, 0.05]},
              "mode": {"values": ["a"]}}
    grid = [{"alpha0": a, "gamma0": g, "mode": "a"} for a in (10.0, 20.0, 40.0)
            for g in (0.1, 0.05)]
    near = grid_neighbours(grid, spaces)
    # index: 0 (10, .1) 1 (10, .05) 2 (20, .1) 3 (20, .05) 4 (40, .1) 5 (40, .05); gamma0's
    # steps follow the values' order, not the order they were listed in
    assert near == {0: [1, 2], 1: [0, 3], 2: [0, 3, 4], 3: [1, 2, 5], 4: [2, 5], 5: [3, 4]}


def test_stability_margin_backs_off_from_a_neighbour_of_divergence():
    """Steps 1, 2, 4, 8 (one parameter): 8 diverged on a seed, 4 is cheapest but its neighbour
    8 was unhealthy, so with the margin 2 is chosen (its neighbours 1 and 4 were healthy);
    without it 4 is. When every healthy configuration lacks the margin, the choice warns."""
    rows = []
    for config, (value, healthy) in enumerate([(9.0, True), (5.0, True), (3.0, True),
                                               (1.0, False)]):
        for seed in range(2):
            ok = healthy or seed == 0
            rows.append(["X", config, seed, value, True, 0.9, ok, "ok" if ok else "grew"])
    energy = OBJECTIVES["energy_to_target"]
    plain = summarize_configurations(_outcomes(rows), energy)
    assert plain[plain.chosen].config.iloc[0] == 2 and "margin" not in plain
    near = {"X": grid_neighbours([{"step": s} for s in (1, 2, 4, 8)],
                                 {"step": {"values": [1, 2, 4, 8]}})}
    table = summarize_configurations(_outcomes(rows), energy, near)
    assert list(table.margin) == [True, True, False, False]
    assert list(table["rank"]) == [2, 1, 3, 4]  # margin first: 2 (5 J), 1 (9 J); then 4; 8
    assert choice_warnings("X", table[table.chosen].iloc[0], energy) == []
    # only two configurations, the healthy one next to the diverging one: chosen, with a warning
    two = summarize_configurations(_outcomes([r for r in rows if r[1] >= 2]), energy,
                                   {"X": {2: [3], 3: [2]}})
    chosen = two[two.chosen].iloc[0]
    assert chosen.config == 2 and not chosen.margin
    assert "one step from divergence" in choice_warnings("X", chosen, energy)[0]


def test_final_objectives_rank_larger_accuracy_first():
    rows = [["X", c, 0, acc, True, acc, True, "ok"] for c, acc in enumerate([0.7, 0.9, 0.8])]
    table = summarize_configurations(_outcomes(rows), OBJECTIVES["final_accuracy"])
    assert list(table.sort_values("config")["rank"]) == [3, 1, 2]


def test_edge_warnings_only_at_the_ends_of_numeric_grids():
    spaces = {"lr": {"values": [0.1, 0.3, 1.0]}, "local_steps": {"values": [1, 5, 10]},
              "mode": {"values": ["a", "b"]}, "fixed": {"values": [2.0]}}
    warnings = edge_warnings("FedAvg", {"lr": 1.0, "local_steps": 5, "mode": "a", "fixed": 2.0},
                             spaces)
    assert len(warnings) == 1 and "lr = 1 is the largest value tried (0.1 to 1)" in warnings[0]
    low = edge_warnings("FedAvg", {"lr": 0.1, "local_steps": 10, "mode": "b", "fixed": 2.0},
                        spaces)
    assert len(low) == 2 and "smallest" in low[0] and "largest" in low[1]
    assert not edge_warnings("FedAvg", {"lr": 0.3, "local_steps": 5, "mode": "b",
                                        "fixed": 2.0}, spaces)


BASE = {"name": "t", "scenario": "quickstart", "objective": "energy_to_target",
        "tuning_seeds": [1], "evaluation_seeds": [2, 3],
        "search": {"FedSGD": {"lr": [0.1, 0.5]}}}


@pytest.mark.parametrize("change, expected", [
    ({"evaluation_seeds": [1, 2]}, "evaluation_seeds: seeds [1] are also tuning seeds"),
    ({"search": {"FedSDG": {"lr": [0.1]}}}, "search.FedSDG: no algorithm labelled 'FedSDG'"),
    ({"search": {"FedSGD": {"lrr": [0.1]}}}, "search.FedSGD.lrr (value 0.1): not accepted"),
    ({"search": {"FedSGD": {"lr": [-1.0]}}}, "search.FedSGD.lr (value -1.0): not accepted"),
    ({"search": {"FedSGD": {"lr": {"log": [0, 1], "num": 3}}}}, "a log range needs lo > 0"),
    ({"search": {"FedSGD": {"name": ["fedavg"]}}}, "search.FedSGD.name: 'name' names the"),
    ({"search": {}}, "search: empty"),
    ({"objective": "energy"}, "objective: unknown objective 'energy'"),
    ({"set": {"target_accuracy": None}}, "objective: 'energy_to_target' needs a target"),
    ({"evaluation_seeds": [2]}, "evaluation_seeds"),
    ({"seeds": [1]}, "seeds: unknown key"),
])
def test_bad_tune_files_are_one_error_line(tmp_path, capsys, change, expected):
    path = tmp_path / "bad-tune.yaml"
    path.write_text(yaml.safe_dump({**BASE, **change}))
    code, out, err = _cli(capsys, "tune", path, "--out", tmp_path / "out")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and expected in err, err
    assert not (tmp_path / "out").exists()
    code, _, err = _cli(capsys, "validate", path)
    assert code == 2 and expected in err


def test_run_refuses_a_tune_file(capsys):
    code, _, err = _cli(capsys, "run", "quickstart-tune")
    assert code == 2 and "this is a tune file" in err and "wirelessfl tune" in err


def _small_quickstart_tune(tmp_path: Path) -> Path:
    """The shipped quickstart tune file with shorter runs, fewer devices, smaller grids and a
    reachable target (the rest as shipped). FedSGD's lr grid is cut short on purpose: both
    values are far too small, so the larger is chosen and warned about."""
    doc = yaml.safe_load((SCENARIOS / "quickstart-tune.yaml").read_text())
    doc["set"] = {"target_accuracy": 0.6, "population.num_devices": 10,
                  "algorithms.DZOFL.rounds": 300, "algorithms.DZOFL.eval_every": 100,
                  "algorithms.FedSGD.rounds": 10, "algorithms.FedAvg.rounds": 6}
    doc["tuning_seeds"], doc["evaluation_seeds"] = [100], [0, 1]
    doc["search"] = {"DZOFL": {"alpha0": [10.0, 40.0], "gamma0": [0.05]},
                     "FedSGD": {"lr": [0.01, 0.03]},
                     "FedAvg": {"lr": [0.2], "local_steps": [1, 5]}}
    path = tmp_path / "quickstart-tune-small.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _best_by_hand(tuning: pd.DataFrame, algorithm: str) -> int:
    """The configuration the rules pick, recomputed from tuning.csv alone."""
    rows = tuning[tuning.algorithm == algorithm]
    ok = rows[(rows.healthy == rows.seeds)]
    full = ok[ok.reached == ok.seeds]
    if len(full):
        return int(full.sort_values(["value_mean", "config"]).config.iloc[0])
    ok = ok.assign(share=ok.reached / ok.seeds)
    return int(ok.sort_values(["share", "closeness_mean"], ascending=False).config.iloc[0])


@pytest.mark.slow
def test_quickstart_tune_end_to_end_local_and_dask_agree(tmp_path, capsys):
    """On worker processes and on a Dask LocalCluster; the tiny study in process: the next
    test."""
    path = _small_quickstart_tune(tmp_path)
    local, dask = tmp_path / "local", tmp_path / "dask"
    code, out, err = _cli(capsys, "tune", path, "--out", local, "--workers", "2", "--quiet")
    assert code == 0, err
    assert "verdict:" in out and "FedAvg (untuned)" in out
    assert "FedSGD: lr = 0.03 is the largest value tried (0.01 to 0.03)" in err
    code, _, err = _cli(capsys, "tune", path, "--out", dask, "--executor", "dask",
                        "--workers", "1", "--quiet")
    assert code == 0, err
    for name in ("tuning.csv", "tuning_runs.csv", "evaluation.csv"):
        assert (local / name).read_text() == (dask / name).read_text(), name
    tuning = pd.read_csv(local / "tuning.csv")
    manifest = json.loads((local / "tune.json").read_text())
    for algorithm in ("DZOFL", "FedSGD", "FedAvg"):
        chosen = tuning[(tuning.algorithm == algorithm) & tuning.chosen]
        assert len(chosen) == 1
        assert int(chosen.config.iloc[0]) == _best_by_hand(tuning, algorithm)
        params = [p for p in ("alpha0", "gamma0", "lr", "local_steps")
                  if p in manifest["choices"][algorithm]]
        assert {p: chosen[p].iloc[0] for p in params} == pytest.approx(
            manifest["choices"][algorithm])
    # evaluation runs use exactly the evaluation seeds, none of the tuning seeds
    seeds = {phase: {r["seed"] for r in json.loads((local / phase / "sweep.json").read_text())
                     ["runs"]} for phase in ("tuning", "evaluation")}
    assert seeds == {"tuning": {100}, "evaluation": {0, 1}}
    evaluation = pd.read_csv(local / "evaluation.csv")
    assert set(evaluation.algorithm) == {"DZOFL", "DZOFL (untuned)", "FedSGD",
                                         "FedSGD (untuned)", "FedAvg", "FedAvg (untuned)"}
    assert (evaluation.seeds == 2).all()
    # the untuned rows run the scenario's own values
    untuned = json.loads(evaluation.set_index("algorithm").parameters["FedAvg (untuned)"])
    assert untuned == {"lr": 0.2, "local_steps": 5}
    for figure in ("tune_DZOFL.png", "tune_FedSGD.png", "tune_FedAvg.png", "report.html"):
        assert (local / figure).is_file()
    assert "data:image/png;base64" in (local / "report.html").read_text()
    # a second run of the same command finishes nothing new and prints the same choices
    code, out2, err2 = _cli(capsys, "tune", path, "--out", local, "--quiet")
    assert code == 0 and "0 to run" in err2
    assert out2.split("verdict:")[0] == out.split("verdict:")[0]


def test_a_tiny_tune_end_to_end_in_process(tmp_path, capsys, in_process_runs):
    """`wirelessfl tune` on a tiny study, its runs in this process (tests/conftest.py's
    runs_in_this_process): FedSGD on the small scenario, two step sizes on one tuning seed, then
    the choice and the scenario's own step size on two evaluation seeds. The choice is the one
    the rules pick from tuning.csv (recomputed by hand), warned about when at the grid's edge;
    the evaluation runs use exactly the evaluation seeds; the figure and the report are
    written."""
    out = tmp_path / "out"
    code, stdout, err = _cli(capsys, "tune", tiny_tune_file(tmp_path), "--out", out, "--quiet")
    assert code == 0, err
    assert "verdict:" in stdout and "FedSGD (untuned)" in stdout
    tuning = pd.read_csv(out / "tuning.csv")
    chosen = tuning[tuning.chosen]
    assert len(chosen) == 1 and int(chosen.config.iloc[0]) == _best_by_hand(tuning, "FedSGD")
    lr = chosen.lr.iloc[0]
    assert json.loads((out / "tune.json").read_text())["choices"]["FedSGD"] == {"lr": lr}
    edge = {0.1: "smallest value tried (0.1 to 0.5)", 0.5: "largest value tried (0.1 to 0.5)"}
    assert f"FedSGD: lr = {lr:g} is the {edge[lr]}" in err
    seeds = {phase: {r["seed"] for r in json.loads((out / phase / "sweep.json").read_text())
                     ["runs"]} for phase in ("tuning", "evaluation")}
    assert seeds == {"tuning": {100}, "evaluation": {0, 1}}
    evaluation = pd.read_csv(out / "evaluation.csv").set_index("algorithm")
    assert set(evaluation.index) == {"FedSGD", "FedSGD (untuned)"}
    assert (evaluation.seeds == 2).all()
    assert json.loads(evaluation.parameters["FedSGD (untuned)"]) == {"lr": 0.2}
    assert (out / "tune_FedSGD.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64" in (out / "report.html").read_text()


def test_objective_scores_read_the_first_row_at_target():
    from wirelessfl.tune.objectives import score

    rounds = pd.DataFrame({"round": [0, 5, 10, 15], "energy_j": [0.0, 1.0, 2.0, 3.0],
                           "test_accuracy": [0.1, 0.5, 0.92, 0.95],
                           "suboptimality": [np.nan] * 4})
    got = score(OBJECTIVES["energy_to_target"], rounds, 0.9, None)
    assert got == {"value": 2.0, "reached": True, "closeness": 0.95, "first": False}
    got = score(OBJECTIVES["rounds_to_target"], rounds, 0.99, None)
    assert math.isnan(got["value"]) and not got["reached"] and got["closeness"] == 0.95
    assert score(OBJECTIVES["final_accuracy"], rounds, None, None)["value"] == 0.95


def test_every_shipped_comparison_says_untuned_or_has_a_tune_file():
    """A scenario that compares methods names no winner unless tuned: its description says its
    settings are untuned (wirelessfl list shows it), and a tune file may cover it."""
    docs = {p: yaml.safe_load(p.read_text()) for p in sorted(SCENARIOS.glob("*.yaml"))}
    tuned = {d["scenario"] for d in docs.values() if isinstance(d, dict) and "search" in d}
    assert "quickstart" in tuned
    for path, doc in docs.items():
        algorithms = doc.get("algorithms") if isinstance(doc, dict) else None
        if isinstance(algorithms, list) and len(algorithms) > 1:
            assert "untuned" in doc.get("description", ""), path.name


def test_stop_at_target_ends_each_algorithm_at_its_first_row_at_target(tmp_path):
    """The stopped run's rows are the full run's rows up to the first one at the target."""
    from wirelessfl.pipeline.runner import run_scenario
    from wirelessfl.results.records import read_run
    from wirelessfl.scenario.loader import load_scenario

    sets = ["population.num_devices=10", "target_accuracy=0.6", "algorithms.DZOFL.rounds=200",
            "algorithms.DZOFL.eval_every=50", "algorithms.FedSGD.rounds=30",
            "algorithms.FedAvg.rounds=10"]
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    run_scenario(load_scenario("quickstart", sets), full, warn=lambda _: None)
    run_scenario(load_scenario("quickstart", [*sets, "stop_at_target=true"]), stopped,
                 warn=lambda _: None)
    a, b = read_run(full), read_run(stopped)
    early = set()
    for label, rows in a.rounds.groupby("algorithm", sort=False):
        at = rows.index[rows.test_accuracy >= 0.6]
        expected = rows.loc[: at[0]] if len(at) else rows
        got = b.rounds[b.rounds.algorithm == label]
        pd.testing.assert_frame_equal(got.reset_index(drop=True),
                                      expected.reset_index(drop=True))
        message = b.manifest["algorithms"][label]["message"]
        assert ("stopped at the target" in message) == bool(len(at) and at[0] != rows.index[-1])
        early |= {label} if len(got) < len(rows) else set()
    assert early  # the case stops something early


def test_stop_when_unhealthy_ends_a_run_at_the_first_row_whose_loss_broke_the_limit(tmp_path):
    """A FedSGD step far too large makes the test loss explode: with stop_when_unhealthy the
    run is the full run's rows up to the first one whose loss exceeds max_loss_growth x the
    first loss (recomputed here from the full run), and it is still judged unhealthy; a
    healthy algorithm in the same scenario runs to its last round."""
    from wirelessfl.pipeline.runner import run_scenario
    from wirelessfl.results.records import read_run
    from wirelessfl.scenario.loader import load_scenario

    sets = ["population.num_devices=10", "algorithms.DZOFL.rounds=20",
            "algorithms.DZOFL.eval_every=10", "algorithms.FedSGD.rounds=30",
            "algorithms.FedSGD.eval_every=2", "algorithms.FedSGD.lr=2000",
            "algorithms.FedAvg.rounds=6", "health.max_loss_growth=3"]
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    run_scenario(load_scenario("quickstart", sets), full, warn=lambda _: None)
    run_scenario(load_scenario("quickstart", [*sets, "stop_when_unhealthy=true"]), stopped,
                 warn=lambda _: None)
    a, b = read_run(full), read_run(stopped)
    rows = a.rounds[a.rounds.algorithm == "FedSGD"].reset_index(drop=True)
    loss = rows.test_loss.to_numpy()
    broke = np.flatnonzero(loss > 3 * loss[0])
    assert len(broke) and broke[0] < len(rows) - 1  # the case stops early
    got = b.rounds[b.rounds.algorithm == "FedSGD"].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, rows.loc[: broke[0]])
    entry = b.manifest["algorithms"]["FedSGD"]
    assert "stopped unhealthy" in entry["message"]
    assert entry["health"]["healthy"] is False
    for label in ("DZOFL", "FedAvg"):
        assert len(b.rounds[b.rounds.algorithm == label]) == \
            len(a.rounds[a.rounds.algorithm == label])


def test_a_test_loss_target_stops_the_run_and_is_scored_there(tmp_path):
    """target_loss: the run ends at the first evaluated round whose test loss is at or below it
    (stop_at_target), the summary's to-target columns are that round's, a tuning objective
    scores it, and a scenario without it keeps the resolved document (and so the fingerprint)
    it had before the key existed."""
    import wirelessfl
    from tests.conftest import small_doc, small_scenario
    from wirelessfl.scenario.loader import resolved_document
    from wirelessfl.tune.objectives import score

    assert "target_loss" not in resolved_document(small_scenario())
    fedsgd = {"name": "fedsgd", "label": "FedSGD", "rounds": 40, "eval_every": 2, "lr": 0.5}
    free = wirelessfl.run(small_doc(algorithms=[fedsgd]), tmp_path / "free", figures=False)
    evaluated = free.rounds[free.rounds.test_loss.notna() & (free.rounds["round"] > 0)]
    losses = evaluated.test_loss.to_numpy()
    bound = float(np.quantile(losses, 0.5))  # reached part-way, at a round found by hand
    first = int(evaluated["round"].to_numpy()[np.argmax(losses <= bound)])
    doc = small_doc(algorithms=[fedsgd], target_loss=bound, stop_at_target=True)
    assert resolved_document(small_scenario(target_loss=bound))["target_loss"] == bound
    stopped = wirelessfl.run(doc, tmp_path / "stopped", figures=False)
    assert int(stopped.rounds["round"].max()) == first
    summary = stopped.summary.iloc[0]
    at = stopped.rounds[stopped.rounds["round"] == first].iloc[0]
    assert summary.energy_to_target_j == at.energy_j
    got = score(OBJECTIVES["rounds_to_target"], free.rounds, None, None, bound)
    assert got["reached"] and got["value"] == first


# ------------------------------------------------------------------ tied parameters
# A search key naming several parameters joined by '=' is one axis of the grid whose value every
# named parameter takes (seed 003 tunes "the beta parameters" of FGDRO-KL so, fgdro.md 2.5).


def _tied_tune_file(folder: Path, search: dict, **changes) -> Path:
    """A tune file of seconds over FedAvg on the small scenario (4 rounds, its own lr 0.2 and
    server_lr 1), ``search`` its FedAvg entry; ``changes`` replace top-level keys."""
    fedavg = {"name": "fedavg", "label": "FedAvg", "rounds": 4, "eval_every": 2,
              "local_steps": 2, "lr": 0.2}
    (folder / "base.yaml").write_text(yaml.safe_dump(small_doc(algorithms=[fedavg])))
    path = folder / "tied-tune.yaml"
    path.write_text(yaml.safe_dump({"name": "tied", "scenario": "base.yaml",
                                    "objective": "final_accuracy", "tuning_seeds": [100],
                                    "evaluation_seeds": [0, 1], "search": {"FedAvg": search},
                                    **changes}, sort_keys=False))
    return path


def test_a_tied_key_is_one_axis_that_sets_every_parameter_it_names(tmp_path):
    """3 tied values x 2 local_steps = 6 configurations (not 3 x 3 x 2), every one with lr ==
    server_lr, in grid order; spaces and axes name the tied key once, whitespace dropped."""
    from wirelessfl.tune.spec import load_tune

    tune = load_tune(str(_tied_tune_file(tmp_path, {"lr = server_lr": [0.1, 0.3, 1.0],
                                                    "local_steps": [1, 3]})))
    grid = tune.grids["FedAvg"]
    assert list(tune.spaces["FedAvg"]) == ["lr=server_lr", "local_steps"]
    assert tune.spaces["FedAvg"]["lr=server_lr"]["parameters"] == ["lr", "server_lr"]
    assert [c.axes for c in grid] == [{"lr=server_lr": v, "local_steps": e}
                                      for v in (0.1, 0.3, 1.0) for e in (1, 3)]
    assert [c.values for c in grid] == [{"lr": v, "server_lr": v, "local_steps": e}
                                        for v in (0.1, 0.3, 1.0) for e in (1, 3)]


def test_a_tied_key_counts_once_toward_the_run_cap(tmp_path):
    """Seed 003's four beta values tie three parameters of FGDRO-KL: 4 configurations. 30
    values on three tied parameters are 30 configurations (30^3 = 27,000 would pass the
    20,000-run cap); 1,000 values on 21 tuning seeds are refused from the counts, '1000
    values', not 1000 x 1000."""
    from wirelessfl.errors import UserError
    from wirelessfl.tune.spec import load_tune

    kl = {"name": "fgdro-kl", "label": "FGDRO-KL", "rounds": 2, "eval_every": 1}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(small_doc(algorithms=[kl])))
    doc = {"scenario": "base.yaml", "objective": "final_accuracy", "tuning_seeds": [100],
           "evaluation_seeds": [0, 1],
           "search": {"FGDRO-KL": {"beta1=beta2=beta3": [0.01, 0.1, 0.2, 0.5]}}}
    path = tmp_path / "kl-tune.yaml"
    path.write_text(yaml.safe_dump(doc))
    grid = load_tune(str(path)).grids["FGDRO-KL"]
    assert [c.values for c in grid] == [{"beta1": b, "beta2": b, "beta3": b}
                                        for b in (0.01, 0.1, 0.2, 0.5)]
    doc["search"] = {"FGDRO-KL": {"beta1=beta2=beta3": {"linear": [0.01, 0.5], "num": 30}}}
    path.write_text(yaml.safe_dump(doc))
    assert len(load_tune(str(path)).grids["FGDRO-KL"]) == 30
    doc["search"] = {"FGDRO-KL": {"beta1=beta2=beta3": [k / 1000 for k in range(1, 1001)]}}
    doc["tuning_seeds"] = list(range(100, 121))
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(UserError, match=r"search\.FGDRO-KL: 1000 values = 1,000 configurations "
                                        r"x 21 tuning seeds = 21,000 runs"):
        load_tune(str(path))


@pytest.mark.parametrize("search, expected", [
    ({"lr=server_lrr": [0.1]},
     "search.FedAvg.lr=server_lrr (value 0.1): not accepted by the scenario"),
    ({"lr=lr": [0.1]}, "search.FedAvg.lr=lr: 'lr' is named twice"),
    ({"lr=server_lr": [0.1], "server_lr": [1.0]},
     "search.FedAvg.server_lr: 'server_lr' is also searched by search.FedAvg.lr=server_lr"),
    ({"lr=server_lr": [0.1], "server_lr=tau": [1.0]},
     "search.FedAvg.server_lr=tau: 'server_lr' is also searched by search.FedAvg.lr=server_lr"),
    ({"lr": [0.1], "lr=server_lr": [0.1]},
     "search.FedAvg.lr=server_lr: 'lr' is also searched by search.FedAvg.lr"),
    ({"lr,server_lr": [0.1]},
     "search.FedAvg.lr,server_lr: join tied parameters with '=', not ',': write 'lr=server_lr'"),
    ({"lr=": [0.1]}, "search.FedAvg.lr=: an empty parameter name"),
    ({"lr=label": [0.1]}, "search.FedAvg.lr=label: 'label' names the algorithm"),
    ({"lr=server_lr": [0.1, 0.1]}, "search.FedAvg.lr=server_lr: the value 0.1 is listed twice"),
])
def test_bad_tied_keys_are_one_error_line(tmp_path, capsys, search, expected):
    path = _tied_tune_file(tmp_path, search)
    for command in (("tune", path, "--out", tmp_path / "out"), ("validate", path)):
        code, out, err = _cli(capsys, *command)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and err.startswith("error: ") and expected in err, err
    assert not (tmp_path / "out").exists()


def test_shipped_tune_files_expand_as_before_tied_keys_existed(tmp_path):
    """Every shipped tune file's configurations are the product of its lists in file order
    (recomputed here from the YAML as the grid was built before tied keys; a file with tied
    keys: the same product, each tied key's value on every parameter it names); the tiny tune
    file's run folders keep the names they had (written down before the change)."""
    from wirelessfl.sweep.spec import run_id
    from wirelessfl.tune.spec import Range, load_tune
    from wirelessfl.tune.study import evaluation_plan, tuning_plan

    def ids(plan):
        return [run_id(values, seed, {k: k for k in values}) for values, _, seed, _ in plan]

    files = [p for p in sorted(SCENARIOS.glob("*.yaml"))
             if isinstance(doc := yaml.safe_load(p.read_text()), dict) and "search" in doc]
    assert len(files) >= 20
    for path in files:
        doc, tune = yaml.safe_load(path.read_text()), load_tune(str(path))
        for label, params in doc["search"].items():
            lists = [Range(**v).values() if isinstance(v, dict) else v for v in params.values()]
            before = [dict(zip(params, combo)) for combo in itertools.product(*lists)]
            if not any("=" in key for key in params):
                assert [c.values for c in tune.grids[label]] == before, (path.name, label)
                assert [c.axes for c in tune.grids[label]] == before, (path.name, label)
                continue
            tied = [{name.strip(): v for key, v in combo.items() for name in key.split("=")}
                    for combo in before]
            assert [c.values for c in tune.grids[label]] == tied, (path.name, label)
    tiny = load_tune(str(tiny_tune_file(tmp_path)))
    assert ids(tuning_plan(tiny)) == ["algorithm=FedSGD_lr=0.1_seed=100-b90334",
                                      "algorithm=FedSGD_lr=0.5_seed=100-000142"]
    assert ids(evaluation_plan(tiny, {"FedSGD": {"lr": 0.5}})) == [
        "algorithm=FedSGD_seed=0-0dba58", "algorithm=FedSGD_seed=1-9c0ca4",
        "algorithm=FedSGD--untuned-_seed=0-9c0b44", "algorithm=FedSGD--untuned-_seed=1-3a45a7"]


def test_a_tied_study_end_to_end_in_process(tmp_path, capsys, in_process_runs):
    """`wirelessfl validate` accepts a tune file with a tied key; `wirelessfl tune` runs it (in
    this process): every tuning run's resolved scenario (its manifest) sets lr == server_lr to
    its configuration's value, and so do the chosen setting's evaluation runs; tuning.csv has
    one column for the tied key, tune.json the choice on both parameters, the printed choice
    names the tie once, and the grid-edge warning names both parameters."""
    from wirelessfl.results.records import read_run

    path = _tied_tune_file(tmp_path, {"lr=server_lr": [0.1, 0.5]}, stability_margin=True)
    code, out, err = _cli(capsys, "validate", path)
    assert code == 0, err
    assert "valid tune file" in out and "FedAvg 2 configurations" in out and "2 tuning runs" in out
    study = tmp_path / "out"
    code, stdout, err = _cli(capsys, "tune", path, "--out", study, "--quiet")
    assert code == 0, err
    tuning = pd.read_csv(study / "tuning.csv")
    assert "lr=server_lr" in tuning and "lr" not in tuning and "server_lr" not in tuning
    assert sorted(tuning["lr=server_lr"]) == [0.1, 0.5] and "margin" in tuning
    runs = sorted((study / "tuning" / "runs").iterdir())
    assert [r.name.split("-")[0] for r in runs] == ["algorithm=FedAvg_lr=0.1_server_lr=0.1_seed=100",
                                                    "algorithm=FedAvg_lr=0.5_server_lr=0.5_seed=100"]
    for run, value in zip(runs, (0.1, 0.5)):
        entry, = read_run(run).manifest["scenario"]["algorithms"]
        assert entry["lr"] == entry["server_lr"] == value
    value = float(tuning[tuning.chosen]["lr=server_lr"].iloc[0])
    manifest = json.loads((study / "tune.json").read_text())
    assert manifest["choices"] == {"FedAvg": {"lr": value, "server_lr": value}}
    assert manifest["search"] == {"FedAvg": {"lr=server_lr": [0.1, 0.5]}}
    evaluation = pd.read_csv(study / "evaluation.csv").set_index("algorithm")
    assert json.loads(evaluation.parameters["FedAvg"]) == {"lr": value, "server_lr": value}
    assert json.loads(evaluation.parameters["FedAvg (untuned)"]) == {"lr": 0.2, "server_lr": None}
    evaluated = [read_run(r) for r in sorted((study / "evaluation" / "runs").iterdir())]
    tuned = [r for r in evaluated if r.manifest["scenario"]["algorithms"][0]["label"] == "FedAvg"]
    assert len(tuned) == 2
    for record in tuned:
        entry, = record.manifest["scenario"]["algorithms"]
        assert entry["lr"] == entry["server_lr"] == value
    assert f"lr=server_lr={value:g}" in stdout  # the choice, the tie named once
    end = "smallest" if value == 0.1 else "largest"
    assert f"FedAvg: lr = server_lr = {value:g} is the {end} value tried (0.1 to 0.5)" in err
    assert "lr=server_lr" in (study / "report.html").read_text()
    assert (study / "tune_FedAvg.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
