"""Datasets: IDX files written by hand, sklearn digits, synthetic data, label selection."""

import gzip
import struct

import numpy as np
import pytest
from pydantic import ValidationError

from wirelessfl.errors import UserError
from wirelessfl.learning.datasets import IDX_FILES, DataConfig, load_dataset

ROWS = COLS = 5
N_TRAIN, N_TEST = 40, 20


def write_idx(path, array: np.ndarray, gz: bool) -> None:
    """IDX header by hand: magic (2051 images / 2049 labels), then the big-endian dimensions."""
    magic = 2051 if array.ndim == 3 else 2049
    raw = struct.pack(f">{1 + array.ndim}i", magic, *array.shape) + array.astype(np.uint8).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        raw = gzip.compress(raw)
    path.write_bytes(raw)


def labels_for(n: int) -> np.ndarray:
    return np.arange(n) % 10


def images_for(labels: np.ndarray) -> np.ndarray:
    """Every pixel of an image is 10 * its label, so relabelling can be checked from x."""
    return np.broadcast_to((10 * labels)[:, None, None], (len(labels), ROWS, COLS)).copy()


def make_idx_folder(folder, gz: bool, skip=()):
    folder.mkdir(exist_ok=True)
    ytr, yte = labels_for(N_TRAIN), labels_for(N_TEST)
    arrays = dict(zip(IDX_FILES, [images_for(ytr), ytr, images_for(yte), yte]))
    for name, array in arrays.items():
        if name not in skip:
            write_idx(folder / name, array, gz)
    return folder


@pytest.mark.parametrize("gz", [False, True])
def test_idx_plain_and_gz(tmp_path, gz):
    root = make_idx_folder(tmp_path / "fm", gz)
    ds = load_dataset(DataConfig(name="fashionmnist", root=str(root)), seed=0)
    assert ds.x_train.shape == (N_TRAIN, 1, ROWS, COLS) and ds.x_train.dtype == np.float32
    assert ds.x_test.shape == (N_TEST, 1, ROWS, COLS)
    assert ds.y_train.dtype == np.int64 and ds.num_classes == 10
    assert ds.input_shape == (1, ROWS, COLS)
    assert np.array_equal(ds.y_train, labels_for(N_TRAIN))
    assert np.allclose(ds.x_train[:, 0, 0, 0], 10 * ds.y_train / 255.0)


def test_idx_classes_relabelled_in_given_order(tmp_path):
    root = make_idx_folder(tmp_path / "fm", gz=True)
    ds = load_dataset(DataConfig(name="fashionmnist", root=str(root), classes=[7, 6]), seed=0)
    assert ds.num_classes == 2
    assert len(ds.y_train) == 8 and len(ds.y_test) == 4  # labels 6 and 7, 4 + 4 and 2 + 2
    original = np.rint(ds.x_train[:, 0, 0, 0] * 255 / 10).astype(int)
    assert np.array_equal(np.where(original == 7, 0, 1), ds.y_train)
    assert set(original) == {6, 7}


def test_idx_positive_classes(tmp_path):
    root = make_idx_folder(tmp_path / "fm", gz=False)
    ds = load_dataset(DataConfig(name="mnist", root=str(root), positive_classes=[1, 2, 3]), seed=0)
    assert ds.num_classes == 2 and ds.y_train.sum() == 12 and len(ds.y_train) == N_TRAIN


def test_idx_wrong_magic_names_the_file(tmp_path):
    root = make_idx_folder(tmp_path / "fm", gz=False)
    bad = root / "train-labels-idx1-ubyte"
    raw = bytearray(bad.read_bytes())
    raw[:4] = struct.pack(">i", 1234)
    bad.write_bytes(bytes(raw))
    with pytest.raises(UserError, match=r"train-labels-idx1-ubyte is not an IDX label file .*1234"):
        load_dataset(DataConfig(name="mnist", root=str(root)), seed=0)


def test_idx_truncated_and_bad_gzip(tmp_path):
    root = make_idx_folder(tmp_path / "fm", gz=False)
    path = root / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(UserError, match="t10k-images-idx3-ubyte should hold"):
        load_dataset(DataConfig(name="mnist", root=str(root)), seed=0)
    path.unlink()
    (root / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(UserError, match=r"t10k-images-idx3-ubyte.gz cannot be read"):
        load_dataset(DataConfig(name="mnist", root=str(root)), seed=0)


def test_idx_missing_files_listed(tmp_path):
    root = make_idx_folder(tmp_path / "fm", gz=True,
                           skip=("train-labels-idx1-ubyte", "t10k-images-idx3-ubyte"))
    with pytest.raises(UserError) as err:
        load_dataset(DataConfig(name="fashionmnist", root=str(root)), seed=0)
    msg = str(err.value)
    assert "lacks train-labels-idx1-ubyte, t10k-images-idx3-ubyte (plain or .gz)" in msg
    assert "FashionMNIST" in msg and str(root) in msg and "\n" not in msg


def test_idx_missing_folder_and_root(tmp_path):
    with pytest.raises(UserError, match=r"folder .*nowhere does not exist.*train-images-idx3"):
        load_dataset(DataConfig(name="fashionmnist", root=str(tmp_path / "nowhere")), seed=0)
    with pytest.raises(UserError, match="needs data.root"):
        load_dataset(DataConfig(name="mnist"), seed=0)


def test_fashionmnist_read_where_the_distribution_package_puts_it(tmp_path, monkeypatch):
    """Without data.root, FashionMNIST is read from the folder Debian's dataset-fashion-mnist
    installs (here a generated stand-in); a given data.root still wins; without either, one
    error names the package and data.root."""
    from wirelessfl.learning import datasets
    from wirelessfl.problems.data_size import dataset_shape

    installed = make_idx_folder(tmp_path / "usr-share", gz=True)
    monkeypatch.setitem(datasets.DISTRIBUTION_ROOTS, "fashionmnist",
                        (str(installed), "dataset-fashion-mnist"))
    ds = load_dataset(DataConfig(name="fashionmnist", classes=[6, 7]), seed=0)
    assert ds.x_train.shape == (8, 1, ROWS, COLS) and set(ds.y_train) == {0, 1}
    assert dataset_shape(DataConfig(name="fashionmnist")).train == N_TRAIN
    own = tmp_path / "own"
    make_idx_folder(own, gz=False)
    (own / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(UserError, match="lacks t10k-labels-idx1-ubyte"):
        load_dataset(DataConfig(name="fashionmnist", root=str(own)), seed=0)
    monkeypatch.setitem(datasets.DISTRIBUTION_ROOTS, "fashionmnist",
                        (str(tmp_path / "absent"), "dataset-fashion-mnist"))
    with pytest.raises(UserError) as err:
        load_dataset(DataConfig(name="fashionmnist"), seed=0)
    msg = str(err.value)
    assert "apt-get install dataset-fashion-mnist" in msg and "data.root" in msg
    assert "\n" not in msg


def test_idx_root_tilde_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    make_idx_folder(tmp_path / "fm", gz=True)
    ds = load_dataset(DataConfig(name="mnist", root="~/fm"), seed=0)
    assert len(ds.y_train) == N_TRAIN


def test_digits_shapes_range_and_stratified_split():
    ds = load_dataset(DataConfig(name="digits"), seed=0)
    assert ds.input_shape == (64,) and ds.num_classes == 10
    assert ds.x_train.shape == (1347, 64) and ds.x_test.shape == (450, 64)  # 1797 samples, 25 %
    assert ds.x_train.min() >= 0 and ds.x_train.max() <= 1 and ds.x_train.max() == 1
    train_counts = np.bincount(ds.y_train, minlength=10)
    test_counts = np.bincount(ds.y_test, minlength=10)
    share = test_counts / (train_counts + test_counts)
    assert np.all(np.abs(share - 0.25) < 0.02)


def test_digits_deterministic_per_seed():
    a = load_dataset(DataConfig(name="digits"), seed=3)
    b = load_dataset(DataConfig(name="digits"), seed=3)
    c = load_dataset(DataConfig(name="digits"), seed=4)
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.y_train, c.y_train)


def test_digits28_upscaled():
    small = load_dataset(DataConfig(name="digits"), seed=1)
    big = load_dataset(DataConfig(name="digits28"), seed=1)
    assert big.input_shape == (1, 28, 28) and big.x_train.shape[1:] == (1, 28, 28)
    assert np.array_equal(small.y_train, big.y_train)  # same split
    assert abs(big.x_train.mean() - small.x_train.mean()) < 0.01
    per_image = big.x_train.mean((1, 2, 3)) - small.x_train.mean(1)
    assert np.abs(per_image).max() < 0.02
    assert big.x_train.min() >= 0 and big.x_train.max() <= 1


def test_digits_positive_classes_counts():
    full = load_dataset(DataConfig(name="digits"), seed=2)
    binary = load_dataset(DataConfig(name="digits", positive_classes=[0, 1, 2]), seed=2)
    assert binary.num_classes == 2 and set(np.unique(binary.y_train)) == {0, 1}
    assert binary.y_train.sum() == np.isin(full.y_train, [0, 1, 2]).sum()
    assert binary.y_test.sum() == np.isin(full.y_test, [0, 1, 2]).sum()


def test_classes_absent_label_is_user_error():
    with pytest.raises(UserError, match=r"data.classes lists label\(s\) \[11\]"):
        load_dataset(DataConfig(name="digits", classes=[3, 11]), seed=0)


def test_subsampling_deterministic_subset():
    cfg = DataConfig(name="digits", max_train_samples=100, max_test_samples=30)
    a, b = load_dataset(cfg, seed=0), load_dataset(cfg, seed=0)
    full = load_dataset(DataConfig(name="digits"), seed=0)
    assert a.x_train.shape == (100, 64) and a.x_test.shape == (30, 64)
    assert np.array_equal(a.x_train, b.x_train)
    rows = {r.tobytes() for r in full.x_train}
    assert all(r.tobytes() in rows for r in a.x_train)


def test_synthetic_standardised_and_deterministic():
    cfg = DataConfig(name="synthetic", synthetic={"num_samples": 400, "num_features": 6,
                                                   "num_classes": 3})
    ds = load_dataset(cfg, seed=5)
    assert ds.input_shape == (6,) and ds.num_classes == 3 and len(ds.y_train) == 300
    assert np.allclose(ds.x_train.mean(0), 0, atol=1e-5)
    assert np.allclose(ds.x_train.std(0), 1, atol=1e-3)
    assert np.array_equal(ds.x_test, load_dataset(cfg, seed=5).x_test)


@pytest.mark.parametrize("kwargs, match", [
    ({"classes": [3]}, "fewer than 2"),
    ({"classes": [6, 7], "positive_classes": [6]}, "not both"),
    ({"classes": [6, 6]}, "repeats"),
    ({"positive_classes": []}, "empty"),
    ({"test_fraction": 1.0}, "less than 1"),
    ({"colour": "red"}, "Extra inputs"),
    ({"synthetic": {"num_classes": 8, "informative": 2}}, "too few"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        DataConfig(**kwargs)


# ---- damaged and hostile files: one clean error naming the file, before large arrays -----------
def _header(magic: int, *dims: int) -> bytes:
    return struct.pack(f">{1 + len(dims)}i", magic, *dims)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_labels_above_nine_are_refused(tmp_path, gz):
    root = make_idx_folder(tmp_path / "fm", gz)
    bad = labels_for(N_TRAIN).copy()
    bad[3] = 12
    write_idx(root / "train-labels-idx1-ubyte", bad, gz)
    with pytest.raises(UserError, match=r"train-labels-idx1-ubyte.* holds label 12 but "
                                        r"MNIST-format labels are 0\.\.9"):
        load_dataset(DataConfig(name="fashionmnist", root=str(root)), seed=0)


@pytest.mark.parametrize("dims, fragment", [
    ((-5, ROWS, COLS), "declares a negative dimension"),
    ((2**20, 2**10, 2**10), "more than an IDX file this loader accepts"),
    ((N_TRAIN + 1, ROWS, COLS), "should hold"),  # the header promises more than the file has
])
@pytest.mark.parametrize("gz", [False, True])
def test_idx_headers_are_checked_before_anything_is_read(tmp_path, dims, fragment, gz):
    from wirelessfl.learning.datasets import data_facts

    root = make_idx_folder(tmp_path / "fm", gz)
    body = images_for(labels_for(N_TRAIN)).astype(np.uint8).tobytes()
    raw = _header(2051, *dims) + body
    name = "train-images-idx3-ubyte" + (".gz" if gz else "")
    (root / name).write_bytes(gzip.compress(raw) if gz else raw)
    config = DataConfig(name="fashionmnist", root=str(root))
    with pytest.raises(UserError, match=fragment):
        data_facts(config)  # what validate and the start of a run check
    with pytest.raises(UserError, match=fragment):
        load_dataset(config, seed=0)


def test_data_facts_match_the_loaded_set(tmp_path):
    """The shape and counts validate reasons with are those loading gives (independent truth:
    the arrays written and sklearn's digits)."""
    from wirelessfl.learning.datasets import data_facts

    root = make_idx_folder(tmp_path / "fm", gz=True)
    for config in (DataConfig(name="fashionmnist", root=str(root)), DataConfig(name="digits"),
                   DataConfig(name="breast_cancer", test_fraction=0.3),
                   DataConfig(name="digits28", max_train_samples=100),
                   DataConfig(name="synthetic", synthetic={"num_samples": 99})):
        facts, ds = data_facts(config), load_dataset(config, seed=0)
        assert facts.input_shape == ds.input_shape
        assert facts.labels == ds.num_classes
        assert facts.train_samples == len(ds.y_train)


def test_idx_images_of_no_pixels_are_one_user_error(tmp_path):
    """0x0 images ended in a traceback from the model's reshape."""
    root = make_idx_folder(tmp_path / "fm", gz=False)
    ytr = labels_for(N_TRAIN)
    write_idx(root / "train-images-idx3-ubyte", np.zeros((N_TRAIN, 0, 0), np.uint8), gz=False)
    write_idx(root / "train-labels-idx1-ubyte", ytr, gz=False)
    with pytest.raises(UserError, match=r"train-images-idx3-ubyte declares images of 0x0 "
                                        r"pixels; a model needs at least one pixel"):
        load_dataset(DataConfig(name="fashionmnist", root=str(root)), seed=0)


def test_an_empty_test_set_is_one_user_error(tmp_path):
    """A run on an empty test set ran 'complete' with accuracy 0 (an accuracy of nothing)."""
    root = make_idx_folder(tmp_path / "fm", gz=False)
    write_idx(root / "t10k-images-idx3-ubyte", np.zeros((0, ROWS, COLS), np.uint8), gz=False)
    write_idx(root / "t10k-labels-idx1-ubyte", np.zeros(0, np.uint8), gz=False)
    with pytest.raises(UserError, match="leaves an empty test set"):
        load_dataset(DataConfig(name="fashionmnist", root=str(root)), seed=0)
