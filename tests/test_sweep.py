"""Sweeps: validation of sweep files, the same numbers on every executor, resuming after a kill,
failed runs kept and retried.

The tests of what a sweep does with its runs run them twice: in this process (the fast tier;
tests/conftest.py's ``runs_in_this_process``) and in the local executor's worker processes (fresh
interpreters: slow). The executors themselves (worker processes, a SIGKILLed sweep, Dask) are
tested in the slow tier only."""

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
import yaml

from tests.conftest import RUNS_WHERE, runs_at, runs_in_this_process, small_doc
from tests.conftest import cli as _cli
from wirelessfl.cli import main

ROOT = Path(__file__).resolve().parents[1]
# Subprocesses and Dask workers must import this checkout's code (not another install).
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
GRID = {"channel.uplink.tx_power_dbm": [0, 23]}


def _tiny():
    """The small scenario, shortened: each run is well under a second of simulation."""
    return small_doc(algorithms=[{"name": "dzofl", "rounds": 20, "eval_every": 10},
                                 {"name": "fedsgd", "rounds": 4, "eval_every": 2, "lr": 0.5}])


def _write_sweep(folder: Path, sweep: dict, base: dict | None = None) -> Path:
    (folder / "base.yaml").write_text(yaml.safe_dump(base or _tiny(), sort_keys=False))
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump({"scenario": "base.yaml", **sweep}, sort_keys=False))
    return path



def _finished(out: Path) -> dict[str, float]:
    """Run folder -> mtime of its rounds.parquet, for every run folder in place."""
    return {p.name: (p / "rounds.parquet").stat().st_mtime_ns
            for p in (out / "runs").iterdir() if not p.name.startswith(".")}


def _frames(out: Path, name: str) -> dict[str, pd.DataFrame]:
    return {p.name: pd.read_parquet(p / name) for p in sorted((out / "runs").iterdir())}


@pytest.fixture(scope="module", params=RUNS_WHERE)
def local_sweep(request, tmp_path_factory):
    """A 2 x 2 sweep (power x seed) run with the local executor on 2 workers: its runs in this
    process, or (slow) in 2 worker processes."""
    folder = tmp_path_factory.mktemp("local")
    path = _write_sweep(folder, {"grid": GRID, "seeds": [0, 1]})
    with runs_at(request.param):
        code = main(["sweep", str(path), "--out", str(folder / "out"), "--workers", "2",
                     "--quiet", "--no-compare"])
    assert code == 0
    return path, folder / "out"


def test_sweep_folder_layout_and_table(local_sweep):
    _, out = local_sweep
    table = pd.read_csv(out / "runs.csv")
    assert len(table) == 4 and set(table.status) == {"complete"}
    assert sorted(table["channel.uplink.tx_power_dbm"]) == [0, 0, 23, 23]
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["keys"] == ["channel.uplink.tx_power_dbm"] and manifest["seeds"] == [0, 1]
    for row in table.itertuples():
        run = json.loads((out / row.folder / "manifest.json").read_text())
        # each run folder is the format `wirelessfl run` writes, for its own point and seed
        assert run["status"] == "complete" and run["seed"] == row.seed
        assert run["scenario"]["channel"]["uplink"]["tx_power_dbm"] == row[4]
        assert {"rounds.parquet", "devices.parquet", "summary.csv"} <= {
            p.name for p in (out / row.folder).iterdir()}
    assert not [p for p in (out / "runs").iterdir() if p.name.startswith(".")]


def test_a_sweep_point_equals_wirelessfl_run_of_that_point(local_sweep, tmp_path, capsys):
    path, out = local_sweep
    table = pd.read_csv(out / "runs.csv")
    row = table[(table.seed == 1) & (table["channel.uplink.tx_power_dbm"] == 0)].iloc[0]
    code, _, _ = _cli(capsys, "run", path.parent / "base.yaml", "--out", tmp_path / "one",
                      "--set", "seed=1", "--set", "channel.uplink.tx_power_dbm=0", "--quiet",
                      "--no-report")
    assert code == 0
    for name in ("rounds.parquet", "devices.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(out / row.folder / name),
                                      pd.read_parquet(tmp_path / "one" / name))


def test_a_worker_reports_the_package_it_imported():
    """sweep/worker.py names the package's __init__.py without importing the top package (a
    higher layer): its result's 'module' is still ``wirelessfl.__file__``, this checkout's."""
    import wirelessfl
    from wirelessfl.sweep.worker import run_point

    result = run_point({"run_id": "r", "scenario": {"nosuch": 1}, "source": "test",
                        "sweep": {}})
    assert result["status"] == "failed"
    assert result["module"] == wirelessfl.__file__ == str(ROOT / "wirelessfl" / "__init__.py")


@pytest.mark.slow
@pytest.mark.parametrize("local_sweep", ["worker-processes"], indirect=True)
def test_dask_cluster_gives_the_local_executors_numbers(local_sweep, tmp_path, capsys):
    distributed = pytest.importorskip("distributed")
    path, local_out = local_sweep
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       host="127.0.0.1", dashboard_address=None,
                                       env={"PYTHONPATH": ENV["PYTHONPATH"]})
    try:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        with distributed.Client(cluster) as client:  # the workers run this checkout's code
            modules = client.run(lambda: __import__("wirelessfl").__file__)
            assert set(modules.values()) == {str(ROOT / "wirelessfl" / "__init__.py")}
        code, _, err = _cli(capsys, "sweep", path, "--out", tmp_path / "dask", "--executor",
                            "dask", "--address", cluster.scheduler_address, "--quiet",
                            "--no-compare")
        assert code == 0, err
    finally:
        cluster.close()
    assert cluster.status.name == "closed"
    for name in ("rounds.parquet", "devices.parquet"):
        local, dask = _frames(local_out, name), _frames(tmp_path / "dask", name)
        assert list(local) == list(dask) and len(local) == 4
        for run in local:
            pd.testing.assert_frame_equal(local[run], dask[run])
    # 1 worker instead of 2, locally and on the LocalCluster the command starts and stops itself
    for out, executor in ((tmp_path / "one", "local"), (tmp_path / "own-cluster", "dask")):
        code, _, err = _cli(capsys, "sweep", path, "--out", out, "--workers", "1", "--executor",
                            executor, "--quiet", "--no-compare")
        assert code == 0, err
        for run, frame in _frames(out, "rounds.parquet").items():
            pd.testing.assert_frame_equal(frame, _frames(local_out, "rounds.parquet")[run])


def test_rerun_skips_finished_runs(local_sweep, capsys):
    path, out = local_sweep
    before = _finished(out)
    code, stdout, err = _cli(capsys, "sweep", path, "--out", out, "--quiet", "--no-compare")
    assert code == 0
    assert "4 already finished, 0 to run" in err
    assert "4 of 4 runs finished (4 skipped" in stdout
    assert _finished(out) == before


def test_a_sweep_stopped_midway_reruns_only_the_missing_runs(tmp_path, capsys):
    """In process: Ctrl-C (KeyboardInterrupt) as the third of six runs starts; the two finished
    runs are kept, and the same command runs only the four missing ones (the finished ones not
    rewritten). A SIGKILLed sweep process and its workers: the next test (slow)."""
    path = _write_sweep(tmp_path, {"grid": {"channel.uplink.tx_power_dbm": [0, 10, 23]},
                                   "seeds": [0, 1]})
    out = tmp_path / "out"

    def ctrl_c(k, task):
        if k == 2:
            raise KeyboardInterrupt

    argv = ("sweep", path, "--out", out, "--workers", "1", "--quiet", "--no-compare")
    with runs_in_this_process(before_each=ctrl_c):
        code, _, err = _cli(capsys, *argv)
    assert code == 130 and err.rstrip().splitlines()[-1].startswith("interrupted: "), err
    before = _finished(out)
    assert len(before) == 2
    assert set(pd.read_csv(out / "runs.csv").status) == {"complete", "pending"}
    with runs_in_this_process():
        code, _, err = _cli(capsys, *argv)
    assert code == 0
    assert "2 already finished, 4 to run" in err
    after = _finished(out)
    assert len(after) == 6
    assert {k: after[k] for k in before} == before  # the finished ones were not rewritten
    assert set(pd.read_csv(out / "runs.csv").status) == {"complete"}
    assert not [p for p in (out / "runs").iterdir() if p.name.startswith(".")]


def test_a_stop_right_after_a_run_folder_is_published_still_records_that_run(tmp_path, capsys,
                                                                           monkeypatch):
    """SIGTERM between a run folder's publication and its entry's update (the window a slow
    test hit by chance): runs.csv records the run as its folder says, complete, not pending."""
    from wirelessfl.sweep import study

    path = _write_sweep(tmp_path, {"grid": {"channel.uplink.tx_power_dbm": [0, 23]},
                                   "seeds": [0]})
    out = tmp_path / "out"
    publish = study.publish_folder

    def publish_then_stop(files, folder):
        publish(files, folder)
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(study, "publish_folder", publish_then_stop)
    with runs_in_this_process():
        code, _, err = _cli(capsys, "sweep", path, "--out", out, "--workers", "1", "--quiet",
                            "--no-compare")
    assert code == 130, err
    table = pd.read_csv(out / "runs.csv")
    assert len(_finished(out)) == 1
    assert sorted(table[table.status == "complete"].run) == sorted(_finished(out))
    assert set(table.status) == {"complete", "pending"}


@pytest.mark.slow
def test_killed_sweep_reruns_only_the_missing_runs(tmp_path, capsys):
    path = _write_sweep(tmp_path, {"grid": {"channel.uplink.tx_power_dbm": [0, 10, 23]},
                                   "seeds": [0, 1]})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "wirelessfl", "sweep", str(path), "--out",
                             str(out), "--workers", "1", "--quiet", "--no-compare"], env=ENV,
                            cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        runs = out / "runs"
        if runs.is_dir() and any(not p.name.startswith(".") for p in runs.iterdir()):
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its worker processes, mid-sweep
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    before = _finished(out)
    assert 1 <= len(before) < 6
    code, _, err = _cli(capsys, "sweep", path, "--out", out, "--workers", "1", "--quiet",
                             "--no-compare")
    assert code == 0
    assert f"{len(before)} already finished, {6 - len(before)} to run" in err
    after = _finished(out)
    assert len(after) == 6
    assert {k: after[k] for k in before} == before  # the finished ones were not rewritten
    assert set(pd.read_csv(out / "runs.csv").status) == {"complete"}
    assert not [p for p in (out / "runs").iterdir() if p.name.startswith(".")]


def test_a_second_sweep_on_a_running_sweeps_folder_is_refused(tmp_path, capsys, runs_where):
    """The folder's flock is held (here by this process, through another open file: flock locks
    of two open files conflict, even in one process): refused, one line, nothing written. Once
    it is released, a lock file naming a live process but not locked (what a killed writer
    leaves) does not block: only the kernel's lock counts."""
    from wirelessfl.results.records import acquire_lock

    path = _write_sweep(tmp_path, {"grid": {"channel.uplink.tx_power_dbm": [0]}, "seeds": [0]})
    out = tmp_path / "out"
    out.mkdir()
    with acquire_lock(out):
        assert (out / ".lock").read_text() == str(os.getpid())
        code, _, err = _cli(capsys, "sweep", path, "--out", out, "--workers", "1", "--quiet")
        assert code == 2
        assert err == (f"error: {out}: another run (process {os.getpid()}) is writing to this "
                       "folder; wait for it or choose another --out\n")
        assert not (out / "runs.csv").exists()
    assert not (out / ".lock").exists()
    (out / ".lock").write_text(str(os.getppid()))
    code, _, err = _cli(capsys, "sweep", path, "--out", out, "--workers", "1", "--quiet",
                        "--no-compare")
    assert code == 0, err
    assert not (out / ".lock").exists()


def test_failed_run_keeps_its_error_and_is_retried(tmp_path, capsys, runs_where):
    # FashionMNIST from a folder that does not exist: valid scenario, fails when it runs
    path = _write_sweep(tmp_path, {"points": [{"data.name": "digits"},
                                              {"data.name": "fashionmnist",
                                               "data.root": str(tmp_path / "missing")}]})
    out = tmp_path / "out"
    code, _, err = _cli(capsys, "sweep", path, "--out", out, "--workers", "1", "--quiet")
    assert code == 1 and "Traceback" not in err
    table = pd.read_csv(out / "runs.csv").set_index("data.name")
    assert table.loc["digits", "status"] == "complete"
    assert table.loc["fashionmnist", "status"] == "failed"
    assert "train-images-idx3-ubyte" in table.loc["fashionmnist", "message"]
    assert not (out / table.loc["fashionmnist", "folder"]).exists()
    finished = _finished(out)
    code, _, err = _cli(capsys, "sweep", path, "--out", out, "--workers", "1", "--quiet")
    assert code == 1 and "1 already finished, 1 to run (1 failed before, retried)" in err
    table = pd.read_csv(out / "runs.csv").set_index("data.name")
    assert table.loc["fashionmnist", "attempts"] == 2
    assert "train-images-idx3-ubyte" in table.loc["fashionmnist", "message"]
    assert _finished(out) == finished
    # the comparison covers the finished run (one seed, two algorithms), not the failed one
    from wirelessfl.results.compare import compare_dirs

    comp = compare_dirs([out])
    assert len(comp.runs) == 2 and set(comp.runs.run) == {str(out / table.loc["digits",
                                                                             "folder"])}


def test_changed_base_scenario_reruns_stale_runs(tmp_path, capsys, runs_where):
    path = _write_sweep(tmp_path, {"grid": {"channel.uplink.tx_power_dbm": [23]}})
    out = tmp_path / "out"
    assert _cli(capsys, "sweep", path, "--out", out, "--workers", "1", "--quiet",
                "--no-compare")[0] == 0
    _write_sweep(tmp_path, {"grid": {"channel.uplink.tx_power_dbm": [23]}},
                 small_doc(target_accuracy=0.6, algorithms=_tiny()["algorithms"]))
    code, _, err = _cli(capsys, "sweep", path, "--out", out, "--workers", "1", "--quiet",
                        "--no-compare")
    assert code == 0 and "0 already finished, 1 to run" in err
    run, kept = sorted((out / "runs").iterdir())
    assert json.loads((run / "manifest.json").read_text())["scenario"]["target_accuracy"] == 0.6
    # the earlier run (another scenario) is kept beside it, not deleted
    assert kept.name.startswith(run.name + ".replaced-")
    assert json.loads((kept / "manifest.json").read_text())["scenario"]["target_accuracy"] == 0.5
    assert kept.name in pd.read_csv(out / "runs.csv").message[0]


@pytest.mark.parametrize(
    ("sweep", "expected"),
    [
        ({"grid": GRID, "seedz": [0]}, "study.yaml: seedz: unknown key"),
        ({"grid": {"channel.uplink.tx_pwr_dbm": [0]}},
         "study.yaml: grid.channel.uplink.tx_pwr_dbm (value 0): not accepted by the scenario"),
        ({"grid": {"population.num_devices": [10, -3]}},
         "study.yaml: grid.population.num_devices (value -3): not accepted"),
        ({"grid": {}}, "study.yaml: grid: empty"),
        ({"grid": {"population.num_devices": []}},
         "study.yaml: grid.population.num_devices: empty list of values"),
        ({"seeds": [0]}, "give exactly one of 'grid'"),
        ({"grid": {"seed": [1, 2]}}, "study.yaml: grid.seed: the seed is swept by the 'seeds'"),
        ({"points": [{"algorithms.nosuch.rounds": 3}]},
         "study.yaml: points[0].algorithms.nosuch: no entry named 'nosuch'"),
        ({"grid": GRID, "set": {"quantization_bitz": 8}}, "study.yaml: set: not accepted"),
        ({"grid": GRID, "seeds": [1, 1]}, "study.yaml: seeds: a seed is listed twice"),
    ],
)
def test_bad_sweep_file_is_one_clean_line(tmp_path, capsys, sweep, expected):
    path = _write_sweep(tmp_path, sweep)
    code, _, err = _cli(capsys, "sweep", path, "--out", tmp_path / "out")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected in lines[0]
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.slow
def test_bad_sweep_file_in_a_real_process_has_no_traceback(tmp_path):
    path = _write_sweep(tmp_path, {"grid": {"population.num_devicez": [3]}})
    proc = subprocess.run([sys.executable, "-m", "wirelessfl", "sweep", str(path)], check=False,
                          capture_output=True, text=True, env=ENV, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "grid.population.num_devicez (value 3)" in proc.stderr
    assert "population.num_devicez: unknown key" in proc.stderr


def test_run_refuses_a_sweep_file_and_bad_flags(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --out is ./sweeps/<name>: nothing may appear
    path = _write_sweep(tmp_path, {"grid": GRID})
    code, _, err = _cli(capsys, "run", path)
    assert code == 2 and "this is a sweep file" in err and "wirelessfl sweep" in err
    code, stdout, _ = _cli(capsys, "validate", path)
    assert code == 0 and "valid sweep over 'base.yaml' (2 runs: 2 points x 1 seeds" in stdout
    code, _, err = _cli(capsys, "sweep", path, "--workers", "0")
    assert code == 2 and err.startswith("error: --workers")
    code, _, err = _cli(capsys, "sweep", path, "--address", "tcp://127.0.0.1:1")
    assert code == 2 and "--address is for --executor dask" in err
    assert not (tmp_path / "sweeps").exists()  # refused before anything was written


def test_html_reports_are_self_contained(local_sweep, tmp_path, capsys):
    import base64
    import re

    _, out = local_sweep
    code, stdout, _ = _cli(capsys, "report", out, "--html", "--out", tmp_path / "sweep")
    assert code == 0 and "reached target" in stdout
    page = (tmp_path / "sweep" / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 4
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    # nothing fetched from anywhere: no script, every src/href is inline
    assert "<script" not in page
    assert re.findall(r'(?:src|href)="(?!data:)', page) == []
    assert "channel.uplink.tx_power_dbm" in page and "tx_power_dbm" in page
    assert page.count("<tr") >= 1 + 4 + 1 + 4  # comparison (2 algorithms x 2 powers) and runs
    run = min((out / "runs").iterdir())
    code, _, _ = _cli(capsys, "report", run, "--html", "--out", tmp_path / "run")
    assert code == 0
    page = (tmp_path / "run" / "report.html").read_text()
    assert "<script" not in page and page.count("data:image/png;base64,") >= 3
    assert "tx_power_dbm:" in page  # the resolved scenario, as YAML
