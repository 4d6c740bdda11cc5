"""Progress of a long study (issue 35): `wirelessfl sweep`, `tune` and `reproduce` print a line
as each run starts, its rounds now and then, and after each finished run an estimate of the time
left; in a log as plain lines, on a terminal above a bar; nothing with --quiet; and the numbers
never depend on it.

The studies run with their runs in this process (tests/conftest.py's ``runs_in_this_process``)
and, slow, on two worker processes, whose progress comes back over their pipes."""

from __future__ import annotations

import io
import math
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import cli as _cli
from tests.conftest import small_doc, tiny_tune_file
from wirelessfl.host.progress import StudyProgress, time_left
from wirelessfl.sweep import heartbeat

START = re.compile(r"^progress: (.+?): run (\d+)/(\d+) started: (.+)$")
ROUND = re.compile(r"^progress: (.+?): run (\d+)/(\d+) \((.+?)\): (.+) round (\d+)/(\d+) "
                   r"\(algorithm 1/1\), [\d.]+ s elapsed$")
DONE = re.compile(r"^progress: (.+?): (\d+)/(\d+) runs done \(failed 0\), .+ elapsed"
                  r"(, about .+ left \(estimate: .+ a run x \d+ runs? left / \d+ workers?\))?$")
FEDSGD = {"name": "fedsgd", "label": "FedSGD", "rounds": 6, "eval_every": 2, "lr": 0.2}


def _sweep_file(folder: Path) -> Path:
    """Two transmit powers x two seeds: 4 runs of FedSGD on the small scenario."""
    (folder / "base.yaml").write_text(yaml.safe_dump(small_doc(algorithms=[FEDSGD])))
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "two", "scenario": "base.yaml", "seeds": [0, 1],
                                    "grid": {"channel.uplink.tx_power_dbm": [0, 23]}}))
    return path


def _check_phase(err: str, name: str, runs: int) -> None:
    """The lines of the phase ``name`` of ``runs`` runs: a start line per run (numbered 1 to
    ``runs`` in the order they start, each run once), at least one round line of a started run,
    a line per finished run, the first of them with an estimate of the time left, and every
    one but the last with one."""
    lines = [line for line in err.splitlines() if line.startswith(f"progress: {name}: ")]
    starts = [m for m in map(START.match, lines) if m]
    assert [int(m[2]) for m in starts] == list(range(1, runs + 1)), lines
    assert {int(m[3]) for m in starts} == {runs}
    assert len({m[4] for m in starts}) == runs  # each names another run
    rounds = [m for m in map(ROUND.match, lines) if m]
    assert rounds, lines
    named = {m[2]: m[4] for m in starts}
    assert all(named[m[2]] == m[4] for m in rounds)  # a round line names its run as it started
    done = [(k, m) for k, m in enumerate(map(DONE.match, lines)) if m]
    assert [int(m[2]) for _, m in done] == list(range(1, runs + 1)), lines
    assert all(m[4] for _, m in done[:-1]) and not done[-1][1][4]
    first_start = lines.index(starts[0][0])
    assert done[0][0] > first_start  # the estimate comes after the first run finished
    assert len(starts) + len(rounds) + len(done) == len(lines)  # every line is of one form


def test_the_estimate_of_the_time_left_by_hand():
    """Finished runs of 10, 20 and 30 s (and one whose worker died: NaN, left out): 20 s a run.
    9 runs left on 3 workers: 20 x 9 / 3 = 60 s; 2 left on 4 workers: only 2 can be busy,
    20 x 2 / 2 = 20 s. Nothing finished, nothing to estimate from; nothing left, no estimate."""
    walls = [10.0, 20.0, 30.0, math.nan]
    assert time_left(walls, 9, 3).seconds == 60.0
    assert str(time_left(walls, 9, 3)) == ("about 1 min 00 s left (estimate: 20.0 s a run x 9 "
                                           "runs left / 3 workers)")
    assert time_left(walls, 2, 4).seconds == 20.0
    assert time_left(walls, 1, 4).busy == 1
    assert time_left([math.nan], 3, 2) is None and time_left([], 3, 2) is None
    assert time_left(walls, 0, 2) is None


def test_the_line_after_a_finished_run_says_the_estimate():
    """A phase of 4 runs on 2 workers, a fake clock: the first run back after 12 s of wall time
    leaves 3 runs, 12 x 3 / 2 = 18 s."""
    now = [0.0]
    stream = io.StringIO()
    bar = StudyProgress({"a": "lr=0.1, seed 0", "b": "lr=0.1, seed 1", "c": "x", "d": "y"}, 2,
                        name="s", stream=stream, clock=lambda: now[0])
    for run in ("a", "b"):
        bar.event({"event": "start", "run_id": run})
    bar.event({"event": "round", "run_id": "b", "state": "FedSGD round 2/6 (algorithm 1/1)",
               "elapsed_s": 3.0})
    now[0] = 13.0
    bar.finished("a", 12.0, failed=False)
    bar.event({"event": "round", "run_id": "a", "state": "late", "elapsed_s": 1.0})  # dropped
    assert stream.getvalue().splitlines() == [
        "progress: s: run 1/4 started: lr=0.1, seed 0",
        "progress: s: run 2/4 started: lr=0.1, seed 1",
        "progress: s: run 2/4 (lr=0.1, seed 1): FedSGD round 2/6 (algorithm 1/1), 3.0 s elapsed",
        ("progress: s: 1/4 runs done (failed 0), 13.0 s elapsed, about 18.0 s left (estimate: "
         "12.0 s a run x 3 runs left / 2 workers)")]


def test_a_run_reports_its_rounds_at_most_every_few_seconds():
    """A fake clock, a round a second, ``every_s`` 5: round events 5 s and 10 s after the start,
    none between; with --quiet (no ``progress`` in the task) no event and no callbacks."""
    now = [0.0]
    events = []
    task = {"run_id": "r", "progress": {"every_s": 5.0}}
    beat = heartbeat.Heartbeat(task, events.append, clock=lambda: now[0])
    beat.started()
    callbacks = beat.callbacks([("FedAvg", 12)])
    callbacks["on_algorithm"]("FedAvg")
    for k in range(1, 13):
        now[0] = float(k)
        callbacks["on_round"](1)
    assert [e["event"] for e in events] == ["start", "round", "round"]
    assert [(e["state"], e["elapsed_s"]) for e in events[1:]] == [
        ("FedAvg round 5/12 (algorithm 1/1)", 5.0), ("FedAvg round 10/12 (algorithm 1/1)", 10.0)]
    quiet = heartbeat.Heartbeat({"run_id": "r", "progress": None}, events.append)
    quiet.started()
    assert quiet.callbacks([("FedAvg", 12)]) == {} and len(events) == 3


def test_the_study_prints_about_one_round_line_every_few_seconds():
    """Each run's interval grows with the workers (N runs side by side), up to 30 s."""
    assert heartbeat.settings(1, quiet=False) == {"every_s": 5.0}
    assert heartbeat.settings(4, quiet=False) == {"every_s": 20.0}
    assert heartbeat.settings(64, quiet=False) == {"every_s": 30.0}
    assert heartbeat.settings(4, quiet=True) is None


def test_a_tune_on_one_worker_prints_starts_rounds_and_the_time_left(tmp_path, capsys,
                                                                      monkeypatch,
                                                                      in_process_runs):
    """`wirelessfl tune --workers 1` in a log: both phases' lines."""
    monkeypatch.setattr(heartbeat, "ROUND_LINES_EVERY_S", 0.0)  # every round: a tiny study
    code, _, err = _cli(capsys, "tune", tiny_tune_file(tmp_path), "--out", tmp_path / "out",
                        "--workers", "1")
    assert code == 0, err
    assert "\r" not in err
    _check_phase(err, "tiny: tuning", 2)
    _check_phase(err, "tiny: evaluation", 4)


def test_quiet_prints_no_progress_and_the_numbers_do_not_depend_on_it(tmp_path, capsys,
                                                                      monkeypatch,
                                                                      in_process_runs):
    """A sweep reporting every round and the same sweep with --quiet: the same rounds."""
    monkeypatch.setattr(heartbeat, "ROUND_LINES_EVERY_S", 0.0)
    path = _sweep_file(tmp_path)
    errs = {}
    for how in ("loud", "quiet"):
        code, _, errs[how] = _cli(capsys, "sweep", path, "--out", tmp_path / how, "--workers",
                                  "1", "--no-compare", *(["--quiet"] if how == "quiet" else []))
        assert code == 0, errs[how]
    assert "progress:" not in errs["quiet"]
    assert any(ROUND.match(line) for line in errs["loud"].splitlines())
    runs = sorted(p.name for p in (tmp_path / "loud" / "runs").iterdir())
    assert len(runs) == 4
    for run in runs:
        for name in ("rounds.parquet", "devices.parquet"):
            pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "loud" / "runs" / run / name),
                                          pd.read_parquet(tmp_path / "quiet" / "runs" / run / name))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_lines_stand_above_a_bar_with_the_estimate(tmp_path, capsys,
                                                                     monkeypatch,
                                                                     in_process_runs):
    monkeypatch.setattr(heartbeat, "ROUND_LINES_EVERY_S", 0.0)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = _cli(capsys, "sweep", _sweep_file(tmp_path), "--out", tmp_path / "out",
                "--workers", "1", "--no-compare")[0]
    monkeypatch.undo()
    assert code == 0
    err = terminal.getvalue()
    assert "\r" in err and "4/4" in err  # tqdm's bar, redrawn in place
    assert "left (estimate)" in err  # the bar's estimate once a run finished
    assert "runs done" not in err  # the bar counts them
    lines = [line.split("\r")[-1] for line in err.splitlines()]
    assert sum(bool(START.match(line)) for line in lines) == 4
    assert any(ROUND.match(line) for line in lines)


@pytest.mark.slow
def test_a_sweep_on_two_worker_processes_prints_their_progress(tmp_path, capsys, monkeypatch):
    """The runs' start and round events come back over the workers' pipes."""
    monkeypatch.setattr(heartbeat, "ROUND_LINES_EVERY_S", 0.0)  # read here, sent in each task
    code, _, err = _cli(capsys, "sweep", _sweep_file(tmp_path), "--out", tmp_path / "out",
                        "--workers", "2", "--no-compare")
    assert code == 0, err
    assert "\r" not in err
    _check_phase(err, "two", 4)
    done = [m for m in map(DONE.match, err.splitlines()) if m]
    assert "/ 2 workers)" in done[0][0]  # 3 runs left: the 2 workers can all be busy
