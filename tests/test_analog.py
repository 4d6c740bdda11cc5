"""The analog uplink (channel/analog.py, ``Network.superpose``) against closed forms and hand
values, and the methods that use it (1P-ZOFL, AirComp FedSGD / FedAvg) against NumPy
transcriptions of their rounds.

Closed forms (Rayleigh, |h|^2 ~ Exp(1); Monte Carlo through the engine, within 4 standard
errors):

* truncated inversion on the small-scale gain at g_th: a device is silent with probability
  1 - exp(-g_th) at any distance, and its mean transmit power is rho_0 sigma^2 E1(g_th) / G_i
  (Zhu, Wang and Huang 2020, truncated channel inversion; E1 the exponential integral, the mean
  of 1{x >= g} / x under Exp(1));
* truncation on the whole gain r^-alpha |h|^2 with devices uniform in a disk of radius R: the
  silent fraction is 1 - (2 / (alpha R^2)) g_th^(-2/alpha) gamma(2/alpha, g_th R^alpha);
* given K transmitting devices sending 1, the mean's noise error has variance 1 / (rho_0 K^2)
  (the real-valued receiver model, noise variance sigma^2 per value, rho_0 the received SNR);
* without channel state at the transmitters the received sum's mean is E|h| times the sum,
  E|h| = sqrt(pi Omega) / 2 for a Rayleigh amplitude of second moment Omega (= 1 here).

Hand values: the airtime of an analog phase of d values is ceil(d / (B slot)) slots whatever the
number of devices, and each device's energy is its power times that time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import simpy
import torch
from scipy import special

from tests.conftest import run_recording_thetas, small_quadratic, small_scenario
from wirelessfl.channel import Cell, Downlink, Uplink
from wirelessfl.channel.analog import (
    RAYLEIGH_MEAN_AMPLITUDE,
    mean_inversion_power,
    silent_fraction_disk,
    silent_probability_fading,
)
from wirelessfl.channel.cell import dbm_to_w
from wirelessfl.contract.payload import Cost, Payload
from wirelessfl.energy import ComputeModel, DevicePower
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.engine.ledger import KIND_INDEX, Ledger
from wirelessfl.engine.network import ANALOG_NOISE_STREAM, ENGINES
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_generator, keyed_rng
from wirelessfl.pipeline.build import build_world, draw_population
from wirelessfl.pipeline.notes import silent_analog_warning
from wirelessfl.pipeline.simulation import run_algorithm

MODEL = ModelProfile(params=650, macs_per_sample=640, activations_per_sample=10, input_size=64)
UPLINK = KIND_INDEX["uplink"]
P_MAX_W = float(dbm_to_w(23.0))  # the seed-002 cell's device power limit (23 dBm)
NOISE_W = float(dbm_to_w(-173.0 + 10 * np.log10(2e6)))  # sigma^2: N0 B over the 2 MHz band


def _network(distances=None, overrides=(), n=None, per_device=True, engine="vectorized"):
    """A network over the seed-002 cell (``overrides`` on the small scenario), devices at
    ``distances`` [m] (or ``n`` placed at random)."""
    n = len(distances) if distances is not None else n
    sc = small_scenario([f"population.num_devices={n}", *overrides])
    cell = (Cell.from_distances(np.asarray(distances, float), sc.channel)
            if distances is not None
            else Cell.build(n, sc.channel, keyed_rng(sc.seed, "placement")))
    _, profiles, device_class, _ = draw_population(sc)
    up, down = Uplink(cell, sc.channel), Downlink(cell, sc.channel)
    power = DevicePower.from_profiles(profiles, device_class, up.tx_power_w, up.circuit_power_w)
    env = simpy.Environment()
    net = ENGINES[engine](env, Ledger(n), up, down, ComputeModel(profiles[0], MODEL, 16), power,
                          keyed_rng(sc.seed, "fading"), keyed_rng(sc.seed, "downlink"),
                          per_device=per_device, seed=sc.seed)
    return env, net, sc


def _phases(env, net, values, phases: int, power_control="truncated-inversion"):
    """Run ``phases`` analog phases of ``values`` [n, k] from every device; per phase the
    result and each device's uplink energy [J]."""
    results, energies = [], []

    def run():
        for _ in range(phases):
            before = net.ledger.energy_j[:, UPLINK].copy()
            result = yield from net.superpose(Cost(), Payload.analog(values.shape[1]), values,
                                              power_control=power_control)
            results.append(result)
            energies.append(net.ledger.energy_j[:, UPLINK] - before)

    env.process(run())
    env.run()
    return results, np.array(energies)


def _within(sample: np.ndarray, expected: float, standard_error: float | None = None):
    mean = float(np.mean(sample))
    se = standard_error if standard_error is not None else \
        float(np.std(sample, ddof=1) / np.sqrt(len(sample)))
    assert abs(mean - expected) <= 4 * se, (mean, expected, se)


def test_truncation_on_the_fading_silences_and_costs_as_the_closed_forms():
    distances = np.repeat([40.0, 200.0, 480.0], 20)
    env, net, _ = _network(distances)
    results, energies = _phases(env, net, torch.ones(len(distances), 1), 1500)
    air = net._analog().airtime_s(1)
    silent = np.array([~r.transmitted for r in results])  # [phases, devices]
    g_th = 0.1  # the -10 dB default
    gain = net.uplink.cell.uplink_mean_snr / P_MAX_W * NOISE_W  # G_i (path loss, linear)
    rho0 = P_MAX_W * gain.min() / NOISE_W / special.exp1(g_th)  # the average-power rule
    for distance in (40.0, 200.0, 480.0):  # the same silence at every distance
        here = distances == distance
        p = silent_probability_fading(g_th)
        assert p == pytest.approx(1 - np.exp(-g_th), rel=1e-15)
        _within(silent[:, here].ravel(), p, np.sqrt(p * (1 - p) / silent[:, here].size))
        # mean transmit power, over all phases (silent ones at 0), per unit rho_0 sigma^2 / G_i
        scaled = (energies[:, here] / air) * gain[here] / (rho0 * NOISE_W)
        _within(scaled.ravel(), special.exp1(g_th))
    assert mean_inversion_power(g_th) == special.exp1(g_th)
    # the farthest device's mean power is the limit (Zhu et al.'s average-power constraint)
    far = distances == 480.0
    _within((energies[:, far] / air).ravel(), P_MAX_W)


@pytest.mark.parametrize(("alpha", "reach"), [(3.76, 1.0), (3.0, 5.0)])
def test_truncation_on_the_gain_silences_the_disk_fraction(alpha, reach):
    """Devices uniform in a disk of radius R under a pure power law r^-alpha (log-distance,
    0 dB at 1 m): the fraction truncation on the whole gain silences; g_th R^alpha = reach."""
    radius, n = 500.0, 20000
    g_th_db = 10 * np.log10(reach) - 10 * alpha * np.log10(radius)
    overrides = ["channel.min_distance_m=0.001", f"channel.cell_radius_m={radius}",
                 ("channel.path_loss={model: log-distance, reference_distance_m: 1, "
                 f"reference_loss_db: 0, exponent: {alpha}, intercept_db: null, "
                 "slope_db_per_decade: null}"),
                 f"channel.uplink.analog={{truncate_on: gain, threshold_db: {g_th_db}}}"]
    env, net, _ = _network(n=n, overrides=overrides)
    results, _ = _phases(env, net, torch.ones(n, 1), 4)
    silent = np.array([~r.transmitted for r in results]).mean(0)  # per device, over phases
    want = silent_fraction_disk(10 ** (g_th_db / 10), alpha, radius)
    # the incomplete-gamma form against a direct numerical integral of the same probability
    r = np.linspace(0, radius, 400001)[1:]
    direct = np.trapezoid(-np.expm1(-(10 ** (g_th_db / 10)) * r**alpha) * 2 * r / radius**2, r)
    assert want == pytest.approx(direct, rel=1e-4)
    # one Bernoulli per device bounds each device's average over phases: a conservative error
    _within(silent, want, np.sqrt(want * (1 - want) / n))


def test_the_noise_of_the_mean_given_k_devices():
    """Every device sends 1 (amplitude 1), nobody truncated: received / K - 1 is the mean's
    noise error, of variance 1 / (rho_0 K^2) per value (20,000 values in one phase)."""
    distances = np.linspace(60.0, 400.0, 20)
    env, net, _ = _network(distances, ["channel.uplink.analog={threshold_db: -300}"])
    (result,), _ = _phases(env, net, torch.ones(20, 20000, dtype=torch.float64), 1)
    k = result.count
    assert k == 20
    gain = net.uplink.cell.uplink_mean_snr / P_MAX_W * NOISE_W
    rho0 = P_MAX_W * gain.min() / NOISE_W / special.exp1(1e-30)
    error = result.received.numpy() / k - 1.0
    var, want = error.var(ddof=1), 1.0 / (rho0 * k**2)
    assert abs(var - want) <= 4 * want * np.sqrt(2 / (len(error) - 1)), (var, want)
    assert abs(error.mean()) <= 4 * np.sqrt(want / len(error))


def test_without_channel_state_the_sum_arrives_scaled_by_the_mean_amplitude():
    distances = np.linspace(30.0, 490.0, 50)
    env, net, _ = _network(distances)
    results, energies = _phases(env, net, torch.ones(50, 1, dtype=torch.float64), 3000,
                                "large-scale-inversion")
    assert all(r.count == 50 for r in results)  # nobody is truncated without channel state
    received = np.array([float(r.received[0]) for r in results])
    assert RAYLEIGH_MEAN_AMPLITUDE == pytest.approx(np.sqrt(np.pi * 1.0) / 2, rel=1e-15)
    _within(received, 50 * RAYLEIGH_MEAN_AMPLITUDE)
    # each device inverts its path loss only: its power is fixed, the weakest's at the limit
    air = net._analog().airtime_s(1)
    power = energies / air
    np.testing.assert_allclose(power, np.broadcast_to(power[0], power.shape), rtol=1e-12)
    assert power[0, -1] == pytest.approx(P_MAX_W, rel=1e-12)


@pytest.mark.parametrize("engine", ["vectorized", "processes"])
@pytest.mark.parametrize("per_device", [False, True])
def test_an_analog_phase_takes_the_same_time_for_one_and_a_thousand_devices(engine, per_device):
    """1,000 values over 2 MHz in 0.125 ms slots: 1000 / (2e6 x 1.25e-4) = 4 slots, 0.5 ms, for
    N = 1 and N = 1,000; one device alone at the limit (its own gain is the weakest): energy
    0.5 ms x P_max / E1(0.1) with channel state (fading none: |h|^2 = 1 clears the threshold),
    0.5 ms x P_max without (23 dBm = 0.19953 W)."""
    for n in (1, 1000):
        env, net, _ = _network([250.0] * n, ["channel.fading=none"], per_device=per_device,
                               engine=engine)
        _phases(env, net, torch.ones(n, 1000), 1)
        assert env.now == pytest.approx(0.5e-3, rel=1e-12)
        np.testing.assert_allclose(net.ledger.busy_s[:, UPLINK], 0.5e-3, rtol=1e-12)
        np.testing.assert_allclose(net.ledger.energy_j[:, UPLINK],
                                   0.5e-3 * 0.19952623149688797 / 1.8229239584193906,
                                   rtol=1e-9)
    env, net, _ = _network([250.0], ["channel.fading=none"], per_device=per_device,
                           engine=engine)
    _phases(env, net, torch.ones(1, 1000), 1, "large-scale-inversion")
    assert net.ledger.energy_j[0, UPLINK] == pytest.approx(0.5e-3 * 0.19952623149688797,
                                                          rel=1e-9)


def test_the_received_sum_is_the_scheduled_values_plus_the_keyed_noise():
    """Per-device streams, fading none: devices beyond the interior radius stay silent, the
    others' values add up exactly and the noise is the keyed stream's normals x the largest
    RMS / sqrt(rho_0), rho_0 from the interior's weakest gain."""
    distances = np.array([50.0, 120.0, 300.0, 420.0, 470.0])
    overrides = ["channel.fading=none", "channel.uplink.analog={interior_radius_m: 350}"]
    env, net, sc = _network(distances, overrides)
    values = torch.tensor(np.random.default_rng(0).normal(size=(5, 7)))
    (result,), energies = _phases(env, net, values, 1, "large-scale-inversion")
    inside = distances <= 350
    assert result.transmitted.tolist() == inside.tolist()
    assert result.active.all()
    gain = net.uplink.cell.uplink_mean_snr / P_MAX_W * NOISE_W
    rho0 = P_MAX_W * gain[inside].min() / NOISE_W
    x = values.numpy()
    amplitude = np.sqrt((x[inside] ** 2).mean(1)).max()
    z = keyed_rng(sc.seed, ANALOG_NOISE_STREAM, 0).standard_normal(7)
    np.testing.assert_allclose(result.received.numpy(),
                               x[inside].sum(0) + amplitude * z / np.sqrt(rho0), rtol=1e-12)
    assert (energies[0, ~inside] == 0).all() and (energies[0, inside] > 0).all()
    led = net.ledger
    assert led.packets_sent.tolist() == [1] * 5
    assert led.packets_delivered.tolist() == inside.astype(int).tolist()
    assert led.bits_up.sum() == 0  # analog symbols carry no bits


def test_a_truncate_on_gain_profile_without_threshold_is_refused():
    with pytest.raises(UserError, match="threshold_db"):
        small_scenario(["channel.uplink.analog={truncate_on: gain}"])


# ---- the methods against transcriptions of their rounds --------------------------------------
def _quadratic_losses(a, c, x):
    return 0.5 * np.einsum("j,njk,k->n", x, a, x) - c @ x


# Fading none (every weight 1): shared streams then draw only the receiver's noise from the
# run's uplink stream keyed (seed, "fading"), phase after phase.
ANALOG_QUADRATIC = ["channel.fading=none"]


def _silencing_run(monkeypatch, algorithm: dict, rounds: int):
    """The quadratic run of ``algorithm`` with an interior radius that silences the two farthest
    of the five devices: (scenario, world, theta after every round, the interior mask, (rho_0
    of large-scale inversion, of truncated inversion at g_th = 0.1))."""
    probe = build_world(small_quadratic(algorithm, overrides=ANALOG_QUADRATIC))
    radius = float(np.sort(probe.cell.distances_m)[2])
    sc = small_quadratic({**algorithm, "rounds": rounds}, overrides=[
        *ANALOG_QUADRATIC, f"channel.uplink.analog={{interior_radius_m: {radius}}}"])
    world, thetas, _ = run_recording_thetas(monkeypatch, sc)
    inside = world.cell.distances_m <= radius
    assert 0 < inside.sum() < len(inside)
    weakest = (world.cell.uplink_mean_snr / P_MAX_W)[inside].min()
    return sc, world, thetas, inside, (P_MAX_W * weakest,
                                       P_MAX_W * weakest / special.exp1(0.1))


@pytest.mark.parametrize("estimator", ["one-point", "two-point"])
def test_zofl_matches_its_round_with_silent_devices_and_receiver_noise(monkeypatch, estimator):
    p = {"alpha0": 0.05, "gamma0": 0.1, "estimator": estimator}
    rounds = 12
    sc, world, thetas, inside, (rho0, _) = _silencing_run(monkeypatch, {"name": "1p-zofl", **p},
                                                          rounds)
    prob = world.evaluator
    a, c, n = prob.a_np, prob.c_np, len(inside)
    d = c.shape[1]
    v1, v2 = (0.51, 0.17) if estimator == "one-point" else (0.26, 0.26)
    x = np.zeros(d)
    want = [x.copy()]
    noise = keyed_rng(sc.seed, "fading")
    for k in range(rounds):
        gen = keyed_generator(sc.seed, "zofl-phi", k)
        phi = (torch.randint(0, 2, (d,), generator=gen, dtype=torch.int8).double() * 2 - 1
               ).numpy() / np.sqrt(d)
        alpha, gamma = p["alpha0"] * (1 + k) ** -v1, p["gamma0"] * (1 + k) ** -v2
        v = _quadratic_losses(a, c, x + gamma * phi)
        if estimator == "two-point":
            v = v - _quadratic_losses(a, c, x - gamma * phi)
        v = v.astype(np.float32).astype(np.float64)  # sent as the model's float32
        amplitude = np.abs(v[inside]).max()
        z = noise.standard_normal(1)[0]
        received = v[inside].sum() + amplitude * z / np.sqrt(rho0)
        x = x - alpha * phi * (n / inside.sum()) * received
        want.append(x.copy())
    assert len(thetas) == rounds + 1
    for got, expected in zip(thetas, want, strict=True):
        np.testing.assert_allclose(got.double().numpy(), expected, rtol=2e-5, atol=2e-6)
    assert not np.allclose(want[-1], 0)


def test_aircomp_fedavg_matches_its_round_with_truncation_and_receiver_noise(monkeypatch):
    p = {"lr": 0.1, "local_steps": 3, "server_lr": 1.0, "average": "uniform"}
    rounds = 8
    sc, world, thetas, inside, (_, rho0) = _silencing_run(
        monkeypatch, {"name": "aircomp-fedavg", **p}, rounds)
    prob = world.evaluator
    a, c = prob.a_np, prob.c_np
    x = np.zeros(c.shape[1])
    want = [x.copy()]
    noise = keyed_rng(sc.seed, "fading")
    for k in range(rounds):
        deltas = []
        for i in np.flatnonzero(inside):
            w = x.copy()
            for _ in range(p["local_steps"]):
                w = w - p["lr"] * (a[i] @ w - c[i])
            deltas.append(w - x)
        deltas = np.array(deltas, dtype=np.float32).astype(np.float64)
        amplitude = np.sqrt((deltas**2).mean(1)).max()
        z = noise.standard_normal(c.shape[1])
        x = x + p["server_lr"] * (deltas.sum(0) + amplitude * z / np.sqrt(rho0)) / inside.sum()
        want.append(x.copy())
    for got, expected in zip(thetas, want, strict=True):
        np.testing.assert_allclose(got.double().numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["1p-zofl", "aircomp-fedsgd"])
def test_both_engines_give_the_same_analog_run(name):
    """An analog phase is synchronous: the process engine (one SimPy process per device) and
    the vectorized one give the same rows, Rayleigh fading and truncation included."""
    rows = {}
    for engine in ("vectorized", "processes"):
        sc = small_quadratic({"name": name, "rounds": 6, "eval_every": 2},
                             overrides=["channel=seed002-cell", f"engine.mode={engine}"])
        rows[engine] = pd.DataFrame(run_algorithm(build_world(sc), sc.algorithms[0]).rows)
    pd.testing.assert_frame_equal(rows["vectorized"], rows["processes"])
    assert rows["processes"].energy_uplink_j.iloc[-1] > 0


def test_an_interior_radius_that_holds_no_device_is_warned_before_the_run():
    """Cell-interior scheduling inside the nearest device: nobody would transmit, so the
    analog methods could never move; the runner's warning names the radius, the nearest device
    and the fix. Without analog methods, or with a radius that holds a device, no warning."""
    sc = small_quadratic({"name": "1p-zofl"}, overrides=[
        "channel=seed002-cell", "channel.uplink.analog={interior_radius_m: 5}"])
    world = build_world(sc)
    nearest = float(world.cell.distances_m.min())
    assert nearest > 5  # min_distance_m is 10 m
    line = silent_analog_warning(world)
    assert "interior_radius_m = 5 m schedules none of the 5 devices" in line
    assert f"raise interior_radius_m above {nearest:.4g} m" in line
    wide = small_quadratic({"name": "1p-zofl"}, overrides=[
        "channel=seed002-cell", f"channel.uplink.analog={{interior_radius_m: {nearest}}}"])
    assert silent_analog_warning(build_world(wide)) is None
    digital = small_quadratic({"name": "dzofl"}, overrides=[
        "channel=seed002-cell", "channel.uplink.analog={interior_radius_m: 5}"])
    assert silent_analog_warning(build_world(digital)) is None


def test_an_analog_device_draws_its_profiles_rule_at_the_power_its_control_chose():
    """pa_efficiency 0.5, a 0.1 W transmitter circuit and a 0.05 W channel circuit: one device
    alone at 250 m without fading transmits rf = P_max / E1(0.1) (truncated inversion at its own,
    the weakest, gain) and draws rf / 0.5 + 0.1 + 0.05 W for the 0.5 ms of 1,000 values; the
    packet uplink's rule (energy/device.py) at the analog power."""
    overrides = ["channel.fading=none", "energy.pa_efficiency=0.5",
                 "energy.tx_circuit_power_w=0.1", "channel.uplink.circuit_power_w=0.05"]
    env, net, _ = _network([250.0], overrides)
    _phases(env, net, torch.ones(1, 1000), 1)
    rf = 0.19952623149688797 / 1.8229239584193906
    assert net.ledger.energy_j[0, UPLINK] == pytest.approx(0.5e-3 * (rf / 0.5 + 0.15), rel=1e-9)


@pytest.mark.parametrize("per_device", [False, True])
def test_a_mask_and_indices_ask_the_same_rows(per_device):
    """The values' rows are the asked devices' in increasing order, whether they are asked by
    an [N] mask or by indices, in both stream modes: the same received sum and transmitters."""
    distances = np.linspace(50.0, 450.0, 8)
    chosen = np.array([1, 4, 6])
    values = torch.arange(3 * 5, dtype=torch.float64).reshape(3, 5)
    got = []
    for asked in (chosen, np.isin(np.arange(8), chosen)):
        env, net, _ = _network(distances, ["channel.fading=none"], per_device=per_device)
        out = []

        def run(net=net, asked=asked, out=out):
            out.append((yield from net.superpose(Cost(), Payload.analog(5), values, asked,
                                                 "large-scale-inversion")))

        env.process(run())
        env.run()
        got.append(out[0])
    np.testing.assert_array_equal(got[0].received.numpy(), got[1].received.numpy())
    assert got[0].count == got[1].count == 3
