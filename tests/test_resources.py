"""The pre-run memory estimate: its parts by hand from the arrays a run holds, sizes read from
file headers without loading, a refusal that names the numbers and the fix before anything is
built, and each algorithm's declared peak of [N, d] arrays against the state it really keeps."""

from __future__ import annotations

import bz2
import gzip
import struct

import pytest
import torch

from tests.conftest import algorithm_scenario, small_doc, small_scenario
from wirelessfl.cli import main
from wirelessfl.errors import UserError
from wirelessfl.learning.datasets import DataConfig
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.checkpoint import read_checkpoint
from wirelessfl.pipeline.memory import (
    check_memory_from_scenario,
    estimate_memory,
    problem_facts,
)
from wirelessfl.pipeline.runner import run_scenario
from wirelessfl.pipeline.simulation import restore_algorithm, run_algorithm
from wirelessfl.plugins import ALGORITHMS
from wirelessfl.problems.data_size import dataset_shape
from wirelessfl.results.records import DEVICE_ROWS_MAX, FULL_OUTPUT_DEVICES

REGISTRY = ALGORITHMS.load_builtins()


@pytest.mark.parametrize("n", [50, 20_000])
def test_bilevel_estimate_by_hand(n):
    """N clients of fedmsa.md's quadratic (d_x = 3, d_w = 4, so d = 11, float64), FedMSA for
    3 rounds evaluated every round, 16-bit uploads: every part from the array inventory. With
    50 clients the end is the peak (the report's five figures: three of energy, the
    optimisation progress and the network's lifetime); with 20,000 the round is."""
    sc = algorithm_scenario({"name": "fedmsa", "rounds": 3, "eval_every": 1},
                            [f"population.num_devices={n}"])
    d = 3 + 2 * 4
    facts = problem_facts(sc)
    data = 8 * n * 4 * (4 + 3 + 1)  # A [4, 4], B [4, 3], c [4] per client, float64
    assert (facts.data_bytes, facts.load_bytes) == (data, data + 8 * n * 4 * 4)  # + G_m
    est = estimate_memory(sc, facts)
    population = n * 450  # no labels: no counts
    state = 7 * n * d * 8  # DriftCorrected's seven [N, d] float64 arrays
    # all N uploads through the quantiser: float64 work from the heap (< 32 MiB)
    compute = n * d * 78
    rows = 1 + 3  # round 0 and each of the 3 rounds
    round_records = n * 512 + rows * 4096
    # the end: the devices' rows read back (22 numbers and two strings a device; beyond
    # FULL_OUTPUT_DEVICES, DEVICE_ROWS_MAX of them), the rounds rows, the figures
    kept = n if n <= FULL_OUTPUT_DEVICES else DEVICE_ROWS_MAX
    end = kept * (22 * 8 + 2 * 60) + rows * 4096 + 5 * 5 * 2**20
    assert est.moments == {"load": facts.load_bytes,
                           "round": data + population + state + compute + round_records,
                           "end": data + population + end}
    fixed = 10 * 2**20  # no torch model
    if n == 50:
        assert est.parts == {"fixed": fixed, "data": data, "population": population,
                             "state": 0, "compute": 0, "records": end}
    else:
        assert est.parts == {"fixed": fixed, "data": data, "population": population,
                             "state": state, "compute": compute, "records": round_records}
    assert est.total == fixed + max(est.moments.values())
    assert (est.worst, est.d, est.itemsize, est.chunked) == ("fedmsa", d, 8, False)


@pytest.mark.parametrize("n", [8, 400])
def test_classifier_estimate_by_hand(n):
    """The small scenario: N devices on digits (1,797 samples, 450 held out for testing), a
    softmax model (d = 65 x 10 = 650, 74 activations a sample), DZOFL 30 rounds / 10, FedSGD
    6 / 2 and FedAvg 4 / 2 at 16 bits, batch 10, one chunk of all N devices: the loader's peak
    and the round of a vector method by hand."""
    sc = small_scenario([f"population.num_devices={n}"])
    facts = problem_facts(sc)
    assert (facts.d, facts.train_samples, facts.test_samples, facts.input_size,
            facts.activations_per_sample, facts.num_classes) == (650, 1347, 450, 64, 74, 10)
    # held: the device-ordered and loaded training inputs, the test inputs, 24 B a sample,
    # 8 more (the minibatch owner sizes) where a device holds fewer than 10 on average (400
    # devices: 3.4 each); loading: 1,797 x 64 values at 24 B (float64 draws, a float32 copy,
    # the split)
    per_sample = 24 if 1347 / n >= 10 else 32
    assert facts.data_bytes == 4 * 64 * (2 * 1347 + 450) + per_sample * 1347
    assert facts.load_bytes == 24 * 1797 * 64
    est = estimate_memory(sc, facts)
    d = 650
    population = n * 450 + n * (64 + 8 * 10 + 16 * 10)
    row = n * 40 + 4096  # a rounds row: its dict and one float per device
    vectors = n * 4 * 10 * (64 + 3 * 74) + n * 3 * d * 4 + n * d * 78  # chunk + quantiser
    # each earlier algorithm's devices.parquet rows: a table, 22 values of 8 B a device
    fedsgd = n * 512 + vectors + (4 * row + n * 176) + 4 * row  # after DZOFL's records
    fedavg = n * 512 + vectors + (8 * row + 2 * n * 176) + 3 * row
    assert est.moments["load"] == facts.load_bytes
    assert est.moments["round"] == facts.data_bytes + population + max(fedsgd, fedavg)
    # the report's nine figures at most (a classifier with data; a battery counted always)
    assert est.moments["end"] > facts.data_bytes + population + 9 * 5 * 2**20
    assert est.total == (10 + 84) * 2**20 + max(est.moments.values())
    assert (est.worst, est.parts["state"]) == ("fedavg", 0)


def test_fgdro_kl_warm_start_pass_is_counted():
    """FGDRO-KL's warm start runs one forward minibatch of every device before round 0 (the
    rounds then compute the 1 % asked): on 20,000 devices of the small problem the compute
    part is that pass, one chunk of all N under the default 1 GiB bound (inputs and
    activations, 10 samples a device: 4 x 10 x (64 + 74) B) plus each device's minibatch
    indices and uniforms (16 B a sample); the cold start's is the round's alone."""
    n = 20_000
    base = {"name": "fgdro-kl", "rounds": 2, "eval_every": 1, "participation": 0.01,
            "batch_size": 10}
    warm = estimate_memory(algorithm_scenario(base, [f"population.num_devices={n}"]))
    cold = estimate_memory(algorithm_scenario({**base, "start": "cold"},
                                              [f"population.num_devices={n}"]))
    assert warm.parts["compute"] == n * 4 * 10 * (64 + 74) + n * 10 * 16
    assert cold.parts["compute"] < warm.parts["compute"] / 8  # 200 devices a round


def test_dataset_sizes_come_from_headers_without_loading(tmp_path):
    """IDX: the 16-byte header of a gzip file (its body is not there at all); LIBSVM: lines and
    the largest feature index of one streaming pass (plain and .bz2)."""
    header = struct.pack(">4i", 2051, 60_000, 28, 28)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(header))
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(struct.pack(">4i", 2051, 10_000, 28, 28))
    shape = dataset_shape(DataConfig(name="mnist", root=str(tmp_path), classes=[6, 7]))
    assert (shape.train, shape.test, shape.input_shape) == (12_000, 2_000, (1, 28, 28))
    assert (shape.classes, shape.loaded_values) == (2, 70_000 * 784)
    (tmp_path / "a.txt").write_text("1 3:0.5 17:1\n-1 2:1\n+1 1:1 40:2\n")
    (tmp_path / "a.t.bz2").write_bytes(bz2.compress(b"-1 5:1\n1 2:3"))  # no final newline
    shape = dataset_shape(DataConfig(name="libsvm", root=str(tmp_path), file="a.txt",
                                     test_file="a.t"))
    assert (shape.train, shape.test, shape.input_shape) == (3, 2, (41,))


def test_a_run_over_the_limit_is_refused_before_the_world_is_built(monkeypatch, tmp_path):
    sc = small_scenario(["engine.memory_limit_mb=8"])
    est = estimate_memory(sc)
    with pytest.raises(UserError, match=rf"small: this run needs about {est.total / 2**30:.2f} "
                                         r"GiB \(by part, GiB: fixed 0\.09.*but 0\.01 GiB is "
                                         r"the engine\.memory_limit_mb; use a larger "
                                         r"engine\.memory_limit_mb or machine"):
        check_memory_from_scenario(sc)

    def no_build(scenario):
        raise AssertionError("built before the memory check")

    monkeypatch.setattr("wirelessfl.pipeline.runner.build_world", no_build)
    with pytest.raises(UserError, match="needs about"):
        run_scenario(sc, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    check_memory_from_scenario(small_scenario(["engine.memory_limit_mb=200"]))  # fits


def test_the_cli_refuses_with_one_line(scenario_file, capsys):
    assert main(["run", str(scenario_file(small_doc())), "--set", "engine.memory_limit_mb=8",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: small: this run needs about") and err.count("\n") == 1


def test_many_devices_of_a_stateful_method_name_the_state_and_suggest_fewer_devices():
    sc = algorithm_scenario({"name": "fedred", "rounds": 1},
                            ["engine.memory_limit_mb=2000", "population.num_devices=100000",
                             "data.name=synthetic", "data.synthetic.num_samples=1000000",
                             "model.name=mlp", "model.hidden=[256]"])
    d = 20 * 256 + 256 + 256 * 2 + 2
    with pytest.raises(UserError, match=rf"fedred: 700,000 per-device vectors \(100,000 devices\) x "
                                        rf"{d:,} parameters x 4 B = "
                                        rf"{7 * 100_000 * d * 4 / 2**30:.2f} GiB.*use fewer "
                                        r"devices \(population\.num_devices\), a smaller model"):
        check_memory_from_scenario(sc)


def test_compute_dominated_runs_suggest_a_smaller_chunk():
    sc = small_scenario(["engine.memory_limit_mb=300", "population.num_devices=5000",
                         "data.name=synthetic", "data.synthetic.num_samples=50000",
                         "model.name=mlp", "model.hidden=[256]"],
                        algorithms=[{"name": "fedsgd", "rounds": 1}])
    est = estimate_memory(sc)
    assert max(est.parts, key=est.parts.get) == "compute"
    with pytest.raises(UserError, match=r"use a smaller chunk \(--set engine\.max_chunk_mb="):
        check_memory_from_scenario(sc)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_declared_peak_covers_the_state_an_algorithm_keeps(tmp_path, name):
    """[N, d] tensors an algorithm keeps between rounds (read from its checkpointed state) are at
    most its declared ``peak_device_arrays``."""
    sc = algorithm_scenario({"name": name, "rounds": 3, "eval_every": 1},
                            ["data.server_fraction=0.3"])
    world = build_world(sc)
    run_algorithm(world, sc.algorithms[0], checkpoint_every=2, checkpoint_path=tmp_path / "c")
    algorithm = restore_algorithm(world, sc.algorithms[0], read_checkpoint(tmp_path / "c"))
    n, d = world.num_devices, world.evaluator.d
    kept = sum(v.numel() for v in vars(algorithm).values()
               if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[0] == n) / (n * d)
    assert kept <= REGISTRY[name].peak_device_arrays


def test_a_huge_model_is_sized_without_being_built_in_memory():
    """A 10^10-parameter MLP (40 GB of float32) is counted on torch's meta device: the memory
    check refuses it naming its size, and the check itself allocates a small fraction of it (it
    built the model on the CPU before: peaks of GBs, or an allocator error for 10^10)."""
    import tracemalloc

    sc = small_scenario(["model.name=mlp", "model.hidden=[100000,100000]"])
    tracemalloc.start()
    try:
        facts = problem_facts(sc)
        with pytest.raises(UserError, match=r"needs about .* GiB"):
            check_memory_from_scenario(sc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert facts.d == 64 * 100_000 + 100_000 + 100_000 * 100_000 + 100_000 + 100_000 * 10 + 10
    assert peak < 2**30  # measured ~65 MB (the data's catalog and the check); the model: 40 GB


def test_the_meta_count_equals_the_built_models():
    """Counting on the meta device gives the built model's d, MACs and activations."""
    from wirelessfl.energy import profile_model
    from wirelessfl.learning.models import build_model

    for name, shape in [("seed002-cnn", (1, 28, 28)), ("mlp", (64,)), ("logistic", (30,)),
                        ("resnet18-cifar", (3, 32, 32))]:
        built, meta = build_model(name, shape, 10), build_model(name, shape, 10, device="meta")
        assert next(meta.parameters()).is_meta
        a, b = profile_model(built, shape), profile_model(meta, shape)
        assert (a.params, a.macs_per_sample, a.activations_per_sample) \
            == (b.params, b.macs_per_sample, b.activations_per_sample), name
