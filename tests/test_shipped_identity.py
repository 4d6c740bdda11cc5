"""Every shipped scenario's short version gives the tables recorded with the code before issue 21,
on any x86-64 CPU.

The truth is ``benchmarks/shipped_identity_values.json.gz``: the tables of every short run, of
the avx2 instruction-set class, which is the code at 5d7e730's (before the restructuring): their
digests are those of ``benchmarks/shipped_identity.json``'s avx2 record, made on an AVX2 host at
that commit (checked here). Every scenario runs here (about 10-30 s of one core in all) and is
compared with it: the exact columns bit for bit, the five floating reductions of
``shipped_identity.TOLERANCES`` within MARGIN x what the kernel configurations measured there
differed by. The exact digests per class are the benchmark's (``shipped_identity.py --check``),
not a test's: an AVX-512 host rounds those reductions otherwise. The same short run twice, and
with 1 and 2 host threads (the project promises results independent of the thread count,
host/threads.py), are same-host comparisons and stay exact.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("shipped_identity",
                                               ROOT / "benchmarks" / "shipped_identity.py")
identity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(identity)

RECORD = json.loads(identity.RECORD.read_text(encoding="utf-8"))
AVX2 = RECORD["classes"]["avx2"]
VALUES = identity.read_values()
FILES = identity.scenario_files()


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder with the generated IDX data, shared by the module's runs."""
    folder = tmp_path_factory.mktemp("identity")
    identity.write_data(folder / "data")
    return folder


_runs: dict[tuple[str, int], dict] = {}


def short_run(name: str, work: Path, threads: int = 1) -> dict:
    """The entry (digests and tables) of ``name``'s short version at ``threads``, run once per
    module."""
    if (name, threads) not in _runs:
        _runs[name, threads] = identity.run_short(name, FILES[name], work, threads=threads)
    return _runs[name, threads]


# --- the records ----------------------------------------------------------------------------

def test_the_records_are_of_the_code_before_issue_21_and_cover_every_scenario():
    assert AVX2["commit"].startswith("5d7e730") and not AVX2["dirty"]
    assert AVX2["threads"] == 1
    avx512 = RECORD["classes"]["avx512"]
    assert avx512["host"]["class"] == "avx512" and avx512["threads"] == 1
    # sweep and tune files are left out, every scenario is in
    assert {"sweep-power", "quickstart-tune", "seed002-tune"}.isdisjoint(FILES)
    assert {"quickstart", "seed001-mco", "seed004-quadratic"} <= set(FILES)
    for scenarios in (AVX2["scenarios"], avx512["scenarios"], VALUES["scenarios"]):
        assert set(FILES) <= set(scenarios)


def test_the_value_record_holds_the_tables_whose_digests_the_avx2_record_holds():
    """The value record (made on an AVX-512 host with the avx2 kernels, 282c5be) against the
    digests made on an AVX2 host at 5d7e730: every table and column, bit for bit."""
    assert VALUES["reference"] == "avx2" and VALUES["host"]["class"] == "avx2"
    for name, entry in VALUES["scenarios"].items():
        recorded = AVX2["scenarios"][name]
        assert entry["file_sha256"] == recorded["file_sha256"]
        assert entry["overrides"] == recorded["overrides"]
        assert entry["status"] == recorded["status"]
        for table in identity.TABLES:
            frame = identity.decode_frame(entry["tables"][table])
            assert identity.table_digest(frame) == recorded[table], (name, table)


def test_the_classes_differ_only_in_toleranced_columns():
    """The exact records of two classes (recorded on two hosts) against the classification:
    every column whose digests differ is one of TOLERANCES."""
    avx512 = RECORD["classes"]["avx512"]["scenarios"]
    differing = set()
    for name, entry in AVX2["scenarios"].items():
        for table in identity.TABLES:
            old, new = entry[table]["columns"], avx512[name][table]["columns"]
            assert list(old) == list(new)
            differing |= {(table, c) for c in old if old[c] != new[c]}
    assert differing and differing <= set(identity.TOLERANCES)


def test_the_spreads_were_measured_on_every_configuration_for_the_toleranced_columns():
    assert list(VALUES["configurations"]) == ["avx2", "default", "avx512",
                                              "avx512+mkl-compatible"]
    for name, entry in VALUES["scenarios"].items():
        for table in identity.TABLES:
            columns = entry["tables"][table]["columns"]
            toleranced = {c for c in columns if (table, c) in identity.TOLERANCES}
            assert set(entry["spread"].get(table, {})) == toleranced, (name, table)
            labels = set(columns["algorithm"]["values"])
            for per in entry["spread"].get(table, {}).values():
                assert set(per) == labels and all(v >= 0 for v in per.values())
    # the zeroth-order methods amplify the roundings: their spread is measured, not assumed
    assert VALUES["scenarios"]["quickstart"]["spread"]["rounds"]["param_norm"]["DZOFL"] > 1e-5


# --- the scenarios, within the tolerances, on this host -----------------------------------------

@pytest.mark.parametrize("name", sorted(FILES))
def test_short_version_gives_the_recorded_values(name, work):
    if name not in VALUES["scenarios"]:
        pytest.skip(f"{name} is newer than the value record (record it with the old code)")
    [row] = identity.compare_values({name: VALUES["scenarios"][name]},
                                    {name: short_run(name, work)})
    assert row["rounds"] and row["devices"], row["note"]
    assert row["note"] == ""  # same scenario file, same short version
    assert short_run(name, work)["status"] == "complete"


def test_a_one_percent_change_of_a_learning_rate_fails(work):
    """A real change: FedAvg's learning rate 0.2 -> 0.202 in quickstart. Its test loss moves
    far beyond its tolerance, and the exact accuracies change too."""
    name = "quickstart"
    overrides = identity.short_overrides(name, FILES[name], work / "data")
    out = work / "quickstart-lr"
    identity.run_in_process(FILES[name], overrides + ["algorithms.2.lr=0.202"], out, 1)
    frames, _ = identity.read_run(out)
    entry = VALUES["scenarios"][name]
    recorded = identity.decode_frame(entry["tables"]["rounds"])
    results, problems = identity.compare_frames("rounds", recorded, frames["rounds"],
                                                entry["spread"]["rounds"])
    by = {r["column"]: r for r in results}
    assert not by["test_loss"]["ok"] and by["test_loss"]["max_ratio"] > 10
    assert not by["test_accuracy"]["ok"] and by["test_accuracy"]["exact"]
    assert any(p.startswith("test_loss: beyond its tolerance") for p in problems)
    # the other algorithms' rows are those of the unchanged run on this host
    unchanged = short_run(name, work)["tables"]["rounds"]
    fedavg = unchanged["algorithm"] == "FedAvg"
    for column in ("test_loss", "test_accuracy"):
        assert unchanged.loc[~fedavg, column].equals(frames["rounds"].loc[~fedavg, column])
        assert not unchanged.loc[fedavg, column].equals(frames["rounds"].loc[fedavg, column])


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


def test_a_difference_fails_the_exact_check_and_names_the_column(tmp_path, capsys, work,
                                                                monkeypatch):
    """--check against a record of this host's class: this host's own digests, one doctored.
    In this process (OpenBLAS pinned as the records are, so --check does not rerun itself)."""
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    host = identity.host_facts()["class"]
    entry = identity.record_entry(short_run("seed004-quadratic", work))
    entry["rounds"]["digest"] = "0" * 64
    entry["rounds"]["columns"]["suboptimality"] = "0" * 64
    doctored = tmp_path / "record.json"
    doctored.write_text(json.dumps({"classes": {host: {"commit": None, "scenarios": {
        "seed004-quadratic": entry}}}}))
    code = identity.main(["--check", "--only", "seed004-quadratic", "--file", str(doctored)])
    out = capsys.readouterr().out
    assert code == 1
    assert "DIFFERS" in out and "rounds: changed: suboptimality" in out
    assert "equal" in out  # devices.parquet, not doctored
    # a record without this host's class: said, exit status 2, nothing run
    doctored.write_text(json.dumps({"classes": {"no-such-class": {"scenarios": {}}}}))
    assert identity.main(["--check", "--file", str(doctored)]) == 2
    assert f"no exact record for this host's class '{host}'" in capsys.readouterr().out


def test_the_exact_actions_pin_the_records_openblas_kernels(monkeypatch):
    """--record and --check rerun themselves with OPENBLAS_CORETYPE=Haswell (EXACT_OPENBLAS)
    unless the environment already says so: OpenBLAS picks its kernels when it loads, by CPU
    model (SkylakeX's on an AVX-512 host change the last bits of numpy's float64 products), and
    every exact digest was recorded with Haswell's, as each record's environment says."""
    reruns = []
    monkeypatch.setattr(identity.subprocess, "run", lambda command, env, check: reruns.append(
        (command, env)) or SimpleNamespace(returncode=7))
    monkeypatch.setenv("OPENBLAS_CORETYPE", "SkylakeX")
    assert identity.main(["--check", "--only", "quickstart"]) == 7
    command, env = reruns.pop()
    assert env["OPENBLAS_CORETYPE"] == "Haswell" and command[-3:] == ["--check", "--only",
                                                                      "quickstart"]
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    assert identity.main(["--record", "--only", "quickstart", "--file", "unused.json"]) == 7
    assert reruns.pop()[1]["OPENBLAS_CORETYPE"] == "Haswell"
    # the records' own environments
    for facts in RECORD["classes"].values():
        for entry in facts["scenarios"].values():
            environment = entry["re_recorded"]["host"]["environment"]
            assert environment.get("OPENBLAS_CORETYPE") == "Haswell", environment


def test_check_values_names_a_column_beyond_its_tolerance(tmp_path, capsys):
    document = copy.deepcopy(VALUES)
    entry = document["scenarios"]["seed004-quadratic"]
    entry["tables"]["rounds"]["columns"]["suboptimality"]["values"][1] *= 1 + 1e-4
    doctored = tmp_path / "values.json.gz"
    identity.write_values(doctored, document)
    code = identity.main(["--check-values", "--only", "seed004-quadratic", "--file",
                          str(doctored)])
    out = capsys.readouterr().out
    assert code == 1
    assert "rounds: suboptimality: beyond its tolerance" in out


# --- comparing within the tolerances (pure) ---------------------------------------------------

def _rounds(**columns) -> pd.DataFrame:
    return pd.DataFrame({"algorithm": ["A", "A", "B"], **columns})


def test_a_toleranced_column_within_its_tolerance_passes_and_beyond_it_fails():
    """test_loss: MARGIN x max(the algorithm's measured spread, 2^-23 x |value|). Row 0: 100 x
    1e-6 = 1e-4 (the spread dominates); row 2 (spread 0): 100 x 2^-23 x 0.5 = 5.96e-6."""
    assert identity.MARGIN == 100
    recorded = _rounds(test_loss=[2.0, 1.5, 0.5])
    spreads = {"test_loss": {"A": 1e-6, "B": 0.0}}

    def check(values):
        results, problems = identity.compare_frames("rounds", recorded,
                                                    _rounds(test_loss=values), spreads)
        return problems, results[1]

    problems, result = check([2.0 + 0.9e-4, 1.5, 0.5 + 5.9e-6])
    assert problems == [] and result["ok"] and not result["equal"]
    assert result["max_ratio"] == pytest.approx(0.99, rel=1e-3)  # row 2: 5.9e-6 / 5.96e-6
    for values in ([2.0 + 1.1e-4, 1.5, 0.5], [2.0, 1.5, 0.5 + 6.1e-6], [2.0, 1.5, 0.5 - 1e-5]):
        problems, result = check(values)
        assert not result["ok"] and problems[0].startswith("test_loss: beyond its tolerance")
    # a NaN where the record has a number (or none where it has one) is no rounding
    problems, _ = check([2.0, np.nan, 0.5])
    assert problems == ["test_loss: NaN or infinity at other rows"]
    # a zero stays zero where nothing was measured: no rounding of 0 is allowed
    zero = _rounds(test_loss=[2.0, 1.5, 0.0])
    results, problems = identity.compare_frames("rounds", zero, _rounds(
        test_loss=[2.0, 1.5, 1e-300]), spreads)
    assert problems and results[1]["max_ratio"] == np.inf
    assert identity.compare_frames("rounds", zero, zero.copy(), spreads)[1] == []


def test_any_change_in_an_exact_column_fails():
    recorded = _rounds(test_accuracy=[0.5, 0.25, np.nan], transmissions=[3, 4, 5],
                       device_accuracy=[np.array([0.5, 0.25]), np.array([1.0, 0.0]), None])
    changes = {"test_accuracy": [0.5, np.nextafter(0.25, 1.0), np.nan],
               "transmissions": [3, 4, 6],
               "device_accuracy": [np.array([0.5, 0.25]), np.array([1.0, 1e-300]), None]}
    assert identity.compare_frames("rounds", recorded, recorded.copy(), {})[1] == []
    for column, values in changes.items():
        changed = recorded.copy()
        changed[column] = values
        _, problems = identity.compare_frames("rounds", recorded, changed, {})
        assert len(problems) == 1 and problems[0].startswith(column), problems
    # a float column not in TOLERANCES is exact however small the change
    assert ("rounds", "test_accuracy") not in identity.TOLERANCES
    as_int32 = recorded.assign(transmissions=recorded.transmissions.astype("int32"))
    assert identity.compare_frames("rounds", recorded, as_int32, {})[1] == [
        "transmissions: int64 x 3 -> int32 x 3"]


def test_compare_values_names_rows_columns_and_a_changed_short_version():
    frame = _rounds(test_loss=[2.0, 1.5, 0.5])
    recorded = {"s": {"file_sha256": "f", "overrides": ["a=1"], "status": "complete",
                      "tables": {t: identity.encode_frame(frame) for t in identity.TABLES},
                      "spread": {}}}
    current = {"s": {"file_sha256": "f", "overrides": ["a=2"], "status": "complete",
                     "tables": {"rounds": frame.iloc[:2], "devices": frame.drop(
                         columns="test_loss")}}, "t": {}}
    rows = identity.compare_values(recorded, current)
    assert [r["scenario"] for r in rows] == ["s", "t"]
    assert rows[0]["rounds"] is False and rows[0]["devices"] is False
    assert "rounds: 3 -> 2 rows" in rows[0]["note"]
    assert "devices: columns: gone ['test_loss'], new []" in rows[0]["note"]
    assert "short version changed since recorded" in rows[0]["note"]
    assert rows[1]["rounds"] is None  # new, not in the value record: no failure
    assert identity.values_failed(rows)


def test_the_value_record_s_tables_read_back_to_the_same_digests():
    frame = pd.DataFrame({
        "algorithm": pd.Series(["A", None, "B"], dtype="str"), "round": [0, 1, 2],
        "x": [1.0, np.nan, -np.inf], "flag": [True, False, True],
        "device_accuracy": [np.array([0.1, 0.2]), None, np.array([1, 2], dtype=np.int64)]})
    doc = json.loads(json.dumps(identity.encode_frame(frame)))
    assert identity.table_digest(identity.decode_frame(doc)) == identity.table_digest(frame)


def test_build_value_record_keeps_the_largest_spread_and_refuses_an_exact_difference():
    def dump(loss, accuracy):
        rounds = _rounds(test_loss=loss, test_accuracy=accuracy)
        return {"host": {"class": "x"}, "scenarios": {"s": {
            "file_sha256": "f", "overrides": [], "status": "complete",
            "tables": {"rounds": identity.encode_frame(rounds),
                       "devices": identity.encode_frame(rounds[["algorithm"]])}}}}

    reference = dump([2.0, 1.5, 0.5], [0.5, 0.5, 0.25])
    record = identity.build_value_record(
        {"avx2": reference, "one": dump([2.0 + 1e-6, 1.5, 0.5], [0.5, 0.5, 0.25]),
         "two": dump([2.0, 1.5 - 3e-6, 0.5 + 1e-7], [0.5, 0.5, 0.25])})
    spread = record["scenarios"]["s"]["spread"]["rounds"]["test_loss"]
    assert spread["A"] == pytest.approx(3e-6, rel=1e-6)
    assert spread["B"] == pytest.approx(1e-7, rel=1e-6)
    assert "test_accuracy" not in record["scenarios"]["s"]["spread"]["rounds"]
    with pytest.raises(SystemExit, match="test_accuracy"):
        identity.build_value_record({"avx2": reference,
                                     "one": dump([2.0, 1.5, 0.5], [0.5, 0.55, 0.25])})


# --- the host's class (pure) ----------------------------------------------------------------

def test_the_libraries_kernel_sets_name_the_class():
    assert [identity.torch_level(c) for c in ("AVX512", "AVX2", "DEFAULT")] == \
        ["avx512", "avx2", "default"]
    dispatch, baseline = ["X86_V3", "X86_V4", "AVX512_ICL", "AVX512_SPR"], ["X86_V2"]
    on = {"X86_V3": True, "X86_V4": True, "AVX512_ICL": True, "AVX512_SPR": False}
    assert identity.numpy_level(on, dispatch, baseline) == "avx512"
    # NPY_DISABLE_CPU_FEATURES switches the targets off (the CPU's AVX512F flag stays True)
    on_avx2 = {**on, "X86_V4": False, "AVX512_ICL": False, "AVX512F": True}
    assert identity.numpy_level(on_avx2, dispatch, baseline) == "avx2"
    assert identity.numpy_level({}, dispatch, baseline) == "default"
    # numpy before 2.4 names features
    assert identity.numpy_level({"AVX2": True, "AVX512_SKX": True}, ["AVX2", "AVX512_SKX"],
                                ["SSE3"]) == "avx512"
    assert identity.onednn_level("Intel AVX-512 with Intel DL Boost and bfloat16 support") \
        == "avx512"
    assert identity.onednn_level("Intel AVX2") == "avx2"
    assert identity.onednn_level("Intel SSE4.1") == "default"
    assert identity.onednn_level(None) is None
    assert identity.class_of({"torch": "avx2", "numpy": "avx2", "onednn": None}) == "avx2"
    assert identity.class_of({"torch": "avx512", "numpy": "avx2", "onednn": "avx512"}) == \
        "torch-avx512+numpy-avx2+onednn-avx512"


def test_the_configurations_measured_on_each_class():
    assert list(identity.measured_configurations("avx512")) == [
        "avx2", "default", "avx512", "avx512+mkl-compatible"]
    assert list(identity.measured_configurations("avx2")) == [
        "avx2", "default", "avx2+mkl-compatible"]
    assert identity.measured_configurations("avx2")["avx2"] == {}  # the host's own kernels
    with pytest.raises(SystemExit, match="avx2"):
        identity.measured_configurations("default")
    env = identity.emulation_env("avx2")
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert all(identity.numpy_target_level(t) == "avx512"
               for t in env["NPY_DISABLE_CPU_FEATURES"].split())


# --- digests (pure) -------------------------------------------------------------------------

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
