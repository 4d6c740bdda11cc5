"""Every registered algorithm, the same checks (scikit-learn's estimator-suite idea): determinism,
declared payloads equal the ledger's bits, energies add up, lost packets change nothing, clean
parameter errors. A new algorithm gets these by registering."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.conftest import algorithm_scenario, small_scenario
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.errors import UserError
from wirelessfl.plugins import ALGORITHMS

REGISTRY = ALGORITHMS.load_builtins()
NAMES = sorted(REGISTRY)
ROUNDS = 4


# fedmsa with every client running the local steps, so that each device's traffic is the
# declared per-device payload.
EXTRA = {"fedmsa": {"local_clients": 8}}


def _scenario(name, *overrides):
    algorithm = {"name": name, "rounds": ROUNDS, "eval_every": 1, **EXTRA.get(name, {})}
    # a base station with data of its own (seed 000), which only ZO-HFL reads
    return algorithm_scenario(algorithm, ["data.server_fraction=0.3", *overrides])


def _run(sc):
    world = build_world(sc)
    return world, run_algorithm(world, sc.algorithms[0])


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_results(name):
    a = pd.DataFrame(_run(_scenario(name))[1].rows)
    b = pd.DataFrame(_run(_scenario(name))[1].rows)
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bits", [16, 4])
def test_ledger_bits_equal_declared_payloads(name, bits):
    sc = _scenario(name, "channel=seed002-pinned", "channel.uplink.delivery_probability=1.0",
                   f"quantization_bits={bits}")
    world, run = _run(sc)
    n = world.num_devices
    cls = REGISTRY[name]
    d = world.evaluator.d
    blocks = {"blocks": world.evaluator.blocks} if name == "fednest" else {}
    up, down = cls.declared_payloads(d, bits, participants=n, **blocks)
    first = cls.initial_payloads(d, bits)
    up0, down0, packets0 = (first[0].bits, first[1].bits, 1) if first else (0, 0, 0)
    assert run.ledger.bits_up.tolist() == [up.bits * ROUNDS + up0] * n
    assert run.ledger.bits_down.tolist() == [down.bits * ROUNDS + down0] * n
    assert run.ledger.packets_delivered.tolist() == [cls.uploads_per_round * ROUNDS + packets0] * n
    assert run.ledger.exchanges == cls.uploads_per_round * ROUNDS + packets0


@pytest.mark.parametrize("name", NAMES)
def test_energies_non_negative_and_add_up(name):
    sc = _scenario(name)
    _, run = _run(sc)
    rows = pd.DataFrame(run.rows)
    assert (run.ledger.energy_j >= 0).all()
    np.testing.assert_allclose(rows.energy_j, rows.energy_compute_j + rows.energy_uplink_j
                               + rows.energy_downlink_j, rtol=1e-12)
    np.testing.assert_allclose(rows.energy_compute_j, rows.energy_compute_forward_j
                               + rows.energy_compute_backward_j, rtol=1e-12)
    assert (np.diff(rows.energy_j) > 0).all() and (np.diff(rows.sim_time_s) > 0).all()
    assert rows.energy_j.iloc[-1] == pytest.approx(run.ledger.energy_j.sum(), rel=1e-12)
    # the base station is on air every round (its transmit power x its airtime), kept beside
    # the devices' energy: system = devices + base station
    np.testing.assert_allclose(rows.energy_system_j, rows.energy_j + rows.energy_bs_j,
                               rtol=1e-15)
    assert (np.diff(rows.energy_bs_j) > 0).all() and (np.diff(rows.bs_airtime_s) > 0).all()
    draw_w = 10 ** ((sc.channel.downlink.tx_power_dbm - 30) / 10) + \
        sc.channel.downlink.circuit_power_w
    np.testing.assert_allclose(rows.energy_bs_j, draw_w * rows.bs_airtime_s, rtol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_lost_packets_never_reach_the_model(name):
    """With every upload lost, nothing the devices hold may reach the global model: it stays
    theta_0 (or, for a method whose base station learns from its own data, its trajectory does
    not depend on how the devices' data is split), while energy is still spent."""
    lost = ["channel=seed002-pinned", "channel.uplink.delivery_probability=1e-12"]
    _, run = _run(_scenario(name, *lost))
    rows = pd.DataFrame(run.rows)
    assert run.ledger.packets_delivered.sum() == 0
    assert rows.energy_uplink_j.iloc[-1] > 0
    if not REGISTRY[name].server_learns:
        assert rows.test_loss.nunique() == 1 and rows.test_accuracy.nunique(dropna=False) == 1
    _, other = _run(_scenario(name, *lost, "partition={scheme: dirichlet, alpha: 0.1}"))
    pd.testing.assert_series_equal(rows.test_loss, pd.DataFrame(other.rows).test_loss)


@pytest.mark.parametrize("name", NAMES)
def test_bad_parameters_give_a_clean_error(name):
    with pytest.raises(UserError, match=r"algorithms\[0\]\.rounds: Input should be greater than 0"):
        small_scenario(algorithms=[{"name": name, "rounds": 0}])
    with pytest.raises(UserError, match=r"algorithms\[0\]\.no_such_parameter: unknown key"):
        small_scenario(algorithms=[{"name": name, "no_such_parameter": 1}])
