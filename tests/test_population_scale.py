"""Populations larger than the data and the per-device outputs of large runs.

A world of 100,000 devices on a 2,000-sample dataset builds in seconds, each device holding one
sample drawn with replacement; the memory estimate's data and population parts are checked by
hand. Above FULL_OUTPUT_DEVICES devices, devices.parquet keeps the rows of the devices that took
part (a sample of them beyond DEVICE_ROWS_MAX) and the manifest the quantiles and totals over
every device, and the label counts of a sample: checked on hand-computed small cases (the limits
lowered) and end to end; the figures say what they draw.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

import wirelessfl
from tests.conftest import small_doc
from wirelessfl.learning.partition import label_counts, mean_tv_distance
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.memory import estimate_memory, problem_facts
from wirelessfl.report import plots
from wirelessfl.results import records
from wirelessfl.results.records import DEVICE_COLUMNS, device_records, partition_manifest


def _wide_doc(n: int) -> dict:
    """n devices on 2,000 synthetic samples (8 features, 4 classes; 1,500 for training), an
    MLP 8-8-4, one FedAvg round."""
    return small_doc(
        name="wide", population={"num_devices": n},
        data={"name": "synthetic", "synthetic": {"num_samples": 2000, "num_features": 8,
                                                 "num_classes": 4, "informative": 3}},
        model={"name": "mlp", "hidden": [8]},
        algorithms=[{"name": "fedavg", "rounds": 1, "eval_every": 1, "local_steps": 1,
                     "participation": 0.001}])


def test_a_world_of_100000_devices_on_2000_samples():
    """Every device draws one sample (the population outgrows the 1,500 training samples); the
    build takes seconds (about 1 s on 2 shared cores; the bound is generous for a loaded
    machine); the manifest keeps the label counts of 2,000 sampled devices."""
    n = 100_000
    scenario = wirelessfl.load_scenario(_wide_doc(n))
    start = time.perf_counter()
    world = build_world(scenario)
    assert time.perf_counter() - start < 10.0
    assert world.shards.with_replacement and world.shards.sizes.tolist() == [1] * n
    assert world.evaluator.data.sizes.sum() == n and world.evaluator.data.x.shape == (1500, 8)
    assert world.evaluator.data.index.shape == (n,)  # indices into the training set, no copies
    assert world.shards.order.max() < 2000 and len(np.unique(world.shards.order)) <= 1500
    record = world.partition_record()
    sample = record["label_counts_sample"]
    counts = label_counts(world.dataset.y_train, world.shards, 4)
    assert len(sample["devices"]) == 2000 and sample["devices"] == sorted(sample["devices"])
    assert sample["counts"] == counts[sample["devices"]].tolist()
    assert "label_counts" not in record and record["num_devices"] == n
    assert record["class_totals"] == counts.sum(axis=0).tolist() and sum(record["class_totals"]) == n
    assert record["mean_label_tv"] == mean_tv_distance(counts)
    assert (record["with_replacement"], record["samples_drawn"],
            record["training_samples_on_devices"]) == (True, n, 1500)


def test_memory_estimate_of_a_population_drawing_with_replacement():
    """Data: the inputs as loaded (1,500 x 8 float32) and as the devices read them (the
    training set once: the entries, one or seven a device, outnumber it), the test set
    (500 x 8), 32 B an entry (24 always, 8 for the minibatch owner sizes: one or seven samples
    a device, fewer than fedavg's minibatch of 10; 24 at twenty a device, where the owner sizes
    are never made); population: 450 B a device, the
    label-count lists of 2,000 sampled devices (64 + 8 x 4 B each) and two [N, 4] arrays."""
    n = 100_000
    for extra, entries, per_entry in (({}, n, 32),
                                      ({"partition": {"samples_per_device": 7}}, 7 * n, 32),
                                      ({"partition": {"samples_per_device": 20}}, 20 * n, 24)):
        doc = _wide_doc(n)
        doc.update(extra)
        scenario = wirelessfl.load_scenario(doc)
        facts = problem_facts(scenario)
        assert facts.data_bytes == 4 * 8 * (1500 + 1500 + 500) + per_entry * entries
        est = estimate_memory(scenario, facts)
        assert est.parts["population"] == n * 450 + 2000 * (64 + 8 * 4) + n * 2 * 8 * 4
    fits = wirelessfl.load_scenario(_wide_doc(1000))  # the split: the training set as before
    # 1.5 samples a device on average, fewer than the minibatch: the owner sizes counted
    assert problem_facts(fits).data_bytes == 4 * 8 * (2 * 1500 + 500) + 32 * 1500


# ---- devices.parquet and the manifest above the limit -------------------------------------------
def _columns(n: int) -> dict[str, np.ndarray]:
    """Per-device columns of a 6-device run: energy 0..5 J, devices 1..4 took part (computed or
    sent), devices 1 and 4 ran out of energy at 7 s and 1 s, classes a b a a b b."""
    columns = {name: np.zeros(n) for name in DEVICE_COLUMNS[1:]}
    columns["device"] = np.arange(n, dtype=np.int64)
    columns["device_class"] = np.array(["a", "b", "a", "a", "b", "b"][:n], dtype=object)
    columns["energy_j"] = np.arange(n, dtype=float)
    columns["compute_s"] = np.array([0.0, 1.0, 0.0, 2.0, 3.0, 0.0][:n])
    columns["depleted_at_s"] = np.array([np.nan, 7.0, np.nan, np.nan, 1.0, np.nan][:n])
    for name in ("packets_sent", "packets_delivered", "transmissions", "late_uploads",
                 "broadcasts_missed"):
        columns[name] = np.zeros(n, dtype=np.int64)
    columns["transmissions"][2] = 1
    return columns


def test_device_records_below_the_limit_are_every_row_as_before(monkeypatch):
    """Up to the limit: one row per device, the table the dict rows made (same dtypes)."""
    monkeypatch.setattr(records, "FULL_OUTPUT_DEVICES", 6)
    columns = _columns(6)
    frame, summary = device_records("A", columns, np.arange(6))
    rows = [{"algorithm": "A", **{k: v[i].item() if hasattr(v[i], "item") else v[i]
                                  for k, v in columns.items()}} for i in range(6)]
    assert summary is None
    pd.testing.assert_frame_equal(frame, pd.DataFrame(rows, columns=DEVICE_COLUMNS))


def test_device_records_above_the_limit_by_hand(monkeypatch):
    """6 devices > 4: devices 1-4 took part; at most 2 rows: the two of lowest rank among them
    (ranks 3, 0, 1, 4 -> devices 2 and 3); quantiles over all 6 by hand (linear interpolation
    at q x 5), depleted_at_s over the two that ran out; per class a (0, 2, 3), b (1, 4, 5)."""
    monkeypatch.setattr(records, "FULL_OUTPUT_DEVICES", 4)
    monkeypatch.setattr(records, "DEVICE_ROWS_MAX", 2)
    frame, summary = device_records("A", _columns(6), np.array([5, 3, 0, 1, 4, 2]))
    assert frame.device.tolist() == [2, 3] and frame.algorithm.tolist() == ["A", "A"]
    assert frame.columns.tolist() == DEVICE_COLUMNS
    assert (summary["num_devices"], summary["took_part"], summary["rows_written"]) == (6, 4, 2)
    assert summary["rows"].startswith("a random sample of 2 of the 4 devices that took part")
    energy = summary["columns"]["energy_j"]
    assert (energy["count"], energy["sum"], energy["mean"]) == (6, 15.0, 2.5)
    assert energy["quantiles"] == pytest.approx([0, 0.25, 1.25, 2.5, 3.75, 4.75, 5])
    depleted = summary["columns"]["depleted_at_s"]
    assert (depleted["count"], depleted["sum"], depleted["mean"]) == (2, 8.0, 4.0)
    assert depleted["quantiles"] == pytest.approx([1, 1.3, 2.5, 4, 5.5, 6.7, 7])
    assert summary["classes"]["a"] == {**summary["classes"]["a"], "devices": 3, "took_part": 2,
                                       "energy_j": 5.0, "compute_s": 2.0}
    assert summary["classes"]["b"]["devices"] == 3 and summary["classes"]["b"]["energy_j"] == 10
    monkeypatch.setattr(records, "DEVICE_ROWS_MAX", 10)
    frame, summary = device_records("A", _columns(6), np.arange(6))
    assert frame.device.tolist() == [1, 2, 3, 4]
    assert summary["rows"].startswith("every device that took part")


def test_partition_manifest_keeps_a_sample_of_label_counts_above_the_limit(monkeypatch):
    counts = np.array([[3, 0], [1, 1], [0, 2], [5, 5], [2, 0]])
    ranks = np.array([4, 0, 3, 1, 2])
    full = partition_manifest("iid", {}, counts, ranks)
    assert full["label_counts"] == counts.tolist() and "label_counts_sample" not in full
    monkeypatch.setattr(records, "FULL_OUTPUT_DEVICES", 3)
    monkeypatch.setattr(records, "LABEL_SAMPLE_DEVICES", 2)
    entry = partition_manifest("iid", {}, counts, ranks, {"with_replacement": True})
    assert entry["label_counts_sample"] == {"devices": [1, 3], "counts": [[1, 1], [5, 5]]}
    assert (entry["num_devices"], entry["class_totals"]) == (5, [11, 8])
    # TV by hand: overall (11/19, 8/19); devices' mixes (1,0), (.5,.5), (0,1), (.5,.5), (1,0)
    overall = 11 / 19
    tv = [1 - overall, abs(0.5 - overall), overall, abs(0.5 - overall), 1 - overall]
    assert entry["mean_label_tv"] == pytest.approx(np.mean(tv))
    assert entry["with_replacement"] is True and "label_counts" not in entry


# ---- figures ------------------------------------------------------------------------------------
class _Record:
    def __init__(self, rounds, devices, manifest):
        self.rounds, self.devices, self.manifest = rounds, devices, manifest


def test_label_histogram_of_a_sample_says_so():
    counts = np.random.default_rng(0).integers(0, 5, size=(300, 3)).tolist()
    manifest = {"scenario": {"name": "x"}, "partition": {
        "scheme": "dirichlet", "params": {"alpha": 0.1}, "num_classes": 3, "mean_label_tv": 0.4,
        "num_devices": 1_000_000, "class_totals": [1, 2, 3], "with_replacement": True,
        "label_counts_sample": {"devices": list(range(0, 3000, 10)), "counts": counts}}}
    fig = plots.label_histogram(_Record(pd.DataFrame(), pd.DataFrame(), manifest))
    ax = fig.axes[0]
    assert ax.get_xlabel() == ("device: a random sample of 300 of the 1,000,000 devices, "
                               "in id order")
    assert "drawn with replacement" in ax.get_title() and "(over all devices)" in ax.get_title()
    assert len(ax.collections) == 3  # one outline per class, one step per sampled device


def test_device_accuracy_points_of_a_sample_box_of_all(monkeypatch):
    monkeypatch.setattr(plots, "POINT_DEVICES", 5)
    values = np.linspace(0, 1, 50).tolist()
    rounds = pd.DataFrame({"algorithm": ["A"], "round": [1], "energy_j": [1.0],
                           "device_accuracy": [values], "worst_device_accuracy": [0.0],
                           "worst_k_device_accuracy": [0.1]})
    fig = plots.device_accuracy(_Record(rounds, pd.DataFrame(), {"scenario": {}}))
    ax = fig.axes[0]
    assert [len(c.get_offsets()) for c in ax.collections] == [5]
    assert "boxes: all 50 devices; points: a random 5" in ax.get_title()


# ---- end to end ---------------------------------------------------------------------------------
def test_a_run_above_the_limit_keeps_the_devices_that_took_part(monkeypatch):
    """30 devices with the limit lowered to 20: FedAvg asks 3 devices a round for 2 rounds; the
    in-memory run keeps the rows of those that took part, and its manifest entry counts them;
    every figure draws."""
    monkeypatch.setattr(records, "FULL_OUTPUT_DEVICES", 20)
    doc = small_doc(population={"num_devices": 30},
                    algorithms=[{"name": "fedavg", "rounds": 2, "eval_every": 1,
                                 "local_steps": 1, "participation": 0.1}])
    result = wirelessfl.run(doc)
    devices = result.devices
    summary = result.manifest["algorithms"]["fedavg"]["devices"]
    assert 3 <= len(devices) <= 6 and summary["took_part"] == len(devices)
    assert summary["num_devices"] == 30 and summary["rows_written"] == len(devices)
    assert ((devices.compute_s > 0) | (devices.transmissions > 0)).all()
    assert summary["columns"]["compute_s"]["count"] == 30
    assert summary["columns"]["compute_s"]["sum"] == pytest.approx(devices.compute_s.sum())
    assert len(result.manifest["partition"]["label_counts_sample"]["devices"]) == 30
    for name in plots.FIGURES:
        result.figure(name)
    fig = plots.device_energy(result)
    assert "took part" in fig.axes[0].get_title()
    assert fig.axes[0].get_xticklabels()[0].get_text().endswith("(30 devices)")


def test_rounds_rows_list_the_accuracies_of_a_sample_above_the_limit(monkeypatch):
    """30 devices with the limit lowered to 20 and the sample to 7: each rounds row lists the
    accuracies of the label-count sample's 7 devices (named in the manifest), equal to those
    entries of the whole run's 30, while its mean, worst and worst-k stay the whole
    population's; the figure says what it draws."""
    doc = small_doc(population={"num_devices": 30},
                    algorithms=[{"name": "fedavg", "rounds": 2, "eval_every": 1,
                                 "local_steps": 1, "participation": 0.5}])
    whole = wirelessfl.run(doc)
    assert "device_accuracy_devices" not in whole.manifest["algorithms"]["fedavg"]
    monkeypatch.setattr(records, "FULL_OUTPUT_DEVICES", 20)
    monkeypatch.setattr(records, "LABEL_SAMPLE_DEVICES", 7)
    monkeypatch.setattr(records, "ACCURACY_SAMPLE_DEVICES", 7)
    sampled = wirelessfl.run(doc)
    ids = sampled.manifest["algorithms"]["fedavg"]["device_accuracy_devices"]
    assert ids == sampled.manifest["partition"]["label_counts_sample"]["devices"]
    assert len(ids) == 7 and ids == sorted(ids)
    assert len(whole.rounds) == len(sampled.rounds) == 3
    for (_, full), (_, part) in zip(whole.rounds.iterrows(), sampled.rounds.iterrows()):
        assert len(full.device_accuracy) == 30 and len(part.device_accuracy) == 7
        np.testing.assert_array_equal(np.asarray(full.device_accuracy)[ids],
                                      part.device_accuracy)
        for column in ("mean_device_accuracy", "worst_device_accuracy",
                       "worst_k_device_accuracy", "test_accuracy"):
            assert part[column] == full[column]
    title = plots.device_accuracy(sampled).axes[0].get_title()
    assert "boxes and points: a random 7 of the 30 devices" in title


def test_index_sets_read_the_samples_a_copy_would_hold():
    """3,000 devices on 1,500 training samples hold indices into them; an evaluator over the
    same positions copied out (what a smaller population holds) gives bit-equal minibatch
    losses, gradients and local SGD, and the training objective and its gradient (each
    distinct sample once, weighted by its positions) to float rounding."""
    import dataclasses

    import torch

    from wirelessfl.problems.classifier import BatchedEvaluator

    world = build_world(wirelessfl.load_scenario(_wide_doc(3000)))
    ev = world.evaluator
    data = ev.data
    assert data.index is not None and len(data.x) == 1500 and data.num_samples == 3000
    copied = dataclasses.replace(data, x=data.x[data.index], y=data.y[data.index], index=None)
    ref = BatchedEvaluator(ev.flat, copied, ev.activations_per_sample, ev.input_size,
                           l2=ev.l2)
    theta = ev.initial()
    devices = np.array([0, 5, 17, 2999])
    idx = ev.minibatches(1, "b", (0,), 1, 2, devices, True)
    models = theta + 0.01 * torch.randn(len(devices), theta.numel(),
                                        generator=torch.Generator().manual_seed(0))
    assert torch.equal(ev.device_losses(theta, idx[0]), ref.device_losses(theta, idx[0]))
    for a, b in zip(ev.stacked_losses_and_gradients(models, idx[0]),
                    ref.stacked_losses_and_gradients(models, idx[0])):
        assert torch.equal(a, b)
    assert torch.equal(ev.full_gradients(theta), ref.full_gradients(theta))
    assert ev.objective(theta) == pytest.approx(ref.objective(theta), rel=1e-6)
    torch.testing.assert_close(ev.objective_gradient(theta), ref.objective_gradient(theta),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(ev.label_mix, ref.label_mix)


@pytest.mark.parametrize("problem", [
    {"name": "quadratic", "dimension": 6},
    {"name": "logistic", "l2": 0.01},
    None,  # the classifier (an MLP on index sets into the shared data)
], ids=["quadratic", "logistic", "classifier"])
def test_exact_gradients_of_a_subset_are_the_rows_of_the_whole_population(problem):
    """Problem.full_gradients(theta, devices) passes over the devices' own data only (drift
    methods' exact gradients at partial participation); its rows are the whole population's rows,
    at a shared point and at the devices' own models. The quadratic and the logistic problem give
    them bit for bit; the classifier stacks a subset's devices in different chunks (a matmul's
    summation order), so to float32 rounding."""
    import torch

    if problem is None:
        doc = _wide_doc(300)
    else:
        doc = small_doc(data={"name": "breast_cancer"}, problem=problem,
                        population={"num_devices": 12},
                        partition={"scheme": "quantity-skew", "beta": 0.5})
        doc.pop("model")
        if problem["name"] == "quadratic":
            doc.pop("data"), doc.pop("partition")
    ev = build_world(wirelessfl.load_scenario(doc)).evaluator
    gen = torch.Generator().manual_seed(0)
    theta = ev.initial()
    theta = theta + 0.1 * torch.randn(theta.shape, generator=gen, dtype=theta.dtype)
    n = ev.num_devices
    models = theta + 0.1 * torch.randn((n, theta.numel()), generator=gen, dtype=theta.dtype)
    devices = np.sort(np.random.default_rng(1).choice(n, n // 3, replace=False))
    for point, own in ((theta, theta), (models, models[torch.as_tensor(devices)])):
        whole = ev.full_gradients(point)[torch.as_tensor(devices)]
        subset = ev.full_gradients(own, devices)
        assert subset.shape == whole.shape and subset.dtype == whole.dtype
        if problem is None:
            torch.testing.assert_close(subset, whole, rtol=1e-5, atol=1e-7)
        else:
            assert torch.equal(subset, whole)
