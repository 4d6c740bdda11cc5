"""Every shipped scenario's short version gives the tables recorded with the code before issue 21.

The truth is ``benchmarks/shipped_identity.json``: digests of rounds.parquet and devices.parquet
written by the code at 5d7e730 (before the restructuring), recorded by
``benchmarks/shipped_identity.py --record``. Every scenario runs here (about 30 s of one core in
all), so this is the script's ``--check`` in process. The digests themselves are checked against
hand-built bytes, and their stability: the same short run twice, and with 1 and 2 host threads
(the project promises results independent of the thread count, host/threads.py).
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("shipped_identity",
                                               ROOT / "benchmarks" / "shipped_identity.py")
identity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(identity)

RECORD = json.loads(identity.RECORD.read_text(encoding="utf-8"))
FILES = identity.scenario_files()


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder with the generated IDX data, shared by the module's runs."""
    folder = tmp_path_factory.mktemp("identity")
    identity.write_data(folder / "data")
    return folder


_runs: dict[tuple[str, int], dict] = {}


def short_run(name: str, work: Path, threads: int = 1) -> dict:
    """The record entry of ``name``'s short version at ``threads``, run once per module."""
    if (name, threads) not in _runs:
        _runs[name, threads] = identity.run_short(name, FILES[name], work, threads=threads)
    return _runs[name, threads]


def test_the_record_is_of_the_code_before_issue_21_and_covers_every_scenario():
    assert RECORD["commit"].startswith("5d7e730") and not RECORD["dirty"]
    assert RECORD["threads"] == 1
    # sweep and tune files are left out, every scenario is in
    assert {"sweep-power", "quickstart-tune", "seed002-tune"}.isdisjoint(FILES)
    assert {"quickstart", "seed001-mco", "seed004-quadratic"} <= set(FILES)
    assert set(FILES) <= set(RECORD["scenarios"])


@pytest.mark.parametrize("name", sorted(FILES))
def test_short_version_gives_the_recorded_tables(name, work):
    if name not in RECORD["scenarios"]:
        pytest.skip(f"{name} is newer than the record (record it with the old code)")
    [row] = identity.compare({name: RECORD["scenarios"][name]}, {name: short_run(name, work)})
    assert row["rounds"] and row["devices"], row["note"]
    assert row["note"] == ""  # same scenario file, same short version
    assert short_run(name, work)["status"] == "complete"


def test_the_same_short_run_twice_gives_the_same_digests(work):
    first = short_run("quickstart", work)
    again = identity.run_short("quickstart", FILES["quickstart"], work)
    for table in identity.TABLES:
        assert again[table] == first[table]
    assert again["final"] == first["final"]


def test_one_and_two_host_threads_give_the_same_digests(work):
    """seed002-digits28: the seed-002 CNN, whose convolution gradients once changed with the
    thread count (host/threads.py); and quickstart's 50 devices over the pool."""
    for name in ("seed002-digits28", "quickstart"):
        one, two = short_run(name, work, threads=1), short_run(name, work, threads=2)
        for table in identity.TABLES:
            assert two[table]["digest"] == one[table]["digest"], (name, table)


def test_a_difference_fails_the_check_and_names_the_column(tmp_path, capsys):
    record = copy.deepcopy(RECORD)
    entry = record["scenarios"]["seed004-quadratic"]
    entry["rounds"]["digest"] = "0" * 64
    entry["rounds"]["columns"]["suboptimality"] = "0" * 64
    doctored = tmp_path / "record.json"
    doctored.write_text(json.dumps(record))
    code = identity.main(["--check", "--only", "seed004-quadratic", "--file", str(doctored)])
    out = capsys.readouterr().out
    assert code == 1
    assert "DIFFERS" in out and "rounds: changed: suboptimality" in out


def test_compare_names_new_and_gone_columns_and_rows():
    old = {"digest": "a", "rows": 3, "columns": {"x": "1", "y": "2"}}
    new = {"digest": "b", "rows": 4, "columns": {"x": "1", "z": "3"}}
    assert identity.compare_table(old, new) == (False, "3 -> 4 rows; gone: y; new: z")
    rows = identity.compare({"s": {"rounds": old, "devices": old}},
                            {"s": {"rounds": old, "devices": old}, "t": {}})
    assert [r["rounds"] for r in rows] == [True, None]  # t: new, not in the record
    assert not identity.failed(rows)
    assert identity.failed(identity.compare({"s": {}}, {}))  # recorded, not run


def test_column_digest_is_the_hand_built_hash():
    series = pd.Series([1.0, np.nan, -2.5], name="x")
    canonical = np.array([1.0, np.nan, -2.5]).tobytes()
    assert identity.column_digest(series) == hashlib.sha256(
        b"x\0float64\0" + b"3\0" + canonical).hexdigest()
    # a NaN's payload bits are no result; one ulp, a dtype or a name is
    payload_nan = np.array([0x7FF8000000000001], dtype=np.uint64).view(np.float64)[0]
    assert identity.column_digest(pd.Series([1.0, payload_nan, -2.5], name="x")) \
        == identity.column_digest(series)
    for other in (pd.Series([np.nextafter(1.0, 2.0), np.nan, -2.5], name="x"),
                  pd.Series([1.0, np.nan, -2.5], name="x", dtype="float32"),
                  pd.Series([1.0, np.nan, -2.5], name="w")):
        assert identity.column_digest(other) != identity.column_digest(series)


def test_object_cells_are_told_apart():
    """Per-device accuracy arrays (rounds.parquet's device_accuracy), text, numbers, None."""
    arrays = pd.Series([np.array([0.5, 0.25]), None], name="device_accuracy")
    changed = pd.Series([np.array([0.5, np.nextafter(0.25, 1.0)]), None], name="device_accuracy")
    assert identity.column_digest(arrays) != identity.column_digest(changed)
    cells = [1, 1.0, "1", [1], None, True]
    assert len({identity._element_bytes(c) for c in cells}) == len(cells)


def test_table_digest_ignores_how_the_parquet_file_was_written(tmp_path):
    frame = pd.DataFrame({"algorithm": ["A", "A", "B"], "round": [0, 1, 0],
                          "test_accuracy": [0.1, 0.5, np.nan],
                          "device_accuracy": [[0.1, 0.2], [0.5, 0.5], [0.0, 1.0]]})
    frame.to_parquet(tmp_path / "a.parquet", compression="snappy")
    frame.to_parquet(tmp_path / "b.parquet", compression="gzip", row_group_size=1, index=True)
    a, b = (identity.table_digest(pd.read_parquet(tmp_path / f)) for f in ("a.parquet",
                                                                            "b.parquet"))
    assert a == b and a["rows"] == 3
    assert (tmp_path / "a.parquet").read_bytes() != (tmp_path / "b.parquet").read_bytes()
    assert identity.final_values(frame) == {"A": {"round": 1, "test_accuracy": 0.5},
                                            "B": {"round": 0}}


def test_generated_idx_files_are_the_same_bytes_each_time(tmp_path):
    a = identity.write_idx_folder(tmp_path / "a", 0)
    b = identity.write_idx_folder(tmp_path / "b", 0)
    for name in identity.IDX_FILES:
        raw = (a / f"{name}.gz").read_bytes()
        assert raw == (b / f"{name}.gz").read_bytes()
    images = gzip.decompress((a / "train-images-idx3-ubyte.gz").read_bytes())
    assert images[:16] == np.array([2051, identity.IDX_TRAIN, 28, 28], ">i4").tobytes()
    assert len(images) == 16 + identity.IDX_TRAIN * 28 * 28
