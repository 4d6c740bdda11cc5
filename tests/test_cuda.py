"""The ``device: cuda`` path, on a GPU. Skipped without one (CI has none): run where one is
(``python3 -m pytest tests/test_cuda.py``); benchmarks/cuda_check.py runs every shipped scenario
there too and records what it saw (benchmarks/cuda_check.json).

For every registered algorithm, on the checkpoint suite's small scenarios
(test_checkpoint_format.py):

* a GPU run completes, and the same run again records the same bytes (same scenario and seed,
  same numbers: the GPU computes with deterministic kernels, pipeline/build.py
  ``deterministic_gpu``);
* interrupted and resumed twice from checkpoints, it records the uninterrupted GPU run;
* against the same run on the CPU (the independent truth: another device's kernels), every
  column of the simulated world (times, energies, bits, counts) is equal, and the learning
  columns agree within ``LEARNING_TOLERANCE``.

And each model family's per-device gradients (the stacked path's strategies: linear, the
per-device chain, vmap, batch norm per device) on the GPU equal the CPU's within float32
roundings.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tests.test_checkpoint_format import SCENARIOS as CHECKPOINT_SCENARIOS
from tests.test_checkpoint_format import _interrupted_twice, _table
from wirelessfl.learning import stacked
from wirelessfl.learning.flat_model import FlatModel
from wirelessfl.learning.models import build_model
from wirelessfl.learning.seeds import keyed_generator
from wirelessfl.pipeline import checkpoint as ck
from wirelessfl.pipeline.build import build_world, deterministic_gpu
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.problems.classifier import BatchedEvaluator, DeviceData
from wirelessfl.results.records import LEARNING_COLUMNS, ROUND_COLUMNS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# [D] After 6 rounds in float32 on another device's kernels (other summation orders): relative to
# the column's largest magnitude in the run. The zeroth-order methods amplify roundings through
# their finite differences of losses, as on CPUs of other vector widths (shipped_identity.py
# TOLERANCES), and an accuracy may move by a test sample near the decision boundary.
LEARNING_TOLERANCE = 1e-3
ACCURACY_SAMPLES = 2  # [D] test samples an accuracy may differ by


def _gpu(algorithm_case):
    """The checkpoint suite's scenario of ``algorithm_case`` with ``device: cuda``."""
    sc = CHECKPOINT_SCENARIOS[algorithm_case]()
    return sc.model_copy(update={"device": "cuda"})


@pytest.mark.parametrize("name", sorted(CHECKPOINT_SCENARIOS))
def test_a_gpu_run_is_repeatable_and_resumes_exactly(tmp_path, name):
    sc = _gpu(name)
    world = build_world(sc)
    assert world.device.type == "cuda"
    full = run_algorithm(world, sc.algorithms[0])
    assert full.status == "complete", full.message
    again = run_algorithm(build_world(sc), sc.algorithms[0])
    assert _table(full.rows, tmp_path) == _table(again.rows, tmp_path)
    resumed = _interrupted_twice(sc, tmp_path / ck.CHECKPOINT_NAME)
    assert _table(full.rows, tmp_path) == _table(resumed.rows, tmp_path)


def _frame(rows) -> pd.DataFrame:
    return pd.DataFrame([{c: r.get(c) for c in ROUND_COLUMNS} for r in rows])


def _learning_close(column: str, cpu: pd.Series, gpu: pd.Series, test_size: int) -> None:
    if column == "device_accuracy":
        a = np.stack([np.asarray(v, dtype=float) for v in cpu])
        b = np.stack([np.asarray(v, dtype=float) for v in gpu])
        np.testing.assert_allclose(b, a, atol=0.05, equal_nan=True, err_msg=column)
        return
    a, b = cpu.to_numpy(dtype=float), gpu.to_numpy(dtype=float)
    assert np.array_equal(np.isnan(a), np.isnan(b)), column
    if column.endswith("accuracy"):
        tolerance = ACCURACY_SAMPLES / test_size + 1e-12
    else:
        tolerance = LEARNING_TOLERANCE * float(np.nanmax(np.abs(a), initial=0.0)) + 1e-12
    worst = float(np.nanmax(np.abs(a - b), initial=0.0))
    assert worst <= tolerance, f"{column}: cpu and gpu differ by {worst:.3g} > {tolerance:.3g}"


@pytest.mark.parametrize("name", sorted(CHECKPOINT_SCENARIOS))
def test_a_gpu_run_records_the_cpu_run(name):
    cpu_sc = CHECKPOINT_SCENARIOS[name]()
    cpu_world = build_world(cpu_sc)
    cpu = _frame(run_algorithm(cpu_world, cpu_sc.algorithms[0]).rows)
    gpu_sc = _gpu(name)
    gpu = _frame(run_algorithm(build_world(gpu_sc), gpu_sc.algorithms[0]).rows)
    assert list(cpu.columns) == list(gpu.columns) and len(cpu) == len(gpu)
    test_size = len(cpu_world.dataset.y_test) if cpu_world.dataset is not None else 1
    for column in cpu.columns:
        if column in LEARNING_COLUMNS:
            _learning_close(column, cpu[column], gpu[column], test_size)
        else:
            pd.testing.assert_series_equal(gpu[column], cpu[column], check_exact=True,
                                           obj=column)


# (model name, input shape, hidden widths, PER_DEVICE_MIN_PARAMETERS: 0 forces the per-device
# chain, a huge one the stacked linear path), one per strategy of learning/stacked.py
MODELS = {"mlp stacked": ("mlp", (20,), (16,), 10**15),
          "mlp per-device chain": ("mlp", (20,), (16,), 0),
          "logistic": ("logistic", (20,), (), 10**15),
          "seed002-cnn": ("seed002-cnn", (1, 16, 16), (), None),
          "resnet18 (batch norm per device)": ("resnet18-cifar", (3, 16, 16), (), None)}


# 10 classes: ResNet-18's d = 11,173,962 = 2 mod 4, so row i of [n, d] starts 8 bytes off a
# 16-byte boundary for odd i (stacked.device_row)
CLASSES = 10


def _evaluator(case: str, device: str, monkeypatch) -> BatchedEvaluator:
    name, shape, hidden, threshold = MODELS[case]
    if threshold is not None:  # the same strategy on both devices
        monkeypatch.setattr(stacked, "PER_DEVICE_MIN_PARAMETERS", threshold)
        monkeypatch.setattr(stacked, "PER_DEVICE_MIN_PARAMETERS_GPU", threshold)
    gen = torch.Generator().manual_seed(3)
    devices, per = 3, 8
    x = torch.randn(devices * per, *shape, generator=gen).numpy()
    y = torch.randint(0, CLASSES, (devices * per,), generator=gen).numpy()
    shards = [np.arange(i * per, (i + 1) * per) for i in range(devices)]
    if device == "cuda":
        deterministic_gpu()  # as a GPU run computes (pipeline/build.py torch_device)
    data = DeviceData.from_shards(x, y, shards, x[:4], y[:4], device)
    model = build_model(name, shape, CLASSES, hidden=hidden or (16,), seed=0).to(device)
    return BatchedEvaluator(FlatModel(model), data, activations_per_sample=4096,
                            input_size=int(np.prod(shape)))


@pytest.mark.parametrize("case", sorted(MODELS))
def test_per_device_gradients_on_the_gpu_equal_the_cpus(case, monkeypatch):
    cpu = _evaluator(case, "cpu", monkeypatch)
    gpu = _evaluator(case, "cuda", monkeypatch)
    assert gpu.stacked.strategy == cpu.stacked.strategy
    theta = cpu.initial()
    noise = torch.randn(3, cpu.d, generator=torch.Generator().manual_seed(4))
    models = theta + 0.01 * noise * theta.abs().max()
    idx = cpu.sample(keyed_generator(0, "gpu-test", 0), 4)[0]  # [n, b]: one step
    want = cpu.stacked_gradients(models, idx)
    got = gpu.stacked_gradients(models.cuda(), idx.cuda()).cpu()
    scale = float(want.abs().max())
    # [D] float32 roundings of a few-layer pass summed in another order: 1e-4 of the largest
    # gradient entry (TF32 is off on the GPU, deterministic_gpu)
    assert float((got - want).abs().max()) <= 1e-4 * scale, case



@pytest.mark.parametrize("case", sorted(MODELS))
def test_a_devices_gradient_on_the_gpu_does_not_depend_on_its_row(case, monkeypatch):
    """Each device's gradient computed in a chunk of three equals the same device's alone (its
    parameters a fresh, aligned tensor): bit for bit where devices are passed one by one (the
    same kernels on the same numbers), to float32 roundings where one batched product takes
    them all."""
    gpu = _evaluator(case, "cuda", monkeypatch)
    theta = gpu.initial()
    noise = torch.randn(3, gpu.d, generator=torch.Generator().manual_seed(4)).cuda()
    models = theta + 0.01 * noise * theta.abs().max()
    idx = gpu.sample(keyed_generator(0, "gpu-test", 0), 4)[0]
    together = gpu.stacked_gradients(models, idx)
    for i in range(len(models)):
        alone = gpu.stacked_gradients(models[i:i + 1].clone(), idx[i:i + 1])
        if gpu.stacked.strategy == "per-device":  # the same pass, device by device
            assert torch.equal(together[i], alone[0]), (case, i)
        else:  # one batched product of 3 or of 1: cuBLAS may pick another kernel [D]
            torch.testing.assert_close(alone[0], together[i], rtol=1e-5,
                                       atol=1e-6 * float(together.abs().max()))
