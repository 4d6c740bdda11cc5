"""What the command line prints around a run: --version, the summary tables (at most 100
columns, the numbers of summary.csv to the shown precision) and progress (a bar on a terminal,
plain lines in logs, each algorithm's total its own rounds, nothing with --quiet)."""

from __future__ import annotations

import io
import math
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.conftest import cli as _cli
from tests.conftest import small_doc
from wirelessfl.cli import main
from wirelessfl.host import progress
from wirelessfl.results.summary import SUMMARY_COLUMNS, format_summary

ROOT = Path(__file__).resolve().parents[1]

# Written out here, not taken from results/summary.py: the header of each printed column, the
# summary.csv column it shows and its precision (sig: 3 significant figures; count: exact below
# a million; pct: 0.1 %; acc: 1e-4).
COLUMNS = {
    "to target": {"rounds": ("rounds_to_target", "count"),
                  "time [s]": ("time_to_target_s", "sig"),
                  "energy [J]": ("energy_to_target_j", "sig"),
                  "system [J]": ("system_energy_to_target_j", "sig"),
                  "gradients": ("gradient_evaluations_to_target", "count"),
                  "compute": ("compute_share", "pct"), "radio": ("radio_share", "pct"),
                  "idle": ("idle_share", "pct")},
    "after the last round": {"rounds": ("rounds", "count"), "time [s]": ("sim_time_s", "sig"),
                             "energy [J]": ("energy_j", "sig"),
                             "system [J]": ("energy_system_j", "sig"),
                             "uplink [bit]": ("uplink_bits_per_device_round", "count"),
                             "delivered": ("in_time_fraction", "pct"),
                             "late uploads": ("late_uploads", "count")},
    "at the last evaluation": {"final acc.": ("final_accuracy", "acc"),
                               "worst device": ("final_worst_device_accuracy", "acc"),
                               "worst class": ("final_worst_class_accuracy", "acc"),
                               "final f - f*": ("final_suboptimality", "sig"),
                               "healthy": ("healthy", "bool")},
}
PROGRESS = re.compile(r"progress: (\S+) round (\d+)/(\d+) \(algorithm (\d)/(\d)\), [\d.]+ s "
                      r"elapsed")
ENDED = re.compile(r"progress: (\S+) (finished|ended) at round (\d+)/(\d+) \(algorithm "
                   r"(\d)/(\d)\), [\d.]+ s elapsed")



def _tables(text: str) -> dict[str, pd.DataFrame]:
    """The printed summary read back: first title line's start -> the table's cells (str),
    one row per algorithm; cells are separated by two or more spaces."""
    tables = {}
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        rule = next(i for i, line in enumerate(lines) if set(line) == {"-"})
        key = next(k for k in COLUMNS if lines[0].startswith(k) or k == "to target"
                   and lines[0].startswith(("to target", "no target")))
        header = re.split(r"\s{2,}", lines[rule - 1].strip())
        rows = [re.split(r"\s{2,}", line.strip()) for line in lines[rule + 1:]]
        assert all(len(r) == len(header) for r in rows), block
        tables[key] = pd.DataFrame(rows, columns=header)
    return tables


def _agrees(cell: str, value, kind: str) -> bool:
    """Whether the printed ``cell`` is ``value`` at the precision of ``kind``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return cell == "-"
    if kind == "bool":
        return cell == ("yes" if value else "NO")
    if kind == "pct":
        return cell.endswith("%") and abs(float(cell[:-1]) - 100 * value) <= 0.05 + 1e-9
    if kind == "acc":
        return abs(float(cell) - value) <= 5e-5 + 1e-12
    if kind == "count" and abs(value) < 1e6:
        return int(cell.replace(",", "")) == round(value)
    return float(cell) == pytest.approx(value, rel=5e-3)  # three significant figures


def _check_against(text: str, table: pd.DataFrame, width: int = 100) -> dict:
    """Every line of the printed summary fits ``width``; each shown value is ``table``'s (the
    summary.csv) at its precision; returns the tables read back."""
    assert max(len(line) for line in text.split("\n")) <= width
    tables = _tables(text)
    for key, shown in tables.items():
        assert len(shown) == len(table)
        for (_, row), (_, csv) in zip(shown.iterrows(), table.iterrows()):
            label = str(csv.algorithm)
            assert row.algorithm == label or (
                "…" in row.algorithm and label.startswith(row.algorithm.split("…")[0])
                and label.endswith(row.algorithm.split("…")[1]))
            for header in shown.columns[1:]:
                column, kind = COLUMNS[key][header]
                assert _agrees(row[header], csv[column], kind), (key, label, header)
    return tables


def _wide_table(n: int = 17, seed: int = 0) -> pd.DataFrame:
    """A summary of ``n`` algorithms with long labels (sweep- and tune-like: a name and its
    settings) and values over many magnitudes: some not reached, one failed before its first
    evaluation, late uploads, f - f* known."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n):
        e = float(10 ** rng.uniform(-6, 5))
        rows.append({
            "algorithm": f"Algorithm-{k} (lr={rng.uniform():.4f}, local_steps={k + 1}, batch=10)",
            "rounds_to_target": None if k % 4 == 3 else int(10 ** rng.uniform(0, 6.5)),
            "time_to_target_s": float(10 ** rng.uniform(-4, 6)),
            "energy_to_target_j": e, "system_energy_to_target_j": 7 * e,
            "compute_share": float(rng.uniform()), "radio_share": float(rng.uniform()),
            "idle_share": float(rng.uniform()), "final_accuracy": float(rng.uniform()),
            "final_worst_device_accuracy": float(rng.uniform()),
            "final_suboptimality": float(10 ** rng.uniform(-15, 3)),
            "gradient_evaluations_to_target": float(10 ** rng.uniform(0, 7)),
            "rounds": int(10 ** rng.uniform(0, 6.9)), "sim_time_s": float(10 ** rng.uniform(-3, 7)),
            "energy_j": 3 * e, "energy_system_j": 30 * e,
            "uplink_bits_per_device_round": float(10 ** rng.uniform(0, 9)),
            "in_time_fraction": float(rng.uniform()),
            "late_uploads": int(10 ** rng.uniform(0, 8)), "healthy": bool(k % 5),
            "health": "ok"})
        for key in ("time_to_target_s", "energy_to_target_j", "system_energy_to_target_j",
                    "gradient_evaluations_to_target"):
            if rows[-1]["rounds_to_target"] is None:
                rows[-1][key] = math.nan
    rows.append({"algorithm": "Failed-before-its-first-evaluation (lr=10)", "rounds": 0,
                 "healthy": False, "health": "failed"})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


# --- --version -------------------------------------------------------------------------------

def test_version_prints_the_packages_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"wirelessfl {declared}\n"
    try:  # the installed distribution's metadata, where the package is installed
        assert metadata.version("wirelessfl") == declared
    except metadata.PackageNotFoundError:
        pass


# --- the summary tables ----------------------------------------------------------------------

@pytest.mark.parametrize("targets", [(0.9, None), (0.9, 1e-6), (None, 1e-6), (None, None)])
def test_summary_of_17_algorithms_with_long_labels_fits_100_columns(targets):
    table = _wide_table()
    text = format_summary(table, *targets)
    tables = _check_against(text, table)
    labels = list(tables["to target"].algorithm)
    assert all("…" in label for label in labels)  # every label here is too long for 100
    assert len(set(labels)) == len(labels)  # still told apart (their ends differ)
    # the same label in every table, so the rows line up
    assert all(list(t.algorithm) == labels for t in tables.values())
    has_target = targets != (None, None)
    assert ("rounds" in tables["to target"].columns) == has_target
    assert ("not reached" in text) == has_target
    assert "late uploads" in tables["after the last round"].columns


def test_summary_leaves_out_what_nobody_has_and_keeps_short_labels_whole():
    """Without f* (a classifier), without the base station's energy (a run recorded before
    it), without deadlines and without accuracy (a quadratic): those columns go; short labels
    are printed whole."""
    table = _wide_table(4).iloc[:4].copy()
    table["algorithm"] = ["DZOFL", "FedSGD", "FedAvg", "Scaffold (K=10)"]
    table[["final_suboptimality", "energy_system_j", "system_energy_to_target_j"]] = math.nan
    table["late_uploads"] = 0
    text = format_summary(table, 0.9)
    tables = _check_against(text, table)
    for shown in tables.values():
        assert list(shown.algorithm) == list(table.algorithm)
        assert not {"system [J]", "gradients", "final f - f*", "late uploads"} & set(shown)
    assert "system" not in text
    quadratic = table.assign(final_accuracy=math.nan, final_worst_device_accuracy=math.nan,
                             final_suboptimality=1e-9)
    shown = _check_against(format_summary(quadratic, None, 1e-6), quadratic)
    assert list(shown["at the last evaluation"].columns) == ["algorithm", "final f - f*",
                                                            "healthy"]


# --- a run: the printed tables against summary.csv, progress lines on a captured stderr ------

def _lines(err: str) -> tuple[list[tuple], list[tuple]]:
    assert "\r" not in err
    rounds = [(m[1], int(m[2]), int(m[3]), int(m[4]), int(m[5]))
              for m in map(PROGRESS.fullmatch, err.splitlines()) if m]
    ends = [(m[1], m[2], int(m[3]), int(m[4]), int(m[5]), int(m[6]))
            for m in map(ENDED.fullmatch, err.splitlines()) if m]
    assert len(rounds) + len(ends) == err.count("progress:")  # every line is of one form
    return rounds, ends


def test_run_in_a_log_prints_progress_lines_and_a_summary_of_summary_csv(
        tmp_path, scenario_file, capsys, monkeypatch):
    """stderr captured (not a terminal): plain lines, no carriage return; a line at each tenth
    of the 30 + 6 + 4 rounds and one as each algorithm ends, every total the scenario's own
    rounds; stdout's tables hold summary.csv's numbers."""
    monkeypatch.setattr(progress, "LINE_EVERY_S", math.inf)  # only the tenths: deterministic
    out = tmp_path / "run"
    code, stdout, err = _cli(capsys, "run", scenario_file(small_doc()), "--out", out,
                             "--no-report")
    assert code == 0
    rounds, ends = _lines(err)
    own = {"dzofl": (30, 1), "fedsgd": (6, 2), "fedavg": (4, 3)}
    assert ends == [(name, "finished", r, r, k, 3) for name, (r, k) in own.items()]
    # every 4 rounds of the 40 in all: dzofl's 4, 8, ..., 28, then fedsgd's 2 and 6, fedavg's 4
    assert rounds == ([("dzofl", k, 30, 1, 3) for k in range(4, 29, 4)]
                      + [("fedsgd", 2, 6, 2, 3), ("fedsgd", 6, 6, 2, 3), ("fedavg", 4, 4, 3, 3)])
    _check_against(stdout, pd.read_csv(out / "summary.csv"))


def test_early_stops_end_each_algorithm_at_its_last_recorded_round(tmp_path, scenario_file,
                                                                   capsys, monkeypatch):
    """stop_at_target: each algorithm ends at the round it reached the target; its line says
    so against its own rounds, and the rounds it did not run leave the total (a line per
    round here: every round line's count is below its algorithm's rounds)."""
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    doc = small_doc(stop_at_target=True, target_accuracy=0.4)
    doc["algorithms"][1]["rounds"], doc["algorithms"][2]["rounds"] = 10, 8
    path, out = scenario_file(doc), tmp_path / "run"
    code, _, err = _cli(capsys, "run", path, "--out", out, "--no-report", "--quiet")
    assert code == 0 and "progress:" not in err  # --quiet: no lines either
    code, _, err = _cli(capsys, "run", path, "--out", tmp_path / "again", "--no-report")
    assert code == 0
    rounds, ends = _lines(err)
    summary = pd.read_csv(out / "summary.csv").set_index("algorithm")
    own = {"dzofl": 30, "fedsgd": 10, "fedavg": 8}
    assert [e[0] for e in ends] == list(own)
    for name, how, completed, total, _, _ in ends:
        assert total == own[name] and completed == summary.loc[name, "rounds"]
        assert how == ("finished" if completed == total else "ended")
        if how == "ended":  # stopped at the target's first row
            assert completed == summary.loc[name, "rounds_to_target"]
        assert [r[1] for r in rounds if r[0] == name] == list(range(1, completed + 1))
    assert any(how == "ended" for _, how, *_ in ends)  # the case this test is about


def test_resumed_run_counts_only_the_algorithms_left(tmp_path, scenario_file, capsys,
                                                     monkeypatch):
    """A run interrupted in fedsgd (checkpoint after round 4) and resumed: dzofl, recorded,
    is not counted; fedsgd goes on from round 4 of its 6, fedavg runs its 4."""
    from wirelessfl.pipeline.runner import run_scenario
    from wirelessfl.scenario.loader import load_scenario

    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    path, out = scenario_file(small_doc()), tmp_path / "run"
    seen = {"label": None, "round": 0}

    def start(label):
        seen.update(label=label, round=0)

    def stop_at_fedsgd_round_5(n):
        seen["round"] += n
        if seen["label"] == "fedsgd" and seen["round"] == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_scenario(load_scenario(str(path)), out, on_round=stop_at_fedsgd_round_5,
                     on_algorithm=start, checkpoint_every=2)
    capsys.readouterr()
    code, _, err = _cli(capsys, "run", "--resume", out, "--no-report")
    assert code == 0
    rounds, ends = _lines(err)
    assert ends == [("fedsgd", "finished", 6, 6, 2, 3), ("fedavg", "finished", 4, 4, 3, 3)]
    assert [(r[0], r[1], r[2]) for r in rounds] == [
        ("fedsgd", 4, 6), ("fedsgd", 5, 6), ("fedsgd", 6, 6),
        ("fedavg", 1, 4), ("fedavg", 2, 4), ("fedavg", 3, 4), ("fedavg", 4, 4)]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_bar_and_quiet_silences_it(tmp_path, scenario_file, monkeypatch,
                                                   capsys):
    path = scenario_file(small_doc(algorithms=small_doc()["algorithms"][1:]))
    for quiet in (False, True):
        terminal = _Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        code = main(["run", str(path), "--out", str(tmp_path / f"q{quiet}"), "--no-report",
                     *(["--quiet"] if quiet else [])])
        monkeypatch.undo()
        assert code == 0
        err = terminal.getvalue()
        assert "progress:" not in err
        # tqdm's bar: redrawn in place, the algorithm as its description, 10 rounds in all
        assert ("\r" in err and "fedavg" in err and "10/10" in err) == (not quiet)
    capsys.readouterr()


# --- sweeps ----------------------------------------------------------------------------------

def test_sweep_in_a_log_prints_a_line_per_run(tmp_path, capsys, in_process_runs):
    """A line per finished run (its start and round lines, and the estimate of the time left:
    tests/test_study_progress.py)."""
    base = small_doc(algorithms=[{"name": "fedsgd", "rounds": 4, "eval_every": 2, "lr": 0.5}])
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base, sort_keys=False))
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "two", "scenario": "base.yaml", "seeds": [0],
                                    "grid": {"channel.uplink.tx_power_dbm": [0, 23]}}))
    code, _, err = _cli(capsys, "sweep", path, "--out", tmp_path / "out", "--workers", "1",
                        "--no-compare")
    assert code == 0 and "\r" not in err
    lines = [line.split(", ")[0] for line in err.splitlines() if "runs done" in line]
    assert lines == ["progress: two: 1/2 runs done (failed 0)",
                     "progress: two: 2/2 runs done (failed 0)"]


# --- the Progress counter itself -------------------------------------------------------------

def test_progress_lines_every_tenth_and_every_interval_of_wall_time(monkeypatch):
    """A fake clock: a line when the count crosses another tenth of the total, or when
    LINE_EVERY_S has passed since the last line (of either kind); the final state once at
    close."""
    monkeypatch.setattr(progress, "LINE_EVERY_S", 30.0)
    now = [0.0]
    stream = io.StringIO()
    bar = progress.Progress(1000, "run", name="s", stream=stream, clock=lambda: now[0])
    for k in range(1, 251):
        now[0] = k * 1.0  # one second per unit
        bar.update()
    bar.close()
    counts = [int(re.search(r"run (\d+)/1000", line)[1]) for line in stream.getvalue().splitlines()]
    assert counts == [30, 60, 90, 100, 130, 160, 190, 200, 230, 250]
    assert stream.getvalue().splitlines()[0] == "progress: s run 30/1000, 30.0 s elapsed"


def test_duration_text():
    assert [progress.duration(s) for s in (12.46, 59.94, 61, 3599, 3600, 7322)] == [
        "12.5 s", "59.9 s", "1 min 01 s", "59 min 59 s", "1 h 00 min", "2 h 02 min"]


def test_run_progress_total_leaves_out_recorded_algorithms_and_unrun_rounds():
    """The bar's total: the rounds of the algorithms still to run (a resumed run skips the
    recorded ones); an algorithm that ends early takes its unrun rounds out, so the bar ends
    at its total (tqdm's last drawing, on a terminal)."""
    terminal = _Terminal()
    bar = progress.RunProgress([("A", 10), ("B", 20), ("C", 5)], done={"A"}, stream=terminal)
    assert bar.total == 25
    bar.start("B")
    bar.update(7)  # B stops at round 7 of its 20
    bar.start("C")
    assert bar.total == 12
    bar.update(5)
    bar.close()
    assert bar.count == bar.total == 12
    assert "12/12" in terminal.getvalue().split("\r")[-1]
