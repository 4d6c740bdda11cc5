"""Scenario loading: catalog resolution, inline and --set overrides, clean errors."""

from __future__ import annotations

import pytest

from tests.conftest import small_doc, small_scenario
from wirelessfl.errors import UserError
from wirelessfl.scenario import catalog
from wirelessfl.scenario.loader import apply_override, load_scenario, scenario_from_document


def test_every_shipped_scenario_validates():
    from wirelessfl.scenario.loader import is_sweep_document, is_tune_document
    from wirelessfl.sweep.spec import load_sweep
    from wirelessfl.tune.spec import load_tune
    from wirelessfl.tune.study import tuning_plan

    names = list(catalog.entries("scenarios"))
    assert {"quickstart", "seed002-digits28", "seed002-fashionmnist", "sweep-power",
            "quickstart-tune", "seed002-tune"} <= set(names)
    for name in names:
        doc = catalog.read_yaml(catalog.entries("scenarios")[name], "scenario")
        if is_sweep_document(doc):
            assert load_sweep(name).points  # every point's scenario validates
            continue
        if is_tune_document(doc):
            assert tuning_plan(load_tune(name))  # every configuration's scenario validates
            continue
        scenario = load_scenario(name)
        assert scenario.algorithms


def test_profile_by_name_is_resolved_from_the_catalog():
    sc = small_scenario()
    assert sc.channel.name == "seed002-cell"
    assert sc.channel.uplink.tx_power_dbm == 23  # seed 002 default (3GPP power class 3)
    assert sc.energy.mac_energy_j == pytest.approx(3.7e-12)


def test_inline_fields_override_the_profile_deeply():
    sc = small_scenario(channel={"profile": "seed002-cell", "uplink": {"tx_power_dbm": 10}})
    assert sc.channel.uplink.tx_power_dbm == 10
    # fields not overridden keep the profile's values
    assert sc.channel.uplink.bandwidth_hz == 2e6
    assert sc.channel.cell_radius_m == 500


def test_set_opens_a_profile_given_by_name():
    sc = small_scenario(["channel.uplink.tx_power_dbm=5", "energy.rx_power_w=0.25"])
    assert sc.channel.uplink.tx_power_dbm == 5
    assert sc.energy.rx_power_w == 0.25
    assert sc.channel.name == "seed002-cell"


def test_set_addresses_algorithms_by_index_or_name():
    sc = small_scenario(["algorithms.0.rounds=7", "algorithms.fedavg.local_steps=9",
                         "quantization_bits=8"])
    assert sc.algorithms[0].rounds == 7
    assert sc.algorithms[2].local_steps == 9
    assert all(a.bits == 8 for a in sc.algorithms)  # the scenario's M reaches every algorithm


def test_set_addresses_a_label_holding_an_equals_sign():
    """Shipped labels such as "ZO-HFL (tau=5)" hold "=": the key ends at the first "=" outside
    parentheses; the value may hold "=" too."""
    sc = load_scenario("seed000-fig2-digits", ["algorithms.ZO-HFL (tau=20).gamma0=0.25"])
    assert [a.gamma0 for a in sc.algorithms] == [2.0, 0.25, 2.0]
    doc = small_doc()
    apply_override(doc, "algorithms.0.label=a=b")
    assert doc["algorithms"][0]["label"] == "a=b"
    with pytest.raises(UserError, match="no entry named 'ZO-HFL \\(tau=7\\)'"):
        load_scenario("seed000-fig2-digits", ["algorithms.ZO-HFL (tau=7).gamma0=1"])


def test_set_errors_are_clean():
    doc = small_doc()
    with pytest.raises(UserError, match="out of range"):
        apply_override(doc, "algorithms.9.rounds=1")
    with pytest.raises(UserError, match="no entry named 'fedprox'"):
        apply_override(doc, "algorithms.fedprox.rounds=1")
    with pytest.raises(UserError, match="key.path=value"):
        apply_override(doc, "rounds")


@pytest.mark.parametrize(
    ("changes", "overrides", "expected"),
    [
        ({}, ["algorithms.0.name=dzfl"], "algorithms[0].name: unknown algorithm 'dzfl'; did you mean 'dzofl'"),
        ({"channel": "seed002-cel"}, [], "channel.profile: unknown channel profile 'seed002-cel'; did you mean 'seed002-cell'"),
        ({}, ["algorithms.1.rounds=many"], "algorithms[1].rounds: Input should be a valid integer"),
        ({}, ["energy.rx_power_w=-1"], "energy.rx_power_w: Input should be greater than or equal to 0"),
        ({}, ["algorithms.0.alpha0=-2"], "algorithms[0].alpha0: Input should be greater than 0"),
        ({}, ["population.num_devices=0"], "population.num_devices: Input should be greater than 0"),
        ({}, ["model.name=resnet"], "model.name: unknown model 'resnet'"),
        ({}, ["colour=blue"], "colour: unknown key"),
        ({}, ["algorithms.0.v1=0.9"], "algorithms[0]: v1=0.9, v2=0.26 break seed 002's conditions"),
    ],
)
def test_bad_values_name_the_key_path(changes, overrides, expected):
    with pytest.raises(UserError) as info:
        small_scenario(overrides, **changes)
    assert expected in str(info.value)
    # a bad --set is the command line's mistake, named first, not the file's
    assert str(info.value).startswith(f"--set {overrides[0]}: " if overrides else "small.yaml: ")


def test_duplicate_labels_are_rejected():
    algos = [{"name": "dzofl"}, {"name": "dzofl", "alpha0": 1.0}]
    with pytest.raises(UserError, match="give each a distinct 'label'"):
        small_scenario(algorithms=algos)


def test_not_a_mapping():
    with pytest.raises(UserError, match="a scenario must be a mapping"):
        scenario_from_document(["x"], "list.yaml")


def test_yaml_syntax_error_gives_line_and_column(scenario_file):
    path = scenario_file("name: x\nalgorithms: [dzofl\n")
    with pytest.raises(UserError, match=r"line \d+, column \d+: invalid YAML"):
        load_scenario(str(path))


def test_unsafe_yaml_tags_are_never_executed(scenario_file):
    path = scenario_file("name: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(UserError, match="invalid YAML"):
        load_scenario(str(path))


def test_profile_file_relative_to_the_scenario(scenario_file, tmp_path):
    (tmp_path / "mycell.yaml").write_text("cell_radius_m: 250\n")
    doc = small_doc(channel={"profile": "mycell.yaml"})
    path = scenario_file(doc)
    sc = load_scenario(str(path))
    assert sc.channel.cell_radius_m == 250
