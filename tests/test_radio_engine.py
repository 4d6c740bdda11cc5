"""The radio layer inside the engine: shared spectrum, deadlines, ARQ, downlink loss and
correlated fading give the same seconds, joules and deliveries in both engines, and behave as a
wireless engineer expects (fair round-robin, queueing that grows with N, stragglers dropped)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import simpy

from tests.conftest import small_scenario
from wirelessfl.engine.spectrum import SharedSpectrum, schedule_uploads, scheduler_priorities
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm

SHARED = ["channel.uplink.spectrum.mode=shared", "channel.uplink.spectrum.pool_bandwidth_hz=4e6"]
SETTINGS = {
    "shared-round-robin": SHARED + ["channel.uplink.spectrum.channels=2"],
    "shared-proportional-fair": SHARED + ["channel.uplink.spectrum.channels=3",
                                          "channel.uplink.spectrum.scheduler=proportional-fair",
                                          "channel.uplink.mode=adaptive"],
    "tdma-deadline": SHARED + ["channel.uplink.deadline_s=0.01"],
    "arq-mcs-gauss-markov": ["channel=3gpp-uma"],
    "downlink-loss-unicast": ["channel.downlink.loss=true", "channel.downlink.mode=unicast",
                              "channel.downlink.tx_power_dbm=0",
                              "channel.fading.correlation=block",
                              "channel.fading.coherence_time_s=0.05"],
}


def _run(overrides, index):
    sc = small_scenario(overrides)
    world = build_world(sc)
    return world, run_algorithm(world, sc.algorithms[index])


@pytest.mark.parametrize("index", [0, 1, 2])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_engines_agree_under_radio_settings(setting, index):
    _, vec = _run(SETTINGS[setting] + ["engine.mode=vectorized"], index)
    _, proc = _run(SETTINGS[setting] + ["engine.mode=processes"], index)
    a, b = pd.DataFrame(vec.rows), pd.DataFrame(proc.rows)
    np.testing.assert_allclose(a.sim_time_s, b.sim_time_s, rtol=1e-12, atol=0)
    np.testing.assert_allclose(a.queue_wait_s, b.queue_wait_s, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(vec.ledger.energy_j, proc.ledger.energy_j, rtol=1e-9, atol=1e-15)
    station = ["energy_bs_j", "bs_airtime_s", "energy_system_j"]
    np.testing.assert_allclose(a[station], b[station], rtol=1e-12, atol=0)
    cols = ["transmissions", "late_uploads", "broadcasts_missed", "delivered_fraction",
            "bits_up", "bits_down", "test_accuracy", "test_loss"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    np.testing.assert_array_equal(vec.ledger.packets_delivered, proc.ledger.packets_delivered)


def test_settings_exercise_what_they_name():
    rows = {s: pd.DataFrame(_run(SETTINGS[s], 1)[1].rows).iloc[-1] for s in SETTINGS}
    assert rows["shared-round-robin"].queue_wait_s > 0
    assert rows["tdma-deadline"].late_uploads > 0
    assert rows["arq-mcs-gauss-markov"].transmissions > rows["arq-mcs-gauss-markov"].bits_up / 1e12
    assert rows["downlink-loss-unicast"].broadcasts_missed > 0


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_list_scheduler_equals_the_simpy_pool(channels):
    """Random ready times (with ties), durations and priorities: the heap schedule is exactly
    what devices queueing on the SimPy component get."""
    rng = np.random.default_rng(channels)
    n = 23
    ready = np.round(rng.uniform(0, 2, n), 1)  # many ties
    hold = rng.uniform(0.1, 1.0, n)
    priority = scheduler_priorities("proportional-fair", 5, rng.uniform(1, 5, n), np.ones(n))
    active = rng.random(n) < 0.9
    expected = schedule_uploads(ready, hold, priority, channels, active)

    env = simpy.Environment()
    pool = SharedSpectrum(env, channels)
    granted_at = ready.copy()

    def device(i):
        yield env.timeout(ready[i])
        granted_at[i] = yield pool.request(i, priority[i])
        yield env.timeout(hold[i])
        pool.release()

    for i in np.flatnonzero(active):
        env.process(device(i))
    env.run()
    np.testing.assert_array_equal(granted_at, expected)
    # never more than `channels` uploads on air at once
    starts, ends = expected[active], (expected + hold)[active]
    for t in starts:
        assert ((starts <= t) & (ends > t)).sum() <= channels


def _jain(x):
    x = np.asarray(x, float)
    return x.sum() ** 2 / (len(x) * (x ** 2).sum())


def test_round_robin_is_fair_over_a_long_run_and_not_within_one_phase():
    """Equal mean SNR (equal distances, no fading), TDMA pool: per-device upload throughput
    (bits / time from ready to delivered, waiting included) has Jain index > 0.99 over 40 rounds
    (5 full rotations of 8 devices), while one phase alone is far from fair."""
    base = SHARED + ["population.distances_m=[200,200,200,200,200,200,200,200]",
                     "channel.fading=none"]
    long_run = _run(base + ["algorithms.fedsgd.rounds=40", "algorithms.fedsgd.eval_every=40"],
                    1)[1]
    led = long_run.ledger
    throughput = led.bits_up / (led.busy_s[:, 2] + led.queue_wait_s)
    assert _jain(throughput) > 0.99
    one = _run(base + ["algorithms.fedsgd.rounds=1", "algorithms.fedsgd.eval_every=1"], 1)[1]
    assert _jain(one.ledger.bits_up / (one.ledger.busy_s[:, 2] + one.ledger.queue_wait_s)) < 0.9


def test_a_loaded_pool_makes_upload_time_grow_with_the_number_of_devices():
    """TDMA: one FedSGD round takes about N uploads back to back; dedicated bands do not grow."""
    times = {}
    for mode in ("dedicated", "shared"):
        for n in (4, 8, 16):
            extra = SHARED if mode == "shared" else []
            run = _run(extra + [f"population.num_devices={n}", "channel.fading=none",
                                "algorithms.fedsgd.rounds=1", "algorithms.fedsgd.eval_every=1"],
                       1)[1]
            times[mode, n] = pd.DataFrame(run.rows).iloc[-1].sim_time_s
    assert times["shared", 16] > 1.8 * times["shared", 8] > 3.2 * times["shared", 4] / 2
    assert times["dedicated", 16] < 1.2 * times["dedicated", 4]


def test_deadline_drops_stragglers_and_bounds_the_round():
    deadline = 0.01
    world, run = _run(SETTINGS["tdma-deadline"] + ["algorithms.fedsgd.rounds=3",
                                                   "algorithms.fedsgd.eval_every=1"], 1)
    rows = pd.DataFrame(run.rows)
    led = run.ledger
    assert led.late_uploads.sum() > 0
    # a late upload is never delivered: delivered + late <= sent
    assert (led.packets_delivered + led.late_uploads <= led.packets_sent).all()
    # each round lasts at most the deadline plus its broadcast
    dl = world.downlink().broadcast(world.flat.d * 16 + 32)
    assert (np.diff(rows.sim_time_s) <= deadline + dl + 1e-9).all()


def test_devices_that_miss_a_broadcast_sit_out_until_resynced():
    _, run = _run(SETTINGS["downlink-loss-unicast"] + ["population.num_devices=8"], 2)
    led = run.ledger
    rounds = run.params.rounds
    assert led.broadcasts_missed.sum() > 0
    assert led.packets_sent.sum() < rounds * 8  # stale devices did not upload
    assert np.isfinite(pd.DataFrame(run.rows).test_loss).all()
