"""Same scenario + same seed = byte-identical rounds.parquet and devices.parquet, whatever the
thread count (OMP_NUM_THREADS, --threads), the executor (run, local sweep, Dask sweep) and the
load (runs side by side). The CNN is the case that used to differ: oneDNN split its
weight-gradient reductions by thread count (host/threads.py). The runs in fresh interpreters
(OpenMP thread counts are set at their start) and on Dask are slow; the thread pool's passes and
its choice run in the fast tier, and tests/test_shipped_identity.py compares 1 and 2 host threads
in process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.test_evaluator import make_evaluator
from wirelessfl.host import threads
from wirelessfl.learning.seeds import keyed_generator

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("rounds.parquet", "devices.parquet")
# seed002-cnn on digits28, 10 devices: a few rounds of each kind of CNN work (per-device
# gradients at a shared model, local SGD, shared-model forward passes, test-set evaluation in
# blocks of 256 samples and a remainder). Before the fix, OMP_NUM_THREADS=1 and 2 gave different
# test losses for both FedSGD and FedAvg here.
CNN = {
    "name": "cnn-determinism", "seed": 0, "channel": "seed002-cell",
    "energy": "seed002-accelerator", "population": {"num_devices": 10},
    "data": {"name": "digits28", "positive_classes": [1, 3, 5, 7, 9], "max_test_samples": 300},
    "model": {"name": "seed002-cnn"}, "quantization_bits": 16, "target_accuracy": 0.8,
    "algorithms": [
        {"name": "fedsgd", "label": "FedSGD", "rounds": 3, "eval_every": 1, "batch_size": 10,
         "lr": 0.1},
        {"name": "fedavg", "label": "FedAvg", "rounds": 2, "eval_every": 1, "batch_size": 10,
         "lr": 0.1, "local_steps": 3},
        {"name": "dzofl", "label": "DZOFL", "rounds": 6, "eval_every": 6, "batch_size": 10,
         "alpha0": 100, "gamma0": 0.05},
    ],
}


def _env(omp: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": str(omp)}
    env.pop("MKL_NUM_THREADS", None)
    return env


def _start(cwd: Path, omp: int, *argv) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "wirelessfl", *map(str, argv), "--quiet"],
                            cwd=cwd, env=_env(omp), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _wait(*procs: subprocess.Popen) -> None:
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]


def _tables(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in TABLES}


def _sweep_run(out: Path) -> Path:
    (folder,) = [p for p in (out / "runs").iterdir() if not p.name.startswith(".")]
    return folder


@pytest.fixture(scope="module")
def cnn_runs(tmp_path_factory):
    """The CNN scenario by `wirelessfl run` (2 runs side by side: 1 OpenMP thread and --threads
    1; 2 OpenMP threads and --threads 2), then by a local sweep (2 OpenMP threads, the default
    threads) beside a Dask sweep on a LocalCluster it starts itself (1 OpenMP thread)."""
    folder = tmp_path_factory.mktemp("determinism")
    (folder / "cnn.yaml").write_text(yaml.safe_dump(CNN, sort_keys=False))
    (folder / "sweep.yaml").write_text(yaml.safe_dump(
        {"scenario": "cnn.yaml", "grid": {"quantization_bits": [16]}, "seeds": [0]}))
    run = ("run", "cnn.yaml", "--no-report", "--out")
    _wait(_start(folder, 1, *run, "one", "--threads", "1"),
          _start(folder, 2, *run, "two", "--threads", "2"))
    sweep = ("sweep", "sweep.yaml", "--workers", "1", "--no-compare", "--out")
    _wait(_start(folder, 2, *sweep, "local"),
          _start(folder, 1, *sweep, "dask", "--executor", "dask"))
    return folder


@pytest.mark.slow
def test_thread_counts_give_identical_tables(cnn_runs):
    assert _tables(cnn_runs / "one") == _tables(cnn_runs / "two")
    for name, used in (("one", 1), ("two", 2)):
        manifest = json.loads((cnn_runs / name / "manifest.json").read_text())
        assert manifest["threads"]["requested"] == used
        assert manifest["threads"]["used"] == used and manifest["threads"]["intra_op"] == 1


@pytest.mark.slow
def test_local_and_dask_sweeps_give_the_runs_tables(cnn_runs):
    for executor in ("local", "dask"):
        run = _sweep_run(cnn_runs / executor)
        assert _tables(run) == _tables(cnn_runs / "one"), executor
        setting = json.loads((run / "manifest.json").read_text())["threads"]
        assert setting["requested"] is None and setting["used"] >= 1
        sweep = json.loads((cnn_runs / executor / "sweep.json").read_text())
        assert sweep["executor"]["kind"] == executor and sweep["executor"]["threads"] is None


@pytest.fixture
def pool_of():
    """Set the thread pool's size for a test; back to none afterwards."""
    def use(size: int) -> None:
        threads.configure(size)

    yield use
    threads.configure(1)


def _cnn_results(ev) -> dict[str, torch.Tensor]:
    """Every threaded pass of the evaluator, at a perturbed model."""
    theta = ev.flat.initial() + 0.01 * torch.randn(ev.flat.d,
                                                   generator=torch.Generator().manual_seed(1))
    idx = ev.sample(keyed_generator(0, "t", 0), 4, steps=2)
    models = theta.expand(ev.num_devices, -1).clone()
    losses, grads = ev.stacked_losses_and_gradients(models, idx[0])
    accuracy, loss, devices = ev.evaluate_devices(theta, batch=3)
    return {"device_losses": ev.device_losses(theta, idx[0]),
            "stacked_losses": ev.stacked_losses(models, idx[0]), "losses": losses,
            "grads": grads, "local_sgd": torch.cat([m for _, m in ev.local_sgd(theta, idx, 0.1)]),
            "full_gradients": ev.full_gradients(theta), "objective": torch.tensor(ev.objective(theta)),
            "objective_gradient": ev.objective_gradient(theta),
            "evaluation": torch.tensor([accuracy, loss, *devices])}


def test_threaded_evaluator_passes_do_not_depend_on_the_pool_size(pool_of, monkeypatch):
    monkeypatch.setattr("wirelessfl.problems.classifier.SAMPLE_BLOCK", 2)  # several blocks
    monkeypatch.setattr("wirelessfl.problems.classifier.PIECE_SAMPLES", 8)  # and pieces
    results = {}
    for size in (1, 2, 3):
        pool_of(size)
        ev = make_evaluator("seed002-cnn")
        assert ev.threaded
        results[size] = _cnn_results(ev)
        # the pool really ran pieces: its threads made private copies of the module
        assert bool(ev.flat._copies) == (size > 1)
    for size in (2, 3):
        for key, value in results[1].items():
            assert torch.equal(value, results[size][key]), (key, size)


def test_parallel_map_keeps_order_and_grad_mode(pool_of):
    pool_of(3)
    with torch.no_grad():
        modes = threads.parallel_map(lambda i: (i, torch.is_grad_enabled()), range(20))
    assert modes == [(i, False) for i in range(20)]
    assert all(threads.parallel_map(lambda _: torch.is_grad_enabled(), range(4)))
    assert threads.parallel_map(lambda _: torch.get_num_threads(), range(6)) == [1] * 6


def test_thread_choice_is_bounded_by_the_cpus_and_shared_among_workers():
    cpus = threads.cpu_count()
    auto = threads.choose()
    assert 1 <= auto.used <= cpus and auto.requested is None and auto.intra_op == 1
    assert 0.0 <= auto.busy_cpus <= cpus + 0.5
    assert threads.choose(workers=cpus + 1).used == 1
    assert threads.choose(5, workers=4).used == 5  # an explicit request is per run
    with pytest.raises(ValueError):
        threads.choose(0)


def test_threads_option_refuses_a_non_positive_count(capsys):
    from wirelessfl.cli import main

    assert main(["run", "quickstart", "--threads", "0", "--quiet"]) == 2
    assert "--threads: must be a positive number" in capsys.readouterr().err
    assert main(["sweep", "sweep-power", "--threads", "-1", "--quiet"]) == 2
    assert "--threads: must be a positive number" in capsys.readouterr().err
