"""The partition as the user meets it: the scenario's `partition:` section, the manifest's label
counts, and the label histogram drawn from the manifest alone."""

from __future__ import annotations

import json
from typing import get_args

import numpy as np
import pandas as pd
import pytest

from tests.conftest import small_doc, small_scenario
from wirelessfl.cli import main
from wirelessfl.errors import UserError
from wirelessfl.learning.partition import PARTITIONERS, partition
from wirelessfl.report.plots import draw_report, label_histogram
from wirelessfl.results.records import RunRecord, RunWriter, partition_manifest, read_run
from wirelessfl.scenario.loader import resolved_document
from wirelessfl.scenario.schema import PartitionConfig

FAST = [{"name": "fedsgd", "rounds": 2, "eval_every": 1, "lr": 0.5}]


# ---- scenario schema ----------------------------------------------------------------------------
def test_schema_accepts_dirichlet_and_fills_defaults():
    sc = small_scenario(partition={"scheme": "dirichlet", "alpha": 0.1})
    assert sc.partition.params() == {"alpha": 0.1, "min_samples": 1}
    assert small_scenario(partition={"scheme": "shards"}).partition.params() == {
        "shards_per_device": 2}
    assert small_scenario().partition.params() == {}
    # The resolved document keeps only what the scheme reads, and validates again.
    dumped = resolved_document(sc)["partition"]
    assert dumped == {"scheme": "dirichlet", "alpha": 0.1, "min_samples": 1}
    assert PartitionConfig.model_validate(dumped).params() == sc.partition.params()
    assert resolved_document(small_scenario())["partition"] == {"scheme": "iid"}


def test_schema_schemes_are_the_registry():
    assert set(get_args(PartitionConfig.model_fields["scheme"].annotation)) == set(PARTITIONERS)


def test_schema_rejects_a_parameter_the_scheme_does_not_read():
    with pytest.raises(UserError) as err:
        small_scenario(partition={"scheme": "iid", "alpha": 0.1})
    assert str(err.value) == ("small.yaml: partition: 'alpha' is only read by scheme "
                              "'dirichlet' or 'client-dirichlet' but scheme is 'iid'; remove it "
                              "or set scheme: dirichlet")
    with pytest.raises(UserError, match=r"partition: 'min_samples' is only read by scheme "
                                        r"'dirichlet' or 'quantity-skew' or 'client-dirichlet' "
                                        r"but scheme is 'shards'"):
        small_scenario(partition={"scheme": "shards", "min_samples": 2})


@pytest.mark.parametrize("bad, where", [
    ({"scheme": "dirichlet", "alpha": 0}, "partition.alpha: Input should be greater than 0"),
    ({"scheme": "label-skew", "classes_per_device": 1.5}, "partition.classes_per_device"),
    ({"scheme": "noniid"}, ("partition.scheme: Input should be 'iid', 'dirichlet', 'shards', "
                            "'quantity-skew', 'label-skew' or 'client-dirichlet'")),
])
def test_schema_rejects_bad_values(bad, where):
    with pytest.raises(UserError, match=where):
        small_scenario(partition=bad)


def test_scenario_error_too_few_samples_for_the_split():
    from wirelessfl.pipeline.build import build_world

    sc = small_scenario(partition={"scheme": "label-skew", "classes_per_device": 11})
    with pytest.raises(UserError, match=r"partition.classes_per_device=11 exceeds the 10 classes"):
        build_world(sc)


# ---- manifest -----------------------------------------------------------------------------------
def test_partition_manifest_and_writer(tmp_path):
    counts = np.array([[2, 0], [2, 6]])
    entry = partition_manifest("dirichlet", {"alpha": 0.1, "min_samples": 1}, counts)
    assert entry == {"scheme": "dirichlet", "params": {"alpha": 0.1, "min_samples": 1},
                     "num_classes": 2, "mean_label_tv": pytest.approx(0.375),
                     "label_counts": [[2, 0], [2, 6]]}
    RunWriter(tmp_path, {"name": "x"}, 0, partition=entry)
    assert json.loads((tmp_path / "manifest.json").read_text())["partition"]["label_counts"] == [
        [2, 0], [2, 6]]


def test_world_label_counts_are_its_shards():
    from wirelessfl.pipeline.build import build_world

    sc = small_scenario(partition={"scheme": "dirichlet", "alpha": 0.2}, algorithms=FAST)
    world = build_world(sc)
    y = world.dataset.y_train
    expected = [np.bincount(y[s], minlength=world.dataset.num_classes).tolist()
                for s in world.shards]
    record = world.partition_record()
    assert record["label_counts"] == expected
    assert record["scheme"] == "dirichlet" and record["params"] == {"alpha": 0.2,
                                                                    "min_samples": 1}
    assert world.evaluator.data.sizes.tolist() == [sum(row) for row in expected]


# ---- report -------------------------------------------------------------------------------------
def _record(tmp_path, manifest) -> RunRecord:
    rounds = pd.DataFrame({"algorithm": ["a", "a"], "round": [0, 1], "sim_time_s": [0.0, 1.0],
                           "energy_j": [0.0, 1.0], "test_accuracy": [0.1, 0.2],
                           "energy_compute_forward_j": [0.0, 0.5],
                           "energy_compute_backward_j": [0.0, 0.1],
                           "energy_uplink_j": [0.0, 0.3], "energy_downlink_j": [0.0, 0.1]})
    return RunRecord(tmp_path, rounds, pd.DataFrame(), manifest)


def test_label_histogram_from_the_manifest_alone(tmp_path):
    labels = np.repeat(np.arange(10), 60)
    from wirelessfl.learning.partition import label_counts

    counts = label_counts(labels, partition("shards", labels, 12, np.random.default_rng(0)), 10)
    record = _record(tmp_path, {"partition": partition_manifest("shards", {"shards_per_device": 2},
                                                                 counts)})
    paths = draw_report(record)
    assert [p.name for p in paths] == ["accuracy_vs_energy.png", "accuracy_vs_time.png",
                                       "energy_breakdown.png", "energy_per_round.png",
                                       "label_histogram.png"]
    assert (tmp_path / "label_histogram.png").stat().st_size > 1000


def test_old_manifest_without_label_counts_skips_the_histogram(tmp_path):
    record = _record(tmp_path, {"scenario": {"name": "old"}})
    assert label_histogram(record) is None
    assert len(draw_report(record)) == 4  # accuracy x 2, energy breakdown and per round
    assert not (tmp_path / "label_histogram.png").exists()


# ---- end to end through the command line --------------------------------------------------------
def test_cli_run_records_label_counts_and_report_draws_them(tmp_path, scenario_file, capsys):
    doc = small_doc(partition={"scheme": "label-skew", "classes_per_device": 2}, algorithms=FAST)
    out = tmp_path / "run"
    assert main(["run", str(scenario_file(doc)), "--out", str(out), "--quiet", "--no-report"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["partition"]
    assert entry["scheme"] == "label-skew" and entry["params"] == {"classes_per_device": 2}
    counts = np.array(entry["label_counts"])
    assert counts.shape == (8, 10)
    assert ((counts > 0).sum(axis=1) == 2).all()  # #C = 2: two classes on every device
    assert 0.5 < entry["mean_label_tv"] <= 1.0
    assert manifest["scenario"]["partition"] == {"scheme": "label-skew", "classes_per_device": 2}
    assert not (out / "label_histogram.png").exists()
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "label_histogram.png" in capsys.readouterr().out
    assert (out / "label_histogram.png").stat().st_size > 1000
    assert read_run(out).manifest["partition"]["label_counts"] == entry["label_counts"]
