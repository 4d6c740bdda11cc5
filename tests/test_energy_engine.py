"""The device energy model inside the engine: transmit draw through the PA and circuits, idle time
that fills every device's clock, mixed device classes and per-device clocks, batteries that run
out, the precision M in both bits and MAC energy, and conservation over random scenarios.

Hand checks write the formulas out again here (docs/energy.md, docs/models.md) rather than call
the code they check."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import algorithm_scenario, small_scenario
from tests.test_radio_engine import SETTINGS
from wirelessfl.channel.link import Downlink
from wirelessfl.engine.ledger import KIND_INDEX, KINDS
from wirelessfl.errors import UserError
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.plugins import ALGORITHMS
from wirelessfl.report import plots
from wirelessfl.report.plots import draw_report
from wirelessfl.results.records import RunWriter, read_run
from wirelessfl.results.summary import format_summary, summarize
from wirelessfl.scenario import catalog
from wirelessfl.scenario.loader import load_scenario, resolved_document, scenario_from_document
from wirelessfl.tune.objectives import OBJECTIVES, score

IDLE = KIND_INDEX["idle"]
ONE_ROUND = ["algorithms.fedsgd.rounds=1", "algorithms.fedsgd.eval_every=1"]
TWO_DEVICES = ["population.num_devices=2", "population.distances_m=[100, 400]",
               "channel.fading=none"]


def _run(overrides, index=1, **changes):
    sc = small_scenario(overrides, **changes)
    world = build_world(sc)
    return sc, world, run_algorithm(world, sc.algorithms[index])


def _slots(bits, rate_bps, slot_s):
    return math.ceil(bits / (rate_bps * slot_s)) * slot_s


def _broadcast_airtime(sc, bits, distance_m):
    """Downlink airtime at the Shannon rate of the weakest receiver's mean SNR [s]."""
    ch = sc.channel
    noise_w = 10 ** ((ch.noise_density_dbm_hz + 10 * math.log10(ch.downlink.bandwidth_hz)) / 10) / 1e3
    pl_db = ch.path_loss.intercept_db + ch.path_loss.slope_db_per_decade * math.log10(
        distance_m / 1000)
    snr = 10 ** ((ch.downlink.tx_power_dbm - pl_db) / 10) / 1e3 / noise_w
    return _slots(bits, ch.downlink.bandwidth_hz * math.log2(1 + snr), ch.slot_s)


def _check_time_invariant(ledger, now_s, rtol=1e-9):
    """compute + uplink + downlink + idle time = the time each device was alive."""
    alive_s = ledger.alive_s(now_s)
    np.testing.assert_allclose(ledger.active_s() + ledger.busy_s[:, IDLE], alive_s,
                               rtol=rtol, atol=1e-12)


# ---- radio draw: rf / pa_efficiency + tx circuit + the channel's circuit power ----

def test_transmit_draw_goes_through_the_amplifier_and_both_circuits():
    sc, world, run = _run(TWO_DEVICES + ONE_ROUND + [
        "energy.pa_efficiency=0.4", "energy.tx_circuit_power_w=0.3",
        "channel.uplink.circuit_power_w=0.05"])
    packet = world.flat.d * 16 + 32
    airtime = _slots(packet, sc.channel.uplink.rate_bps, sc.channel.slot_s)
    rf_w = 10 ** (23 / 10) / 1e3
    want = (rf_w / 0.4 + 0.3 + 0.05) * airtime
    np.testing.assert_allclose(run.ledger.energy_j[:, KIND_INDEX["uplink"]], [want] * 2,
                               rtol=1e-12)


def test_default_profile_draw_is_the_rf_power_bit_for_bit():
    """pa_efficiency 1 and circuit 0: (rf / 1 + 0) + channel circuit = rf + channel circuit."""
    _sc, world, run = _run(TWO_DEVICES + ONE_ROUND + ["channel.uplink.circuit_power_w=0.05"])
    power = world.device_power()
    up = world.uplink()
    assert (power.tx_draw_w == up.tx_power_w + up.circuit_power_w).all()
    assert (power.idle_power_w == 0).all() and np.isinf(power.battery_j).all()
    assert run.ledger.energy_j[:, IDLE].tolist() == [0.0, 0.0]


# ---- two classes: the round waits for the slowest, the fast one idles ----

def test_two_classes_round_time_is_the_slowest_class_compute_plus_its_upload():
    """One FedSGD round, a phone and an MCU at fixed distances, no fading, hand computed: the
    round lasts the MCU's compute + the upload + the broadcast; the phone idles the difference
    at its idle power; every kind priced by the device's own profile."""
    sc, world, run = _run(TWO_DEVICES + ONE_ROUND + [
        "population.classes={smartphone-soc: 0.5, mcu-iot: 0.5}"])
    names = world.device_class_names()
    assert sorted(names) == ["mcu-iot", "smartphone-soc"]
    profiles = {n: catalog.load_mapping("energy", n, "test") for n in names}
    d = world.flat.d
    packet = d * 16 + 32
    ch = sc.channel
    airtime = _slots(packet, ch.uplink.rate_bps, ch.slot_s)
    dl_air = _broadcast_airtime(sc, packet, 400)
    cycles = 10 * world.model_profile.macs_per_sample  # batch 10, one cycle per MAC
    # FedSGD: one forward (C cycles) and one backward (2 C) pass
    compute_s = {n: 3 * cycles / profiles[n]["cpu_frequency_hz"] for n in names}
    slowest = max(compute_s.values())
    assert compute_s["mcu-iot"] == slowest
    assert run.rows[-1]["sim_time_s"] == pytest.approx(slowest + airtime + dl_air, rel=1e-12)
    rf_w = 10 ** (ch.uplink.tx_power_dbm / 10) / 1e3
    led = run.ledger
    for i, n in enumerate(names):
        p = profiles[n]
        f, kappa = p["cpu_frequency_hz"], p["kappa"]
        want = {
            "compute_forward": kappa * cycles * f ** 2,
            "compute_backward": kappa * 2 * cycles * f ** 2,
            "uplink": (rf_w / p["pa_efficiency"] + p["tx_circuit_power_w"]) * airtime,
            "downlink": p["rx_power_w"] * dl_air,
            "idle": p["idle_power_w"] * (slowest - compute_s[n]),
        }
        for kind, value in want.items():
            assert led.energy_j[i, KIND_INDEX[kind]] == pytest.approx(value, rel=1e-9, abs=1e-15), \
                (n, kind)
    _check_time_invariant(led, run.rows[-1]["sim_time_s"])


def test_per_device_clocks_spread_compute_time():
    _sc, world, run = _run(["energy=smartphone-soc", ("population.cpu_frequency={distribution: "
                           "uniform, low_hz: 0.5e9, high_hz: 2.0e9}"), "channel.fading=none",
                           "algorithms.fedsgd.rounds=2"])
    f = world.frequency_hz
    assert f.shape == (8,) and 0.5e9 <= f.min() < f.max() <= 2.0e9
    compute_s = run.ledger.busy_s[:, 0] + run.ledger.busy_s[:, 1]
    cycles = 10 * world.model_profile.macs_per_sample
    np.testing.assert_allclose(compute_s, 2 * 3 * cycles / f, rtol=1e-12)
    # the slowest clock idles least (only the phases' other waits)
    assert np.argmin(run.ledger.busy_s[:, IDLE]) == np.argmin(f)
    _check_time_invariant(run.ledger, run.rows[-1]["sim_time_s"])


# ---- idle: fills every device's clock, in both engines, under every radio setting ----

IDLE_SETTINGS = {**SETTINGS, "participation": ["algorithms.fedsgd.participation=0.5"]}


@pytest.mark.parametrize("setting", sorted(IDLE_SETTINGS))
def test_idle_fills_the_clock_and_engines_agree(setting):
    overrides = IDLE_SETTINGS[setting] + ["energy.idle_power_w=0.5", "algorithms.fedsgd.rounds=4"]
    _, _, vec = _run(overrides + ["engine.mode=vectorized"])
    _, _, proc = _run(overrides + ["engine.mode=processes"])
    for run in (vec, proc):
        led, now = run.ledger, run.rows[-1]["sim_time_s"]
        _check_time_invariant(led, now)
        np.testing.assert_allclose(led.energy_j[:, IDLE], 0.5 * led.busy_s[:, IDLE], rtol=1e-12)
        assert led.energy_j[:, IDLE].min() > 0  # every device waited at some point
    np.testing.assert_allclose(vec.ledger.energy_j, proc.ledger.energy_j, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(vec.ledger.busy_s, proc.ledger.busy_s, rtol=1e-9, atol=1e-12)
    a, b = pd.DataFrame(vec.rows), pd.DataFrame(proc.rows)
    np.testing.assert_allclose(a.energy_idle_j, b.energy_idle_j, rtol=1e-9)


def test_devices_left_out_idle_through_the_whole_phase():
    """Partial participation: a device not chosen in a round spends that collect idle."""
    _, _, run = _run(["algorithms.fedsgd.participation=0.25", "algorithms.fedsgd.rounds=1",
                      "algorithms.fedsgd.eval_every=1", "energy.idle_power_w=1.0"])
    led = run.ledger
    out = led.packets_sent == 0
    assert out.sum() == 6
    collect_s = run.rows[-1]["sim_time_s"] - led.busy_s[:, KIND_INDEX["downlink"]].max()
    np.testing.assert_allclose(led.busy_s[out, IDLE], collect_s, rtol=1e-12)
    assert (led.energy_j[out, :KIND_INDEX["downlink"]] == 0).all()


def test_still_computing_at_the_deadline_stops_there():
    """A device whose compute outlasts the upload deadline is charged compute up to the cut
    only, sends nothing, and the phase ends at the deadline."""
    overrides = ["energy.throughput_macs_per_s=1e6", "channel.uplink.deadline_s=0.01",
                 "algorithms.fedsgd.rounds=1", "algorithms.fedsgd.eval_every=1"]
    _sc, world, run = _run(overrides)
    led = run.ledger
    assert (led.busy_s[:, 0] + led.busy_s[:, 1] == pytest.approx(0.01, rel=1e-12))
    assert led.packets_delivered.sum() == 0 and led.late_uploads.sum() == 8
    full = world.compute_model(16)
    share = 0.01 / (3 * world.model_profile.macs_per_sample * 10 / 1e6)
    np.testing.assert_allclose(led.energy_j[:, 0], share * full.forward_energy_j(10), rtol=1e-9)
    _check_time_invariant(led, run.rows[-1]["sim_time_s"])


# ---- batteries ----

MCU_BUDGET = ("population.classes={smartphone-soc: 0.25, mcu-iot: {fraction: 0.75, "
              "battery_j: 0.0004}}")
BATTERY = [MCU_BUDGET, "channel.uplink.tx_power_dbm=8", "algorithms.fedsgd.rounds=6",
           "algorithms.fedsgd.eval_every=1"]


@pytest.mark.parametrize("mode", ["vectorized", "processes"])
def test_a_device_whose_battery_runs_out_stops(mode):
    _sc, world, run = _run(BATTERY + [f"engine.mode={mode}"])
    led = run.ledger
    rows = pd.DataFrame(run.rows)
    power = world.device_power()
    spent = led.energy_j.sum(axis=1)
    dead = ~np.isnan(led.depleted_at_s)
    assert dead.any() and (~dead).any()
    assert set(np.asarray(world.device_class_names())[dead]) == {"mcu-iot"}
    # the phase in which the budget is reached completes: at or over it, by less than a round
    assert (spent[dead] >= power.battery_j[dead]).all()
    assert (spent[dead] < 2 * power.battery_j[dead]).all()
    assert np.isinf(power.battery_j[~dead]).all()
    # dead devices stop uploading and listening; the others go on
    assert led.packets_sent[dead].max() < led.packets_sent[~dead].min()
    assert led.bits_down[dead].max() < led.bits_down[~dead].min()
    # alive time ends at depletion; the run records when, and the count of devices left
    _check_time_invariant(led, rows.sim_time_s.iloc[-1])
    assert (led.depleted_at_s[dead] <= rows.sim_time_s.iloc[-1]).all()
    assert (np.diff(rows.alive_devices) <= 0).all()
    assert rows.alive_devices.iloc[0] == 8 and rows.alive_devices.iloc[-1] == (~dead).sum()


def test_engines_agree_when_batteries_run_out():
    _, _, vec = _run(BATTERY + ["engine.mode=vectorized"])
    _, _, proc = _run(BATTERY + ["engine.mode=processes"])
    np.testing.assert_allclose(vec.ledger.energy_j, proc.ledger.energy_j, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(vec.ledger.depleted_at_s, proc.ledger.depleted_at_s, rtol=1e-12)
    np.testing.assert_array_equal(vec.ledger.packets_sent, proc.ledger.packets_sent)


def test_a_budget_never_reached_changes_nothing():
    plain = pd.DataFrame(_run(BATTERY[1:] + [("population.classes={smartphone-soc: 0.25, "
                                             "mcu-iot: 0.75}")])[2].rows)
    big = pd.DataFrame(_run(BATTERY[1:] + [("population.classes={smartphone-soc: 0.25, mcu-iot: "
                                           "{fraction: 0.75, battery_j: 1e6}}")])[2].rows)
    pd.testing.assert_frame_equal(plain, big)


# ---- precision: M sets the payload bits and E_MAC(M) ----

def _forward_energy_by_hand(p: dict, macs: float, activations: float, params: float,
                            inputs: float, bits: int) -> float:
    """Seed 002 eq. 9 written out again, with E_MAC(M) = A (M / M_max)^mu."""
    m_max = p["max_precision_bits"]

    def e_mac(m):
        return p["mac_energy_j"] * (m / m_max) ** p["mac_exponent"]

    root = math.sqrt(bits / (p["mac_units"] * m_max))
    return (e_mac(bits) * macs + 3 * activations * e_mac(m_max)
            + 2 * e_mac(bits) * params + e_mac(bits) * macs * root
            + 2 * e_mac(bits) * activations + e_mac(bits) * macs * root
            + p["dram_to_mac_ratio"] * e_mac(m_max) * inputs
            + 2 * p["dram_to_mac_ratio"] * e_mac(bits)
            * max(params * bits + activations * bits - p["sram_bits"], 0))


def test_precision_sweep_changes_bits_and_forward_energy_as_the_formulas_say():
    p = catalog.load_mapping("energy", "seed002-accelerator", "test")
    rounds, backward = 2, set()
    for bits in (4, 8, 16, 32):
        _sc, world, run = _run([f"quantization_bits={bits}", f"algorithms.fedsgd.rounds={rounds}"])
        led, prof, d = run.ledger, world.model_profile, world.flat.d
        # Payload.vectors: d values of M bits, plus a float32 scale below 32 bits
        per_round = d * bits + (32 if bits < 32 else 0)
        assert led.bits_up.tolist() == [per_round * rounds] * 8
        b = 10
        want = _forward_energy_by_hand(p, b * prof.macs_per_sample,
                                       b * prof.activations_per_sample, d, b * prof.input_size,
                                       bits)
        np.testing.assert_allclose(led.energy_j[:, KIND_INDEX["compute_forward"]],
                                   rounds * want, rtol=1e-12)
        backward.add(round(float(led.energy_j[0, KIND_INDEX["compute_backward"]]), 20))
    assert len(backward) == 1  # the backward pass runs at M_max whatever M is


# ---- scenario: classes and clocks are validated and recorded ----

def test_classes_and_clocks_are_checked_with_clean_errors():
    with pytest.raises(UserError, match="fractions must sum to 1; they sum to 0.9"):
        small_scenario(["population.classes={smartphone-soc: 0.3, mcu-iot: 0.6}"])
    with pytest.raises(UserError, match="unknown energy profile 'mcu-iot2'; did you mean"):
        small_scenario(["population.classes={smartphone-soc: 0.3, mcu-iot2: 0.7}"])
    with pytest.raises(UserError, match="cpu_frequency needs 'cmos' energy profiles"):
        small_scenario([("population.cpu_frequency={distribution: uniform, low_hz: 1e9, "
                        "high_hz: 2e9}")])
    with pytest.raises(UserError, match="distribution 'lognormal' needs 'sigma'"):
        small_scenario(["energy=smartphone-soc",
                        "population.cpu_frequency={distribution: lognormal, median_hz: 1e9}"])
    with pytest.raises(UserError, match="'low_hz' is in Hz"):
        small_scenario(["energy=smartphone-soc",
                        "population.cpu_frequency={distribution: uniform, low_hz: 1, high_hz: 2}"])


def test_class_overrides_and_the_resolved_scenario_round_trip():
    sc = small_scenario([("population.classes={phone: {profile: smartphone-soc, fraction: 0.5}, "
                         "mcu-iot: 0.5}"), "population.classes.mcu-iot.battery_j=3.5"])
    classes = sc.population.classes
    assert classes["phone"].energy.name == "smartphone-soc"
    assert classes["mcu-iot"].energy.battery_j == 3.5
    assert classes["mcu-iot"].energy.kappa == 3.8e-26
    again = scenario_from_document(resolved_document(sc), "manifest")
    assert again == sc
    world = build_world(sc)
    assert world.class_names == ["phone", "mcu-iot"]
    assert sorted(world.device_class_names()) == ["mcu-iot"] * 4 + ["phone"] * 4
    # the draw is keyed by the seed: same seed, same devices per class
    assert (build_world(sc).device_class == world.device_class).all()


def _record_run(sc, folder):
    """(world, run record) of the scenario's algorithms but the first, written to ``folder``."""
    world = build_world(sc)
    writer = RunWriter(folder, resolved_document(sc), sc.seed)
    for params in sc.algorithms[1:]:
        run = run_algorithm(world, params)
        writer.add(run.label, run.rows, run.device_rows(world), {})
    writer.finish()
    return world, read_run(folder)


def test_heterogeneous_run_records_classes_and_draws_lifetime_and_device_figures(tmp_path):
    sc = small_scenario(BATTERY)
    _world, record = _record_run(sc, tmp_path)
    devices = record.devices
    assert set(devices.device_class) == {"smartphone-soc", "mcu-iot"}
    np.testing.assert_allclose(devices.energy_j, devices.energy_compute_j + devices.energy_uplink_j
                               + devices.energy_downlink_j + devices.energy_idle_j, rtol=1e-12)
    assert devices.depleted_at_s.notna().any() and devices.depleted_at_s.isna().any()
    assert (record.rounds.alive_devices <= 8).all()
    names = {p.name for p in draw_report(record)}
    assert {"network_lifetime.png", "device_energy.png"} <= names
    for name in ("network_lifetime.png", "device_energy.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_shipped_heterogeneous_scenario_validates():
    sc = load_scenario("heterogeneous-devices")
    assert set(sc.population.classes) == {"smartphone-soc", "mcu-iot"}
    assert sc.population.classes["mcu-iot"].energy.battery_j is not None
    assert {a.name for a in sc.algorithms} == {"fedavg", "dzofl"}


# ---- the base station's transmit energy ----

def _dbm_to_w(dbm):
    return 10 ** ((dbm - 30) / 10)


class _DownlinkRecorder:
    """Wraps ``Downlink.transmit``: every downlink transmission's receivers, airtime [s] and
    the base station's draw while on air [W] from the profile's own fields."""

    def __init__(self):
        self.calls = []
        original = Downlink.transmit

        def transmit(link, bits, receivers, rng=None, now_s=0.0, mode=None):
            out = original(link, bits, receivers, rng=rng, now_s=now_s, mode=mode)
            down = link.config.downlink
            self.calls.append((bits, np.array(receivers, dtype=bool), out.airtime_s,
                               _dbm_to_w(down.tx_power_dbm) + down.circuit_power_w))
            return out

        self.transmit = transmit  # a function, so that it binds as a method of Downlink

    def energy_j(self):
        return math.fsum(air * draw for _, _, air, draw in self.calls)

    def airtime_s(self):
        return math.fsum(air for _, _, air, _ in self.calls)


SEED002_CNN_AT_500_M = ["population.num_devices=2", "population.distances_m=[100, 500]",
                        "channel.fading=none", "data.name=digits28", "data.classes=[6, 7]",
                        "model.name=seed002-cnn", "algorithms.dzofl.rounds=1",
                        "algorithms.dzofl.eval_every=1", *ONE_ROUND]


@pytest.mark.parametrize("mode", ["vectorized", "processes"])
def test_one_fedsgd_broadcast_costs_the_base_station_46_dbm_times_its_airtime(mode):
    """Seed 002's CNN (d = 45,362) in the seed002-cell profile, the weakest device at 500 m, by
    hand: one FedSGD broadcast is d 16-bit values + a 32-bit scale = 725,824 bits at
    2 MHz x log2(1 + SNR), SNR = 46 - (128.1 + 37.6 log10 0.5) - (-173 + 10 log10 2e6) = 39.21 dB,
    i.e. 26.05 Mbit/s: 223 slots of 0.125 ms on air, at 10^((46 - 30)/10) W = 39.8 W, 1.1097 J.
    A DZOFL broadcast (one 16-bit scalar) is one slot: 4.98 mJ. The devices' energy_j is not
    touched; the system's is the sum."""
    sc = small_scenario([*SEED002_CNN_AT_500_M, f"engine.mode={mode}"])
    world = build_world(sc)
    assert world.evaluator.d == 45_362  # dzofl.md sec. 5
    bits = 45_362 * 16 + 32
    noise_dbm = -173 + 10 * math.log10(2e6)
    snr_db = 46 - (128.1 + 37.6 * math.log10(0.5)) - noise_dbm
    assert snr_db == pytest.approx(39.21, abs=5e-3)
    rate = 2e6 * math.log2(1 + 10 ** (snr_db / 10))
    slots = math.ceil(bits / (rate * 0.125e-3))
    assert slots == 223
    want = _dbm_to_w(46) * slots * 0.125e-3
    assert want == pytest.approx(1.1097, abs=1e-4)

    row = run_algorithm(world, sc.algorithms[1]).rows[-1]  # FedSGD, one round
    assert row["bs_airtime_s"] == pytest.approx(slots * 0.125e-3, rel=1e-12)
    assert row["energy_bs_j"] == pytest.approx(want, rel=1e-12)
    assert row["energy_system_j"] == row["energy_j"] + row["energy_bs_j"]
    # the devices still pay only for listening: 0.1 W x the same airtime each
    assert row["energy_downlink_j"] == pytest.approx(2 * 0.1 * slots * 0.125e-3, rel=1e-12)

    row = run_algorithm(world, sc.algorithms[0]).rows[-1]  # DZOFL, one iteration
    assert row["energy_bs_j"] == pytest.approx(_dbm_to_w(46) * 0.125e-3, rel=1e-12)
    assert row["energy_bs_j"] == pytest.approx(4.976e-3, abs=1e-6)


def test_base_station_draws_its_circuit_power_and_is_on_air_for_every_unicast_packet():
    """Unicast: one packet per device at its own mean-SNR rate, back to back; the base station
    draws transmit + circuit power for the sum of their airtimes."""
    sc, world, run = _run(TWO_DEVICES + ONE_ROUND + ["channel.downlink.mode=unicast",
                                                     "channel.downlink.circuit_power_w=5"])
    packet = world.flat.d * 16 + 32
    air = _broadcast_airtime(sc, packet, 100) + _broadcast_airtime(sc, packet, 400)
    row = run.rows[-1]
    assert row["bs_airtime_s"] == pytest.approx(air, rel=1e-12)
    assert row["energy_bs_j"] == pytest.approx((_dbm_to_w(46) + 5) * air, rel=1e-12)
    assert run.ledger.bs_energy_j == row["energy_bs_j"]


@pytest.mark.parametrize("mode", ["vectorized", "processes"])
def test_resends_to_stale_devices_are_charged_to_the_base_station(mode, monkeypatch):
    """With downlink loss, devices that missed a packet are resent the model (d float32 values,
    Algorithm.resync) to themselves only; each resend is on air and charged like a broadcast:
    base-station energy = sum over every downlink transmission of draw x airtime."""
    recorder = _DownlinkRecorder()
    monkeypatch.setattr(Downlink, "transmit", recorder.transmit)
    _sc, world, run = _run(["channel.downlink.loss=true", "channel.downlink.tx_power_dbm=0",
                            f"engine.mode={mode}"])
    resends = [c for c in recorder.calls if not c[1].all()]
    assert resends, "the setting must make some device stale"
    assert all(bits == world.flat.d * 32 for bits, *_ in resends)
    assert run.ledger.broadcasts_missed.sum() > 0
    row = run.rows[-1]
    assert row["energy_bs_j"] == pytest.approx(recorder.energy_j(), rel=1e-12)
    assert row["bs_airtime_s"] == pytest.approx(recorder.airtime_s(), rel=1e-12)
    assert math.fsum(c[2] for c in resends) > 0


def test_paper_accounting_charges_dzofl_one_forward_pass_per_iteration():
    """energy_accounting: paper (seed 002, Sec. III-C "E_FP x T", Sec. III-B one forward
    computation per iteration): DZOFL's compute energy and compute time are exactly half of
    physical's two queries, every iteration; the radio is unchanged; gradient methods (E_FP +
    E_BP per iteration under both) are unchanged; the manifest's scenario records it."""
    physical, paper = small_scenario(), small_scenario(["energy_accounting=paper"])
    assert resolved_document(physical)["energy_accounting"] == "physical"
    assert resolved_document(paper)["energy_accounting"] == "paper"
    world = build_world(physical)
    a = run_algorithm(world, physical.algorithms[0])
    b = run_algorithm(build_world(paper), paper.algorithms[0])
    fwd, bwd = KIND_INDEX["compute_forward"], KIND_INDEX["compute_backward"]
    iterations = physical.algorithms[0].rounds
    one_pass_j = world.compute_model(16).forward_energy_j(10)  # E_FP of a batch of 10
    one_pass_s = world.compute_model(16).forward_time_s(10)
    np.testing.assert_allclose(a.ledger.energy_j[:, fwd], 2 * iterations * one_pass_j, rtol=1e-12)
    np.testing.assert_allclose(b.ledger.energy_j[:, fwd], iterations * one_pass_j, rtol=1e-12)
    np.testing.assert_array_equal(b.ledger.energy_j[:, fwd], a.ledger.energy_j[:, fwd] / 2)
    np.testing.assert_array_equal(b.ledger.busy_s[:, fwd], a.ledger.busy_s[:, fwd] / 2)
    assert (a.ledger.energy_j[:, bwd] == 0).all() and (b.ledger.energy_j[:, bwd] == 0).all()
    for kind in ("uplink", "downlink"):
        np.testing.assert_array_equal(a.ledger.energy_j[:, KIND_INDEX[kind]],
                                      b.ledger.energy_j[:, KIND_INDEX[kind]])
    assert a.ledger.bs_energy_j == b.ledger.bs_energy_j
    ra, rb = pd.DataFrame(a.rows), pd.DataFrame(b.rows)
    np.testing.assert_allclose(ra.sim_time_s - rb.sim_time_s, ra["round"] * one_pass_s,
                               rtol=1e-9, atol=1e-15)
    np.testing.assert_array_equal(ra.test_accuracy, rb.test_accuracy)  # same numerics
    for index in (1, 2):  # FedSGD, FedAvg: the passes they make under both
        pd.testing.assert_frame_equal(
            pd.DataFrame(run_algorithm(world, physical.algorithms[index]).rows),
            pd.DataFrame(run_algorithm(build_world(paper), paper.algorithms[index]).rows))


def test_summary_tuning_and_breakdown_carry_the_system_energy(tmp_path):
    """The summary's system energy to target and in total are the devices' + the base
    station's at the same rows, the tuning objective reads it, and the energy-breakdown figure
    writes the base station's share above each bar; a run recorded before the base station's
    columns still summarises (system energy NaN, left out of the printed table) and draws."""
    sc = small_scenario(ONE_ROUND)
    world, record = _record_run(sc, tmp_path)
    rounds = record.rounds
    # a target first met after round 0, by at least one algorithm
    target = float(rounds[rounds["round"] > 0].test_accuracy.max())
    assert target > rounds[rounds["round"] == 0].test_accuracy.max()
    table = summarize(rounds, target, world.num_devices).set_index("algorithm")
    last = rounds.groupby("algorithm").tail(1).set_index("algorithm")
    first = rounds[rounds.test_accuracy >= target].groupby("algorithm").head(1)
    first = first.set_index("algorithm")
    for name in table.index:
        assert table.loc[name, "energy_system_j"] == (last.loc[name, "energy_j"]
                                                      + last.loc[name, "energy_bs_j"])
        scored = score(OBJECTIVES["system_energy_to_target"], rounds[rounds.algorithm == name],
                       target, None)["value"]
        if name not in first.index:
            assert math.isnan(table.loc[name, "system_energy_to_target_j"]) and math.isnan(scored)
            continue
        assert table.loc[name, "system_energy_to_target_j"] == pytest.approx(
            first.loc[name, "energy_j"] + first.loc[name, "energy_bs_j"], rel=1e-15)
        assert table.loc[name, "system_energy_to_target_j"] > table.loc[name, "energy_to_target_j"]
        assert scored == table.loc[name, "system_energy_to_target_j"]
    assert len(first) >= 1
    assert "system [J]" in format_summary(table.reset_index(), target)

    texts = sorted(t.get_text() for t in plots.energy_breakdown(record).axes[0].texts)
    want = sorted(f"BS {100 * r.energy_bs_j / (r.energy_j + r.energy_bs_j):.1f}%"
                  for r in last.itertuples())
    assert texts == want and all(t != "BS 0.0%" for t in texts)

    old = ["energy_bs_j", "energy_system_j", "bs_airtime_s"]
    record.rounds = rounds.drop(columns=old)
    before = summarize(record.rounds, target, world.num_devices)
    assert before.energy_system_j.isna().all() and before.system_energy_to_target_j.isna().all()
    assert "system" not in format_summary(before, target)
    assert not plots.energy_breakdown(record).axes[0].texts


def test_energy_accounting_rejects_other_values():
    with pytest.raises(UserError, match="energy_accounting"):
        small_scenario(["energy_accounting=papers"])


# ---- conservation over random small scenarios ----

REGISTRY = ALGORITHMS.load_builtins()
# the methods on the air (a centralized reference sends and spends nothing: check_off_air)
ALGORITHMS = sorted(name for name, cls in REGISTRY.items() if cls.uploads_per_round > 0)


@st.composite
def _scenarios(draw):
    overrides = ["population.num_devices=5", "data.server_fraction=0.3",
                 f"engine.mode={draw(st.sampled_from(['vectorized', 'processes']))}"]
    mode = draw(st.sampled_from(["fixed", "adaptive", "mcs", "pinned"]))
    overrides.append(f"channel.uplink.mode={mode}")
    if mode == "pinned":
        overrides.append(f"channel.uplink.delivery_probability="
                         f"{draw(st.sampled_from([0.3, 0.9, 1.0]))}")
    if draw(st.booleans()):
        overrides += ["channel.uplink.spectrum.mode=shared",
                      "channel.uplink.spectrum.pool_bandwidth_hz=4e6",
                      f"channel.uplink.spectrum.channels={draw(st.integers(1, 3))}"]
    deadline = draw(st.sampled_from([None, 0.002, 0.01, 0.05]))
    if deadline is not None:
        overrides.append(f"channel.uplink.deadline_s={deadline}")
    overrides.append(f"channel.uplink.arq.max_attempts={draw(st.integers(1, 3))}")
    if draw(st.booleans()):
        overrides += ["channel.downlink.loss=true", "channel.downlink.tx_power_dbm=0",
                      f"channel.downlink.mode={draw(st.sampled_from(['broadcast', 'unicast']))}"]
    overrides.append(f"energy.idle_power_w={draw(st.sampled_from([0.0, 0.05, 1.0]))}")
    battery = draw(st.sampled_from([None, 2e-4, 2e-3]))
    if draw(st.booleans()):
        phone = 0.4 if battery is None else f"{{fraction: 0.4, battery_j: {battery}}}"
        overrides.append(f"population.classes={{smartphone-soc: {phone}, mcu-iot: 0.6}}")
    elif battery is not None:
        overrides.append(f"energy.battery_j={battery}")
    name = draw(st.sampled_from(ALGORITHMS))
    algorithm = {"name": name, "rounds": 3, "eval_every": 1,
                 "participation": draw(st.sampled_from([0.4, 1.0]))}
    if name == "zo-hfl":
        algorithm["tau"] = 1.0
    if name == "fedmsa":
        algorithm["local_clients"] = draw(st.integers(1, 5))
    return overrides, algorithm


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios())
def test_energy_is_conserved_over_random_scenarios(case):
    overrides, algorithm = case
    sc = algorithm_scenario(algorithm, overrides)
    world = build_world(sc)
    recorder = _DownlinkRecorder()
    with mock.patch.object(Downlink, "transmit", recorder.transmit):
        run = run_algorithm(world, sc.algorithms[0])
    led, rows = run.ledger, pd.DataFrame(run.rows)
    # the base station: every downlink transmission (broadcasts, unicasts, resends) at its draw
    # x airtime, beside the devices' energy; the system's = devices' + base station's
    # nobody listening (every battery ran out): the base station sends nothing and spends 0
    listened = any(receivers.any() for _, receivers, *_ in recorder.calls)
    assert recorder.calls and (led.bs_energy_j > 0) == listened
    assert led.bs_energy_j == pytest.approx(recorder.energy_j(), rel=1e-12)
    assert rows.energy_bs_j.iloc[-1] == led.bs_energy_j
    assert rows.bs_airtime_s.iloc[-1] == pytest.approx(recorder.airtime_s(), rel=1e-12)
    np.testing.assert_allclose(rows.energy_system_j, rows.energy_j + rows.energy_bs_j,
                               rtol=1e-15)
    assert led.system_energy_j() == pytest.approx(led.energy_j.sum() + recorder.energy_j(),
                                                  rel=1e-12)
    assert (np.diff(rows.energy_bs_j) >= 0).all()
    total = led.energy_j.sum()
    assert (led.energy_j >= 0).all() and (led.busy_s >= 0).all()
    assert total == pytest.approx(sum(led.energy_by_kind().values()), rel=1e-12, abs=1e-300)
    assert total == pytest.approx(led.energy_j.sum(axis=1).sum(), rel=1e-12, abs=1e-300)
    kinds = [f"energy_{k}_j" for k in ("compute", "uplink", "downlink", "idle")]
    np.testing.assert_allclose(rows.energy_j, rows[kinds].sum(axis=1), rtol=1e-12)
    assert rows.energy_j.iloc[-1] == pytest.approx(total, rel=1e-12, abs=1e-300)
    for column in ("sim_time_s", "energy_j", "energy_idle_j", "bits_up", "bits_down"):
        assert (np.diff(rows[column]) >= 0).all(), column
    assert (np.diff(rows.alive_devices) <= 0).all()
    _check_time_invariant(led, float(rows.sim_time_s.iloc[-1]))
    budget = world.device_power().battery_j
    dead = ~led.alive
    event(f"devices whose battery ran out: {'some' if dead.any() else 'none'}")
    event(f"late uploads: {'some' if led.late_uploads.any() else 'none'}")
    assert (led.energy_j.sum(axis=1)[dead] >= budget[dead]).all()
    assert (led.energy_j.sum(axis=1)[~dead] < budget[~dead]).all()
    assert set(KINDS) == set(led.energy_by_kind())
