"""The engine: both time-advance paths agree, the ledger adds up, payloads are what the spec says."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tests.conftest import small_scenario
from wirelessfl.engine.ledger import KINDS
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm


def _run(scenario, index=0):
    world = build_world(scenario)
    return world, run_algorithm(world, scenario.algorithms[index])


@pytest.mark.parametrize("index", [0, 1, 2])
def test_vectorized_and_process_engines_agree(index):
    _vec_world, vec = _run(small_scenario(["engine.mode=vectorized"]), index)
    _, proc = _run(small_scenario(["engine.mode=processes"]), index)
    a, b = pd.DataFrame(vec.rows), pd.DataFrame(proc.rows)
    # Same float operations in the same order: the clocks agree to the last bits.
    np.testing.assert_allclose(a.sim_time_s, b.sim_time_s, rtol=1e-13, atol=0)
    pd.testing.assert_frame_equal(a.drop(columns="sim_time_s"), b.drop(columns="sim_time_s"))
    np.testing.assert_array_equal(vec.ledger.energy_j, proc.ledger.energy_j)
    np.testing.assert_array_equal(vec.ledger.packets_delivered, proc.ledger.packets_delivered)
    assert vec.ledger.packets_sent.sum() > 0


def test_round_time_is_the_slowest_device_plus_the_broadcast():
    """Hand check of one FedSGD round with two devices at fixed distances, no fading."""
    sc = small_scenario(["population.num_devices=2", "population.distances_m=[100, 400]",
                         "channel.fading=none", "algorithms.fedsgd.rounds=1",
                         "algorithms.fedsgd.eval_every=1"])
    world, run = _run(sc, 1)
    d, bits = world.flat.d, 16
    packet = d * bits + 32  # d values of M bits + one float32 scale
    ch, en = sc.channel, sc.energy
    slot, rate = ch.slot_s, ch.uplink.rate_bps
    airtime = math.ceil(packet / (rate * slot)) * slot
    macs = world.model_profile.macs_per_sample * 10
    compute = macs / en.throughput_macs_per_s + 2 * macs / en.throughput_macs_per_s
    # broadcast at the Shannon rate of the weakest device's mean downlink SNR
    noise_w = 10 ** ((ch.noise_density_dbm_hz + 10 * math.log10(ch.downlink.bandwidth_hz)) / 10) / 1e3
    pl_db = ch.path_loss.intercept_db + ch.path_loss.slope_db_per_decade * math.log10(0.4)
    snr = 10 ** ((ch.downlink.tx_power_dbm - pl_db) / 10) / 1e3 / noise_w
    dl_rate = ch.downlink.bandwidth_hz * math.log2(1 + snr)
    dl_air = math.ceil(packet / (dl_rate * slot)) * slot
    assert run.rows[-1]["sim_time_s"] == pytest.approx(compute + airtime + dl_air, rel=1e-12)
    # radio energy is power x airtime, exactly
    tx_w = 10 ** (ch.uplink.tx_power_dbm / 10) / 1e3
    assert run.ledger.energy_j[:, 2] == pytest.approx([tx_w * airtime] * 2, rel=1e-12)
    assert run.ledger.energy_j[:, 3] == pytest.approx([en.rx_power_w * dl_air] * 2, rel=1e-12)


def test_ledger_conservation_and_monotone_rounds():
    _world, run = _run(small_scenario(), 2)
    led = run.ledger
    total = led.energy_j.sum()
    assert total == pytest.approx(sum(led.energy_by_kind().values()), rel=1e-12)
    assert total == pytest.approx(led.energy_j.sum(axis=1).sum(), rel=1e-12)
    assert (led.energy_j >= 0).all()
    rows = pd.DataFrame(run.rows)
    parts = rows.energy_compute_j + rows.energy_uplink_j + rows.energy_downlink_j
    np.testing.assert_allclose(rows.energy_j, parts, rtol=1e-12)
    for column in ("sim_time_s", "energy_j", "bits_up", "bits_down"):
        assert (np.diff(rows[column]) >= 0).all(), column
    assert rows.energy_j.iloc[-1] == pytest.approx(total, rel=1e-12)
    assert set(KINDS) == set(led.energy_by_kind())


@pytest.mark.parametrize("bits", [16, 8])
def test_payload_bits_per_device_per_round(bits):
    sc = small_scenario([f"quantization_bits={bits}"])
    world = build_world(sc)
    n, d = world.num_devices, world.flat.d
    dz = run_algorithm(world, sc.algorithms[0])
    rounds = sc.algorithms[0].rounds
    # DZOFL: exactly M bits per device per iteration, up and down (no header modelled)
    assert dz.ledger.bits_up.tolist() == [bits * rounds] * n
    assert dz.ledger.bits_down.tolist() == [bits * rounds] * n
    sgd = run_algorithm(world, sc.algorithms[1])
    rounds = sc.algorithms[1].rounds
    # FedSGD: d values of M bits + a 32-bit scale per device per round
    assert sgd.ledger.bits_up.tolist() == [(d * bits + 32) * rounds] * n


@pytest.mark.slow  # 4,000 rounds of packets (tests/test_channel_link.py: the same law per link)
def test_fixed_rate_delivery_matches_rayleigh_closed_form():
    """Each device's delivered fraction over many packets vs exp(-(2^(R/B) - 1) / mean SNR)."""
    sc = small_scenario(["population.distances_m=[150, 300, 400, 450, 480, 500, 500, 500]",
                         "channel.uplink.rate_bps=12e6", "algorithms.0.rounds=4000",
                         "algorithms.0.eval_every=4000"])
    _world, run = _run(sc, 0)
    ch = sc.channel
    sent = run.ledger.packets_sent
    frac = run.ledger.packets_delivered / sent
    noise_w = 10 ** ((ch.noise_density_dbm_hz + 10 * math.log10(ch.uplink.bandwidth_hz)) / 10) / 1e3
    for i, dist in enumerate(sc.population.distances_m):
        pl_db = 128.1 + 37.6 * math.log10(dist / 1000)
        snr = 10 ** ((ch.uplink.tx_power_dbm - pl_db) / 10) / 1e3 / noise_w
        p = math.exp(-(2 ** (ch.uplink.rate_bps / ch.uplink.bandwidth_hz) - 1) / snr)
        se = math.sqrt(p * (1 - p) / sent[i])
        assert abs(frac[i] - p) < 4 * se + 1e-9, (i, frac[i], p)
    assert frac.min() < 0.95  # the test exercises real losses


def test_same_seed_same_numbers_and_seed_matters():
    a = pd.DataFrame(_run(small_scenario())[1].rows)
    b = pd.DataFrame(_run(small_scenario())[1].rows)
    pd.testing.assert_frame_equal(a, b)
    c = pd.DataFrame(_run(small_scenario(["seed=4"]))[1].rows)
    assert not a.equals(c)


def test_chunking_does_not_change_results():
    big = pd.DataFrame(_run(small_scenario(["engine.max_chunk_mb=1024"]), 2)[1].rows)
    tiny = pd.DataFrame(_run(small_scenario(["engine.max_chunk_mb=0.01"]), 2)[1].rows)
    np.testing.assert_allclose(big.test_loss, tiny.test_loss, rtol=1e-5)
    pd.testing.assert_frame_equal(big.drop(columns=["test_loss", "test_accuracy"]),
                                  tiny.drop(columns=["test_loss", "test_accuracy"]))


def test_an_algorithm_does_not_depend_on_what_ran_before_it():
    """Every algorithm starts from the same theta_0 on the same world, whatever ran first."""
    sc = small_scenario()
    alone = pd.DataFrame(_run(sc, 2)[1].rows)
    world = build_world(sc)
    for params in sc.algorithms:  # dzofl and fedsgd first, then fedavg on the same world
        last = run_algorithm(world, params)
    pd.testing.assert_frame_equal(alone, pd.DataFrame(last.rows))
