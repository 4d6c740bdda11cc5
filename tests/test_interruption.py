"""Runs that are interrupted (SIGINT, SIGTERM), killed (SIGKILL) or diverge keep what they
recorded, say how to go on, and `wirelessfl run --resume` finishes them with result tables
identical to an uninterrupted run's. The runs stopped by a signal from outside are real
`python -m wirelessfl` processes (slow); in the fast tier a SIGTERM raised in this process stops an
in-process run the same way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import small_doc
from wirelessfl.cli import main
from wirelessfl.pipeline.checkpoint import CHECKPOINT_NAME

ROOT = Path(__file__).resolve().parents[1]
# A quick first algorithm, then a long enough second one to be stopped in the middle of.
ALGORITHMS = [{"name": "fedavg", "rounds": 4, "eval_every": 2, "local_steps": 2, "label": "A"},
              {"name": "dzofl", "rounds": 3000, "eval_every": 100, "label": "B"}]


def _start(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # SIGINT as a terminal gives it: a test suite started in the background (``cmd &``)
    # inherits SIGINT ignored, which the child would keep (an ignored signal stays ignored
    # across exec; a handler resets to the default), and the signal test would test nothing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen([sys.executable, "-m", "wirelessfl", "run", *args, "--quiet",
                                 "--no-report"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)


def _recorded(out: Path) -> list[str]:
    """The algorithms the manifest records so far ([] before it is readable)."""
    try:
        return list(json.loads((out / "manifest.json").read_text())["algorithms"])
    except (OSError, ValueError, KeyError):
        return []


def _wait_for(condition, proc, what: str, timeout=600.0):
    """Poll until ``condition()`` holds (a file state), while the run is alive. The timeout only
    bounds a failing test: a loaded machine may take minutes to start the run."""
    end = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, (f"the run ended before {what}", proc.communicate())
        assert time.monotonic() < end, f"{what}: not within {timeout} s"
        time.sleep(0.01)


def _wait_for_first_algorithm(out: Path, proc, timeout=600.0):
    """Poll the manifest until algorithm A is recorded (B is then running)."""
    _wait_for(lambda: "A" in _recorded(out), proc, "the first algorithm was recorded", timeout)


def _kill_while_b_runs(scenario: Path, out: Path, cwd: Path, *extra: str, ready=None,
                       delay_s: float = 0.0, attempts: int = 3):
    """SIGKILL a run after A is recorded (and ``ready(out)`` holds), ``delay_s`` later, and
    check from the folder that the kill landed while B was running (B not recorded). A kill
    that came after B finished (a starved test process on a loaded machine) tells nothing:
    that attempt is discarded and the run started again in a fresh folder."""
    import shutil

    for _ in range(attempts):
        proc = _start([str(scenario), "--out", str(out), *extra], cwd)
        try:
            _wait_for_first_algorithm(out, proc)
            if ready is not None:
                _wait_for(lambda: ready(out), proc, "the run was ready to be killed")
            time.sleep(delay_s)
        finally:
            proc.kill()
            proc.communicate(timeout=60)
        if _recorded(out) == ["A"] and (ready is None or ready(out)):
            return
        shutil.rmtree(out)
    raise AssertionError(f"B finished before the kill in all {attempts} attempts")


def _tables(out: Path):
    return (pd.read_parquet(out / "rounds.parquet"), pd.read_parquet(out / "devices.parquet"),
            pd.read_csv(out / "summary.csv"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's folder and scenario file."""
    import yaml

    folder = tmp_path_factory.mktemp("reference")
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(small_doc(algorithms=ALGORITHMS)))
    proc = _start([str(path), "--out", str(folder / "run")], folder)
    assert proc.wait(timeout=900) == 0, proc.communicate()  # a loaded machine
    return path, folder / "run"


def _a_complete_b_interrupted(out: Path, ref: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The folder of a run stopped while B ran: manifest interrupted, A complete and B
    interrupted, A's rows those of the uninterrupted run ``ref``; (rounds, ref's rounds)."""
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert manifest["algorithms"]["A"]["status"] == "complete"
    assert manifest["algorithms"]["B"]["status"] == "interrupted"
    rounds = pd.read_parquet(out / "rounds.parquet")
    ref_rounds = pd.read_parquet(ref / "rounds.parquet")
    pd.testing.assert_frame_equal(rounds[rounds.algorithm == "A"].reset_index(drop=True),
                                  ref_rounds[ref_rounds.algorithm == "A"].reset_index(drop=True))
    return rounds, ref_rounds


def _assert_identical(out: Path, ref: Path):
    for ours, theirs in zip(_tables(out), _tables(ref)):
        pd.testing.assert_frame_equal(ours, theirs)
    a, b = (json.loads((p / "manifest.json").read_text()) for p in (out, ref))
    assert a["status"] == b["status"] == "complete"
    assert a["scenario"] == b["scenario"] and a["algorithms"] == b["algorithms"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_cleanly_keeps_the_rounds_and_resume_finishes(tmp_path, reference, sig):
    import shutil

    scenario, ref = reference
    out = tmp_path / "run"
    for _ in range(3):
        proc = _start([str(scenario), "--out", str(out)], tmp_path)
        _wait_for_first_algorithm(out, proc)
        time.sleep(0.3)  # into B's rounds
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        if not (proc.returncode == 0 and _recorded(out) == ["A", "B"]):
            break
        # B finished before the signal (a starved test process on a loaded machine): that
        # attempt tells nothing; start again in a fresh folder, as _kill_while_b_runs does
        shutil.rmtree(out)
    assert proc.returncode == 130, err
    assert f"wirelessfl run --resume {out}" in err and "Traceback" not in err
    rounds, ref_rounds = _a_complete_b_interrupted(out, ref)
    partial = rounds[rounds.algorithm == "B"]
    assert 1 <= len(partial) < (ref_rounds.algorithm == "B").sum()  # B's rounds so far, kept
    assert not (out / ".lock").exists()
    assert main(["run", "--resume", str(out), "--quiet", "--no-report"]) == 0
    _assert_identical(out, ref)


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_uninterrupted_results(tmp_path, reference):
    scenario, ref = reference
    out = tmp_path / "run"
    _kill_while_b_runs(scenario, out, tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "running" and list(manifest["algorithms"]) == ["A"]
    assert (out / ".lock").exists()  # left by the killed writer, stale
    assert main(["run", "--resume", str(out), "--quiet", "--no-report"]) == 0
    _assert_identical(out, ref)


@pytest.mark.slow
def test_a_second_writer_is_refused(tmp_path, reference, capsys):
    scenario, _ = reference
    out = tmp_path / "run"
    proc = _start([str(scenario), "--out", str(out)], tmp_path)
    try:
        _wait_for_first_algorithm(out, proc)
        assert main(["run", "--resume", str(out), "--quiet", "--no-report"]) == 2
        assert f"another run (process {proc.pid}) is writing to this folder" in \
            capsys.readouterr().err
    finally:
        proc.kill()
        proc.wait(timeout=60)
    # a finished folder is not overwritten by a new run either
    assert main(["run", str(scenario), "--out", str(reference[1]), "--quiet"]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_sigterm_in_process_stops_cleanly_keeps_the_rounds_and_resume_finishes(
        tmp_path, scenario_file, monkeypatch, capsys):
    """SIGTERM raised in this process while B runs (at its round 100 of 300): the run stops at a
    clean point as `kill` stops it, exit 130 with the command that goes on, A complete and B's
    rounds so far kept; --resume then gives the uninterrupted run's tables (run here too)."""
    from wirelessfl.engine.context import RunContext

    path = scenario_file(small_doc(algorithms=[ALGORITHMS[0], {**ALGORITHMS[1], "rounds": 300}]))
    ref, out = tmp_path / "ref", tmp_path / "run"
    assert main(["run", str(path), "--out", str(ref), "--quiet", "--no-report"]) == 0
    original = RunContext.end_round

    def end_round(self, completed, theta, *objective):
        original(self, completed, theta, *objective)  # round 100's row is recorded, then the signal
        if self.rounds == 300 and completed == 100:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(RunContext, "end_round", end_round)
    assert main(["run", str(path), "--out", str(out), "--quiet", "--no-report"]) == 130
    err = capsys.readouterr().err
    assert f"wirelessfl run --resume {out}" in err and "Traceback" not in err
    monkeypatch.undo()
    rounds, ref_rounds = _a_complete_b_interrupted(out, ref)
    partial = rounds[rounds.algorithm == "B"].reset_index(drop=True)
    assert list(partial["round"]) == [0, 100]  # eval_every 100: B's rows up to the signal
    pd.testing.assert_frame_equal(
        partial, ref_rounds[ref_rounds.algorithm == "B"].head(2).reset_index(drop=True))
    assert not (out / ".lock").exists()
    assert main(["run", "--resume", str(out), "--quiet", "--no-report"]) == 0
    _assert_identical(out, ref)


# Two algorithms of two rounds: a run of well under a second, interrupted after each of its writes.
QUICK = [{"name": "fedsgd", "rounds": 2, "eval_every": 1, "lr": 0.5, "label": "A"},
         {"name": "fedavg", "rounds": 2, "eval_every": 1, "local_steps": 2, "label": "B"}]


def _count_renames(patch, after: int | None = None, handlers: list | None = None) -> list[int]:
    """Count the run's atomic renames (records.sync's call on the folder that follows each
    os.replace, results/records.py atomic_write); with ``after``, raise what SIGTERM raises
    (runner.sigterm_as_interrupt) right after that rename, noting the SIGTERM disposition of
    that moment in ``handlers``. Returns the count, as a one-item list that the calls update."""
    from wirelessfl.results import records

    original, count = records.sync, [0]

    def sync(path, folder=False):
        original(path, folder)
        if folder:
            count[0] += 1
            if count[0] == after:
                handlers.append(signal.getsignal(signal.SIGTERM))
                raise KeyboardInterrupt("SIGTERM")

    patch.setattr(records, "sync", sync)
    return count


def test_sigterm_right_after_any_write_leaves_a_manifest_that_the_message_matches(
        tmp_path, scenario_file, monkeypatch, capsys):
    """SIGTERM right after each atomic rename of a run, the first included (rounds.parquet in
    the new folder): the folder always holds its manifest, with status 'interrupted' (only the
    last write, summary.csv, comes after the manifest said 'complete'), the line printed states
    that status and --resume finishes the run with the uninterrupted tables. The handler that
    turns SIGTERM into Ctrl-C is in place at each of these points. Before: SIGTERM before the
    algorithm loop (the folder's first writes included) was the default action, the process
    ended silently and left tables without a manifest, which neither --resume nor report
    reads; and an interruption outside an algorithm's rounds printed "manifest status
    'interrupted'" above a manifest that said 'running'."""
    path = scenario_file(small_doc(algorithms=QUICK))
    ref = tmp_path / "ref"
    with monkeypatch.context() as patch:
        renames = _count_renames(patch)
        assert main(["run", str(path), "--out", str(ref), "--quiet", "--no-report"]) == 0
    capsys.readouterr()
    assert renames == [13]  # 3 files at the start, after A, after B and at the end; summary.csv
    for after in range(1, 14):
        out, handlers = tmp_path / f"run-{after}", []
        with monkeypatch.context() as patch:
            _count_renames(patch, after, handlers)
            code = main(["run", str(path), "--out", str(out), "--quiet", "--no-report"])
        err = capsys.readouterr().err
        assert code == 130 and "Traceback" not in err, (after, err)
        assert handlers and callable(handlers[0]), (after, handlers)  # not SIG_DFL: no silent end
        status = json.loads((out / "manifest.json").read_text())["status"]
        assert status == ("complete" if after == 13 else "interrupted"), after
        assert err.rstrip().splitlines()[-1] == (
            f"interrupted: SIGTERM; the rounds recorded so far are in {out} (manifest status "
            f"'{status}'); finish the run with: wirelessfl run --resume {out}"), (after, err)
        assert not (out / ".lock").exists(), after
        assert main(["run", "--resume", str(out), "--quiet", "--no-report"]) == 0, (
            after, capsys.readouterr().err)
        _assert_identical(out, ref)


def test_sigterm_before_the_run_folder_is_written_says_so(tmp_path, scenario_file, monkeypatch,
                                                          capsys):
    """SIGTERM while the world is built, before anything is written: the line says that nothing
    was recorded and that the same command starts again (not '--resume', which has no folder to
    read); the folder holds no run. Before: SIGTERM had its default action there, and the
    command ended without a word."""
    from wirelessfl.pipeline import runner

    handlers = []
    original = runner.build_world

    def build_world(scenario):
        handlers.append(signal.getsignal(signal.SIGTERM))
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(runner, "build_world", build_world)
    path, out = scenario_file(small_doc(algorithms=QUICK)), tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--quiet", "--no-report"]) == 130
    err = capsys.readouterr().err
    assert handlers and callable(handlers[0])
    assert err.rstrip().splitlines()[-1] == (
        f"interrupted: SIGTERM; nothing was recorded in {out} yet; start the run again with "
        "the same command")
    assert not (out / "manifest.json").exists()
    monkeypatch.setattr(runner, "build_world", original)
    assert main(["run", str(path), "--out", str(out), "--quiet", "--no-report"]) == 0


def test_a_diverging_algorithm_stops_with_a_message_and_the_others_finish(tmp_path,
                                                                          scenario_file, capsys):
    algos = [{"name": "fedsgd", "rounds": 6, "eval_every": 1, "lr": 1e38, "label": "blows up"},
             {"name": "fedavg", "rounds": 4, "eval_every": 2, "local_steps": 2, "label": "fine"}]
    out = tmp_path / "run"
    assert main(["run", str(scenario_file(small_doc(algorithms=algos))), "--out", str(out),
                 "--quiet", "--no-report"]) == 0
    err = capsys.readouterr().err
    assert "warning: blows up: loss or parameters became NaN/inf by round" in err
    assert "last finite metrics at round" in err and "lower its learning rate" in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "partial"
    assert manifest["algorithms"]["blows up"]["status"] == "diverged"
    rounds = pd.read_parquet(out / "rounds.parquet")
    fine = rounds[rounds.algorithm == "fine"]
    assert list(fine["round"]) == [0, 2, 4] and fine.test_accuracy.notna().all()
    assert (rounds[rounds.algorithm == "blows up"].test_loss.dropna().abs() < float("inf")).all()


@pytest.mark.slow
def test_sigkill_at_a_random_round_with_checkpoints_resumes_identically(tmp_path, reference,
                                                                         capsys):
    """--checkpoint-every saves B's full state; SIGKILL at a random moment of B's rounds, then
    --resume continues B from its last checkpoint: every result table equals the uninterrupted
    run's."""
    import random

    scenario, ref = reference
    out = tmp_path / "run"
    # killed once B has passed its first checkpoint, a random moment later (B still running)
    _kill_while_b_runs(scenario, out, tmp_path, "--checkpoint-every", "100",
                       ready=lambda folder: (folder / CHECKPOINT_NAME).exists(),
                       delay_s=random.Random().uniform(0.0, 0.5))
    assert main(["run", "--resume", str(out), "--quiet", "--no-report"]) == 0
    assert "B: continuing from the checkpoint after round" in capsys.readouterr().err
    _assert_identical(out, ref)
    assert not (out / CHECKPOINT_NAME).exists()


@pytest.mark.parametrize("name", ["fedred", "scaffold", "fgdro-kl-adam", "zo-hfl", "dzofl"])
def test_a_checkpointed_state_resumes_to_the_same_rounds(tmp_path, name):
    """In process, for algorithms with state of their own: the run resumed from the checkpoint
    after round 3 records exactly the rows and ledger of the run that wrote it."""
    from tests.conftest import algorithm_scenario
    from wirelessfl.pipeline.build import build_world
    from wirelessfl.pipeline.checkpoint import read_checkpoint
    from wirelessfl.pipeline.simulation import run_algorithm

    sc = algorithm_scenario({"name": name, "rounds": 5, "eval_every": 1},
                            ["data.server_fraction=0.3"])
    full = run_algorithm(build_world(sc), sc.algorithms[0], checkpoint_every=3,
                         checkpoint_path=tmp_path / CHECKPOINT_NAME)
    state = read_checkpoint(tmp_path / CHECKPOINT_NAME)
    assert state.completed == 3 and state.label == sc.algorithms[0].display_name
    resumed = run_algorithm(build_world(sc), sc.algorithms[0], resume=state)
    pd.testing.assert_frame_equal(pd.DataFrame(full.rows), pd.DataFrame(resumed.rows))
    assert (full.ledger.energy_j == resumed.ledger.energy_j).all()
    assert (full.ledger.busy_s == resumed.ledger.busy_s).all()
