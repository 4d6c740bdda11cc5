"""LIBSVM files written by hand (labels, sparse features, a test file, errors) and sklearn's
breast cancer set (shape, stratified split, standardisation with the training statistics)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from pydantic import ValidationError

from wirelessfl.errors import UserError
from wirelessfl.learning.datasets import LIBSVM_URL, DataConfig, load_dataset


def write_libsvm(path, labels, features: list[dict[int, float]]) -> None:
    """One '<label> <index>:<value> ...' line per sample (indices one-based, increasing)."""
    lines = [" ".join([str(label)] + [f"{k}:{v:g}" for k, v in sorted(f.items())])
             for label, f in zip(labels, features)]
    path.write_text("\n".join(lines) + "\n")


def sample_rows(n: int, width: int, seed: int = 0) -> list[dict[int, float]]:
    """Sparse rows: feature 1 holds the sample's number (to find it again), two others random."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n):
        row = {1: float(k)}
        for j in rng.choice(np.arange(2, width + 1), 2, replace=False):
            row[int(j)] = float(rng.integers(1, 9))
        rows.append(row)
    return rows


def dense(rows: list[dict[int, float]], width: int) -> np.ndarray:
    out = np.zeros((len(rows), width), np.float32)
    for i, row in enumerate(rows):
        for k, v in row.items():
            out[i, k - 1] = v
    return out


@pytest.mark.parametrize("values", [(-1, 1), (0, 1), (1, 2), ("-1", "+1")])
def test_labels_map_to_0_and_1_in_sorted_order_with_a_test_file(tmp_path, values):
    n, width = 40, 6
    labels = [values[k % 2] for k in range(n)]
    rows = sample_rows(n, width)
    write_libsvm(tmp_path / "train", labels, rows)
    # The test file reaches a higher feature index: both are read with the larger width.
    test_rows = [{1: 100.0 + k, width + 2: 5.0} for k in range(6)]
    write_libsvm(tmp_path / "train.t", [values[(k + 1) % 2] for k in range(6)], test_rows)
    ds = load_dataset(DataConfig(name="libsvm", root=str(tmp_path), file="train",
                                 test_file="train.t"), seed=0)
    assert ds.num_classes == 2 and ds.input_shape == (width + 2,)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    np.testing.assert_array_equal(ds.x_train, dense(rows, width + 2))
    np.testing.assert_array_equal(ds.y_train, np.arange(n) % 2)  # values[0] -> 0, values[1] -> 1
    np.testing.assert_array_equal(ds.x_test, dense(test_rows, width + 2))
    np.testing.assert_array_equal(ds.y_test, (np.arange(6) + 1) % 2)


def test_without_a_test_file_a_stratified_fraction_is_held_out(tmp_path):
    n = 80
    labels = [1] * 60 + [-1] * 20
    rows = sample_rows(n, 5)
    write_libsvm(tmp_path / "a9a", labels, rows)
    ds = load_dataset(DataConfig(name="libsvm", root=str(tmp_path), file="a9a",
                                 test_fraction=0.25), seed=3)
    assert len(ds.y_train) == 60 and len(ds.y_test) == 20
    assert np.bincount(ds.y_test).tolist() == [5, 15]  # 25 % of each class
    # Every sample is kept once, with its own label (feature 1 is its number).
    ids = np.concatenate([ds.x_train[:, 0], ds.x_test[:, 0]]).astype(int)
    assert sorted(ids.tolist()) == list(range(n))
    y = np.concatenate([ds.y_train, ds.y_test])
    np.testing.assert_array_equal(y, np.where(ids < 60, 1, 0))


def test_a_gzipped_file_is_found_by_its_plain_name(tmp_path):
    write_libsvm(tmp_path / "plain", [1, -1] * 10, sample_rows(20, 4))
    (tmp_path / "w8a.gz").write_bytes(gzip.compress((tmp_path / "plain").read_bytes()))
    ds = load_dataset(DataConfig(name="libsvm", root=str(tmp_path), file="w8a",
                                 test_fraction=0.5), seed=0)
    assert len(ds.y_train) + len(ds.y_test) == 20


def test_positive_classes_apply_to_the_mapped_labels(tmp_path):
    write_libsvm(tmp_path / "three", [1, 2, 3] * 10, sample_rows(30, 4))
    ds = load_dataset(DataConfig(name="libsvm", root=str(tmp_path), file="three",
                                 test_fraction=0.3), seed=0)
    assert ds.num_classes == 3 and set(ds.y_train.tolist()) == {0, 1, 2}
    ds = load_dataset(DataConfig(name="libsvm", root=str(tmp_path), file="three",
                                 test_fraction=0.3, positive_classes=[2]), seed=0)
    assert ds.num_classes == 2
    np.testing.assert_array_equal(ds.y_train, (ds.x_train[:, 0].astype(int) % 3 == 2))


def test_a_missing_file_says_what_to_put_where(tmp_path):
    with pytest.raises(UserError) as err:
        load_dataset(DataConfig(name="libsvm", root=str(tmp_path), file="a9a"), seed=0)
    message = str(err.value)
    assert "'a9a'" in message and str(tmp_path) in message and LIBSVM_URL in message
    assert "data.file" in message and "\n" not in message
    write_libsvm(tmp_path / "a9a", [1, -1] * 5, sample_rows(10, 3))
    with pytest.raises(UserError, match=r"no file 'a9a\.t'.*set data\.test_file"):
        load_dataset(DataConfig(name="libsvm", root=str(tmp_path), file="a9a",
                                test_file="a9a.t"), seed=0)
    missing = tmp_path / "nowhere"
    with pytest.raises(UserError, match=rf"data\.root folder {missing} does not exist: put the "
                                        r"LIBSVM file\(s\) 'a9a'"):
        load_dataset(DataConfig(name="libsvm", root=str(missing), file="a9a"), seed=0)
    with pytest.raises(UserError, match=r"dataset 'libsvm' needs data\.root"):
        load_dataset(DataConfig(name="libsvm", file="a9a"), seed=0)


@pytest.mark.parametrize("bad", ["-1 2:x 3:1", "+1 3:1 2:1", "abc 1:1", "+1 4",
                                 "+1 1:1 2147483648:1", "+1 4294967297:1"])
def test_a_malformed_file_names_the_file_and_the_line(tmp_path, bad):
    good = ["+1 1:0.5 3:1", "-1 2:1", "+1 1:2 # a comment"]
    (tmp_path / "broken").write_text("\n".join(good + [bad, "-1 1:1"]) + "\n")
    with pytest.raises(UserError) as err:
        load_dataset(DataConfig(name="libsvm", root=str(tmp_path), file="broken"), seed=0)
    message = str(err.value)
    assert f"{tmp_path / 'broken'}, line 4 is not valid LIBSVM format" in message
    assert "\n" not in message
    assert bad not in message  # data.root may name any file: its lines are never quoted


def test_an_empty_file_and_a_single_label_are_refused(tmp_path):
    (tmp_path / "empty").write_text("")
    with pytest.raises(UserError, match="holds no samples"):
        load_dataset(DataConfig(name="libsvm", root=str(tmp_path), file="empty"), seed=0)
    write_libsvm(tmp_path / "one", [1] * 10, sample_rows(10, 3))
    with pytest.raises(UserError, match=r"single label \(1\)"):
        load_dataset(DataConfig(name="libsvm", root=str(tmp_path), file="one"), seed=0)


def test_file_keys_belong_to_libsvm_only():
    with pytest.raises(ValidationError, match=r"data\.name 'libsvm' needs data\.file"):
        DataConfig(name="libsvm", root="/x")
    with pytest.raises(ValidationError, match=r"data\.file is only read by name 'libsvm'"):
        DataConfig(name="digits", file="a9a")
    with pytest.raises(ValidationError, match=r"data\.test_file is only read by name 'libsvm'"):
        DataConfig(name="breast_cancer", test_file="a9a.t")


# ---- breast cancer ------------------------------------------------------------------------------
def test_breast_cancer_is_split_stratified_and_standardised_with_training_statistics():
    from sklearn.datasets import load_breast_cancer

    raw = load_breast_cancer()
    ds = load_dataset(DataConfig(name="breast_cancer", test_fraction=0.25), seed=1)
    assert ds.num_classes == 2 and ds.input_shape == (30,)
    assert len(ds.y_train) + len(ds.y_test) == 569 and len(ds.y_test) == 143
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    # Stratified: the test set's class shares are the whole set's, to one sample.
    whole = np.bincount(raw.target) / 569
    assert np.abs(np.bincount(ds.y_test) - whole * len(ds.y_test)).max() <= 1
    # Training statistics: the training part has mean 0 and std 1 in every feature...
    np.testing.assert_allclose(ds.x_train.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(ds.x_train.std(0), 1.0, atol=1e-4)
    # ...and the test part went through the same affine map: per feature, the sorted
    # standardised values of train and test together are the sorted raw values, mapped by
    # (raw - mean_train) / std_train (a straight line through all 569 points).
    for k in range(30):
        both = np.sort(np.concatenate([ds.x_train[:, k], ds.x_test[:, k]]).astype(np.float64))
        values = np.sort(raw.data[:, k])
        slope, intercept = np.polyfit(values, both, 1)
        np.testing.assert_allclose(slope * values + intercept, both, atol=1e-4)
        assert not np.isclose(ds.x_test[:, k].mean(), 0.0, atol=1e-6)


@pytest.mark.parametrize("suffix", [".gz", pytest.param(".bz2", marks=pytest.mark.slow)])
def test_a_compression_bomb_is_refused_before_it_is_expanded(tmp_path, suffix):
    """200 MB of valid lines packed into a few hundred KB: refused after reading the allowed
    expansion (LIBSVM_MAX_EXPANSION x its size), without decompressing the rest. Packing 200 MB
    with bzip2 takes ~20 s of CPU: that case is slow."""
    import bz2
    import gzip
    import time
    import zlib

    from wirelessfl.learning.datasets import LIBSVM_MAX_EXPANSION

    chunk = b"1 1:1\n" * (2**20 // 6)  # 1 MiB of valid lines, packed 200 times
    packer = zlib.compressobj(9, zlib.DEFLATED, 31) if suffix == ".gz" else bz2.BZ2Compressor(9)
    path = tmp_path / f"bomb{suffix}"
    path.write_bytes(b"".join(packer.compress(chunk) for _ in range(200)) + packer.flush())
    opener = gzip.open if suffix == ".gz" else bz2.open
    assert opener(path).read(len(chunk)) == chunk
    assert path.stat().st_size * LIBSVM_MAX_EXPANSION + 2**20 < 200 * 2**20
    start = time.perf_counter()
    with pytest.raises(UserError, match=r"bomb.* holds more than .* bytes once decompressed"):
        load_dataset(DataConfig(name="libsvm", root=str(tmp_path), file="bomb"), seed=0)
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_a_non_finite_feature_is_one_user_error_naming_the_sample(tmp_path, bad):
    """It was reported as the algorithm diverging ("lower its learning rate"); the line's text is
    not quoted (data.root may name any file)."""
    rows = sample_rows(6, 5)
    write_libsvm(tmp_path / "a9a", [1, -1] * 3, rows)
    text = (tmp_path / "a9a").read_text().splitlines()
    text[3] += f" 9:{bad}"
    (tmp_path / "a9a").write_text("\n".join(text) + "\n")
    with pytest.raises(UserError, match=r"a9a: sample 4 \(counting from 1\) holds a NaN or an "
                                        r"infinite value") as err:
        load_dataset(DataConfig(name="libsvm", root=str(tmp_path), file="a9a"), seed=0)
    assert f"9:{bad}" not in str(err.value)
