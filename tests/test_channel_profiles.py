"""Catalog profiles, backward compatibility with today's draws, link budgets and `wirelessfl link`."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import small_doc
from wirelessfl import cli
from wirelessfl.channel import Cell, ChannelConfig, Uplink, link_budget
from wirelessfl.scenario.loader import scenario_from_document

CATALOG = Path(__file__).resolve().parents[1] / "channels"
NEW = ("3gpp-uma", "3gpp-umi", "indoor-small-cell")
KEYS = {"mean_snr_db", "delivery_probability", "expected_airtime_s", "expected_energy_j",
        "rate_bps", "mode"}


def load(name: str) -> ChannelConfig:
    return ChannelConfig.model_validate(yaml.safe_load((CATALOG / f"{name}.yaml").read_text()))


# ---- catalog -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [*NEW, "seed002-cell", "seed002-pinned"])
def test_profiles_validate_in_a_scenario_and_round_trip(name, tmp_path):
    sc = scenario_from_document(small_doc(channel=name), "small.yaml", [])
    assert sc.channel.name == name
    assert ChannelConfig.model_validate(sc.channel.model_dump(mode="json")) == sc.channel
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(small_doc(channel=name)))
    assert cli.main(["validate", str(path)]) == 0
    cell = Cell.build(40, sc.channel, np.random.default_rng(0))
    out = Uplink(cell, sc.channel).transmit(1000, np.ones(40, bool), np.random.default_rng(1))
    assert np.all(out.airtime_s > 0) and np.all(out.attempts >= 1)


@pytest.mark.parametrize("name", NEW)
def test_new_profiles_cite_every_value(name):
    text = (CATALOG / f"{name}.yaml").read_text()
    body = text.split("\nsources:")[0]
    in_description = False
    for line in body.splitlines():
        if line.startswith("description:"):
            in_description = True
            continue
        if in_description and line.startswith("  ") and ":" not in line:
            continue
        in_description = False
        m = re.match(r"^\s*[\w.]+:\s*(\S.*)?$", line)
        if m and m.group(1) and not m.group(1).startswith("#") and line.split(":")[0] != "name":
            assert "#" in line, f"{name}: no citation on {line!r}"
    assert load(name).sources  # and a sources: block naming real fields


def test_profile_choices():
    uma, umi, inh = (load(n) for n in NEW)
    assert uma.path_loss.model == "3gpp-uma" and uma.uplink.mode == "mcs"
    assert uma.uplink.arq.max_attempts == 4 and uma.uplink.device_bandwidth_hz == 2e6
    assert umi.fading.correlation == "gauss-markov" and umi.downlink.mode == "unicast"
    assert inh.path_loss.model == "3gpp-inh" and inh.fading.k_factor_applies_to == "los"
    assert inh.uplink.spectrum.channels == 1  # TDMA
    for c in (uma, umi, inh):
        assert c.slot_s == 0.5e-3 and c.uplink.tx_power_dbm == 23


# ---- backward compatibility --------------------------------------------------------------------

def test_seed002_cell_outcomes_equal_todays_draws():
    """Hand re-implementation of the original uplink: one Exp(1) draw per call, fixed-rate outage."""
    cfg = load("seed002-cell")
    cell = Cell.build(60, cfg, np.random.default_rng(5))
    # Placement: r = sqrt(U (R^2 - r0^2) + r0^2), nothing else drawn.
    u = np.random.default_rng(5).random(60)
    np.testing.assert_array_equal(cell.distances_m, np.sqrt(u * (500**2 - 10**2) + 10**2))
    snr_db = 23.0 - (128.1 + 37.6 * np.log10(cell.distances_m / 1000.0)) \
        - (-173.0 + 10.0 * np.log10(2e6))
    np.testing.assert_array_equal(cell.uplink_mean_snr, 10.0 ** (snr_db / 10.0))
    uplink, rng, ref = Uplink(cell, cfg), np.random.default_rng(9), np.random.default_rng(9)
    active = np.arange(60) % 3 != 0
    for t in (0.0, 0.3, 0.7):
        out = uplink.transmit(16, active, rng, now_s=t)
        snr = cell.uplink_mean_snr * ref.standard_exponential(60)
        np.testing.assert_array_equal(out.snr, snr)
        np.testing.assert_array_equal(out.delivered, active & (2e6 * np.log2(1 + snr) >= 4e6))
        np.testing.assert_array_equal(out.airtime_s, np.where(active, 0.125e-3, 0.0))
        np.testing.assert_array_equal(out.attempts, active.astype(int))
    assert rng.random() == ref.random()
    # Pinned: the Exp(1) draw, then one uniform per device.
    pinned = load("seed002-pinned")
    rng, ref = np.random.default_rng(10), np.random.default_rng(10)
    out = Uplink(Cell.from_distances(cell.distances_m, pinned), pinned).transmit(
        16, np.ones(60, bool), rng)
    ref.standard_exponential(60)
    np.testing.assert_array_equal(out.delivered, ref.random(60) < 0.9)


def test_original_profile_form_still_loads():
    doc = {"fading": "rayleigh", "path_loss": {"intercept_db": 120.0, "slope_db_per_decade": 30.0},
           "uplink": {"mode": "fixed"}}
    cfg = ChannelConfig.model_validate(doc)
    assert cfg.path_loss.model == "log-distance-km" and cfg.fading.correlation == "iid"
    assert Cell.from_distances([100.0], cfg).path_loss_db[0] == pytest.approx(120.0 - 30.0)


# ---- link budget and the CLI -------------------------------------------------------------------

def test_cli_link_json_matches_closed_form(capsys):
    assert cli.main(["link", "seed002-cell", "--distance", "200", "--bits", "16", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got) == KEYS
    snr_db = 23 - (128.1 + 37.6 * math.log10(0.2)) - (-173 + 10 * math.log10(2e6))
    p = math.exp(-(2 ** (4e6 / 2e6) - 1) / 10 ** (snr_db / 10))  # Rayleigh, fixed 4 Mbit/s
    assert got["mean_snr_db"] == pytest.approx(snr_db, abs=1e-9)
    assert got["delivery_probability"] == pytest.approx(p, rel=1e-9)
    assert got["expected_airtime_s"] == pytest.approx(0.125e-3)  # 16 bits: one slot
    assert got["expected_energy_j"] == pytest.approx(10 ** (-0.7) * 0.125e-3)
    assert got["rate_bps"] == 4e6 and got["mode"] == "fixed"
    assert cli.main(["link", "3gpp-uma", "--distance", "150", "--bits", "1000"]) == 0
    table = capsys.readouterr().out
    assert "Monte-Carlo over 20000 packets" in table and "delivery_probability" in table


def test_cli_link_errors_are_one_line(capsys, tmp_path):
    assert cli.main(["link", "seed002-cel", "--distance", "200", "--bits", "16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'seed002-cell'" in err
    assert "Traceback" not in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("fading: {model: rician}\n")
    assert cli.main(["link", str(bad), "--distance", "200", "--bits", "16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "k_factor_db" in err
    assert cli.main(["link", "seed002-cell", "--distance", "0", "--bits", "16"]) == 2
    assert "--distance" in capsys.readouterr().err


def test_link_budget_arq_closed_form_and_monte_carlo_agree():
    doc = yaml.safe_load((CATALOG / "seed002-cell.yaml").read_text())
    doc["uplink"]["arq"] = {"max_attempts": 3}
    doc["uplink"]["rate_bps"] = 14e6  # p = exp(-127 / rho) at the cell edge
    iid = ChannelConfig.model_validate(doc)
    closed = link_budget(iid, 500.0, 16)
    rho = 10 ** (closed["mean_snr_db"] / 10)
    p = math.exp(-(2 ** 7 - 1) / rho)
    assert closed["delivery_probability"] == pytest.approx(1 - (1 - p) ** 3)
    assert closed["expected_airtime_s"] == pytest.approx((1 + (1 - p) + (1 - p) ** 2) * 0.125e-3)
    # Gauss-Markov fading that decorrelates completely between attempts, by Monte-Carlo through
    # Uplink.transmit: the same numbers within sampling error.
    doc["fading"] = {"model": "rayleigh", "correlation": "gauss-markov", "doppler_hz": 1e5}
    mc = link_budget(ChannelConfig.model_validate(doc), 500.0, 16)
    q = 1 - (1 - p) ** 3
    assert abs(mc["delivery_probability"] - q) <= 4 * math.sqrt(q * (1 - q) / 20000) + 0.01
    assert mc["expected_airtime_s"] == pytest.approx(closed["expected_airtime_s"], rel=0.03)
