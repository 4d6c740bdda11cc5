"""Processes that die, signals, concurrent writers and strangers (issue 20): a sweep whose worker
is SIGKILLed fails that run only and exits; SIGTERM stops a sweep like Ctrl-C and leaves no
worker behind; workers do not outlive a SIGKILLed sweep; two writers on one run folder never
both proceed (flock), and a killed writer's lock is free; the Dask LocalCluster the command
starts serves only this process; `compare` refuses a run folder given twice.

The commands are real `python -m wirelessfl` processes; their worker processes are found in
/proc (children whose command line is multiprocessing's spawn_main). Those tests, and the Dask
cluster's, are slow; the rest run in process (tests/hostile.py's ``run_in_process``)."""

from __future__ import annotations

import asyncio
import json
import logging
import operator
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import small_doc
from tests.hostile import RUNNERS, assert_refused, assert_untouched, run_cli, snapshot

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
# Each sweep run: well under a second of simulation after its worker has started.
TINY = [{"name": "dzofl", "rounds": 20, "eval_every": 10},
        {"name": "fedsgd", "rounds": 4, "eval_every": 2, "lr": 0.5}]


def _sweep_file(folder: Path, seeds: list[int], algorithms: list[dict] = TINY) -> Path:
    (folder / "base.yaml").write_text(yaml.safe_dump(small_doc(algorithms=algorithms)))
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump({"scenario": "base.yaml", "seeds": seeds,
                                    "grid": {"channel.uplink.tx_power_dbm": [10]}}))
    return path


def _start(*argv, cwd: Path) -> subprocess.Popen:
    """``wirelessfl ARGV`` in its own session (so that a failing test can kill all of it)."""
    return subprocess.Popen([sys.executable, "-m", "wirelessfl", *map(str, argv)], cwd=cwd,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None when it no longer exists."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in "ZX"  # a zombie has exited


def _workers(parent: int) -> set[int]:
    """The live worker processes ('spawn' children) of ``parent``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or _stat(int(entry.name)) is None:
            continue
        stat = _stat(int(entry.name))
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if stat and stat[1] == parent and b"spawn_main" in cmdline and _alive(int(entry.name)):
            found.add(int(entry.name))
    return found


def _until(condition, proc: subprocess.Popen, timeout: float = 120.0, seen: set | None = None):
    """Poll ``condition()`` until it is truthy (its value), collecting the command's workers in
    ``seen``; fails if the command ends first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if seen is not None:
            seen |= _workers(proc.pid)
        value = condition()
        if value:
            return value
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("timed out")


def _finish(proc: subprocess.Popen, seen: set[int], timeout: float = 180.0):
    """Wait for the command to exit, collecting its workers meanwhile; (stdout, stderr)."""
    end = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < end, "the command did not exit"
        seen |= _workers(proc.pid)
        time.sleep(0.05)
    return proc.communicate()


def _kill_all(proc: subprocess.Popen, seen: set[int]) -> None:
    """Cleanup whatever a failing test left running."""
    for pid in seen:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _finished_runs(out: Path) -> list[Path]:
    runs = out / "runs"
    return [p for p in runs.iterdir() if not p.name.startswith(".")] if runs.is_dir() else []


@pytest.mark.slow
def test_a_killed_worker_fails_its_run_only_and_the_sweep_exits(tmp_path):
    """What the OOM killer does: SIGKILL to one of two workers while it holds a run (every
    worker is handed a run as it starts, and starting takes seconds, so the first worker seen
    holds one). Before: every pending run failed (BrokenProcessPool) and the command hung."""
    out = tmp_path / "out"
    proc = _start("sweep", _sweep_file(tmp_path, [0, 1, 2]), "--out", out, "--workers", 2,
                  "--quiet", "--no-compare", cwd=tmp_path)
    seen: set[int] = set()
    try:
        victim = min(_until(lambda: _workers(proc.pid), proc, seen=seen))
        seen.add(victim)
        os.kill(victim, signal.SIGKILL)
        _, err = _finish(proc, seen)
    finally:
        _kill_all(proc, seen)
    assert proc.returncode == 1, err  # a run failed
    assert "Traceback" not in err
    table = pd.read_csv(out / "runs.csv").set_index("run")
    failed = table[table.status == "failed"]
    assert len(failed) == 1 and (table.status == "complete").sum() == 2, table
    reason = "worker process killed by signal 9 (SIGKILL), e.g. out of memory"
    assert failed.message.iloc[0] == reason
    assert f"failed: {failed.index[0]}: {reason}" in err
    assert len(_finished_runs(out)) == 2
    assert len(seen) >= 3  # a new worker took the dead one's place
    assert not [pid for pid in seen if _alive(pid)]


@pytest.mark.slow
def test_sigterm_stops_a_sweep_like_ctrl_c_and_leaves_no_worker(tmp_path):
    """What `scancel` and `kill` send. Before: the command died and its workers ran on,
    re-parented to init."""
    out = tmp_path / "out"
    proc = _start("sweep", _sweep_file(tmp_path, [0, 1, 2, 3]), "--out", out,
                  "--workers", 2, "--quiet", "--no-compare", cwd=tmp_path)
    seen: set[int] = set()
    try:
        _until(lambda: _finished_runs(out), proc, seen=seen)  # runs finished and in flight
        proc.send_signal(signal.SIGTERM)
        _, err = _finish(proc, seen, timeout=60)
    finally:
        _kill_all(proc, seen)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.rstrip().splitlines()[-1] == (f"interrupted: finished runs are kept in {out}; "
                                              "run the same command again to finish the rest")
    assert seen and not [pid for pid in seen if _alive(pid)]
    table = pd.read_csv(out / "runs.csv")
    done = table[table.status == "complete"]
    assert 1 <= len(done) < 4 and set(table.status) <= {"complete", "pending"}
    assert sorted(p.name for p in _finished_runs(out)) == sorted(done.run)
    assert not (out / ".lock").exists()


@pytest.mark.slow
def test_workers_do_not_outlive_a_sigkilled_sweep(tmp_path):
    """SIGKILL reaches no handler: each worker watches its parent (a pipe that reads as closed
    when the parent is gone) and stops its run and itself."""
    out = tmp_path / "out"
    proc = _start("sweep", _sweep_file(tmp_path, [0, 1, 2, 3]), "--out", out,
                  "--workers", 2, "--quiet", "--no-compare", cwd=tmp_path)
    seen: set[int] = set()
    try:
        _until(lambda: _finished_runs(out), proc, seen=seen)
        workers = _workers(proc.pid)
        assert workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        end = time.monotonic() + 30
        while [pid for pid in workers if _alive(pid)] and time.monotonic() < end:
            time.sleep(0.05)
        assert not [pid for pid in workers if _alive(pid)]
    finally:
        _kill_all(proc, seen)


def test_sigterm_is_ctrl_c_for_every_study_command(capsys):
    """sweep, tune and reproduce run through cli._interruptible: SIGTERM arriving in the middle
    ends in the same line as Ctrl-C (the command exits 130), and the previous SIGTERM handler is
    back afterwards."""
    from wirelessfl.cli import _interruptible, build_parser

    def run(study, out, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        raise AssertionError("SIGTERM did not stop the study")

    before = signal.getsignal(signal.SIGTERM)
    for command in ("sweep", "tune", "reproduce"):
        args = build_parser().parse_args([command, "study.yaml", "--quiet"])
        assert _interruptible(run, None, Path("out"), args) is None
        assert capsys.readouterr().err == ("interrupted: finished runs are kept in out; run the "
                                           "same command again to finish the rest\n")
    assert signal.getsignal(signal.SIGTERM) is before


SLOW = [{"name": "fedavg", "rounds": 4, "eval_every": 2, "local_steps": 2, "label": "A"},
        {"name": "dzofl", "rounds": 600, "eval_every": 100, "label": "B"}]


@pytest.mark.slow
def test_two_writers_on_one_run_folder_never_both_proceed(tmp_path):
    """Two `wirelessfl run --out DIR` started together: exactly one writes, the other is
    refused with one line, whichever order they reach the folder in."""
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(small_doc(algorithms=SLOW)))
    out = tmp_path / "run"
    procs = [_start("run", scenario, "--out", out, "--quiet", "--no-report", cwd=tmp_path)
             for _ in range(2)]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=240)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    codes = sorted(r.returncode for r in results)
    assert codes == [0, 2], [r.stderr for r in results]
    assert_refused(next(r for r in results if r.returncode == 2), str(out))
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"


@pytest.mark.slow
def test_a_sigkilled_writers_lock_is_free(tmp_path):
    """The lock file stays behind with the dead writer's process id, and locks nothing: the
    kernel released the flock with the process."""
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(small_doc(algorithms=SLOW)))
    out = tmp_path / "run"
    proc = _start("run", scenario, "--out", out, "--quiet", "--no-report", cwd=tmp_path)
    try:
        _until(lambda: (out / "manifest.json").is_file(), proc)
        proc.kill()
        proc.wait()
    finally:
        _kill_all(proc, set())
    assert (out / ".lock").read_text() == str(proc.pid)
    done = run_cli("run", "--resume", out, "--quiet", "--no-report", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (out / ".lock").exists()


def test_a_lock_file_that_is_a_symbolic_link_is_refused(tmp_path):
    """A crafted run folder whose .lock points at another file: the lock is refused with one
    line, and the file it points at is neither truncated nor written."""
    from wirelessfl.errors import UserError
    from wirelessfl.results.records import acquire_lock

    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".lock").symlink_to(target)
    with pytest.raises(UserError, match=r"lock file .* symbolic link"):
        acquire_lock(folder)
    assert target.read_text() == "keep me"


def _listening_ports(pids: list[int]) -> set[int]:
    """TCP ports on which the processes ``pids`` listen (/proc/net/tcp{,6}, state 0A)."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _answers_http(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as conn:
            conn.sendall(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            return conn.recv(5) == b"HTTP/"
    except OSError:
        return False


async def _as_stranger(address: str, ssl_context) -> object:
    """Open a connection to ``address`` as another process would, ask the scheduler who it is
    (any message would do) and return the answer."""
    from distributed.comm import connect

    args = {} if ssl_context is None else {"ssl_context": ssl_context}
    comm = await connect(address, timeout="3s", **args)
    try:
        await comm.write({"op": "identity"})
        return await comm.read()
    finally:
        comm.abort()


@pytest.mark.slow
def test_the_dask_local_cluster_serves_only_this_process():
    """A stranger (another local user's process) gets nothing from the scheduler without the
    throwaway authority's certificate (plain TCP, TLS without a client certificate, TLS with
    another authority's), and no port of the cluster answers HTTP; our own client computes.
    Before: a plain TCP scheduler that ran anyone's tasks, and HTTP servers on the scheduler
    and the workers."""
    pytest.importorskip("distributed")
    from distributed.comm.core import CommClosedError
    from distributed.security import Security

    from wirelessfl.sweep.executors import _private_cluster

    cluster, client = _private_cluster(1)
    try:
        address = cluster.scheduler_address
        assert address.startswith("tls://127.0.0.1:")
        assert client.submit(operator.add, 1, 2).result() == 3
        no_certificate = ssl.create_default_context()
        no_certificate.check_hostname = False
        no_certificate.verify_mode = ssl.CERT_NONE
        other_authority = Security.temporary().get_connection_args("client")["ssl_context"]
        strangers = [(address.replace("tls://", "tcp://"), None), (address, no_certificate),
                     (address, other_authority)]
        for stranger in strangers:
            with pytest.raises((OSError, TimeoutError, CommClosedError)):
                asyncio.run(_as_stranger(*stranger))
        # the same call with the cluster's own credentials is answered (the probe can pass)
        ours = cluster.security.get_connection_args("client")["ssl_context"]
        assert asyncio.run(_as_stranger(address, ours))["type"] == "Scheduler"
        pids = [os.getpid(), *client.run(os.getpid).values()]
        ports = _listening_ports(pids)
        assert int(address.rsplit(":", 1)[1]) in ports  # the scan sees the cluster's ports
        assert not [port for port in ports if _answers_http(port)]
    finally:
        client.close()
        cluster.close()


@pytest.mark.slow
def test_a_lost_dask_scheduler_is_one_error_line_and_keeps_the_finished_runs(tmp_path):
    """The scheduler given with --address goes away after the first run finished (here the
    LocalCluster it belongs to is closed): the sweep stops with one `error:` line naming the
    scheduler and how to go on (exit 2), nothing else on stderr (before: distributed's own
    loggers added their lines there, tracebacks too depending on where the connection broke,
    and each unfinished run was recorded as failed: 'worker lost: FutureCancelledError'), and
    the runs that finished are kept; the others stay pending for the same command to run."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                       host="127.0.0.1", dashboard_address=None,
                                       silence_logs=logging.CRITICAL,
                                       env={"PYTHONPATH": ENV["PYTHONPATH"],
                                            "OMP_NUM_THREADS": "1"})
    address = cluster.scheduler_address
    out = tmp_path / "out"
    # a run of about a second, so that the cluster is gone before the last one finishes
    proc = _start("sweep", _sweep_file(tmp_path, [0, 1, 2, 3], SLOW[1:]), "--out", out,
                  "--executor", "dask", "--address", address, "--quiet", "--no-compare",
                  cwd=tmp_path)
    try:
        _until(lambda: _finished_runs(out), proc)
        cluster.close()
        _, err = _finish(proc, set(), timeout=60)
    finally:
        cluster.close()
        _kill_all(proc, set())
    assert proc.returncode == 2, err
    lines = err.rstrip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("study: 4 runs"), err  # nothing else
    assert lines[1].startswith(f"error: the Dask scheduler at {address} was lost"), err
    assert lines[1].endswith("the runs that finished are kept: start the scheduler again (or "
                             "give another with --address) and run the same command again to "
                             "finish the rest"), err
    table = pd.read_csv(out / "runs.csv")
    done = table[table.status == "complete"]
    assert 1 <= len(done) < 4 and set(table.status) <= {"complete", "pending"}, table
    assert sorted(p.name for p in _finished_runs(out)) == sorted(done.run)


def test_compare_refuses_a_run_folder_given_twice(tmp_path):
    """The same run counted twice would be two seeds that always agree (a zero-width interval).
    Refused before anything is read or written; here a sweep folder and one of its runs (the
    folder given twice: test_compare.py)."""
    run = tmp_path / "sweep" / "runs" / "p0-s0"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"status": "complete", "seed": 0}))
    (tmp_path / "sweep" / "sweep.json").write_text(json.dumps(
        {"runs": [{"run": "p0-s0", "folder": "runs/p0-s0", "status": "complete"}]}))
    before = snapshot(tmp_path)
    through = RUNNERS["in-process"]("compare", tmp_path / "sweep", run, "--out",
                                    tmp_path / "cmp", cwd=tmp_path)
    assert_refused(through, "p0-s0", f"through {tmp_path / 'sweep'} and {run}",
                   "give each folder once")
    assert_untouched(tmp_path, before)
