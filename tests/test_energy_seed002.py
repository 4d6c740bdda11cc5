"""Seed 002's Section III example (spec dzofl.md, section 3) from the accounting helpers."""

from __future__ import annotations

import pytest

from wirelessfl.energy.seed002 import (
    SECTION_III,
    dzofl_times_s,
    dzofl_upload_bits,
    section_iii_example,
    standard_fl_times_s,
    standard_fl_upload_bits,
    upload_time_s,
)

REL = 1e-12


def test_uploaded_bits_per_device():
    # Standard FL: M d T' = 16 x 4e5 x 100.
    assert standard_fl_upload_bits(400_000, 16, 100) == 64e7
    # DZOFL: M T = 16 x 10,000 = 16e4. The paper prints 16e3 (and "40,000 times fewer"); that is
    # M T for T = 1,000, not for the T = 10,000 its own time example uses (1.25 s = 10,000 slots).
    assert dzofl_upload_bits(16, 10_000) == 16e4
    assert dzofl_upload_bits(16, 1_000) == 16e3
    assert standard_fl_upload_bits(400_000, 16, 100) / dzofl_upload_bits(16, 1_000) == 40_000


def test_standard_fl_upload_time():
    # 64e5 bits at 10 Mbit/s: 640 ms per round (5,120 slots of 0.125 ms), 64 s for 100 rounds.
    times = standard_fl_times_s(400_000, 16, 100, 10e6, 0.125e-3)
    assert times["per_round"] == pytest.approx(0.640, rel=REL)
    assert times["total"] == pytest.approx(64.0, rel=REL)


def test_dzofl_times():
    # One 16-bit scalar fits one 0.125 ms slot: 1.25 s of upload over 10,000 iterations;
    # 16e6 operations at 4 GHz, one per cycle: 4 ms per iteration, 40 s; 41.25 s in all.
    assert upload_time_s(16, 10e6, 0.125e-3) == pytest.approx(0.125e-3, rel=REL)
    times = dzofl_times_s(16, 10_000, 10e6, 0.125e-3, 16e6, 4e9)
    assert times["upload"] == pytest.approx(1.25, rel=REL)
    assert times["compute"] == pytest.approx(40.0, rel=REL)
    assert times["total"] == pytest.approx(41.25, rel=REL)


def test_whole_example_and_its_inputs():
    assert SECTION_III["params"] == 400_000 and SECTION_III["dzofl_iterations"] == 10_000
    ex = section_iii_example()
    assert ex["standard_fl_bits"] == 64e7
    assert ex["dzofl_bits"] == 16e4
    assert ex["bits_ratio"] == pytest.approx(4_000, rel=REL)
    assert ex["standard_fl_upload_per_round_s"] == pytest.approx(0.64, rel=REL)
    assert ex["standard_fl_upload_total_s"] == pytest.approx(64.0, rel=REL)
    assert ex["dzofl_upload_s"] == pytest.approx(1.25, rel=REL)
    assert ex["dzofl_total_s"] == pytest.approx(41.25, rel=REL)
    # Compute, not the radio, bounds DZOFL; the radio bounds standard FL.
    assert ex["dzofl_compute_s"] > 30 * ex["dzofl_upload_s"]
    assert section_iii_example(dzofl_iterations=1_000)["dzofl_bits"] == 16e3
    with pytest.raises(ValueError, match="unknown input"):
        section_iii_example(iterations=5)
