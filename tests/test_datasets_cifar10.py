"""CIFAR-10's binary version written by hand (Krizhevsky 2009, https://www.cs.toronto.edu/~kriz/
cifar.html, "Binary version"): a record is 1 label byte, then the red, green and blue 32x32 planes
row by row. Small batch files in tmp_path: shapes, labels, channel-major pixels, label selection,
root at the folder or its parent, the errors, the memory estimate and a run through the API."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import wirelessfl
from tests.conftest import small_doc
from wirelessfl.errors import UserError
from wirelessfl.learning.datasets import CIFAR10_FILES, DataConfig, data_facts, load_dataset
from wirelessfl.problems.data_size import dataset_shape

# 3 records in each training batch, 2 in the test batch (the real files hold 10,000 each).
TRAIN_LABELS = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 1], [2, 3, 4]]
TEST_LABELS = [3, 7]
ALL_TRAIN = [label for batch in TRAIN_LABELS for label in batch]
RECORD = 3073


def planes_for(label: int) -> np.ndarray:
    """Red plane all 10 + label, green 20 + label, blue 30 + label: a label-0 record is 10, 20,
    30, and every pixel tells which record it came from after relabelling and subsampling."""
    return np.stack([np.full((32, 32), 10 * (c + 1) + label) for c in range(3)])


def record(label: int, planes: np.ndarray | None = None) -> bytes:
    """One 3,073-byte record: the label byte, then the planes (red, green, blue), row-major."""
    planes = planes_for(label) if planes is None else planes
    return bytes([label]) + np.asarray(planes, np.uint8).tobytes()


def make_cifar_folder(parent, name: str = "cifar-10-batches-bin", skip=()):
    """``parent/name`` with the six batch files (but those in ``skip``)."""
    folder = parent / name
    folder.mkdir(parents=True, exist_ok=True)
    for file, labels in zip(CIFAR10_FILES, [*TRAIN_LABELS, TEST_LABELS]):
        if file not in skip:
            (folder / file).write_bytes(b"".join(record(label) for label in labels))
    return folder


def scaled(value) -> np.float32:
    """A pixel as the IDX loader scales it: float32 / 255."""
    return np.float32(value) / np.float32(255)


@pytest.fixture
def no_unpickling(monkeypatch):
    """Any unpickling fails the test: the loader must never run a file's code."""
    def refuse(*_, **__):
        raise AssertionError("a CIFAR-10 file was unpickled")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)


def test_shapes_labels_and_channel_major_pixels(tmp_path, no_unpickling):
    folder = make_cifar_folder(tmp_path)
    ds = load_dataset(DataConfig(name="cifar10", root=str(folder)), seed=0)
    assert ds.x_train.shape == (15, 3, 32, 32) and ds.x_train.dtype == np.float32
    assert ds.x_test.shape == (2, 3, 32, 32) and ds.x_test.dtype == np.float32
    assert ds.y_train.dtype == np.int64 and ds.num_classes == 10
    assert ds.input_shape == (3, 32, 32)
    assert ds.y_train.tolist() == ALL_TRAIN and ds.y_test.tolist() == TEST_LABELS
    first = ds.x_train[0]  # label 0: red 10, green 20, blue 30
    for channel, value in enumerate((10, 20, 30)):
        assert (first[channel] == scaled(value)).all()
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        for channel in range(3):
            assert np.array_equal(x[:, channel], np.broadcast_to(
                scaled(10 * (channel + 1) + y)[:, None, None], x[:, channel].shape))


def test_a_record_reshapes_row_major_to_channels_first(tmp_path):
    folder = make_cifar_folder(tmp_path)
    planes = np.arange(3 * 1024).reshape(3, 32, 32) % 251  # every pixel its own value
    (folder / "test_batch.bin").write_bytes(record(5, planes) + record(6))
    x = load_dataset(DataConfig(name="cifar10", root=str(folder)), seed=0).x_test
    assert np.array_equal(x[0], planes.astype(np.float32) / np.float32(255))
    assert x[0, 0, 0, 1] == scaled(1) and x[0, 0, 1, 0] == scaled(32)  # row by row
    assert x[0, 1, 0, 0] == scaled(1024 % 251)  # green starts after 1,024 red values


def test_root_may_name_the_folder_or_its_parent(tmp_path):
    folder = make_cifar_folder(tmp_path)
    config = DataConfig(name="cifar10", root=str(folder))
    by_folder, by_parent = (load_dataset(c, seed=0) for c in
                            (config, DataConfig(name="cifar10", root=str(tmp_path))))
    assert np.array_equal(by_folder.x_train, by_parent.x_train)
    assert np.array_equal(by_folder.y_test, by_parent.y_test)


def test_classes_and_caps_select_as_for_every_set(tmp_path):
    make_cifar_folder(tmp_path)
    ds = load_dataset(DataConfig(name="cifar10", root=str(tmp_path), classes=[7, 3]), seed=0)
    assert ds.num_classes == 2 and len(ds.y_train) == 3 and len(ds.y_test) == 2
    original = np.rint(ds.x_train[:, 0, 0, 0] * 255).astype(int) - 10
    assert original.tolist() == [3, 7, 3]  # file order kept
    assert ds.y_train.tolist() == [1, 0, 1]  # relabelled by position in data.classes
    capped = load_dataset(DataConfig(name="cifar10", root=str(tmp_path), max_train_samples=4,
                                     max_test_samples=1), seed=0)
    assert len(capped.y_train) == 4 and len(capped.y_test) == 1
    assert np.array_equal(np.rint(capped.x_train[:, 0, 0, 0] * 255).astype(int) - 10,
                          capped.y_train)


def test_missing_files_are_one_error_naming_the_folder_and_the_six_files(tmp_path):
    folder = make_cifar_folder(tmp_path, skip=("data_batch_3.bin", "test_batch.bin"))
    with pytest.raises(UserError) as err:
        load_dataset(DataConfig(name="cifar10", root=str(tmp_path)), seed=0)
    msg = str(err.value)
    assert f"data.root folder {folder} lacks data_batch_3.bin, test_batch.bin" in msg
    assert all(name in msg for name in CIFAR10_FILES) and "data.root" in msg
    assert "\n" not in msg
    with pytest.raises(UserError, match=r"needs data.root"):
        load_dataset(DataConfig(name="cifar10"), seed=0)
    with pytest.raises(UserError, match=r"nowhere does not exist.*cifar-10-binary.tar.gz"):
        data_facts(DataConfig(name="cifar10", root=str(tmp_path / "nowhere")))


@pytest.mark.parametrize("at", ["folder", "parent"])
def test_the_pickled_python_version_is_never_loaded(tmp_path, at, no_unpickling):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"):
        (folder / name).write_bytes(pickle.dumps({"data": b"x"}, protocol=2))
    root = folder if at == "folder" else tmp_path
    with pytest.raises(UserError) as err:
        load_dataset(DataConfig(name="cifar10", root=str(root)), seed=0)
    msg = str(err.value)
    assert "pickled Python version" in msg and "never loaded" in msg
    assert "cifar-10-binary.tar.gz" in msg and "point data.root at its cifar-10-batches-bin" in msg
    assert "\n" not in msg


def test_a_truncated_file_and_a_label_above_nine_name_the_file(tmp_path):
    folder = make_cifar_folder(tmp_path)
    path = folder / "data_batch_2.bin"
    path.write_bytes(path.read_bytes()[:-5])
    config = DataConfig(name="cifar10", root=str(folder))
    match = rf"data_batch_2.bin holds {3 * RECORD - 5:,} bytes, not a whole number of 3,073-byte"
    with pytest.raises(UserError, match=match):
        data_facts(config)  # what validate and the start of a run check
    with pytest.raises(UserError, match=match):
        load_dataset(config, seed=0)
    make_cifar_folder(tmp_path)
    path = folder / "data_batch_4.bin"
    path.write_bytes(record(9) + record(12) + record(1))
    with pytest.raises(UserError, match=r"data_batch_4.bin holds label 12 \(record 2\) but "
                                        r"CIFAR-10 labels are 0\.\.9"):
        load_dataset(config, seed=0)


def test_the_memory_estimate_counts_records_from_file_sizes(tmp_path, monkeypatch):
    make_cifar_folder(tmp_path)
    config = DataConfig(name="cifar10", root=str(tmp_path), max_train_samples=12)
    facts, ds = data_facts(config), load_dataset(config, seed=0)
    assert (facts.input_shape, facts.labels, facts.train_samples) == \
        (ds.input_shape, ds.num_classes, len(ds.y_train)) == ((3, 32, 32), 10, 12)

    def no_reading(*_, **__):
        raise AssertionError("the estimate read the pixels")

    monkeypatch.setattr(np, "fromfile", no_reading)
    shape = dataset_shape(DataConfig(name="cifar10", root=str(tmp_path)))
    assert (shape.train, shape.test, shape.input_shape, shape.classes) == (15, 2, (3, 32, 32), 10)
    assert shape.loaded_values == 17 * 3072
    (tmp_path / "cifar-10-batches-bin" / "data_batch_5.bin").write_bytes(b"".join(
        record(label % 10) for label in range(7)))  # 7 records
    assert dataset_shape(DataConfig(name="cifar10", root=str(tmp_path))).train == 19
    selected = dataset_shape(DataConfig(name="cifar10", root=str(tmp_path), classes=[3, 7]))
    assert selected.classes == 2


def test_a_scenario_on_cifar10_runs_through_the_api(tmp_path):
    make_cifar_folder(tmp_path)
    doc = small_doc(population={"num_devices": 2},
                    data={"name": "cifar10", "root": str(tmp_path)},
                    model={"name": "seed002-cnn"},
                    algorithms=[{"name": "fedavg", "rounds": 1, "eval_every": 1,
                                 "local_steps": 1, "batch_size": 4}])
    scenario = wirelessfl.load_scenario(doc)
    assert scenario.data.name == "cifar10"
    result = wirelessfl.run(scenario)
    assert result.status == "complete"
    assert list(result.summary.algorithm) == ["fedavg"]
