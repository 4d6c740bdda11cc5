"""The command line as a user meets it: numbers, files, and clean errors. The commands run in
process (``cli.main``); two bad inputs also in a fresh interpreter (slow)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.conftest import cli as _cli
from tests.conftest import small_doc
from tests.hostile import RUNNERS
from wirelessfl.results.records import DEVICE_COLUMNS, ROUND_COLUMNS


def test_profile_seed002_cnn(capsys):
    code, out, _ = _cli(capsys, "profile", "seed002-cnn", "--energy", "seed002-accelerator",
                        "--batch", "10", "--json")
    assert code == 0
    got = json.loads(out)
    # Layer shapes of seed 002's CNN on a 1x28x28 input (no padding, stride 1):
    # conv1 20@7x7 -> 20x22x22; conv2 40@7x7 -> 40x16x16; pool 2x2 -> 40x8x8; linear 2560 -> 2.
    conv1_out, conv2_out, pooled = 20 * 22 * 22, 40 * 16 * 16, 40 * 8 * 8
    macs_per_sample = conv1_out * (1 * 7 * 7) + conv2_out * (20 * 7 * 7) + 2 * pooled
    assert macs_per_sample == 10_514_640
    params = (20 * 49 + 20) + (40 * 20 * 49 + 40) + (pooled * 2 + 2)
    assert got["d"] == params == 45_362
    assert got["macs"] == 10 * macs_per_sample
    assert got["activations"] == 10 * (conv1_out + conv2_out + pooled + pooled + 2) == 250_420
    assert got["input_size"] == 784


def test_energy_command_matches_eqs_5_to_10(capsys):
    code, out, _ = _cli(capsys, "energy", "seed002-accelerator", "--macs", "10.56e6",
                        "--activations", "250420", "--params", "45362", "--input-size", "784",
                        "--json")
    assert code == 0
    got = json.loads(out)
    # seed 002, Sec. V inputs, written out by hand: A = 3.7 pJ, mu = 1.25, M = 16, M_max = 32,
    # A_d = 150, p_u = 64, S = 8 MiB (the DRAM spill terms are 0: d M + O_c M < S).
    a, nc, oc, d, x_in = 3.7e-12, 10.56e6, 250_420, 45_362, 784
    e16 = a * (16 / 32) ** 1.25
    e_comp = e16 * nc + 3 * oc * a
    e_w = 2 * e16 * d + e16 * nc * (16 / (64 * 32)) ** 0.5
    e_b = 2 * e16 * oc + e16 * nc * (16 / (64 * 32)) ** 0.5
    e_dram = 150 * a * x_in
    e_bp = 2 * nc * a + 2 * oc * a + d * a + 2 * nc * a * (1 / 64) ** 0.5
    assert got["energy_forward_j"] == pytest.approx(e_comp + e_w + e_b + e_dram, rel=1e-12)
    assert got["energy_backward_j"] == pytest.approx(e_bp, rel=1e-12)


def test_run_writes_documented_files_and_report_rereads_them(tmp_path, scenario_file, capsys):
    path = scenario_file(small_doc())
    out = tmp_path / "run"
    code, stdout, _ = _cli(capsys, "run", str(path), "--out", str(out), "--quiet")
    assert code == 0
    assert "to target accuracy 0.500" in stdout and "dzofl" in stdout
    rounds = pd.read_parquet(out / "rounds.parquet")
    devices = pd.read_parquet(out / "devices.parquet")
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(rounds.columns) == ROUND_COLUMNS
    assert list(devices.columns) == DEVICE_COLUMNS
    assert set(rounds.algorithm) == {"dzofl", "fedsgd", "fedavg"}
    assert len(devices) == 3 * 8
    assert manifest["status"] == "complete"
    assert manifest["scenario"]["channel"]["uplink"]["tx_power_dbm"] == 23
    assert manifest["model"]["d"] == 650
    assert manifest["versions"]["torch"]
    for png in ("accuracy_vs_energy.png", "accuracy_vs_time.png", "energy_breakdown.png"):
        assert (out / png).stat().st_size > 1000
        (out / png).unlink()
    code, stdout, _ = _cli(capsys, "report", str(out))
    assert code == 0 and (out / "accuracy_vs_energy.png").exists()
    # the same scenario and seed give identical rounds.parquet
    again = tmp_path / "again"
    assert _cli(capsys, "run", str(path), "--out", str(again), "--quiet", "--no-report")[0] == 0
    pd.testing.assert_frame_equal(rounds, pd.read_parquet(again / "rounds.parquet"))


BAD_INPUTS = [
    (["--set", "algorithms.0.name=dzfl"], {}, "algorithms[0].name: unknown algorithm 'dzfl'"),
    ([], {"energy": "seed002-accelerater"}, "unknown energy profile 'seed002-accelerater'"),
    (["--set", "algorithms.1.lr=fast"], {}, "algorithms[1].lr: Input should be a valid number"),
    (["--set", "channel.uplink.bandwidth_hz=-2e6"], {}, "channel.uplink.bandwidth_hz"),
    (["--set", "energy.rx_power_w=-0.1"], {}, "energy.rx_power_w"),
    ([], {"data": {"name": "fashionmnist", "root": "/nonexistent/fmnist"}},
     "train-images-idx3-ubyte"),
]


@pytest.mark.parametrize(
    ("argv_extra", "doc_changes", "expected", "runner"),
    [(*case, "in-process") for case in BAD_INPUTS]
    + [pytest.param(*BAD_INPUTS[i], "subprocess", marks=pytest.mark.slow) for i in (0, 5)],
)
def test_bad_input_is_one_clean_line_with_exit_code_2(scenario_file, tmp_path, argv_extra,
                                                       doc_changes, expected, runner):
    path = scenario_file(small_doc(**doc_changes))
    proc = RUNNERS[runner]("run", str(path), "--out", str(tmp_path / "r"), *argv_extra)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert expected in lines[0]


def test_validate_and_list(capsys, scenario_file):
    code, out, _ = _cli(capsys, "validate", str(scenario_file(small_doc())))
    assert code == 0 and "valid" in out
    code, out, _ = _cli(capsys, "list")
    assert code == 0
    for name in ("dzofl", "fedsgd", "fedavg", "seed002-cell", "seed002-accelerator", "quickstart"):
        assert name in out


def test_report_on_a_folder_that_is_not_a_run(capsys, tmp_path):
    code, _, err = _cli(capsys, "report", str(tmp_path))
    assert code == 2 and "not a wirelessfl run folder" in err
