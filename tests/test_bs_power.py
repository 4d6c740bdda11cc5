"""The base station's power models (channel.downlink.bs_power_model, docs/energy.md).

transmit-only (the default): energy_bs_j = (transmit + circuit power) x airtime, as every run
recorded before. earth: EARTH's load-dependent model (Auer et al., "How much energy is needed to
run a wireless network?", IEEE Wireless Communications 18(5), 2011, Table 2 / eq. (1)), macro
values N_TRX = 6, P_max = 20 W, P_0 = 130 W, Delta_p = 4.7, P_sleep = 75 W:
N_TRX (P_0 + Delta_p P_out) x airtime + N_TRX P_sleep x (sim_time_s - airtime).
"""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import small_doc, small_scenario
from wirelessfl import cli
from wirelessfl.errors import UserError
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.runner import run_to_record
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.plugins import ALGORITHMS
from wirelessfl.testing import check_energy_accounting

# The pinned channel (no fading), the downlink at 43 dBm = 19.95 W, under EARTH's P_max = 20 W.
PINNED = ["channel=seed002-pinned", "channel.downlink.tx_power_dbm=43"]
EARTH = [*PINNED, "channel.downlink.bs_power_model=earth"]
N_TRX, P_MAX, P_0, DELTA_P, P_SLEEP = 6, 20.0, 130.0, 4.7, 75.0
P_OUT = 10 ** ((43 - 30) / 10)  # [W]


def _rows(overrides, mode="vectorized"):
    sc = small_scenario([*overrides, f"engine.mode={mode}"])
    status, _, record = run_to_record(sc, None, warn=lambda text: None)
    assert status == "complete"
    return sc, record


def test_earth_constants_are_the_macro_base_station_of_auer_2011():
    earth = small_scenario(EARTH).channel.downlink.earth
    assert (earth.n_trx, earth.p_max_w, earth.p0_w, earth.delta_p, earth.p_sleep_w) \
        == (N_TRX, P_MAX, P_0, DELTA_P, P_SLEEP)
    # by hand: 6 (130 + 4.7 x 19.953) = 1342.66 W on air, 6 x 75 = 450 W asleep
    world = build_world(small_scenario(EARTH))
    assert world.downlink().draw_w == pytest.approx(1342.66, abs=5e-3)
    assert world.downlink().sleep_w == 450.0


@pytest.mark.parametrize("mode", ["vectorized", "processes"])
def test_earth_energy_at_every_row_is_on_air_plus_sleep(mode):
    _, record = _rows(EARTH, mode)
    rows = record.rounds
    later = rows[rows["round"] > 0]
    assert len(later) > 3 and (later.sim_time_s > later.bs_airtime_s).all()
    assert (rows[rows["round"] == 0].energy_bs_j == 0).all()  # nothing before the first round
    want = N_TRX * (P_0 + DELTA_P * P_OUT) * rows.bs_airtime_s \
        + N_TRX * P_SLEEP * (rows.sim_time_s - rows.bs_airtime_s)
    pd.testing.assert_series_equal(rows.energy_bs_j, want, check_names=False, rtol=1e-12)
    assert (rows.energy_system_j == rows.energy_j + rows.energy_bs_j).all()
    # the devices' energy does not depend on the base station's model
    _, default = _rows(PINNED, mode)
    pd.testing.assert_series_equal(rows.energy_j, default.rounds.energy_j)
    pd.testing.assert_series_equal(rows.bs_airtime_s, default.rounds.bs_airtime_s)


def test_earth_is_recorded_in_the_manifest():
    _, record = _rows(EARTH)
    manifest = record.manifest
    assert manifest["scenario"]["channel"]["downlink"]["bs_power_model"] == "earth"
    assert manifest["scenario"]["channel"]["downlink"]["earth"] == {
        "n_trx": N_TRX, "p_max_w": P_MAX, "p0_w": P_0, "delta_p": DELTA_P,
        "p_sleep_w": P_SLEEP}
    station = manifest["base_station"]
    assert station["power_model"] == "earth"
    assert station["earth"]["p_sleep_w"] == P_SLEEP
    assert station["on_air_w"] == pytest.approx(N_TRX * (P_0 + DELTA_P * P_OUT), rel=1e-12)
    assert station["sleep_w"] == N_TRX * P_SLEEP


def test_the_energy_figures_name_the_base_stations_model():
    """The per-round and breakdown figures label the base station's band by its model: its
    transmit energy, or under EARTH its draw on air and asleep (the manifest says which)."""
    from wirelessfl.report import plots

    _, earth = _rows(EARTH)
    _, default = _rows(PINNED)
    label = dict(plots.energy_kinds(earth.rounds, earth.manifest))["energy_bs_j"]
    assert label == "base station (EARTH: on air and asleep)"
    assert dict(plots.energy_kinds(default.rounds, default.manifest))["energy_bs_j"] \
        == "base station (transmit)"
    fig = plots.energy_per_round(earth)
    labels = {p.get_label() for ax in fig.axes for p in ax.patches}
    assert "base station (EARTH: on air and asleep)" in labels


def test_the_default_stays_transmit_only_and_keeps_the_fingerprint():
    sc, record = _rows(PINNED)
    down = sc.channel.downlink
    assert down.bs_power_model == "transmit-only" and down.earth is None
    rows = record.rounds
    draw = P_OUT + down.circuit_power_w
    pd.testing.assert_series_equal(rows.energy_bs_j, draw * rows.bs_airtime_s,
                                   check_names=False, rtol=1e-12)
    # the default is left out of the resolved document: scenarios written before the models
    # existed keep their fingerprint (and resume)
    doc = record.manifest["scenario"]["channel"]["downlink"]
    assert "bs_power_model" not in doc and "earth" not in doc
    assert record.manifest["base_station"] == {
        "power_model": "transmit-only", "tx_power_w": P_OUT, "circuit_power_w": 0.0,
        "on_air_w": P_OUT, "sleep_w": 0.0}


def test_the_conformance_check_holds_under_both_models():
    fedavg = ALGORITHMS.load_builtins()["fedavg"]
    check_energy_accounting(fedavg)  # the default scenario: transmit-only
    doc = small_doc(channel={"profile": "seed002-pinned",
                             "downlink": {"tx_power_dbm": 43, "bs_power_model": "earth"}})
    doc.pop("algorithms")
    check_energy_accounting(fedavg, scenario=doc)


def test_earth_energy_grows_with_the_simulated_time_at_the_same_airtime():
    """FedAvg with ten times the local steps: the same broadcasts (the same airtime), longer
    rounds. Transmit-only charges both the same; EARTH charges the longer run more (its sleep
    draw), so a method of many short rounds can pay more than one of few long rounds there."""
    def fedavg(model, local_steps):
        sc = small_scenario([*PINNED, f"channel.downlink.bs_power_model={model}",
                             f"algorithms.fedavg.local_steps={local_steps}"])
        return pd.DataFrame(run_algorithm(build_world(sc), sc.algorithms[2]).rows)

    a, b = fedavg("earth", 1), fedavg("earth", 30)
    pd.testing.assert_series_equal(a.bs_airtime_s, b.bs_airtime_s)
    assert (b.sim_time_s > a.sim_time_s)[1:].all()  # after round 0
    assert (b.energy_bs_j > a.energy_bs_j)[1:].all()
    assert (a.energy_bs_j.diff().dropna() > 0).all()
    # under transmit-only the two pay the same
    assert fedavg("transmit-only", 1).energy_bs_j.tolist() \
        == fedavg("transmit-only", 30).energy_bs_j.tolist()


@pytest.mark.parametrize(("overrides", "names"), [
    (["channel.downlink.earth.p0_w=-1"], ["channel.downlink.earth.p0_w", "greater than or equal"]),
    (["channel.downlink.earth.delta_p=-4.7"], ["channel.downlink.earth.delta_p"]),
    (["channel.downlink.earth.p_sleep_w=-75"], ["channel.downlink.earth.p_sleep_w"]),
    (["channel.downlink.earth.p_max_w=-20"], ["channel.downlink.earth.p_max_w", "greater than"]),
    (["channel.downlink.earth.n_trx=0"], ["channel.downlink.earth.n_trx"]),
    (["channel.downlink.tx_power_dbm=46"], ["tx_power_dbm", "earth.p_max_w = 20 W",
                                            "set tx_power_dbm <= 43.01 or raise earth.p_max_w"]),
    (["channel.downlink.earth.p_max_w=10"], ["tx_power_dbm", "earth.p_max_w = 10 W"]),
    (["channel.downlink.circuit_power_w=5"], ["circuit_power_w", "earth.p0_w"]),
])
def test_invalid_earth_settings_are_one_clear_error(overrides, names, tmp_path, capsys):
    with pytest.raises(UserError) as err:
        small_scenario([*EARTH, *overrides])
    for name in names:
        assert name in str(err.value)
    args = [f"--set={o}" for o in [*EARTH, *overrides]]
    assert cli.main(["run", "quickstart", "--out", str(tmp_path / "run"), "--quiet",
                     "--no-report", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and names[0] in lines[0]
    assert not (tmp_path / "run").exists()


def test_earth_constants_without_the_earth_model_are_refused():
    with pytest.raises(UserError, match="'earth' is only read with bs_power_model 'earth'"):
        small_scenario([*PINNED, "channel.downlink.earth.p0_w=100"])
    with pytest.raises(UserError, match="'transmit-only' or 'earth'"):
        small_scenario([*PINNED, "channel.downlink.bs_power_model=earth-macro"])
