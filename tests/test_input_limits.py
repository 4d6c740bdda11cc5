"""What no input may carry, checked over every model and field (so a field added later is
covered without touching these tests): NaN and inf, floats beyond float32, booleans taken as
numbers; and the YAML reader's limits (duplicate keys, alias bombs, depth), names and labels,
and the cheap pre-run checks of pipeline/preflight.py against the conditions the run meets later."""

from __future__ import annotations

import math
import time
import types
import typing

import pytest
from pydantic import BaseModel, ValidationError

from tests.conftest import small_doc, small_scenario
from wirelessfl.energy.profile import EnergyProfile
from wirelessfl.errors import UserError
from wirelessfl.pipeline import preflight as checks
from wirelessfl.plugins import ALGORITHMS
from wirelessfl.scenario import catalog, names, safe_yaml
from wirelessfl.scenario.loader import (
    FLOAT32_MAX,
    apply_override,
    check_values,
    load_scenario,
    scenario_from_document,
)
from wirelessfl.scenario.schema import Scenario
from wirelessfl.sweep.spec import SweepFile
from wirelessfl.tune.claims import Claim
from wirelessfl.tune.reproduce import ReproductionFile
from wirelessfl.tune.spec import Range, TuneFile


def _models_in(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def every_model() -> list[type[BaseModel]]:
    """Every pydantic model a user's file reaches: the scenario's tree, every algorithm's
    parameters, every energy compute model, the sweep, tune and reproduction files."""
    REGISTRY = ALGORITHMS.load_builtins()
    roots = [Scenario, SweepFile, TuneFile, Range, Claim, ReproductionFile,
             *(cls.Params for cls in REGISTRY.values()),
             *EnergyProfile._compute_classes.values()]
    found, stack = [], list(roots)
    while stack:
        model = stack.pop()
        if model in found:
            continue
        found.append(model)
        for info in model.model_fields.values():
            stack.extend(_models_in(info.annotation))
    return found


def _holds_float(annotation) -> bool:
    if annotation is float:
        return True
    return any(_holds_float(arg) for arg in typing.get_args(annotation))


def _is_list(annotation) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_is_list(a) for a in typing.get_args(annotation))
    return False


def float_fields() -> list[tuple[type[BaseModel], str, bool]]:
    out = [(model, name, _is_list(info.annotation))
           for model in every_model() for name, info in model.model_fields.items()
           if _holds_float(info.annotation)]
    assert len(out) >= 40  # the issue counted about 40 float fields: the walk finds them
    return out


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "nan", "inf"])
def test_every_float_field_of_every_model_refuses_nan_and_inf(bad):
    for model, field, is_list in float_fields():
        with pytest.raises(ValidationError) as err:
            model.model_validate({field: [bad, bad] if is_list else bad})
        assert any(e["loc"][:1] == (field,) and e["type"] == "finite_number"
                   for e in err.value.errors()), (model.__name__, field, str(err.value)[:300])


def test_every_float_field_refuses_values_beyond_float32():
    for model, field, is_list in float_fields():
        instance = model.model_construct(**{field: [1e300] if is_list else 1e300})
        with pytest.raises(UserError, match=rf"{field}.*beyond float32"):
            check_values({}, instance, "x.yaml")
    assert FLOAT32_MAX == pytest.approx(3.4028234663852886e38)


@pytest.mark.parametrize("override, fragment", [
    ("population.num_devices=true", "expects a number, got the YAML boolean true"),
    ("population.num_devices=1e9", "write 1000000000"),
    ("model.hidden=[true]", "model.hidden[0]: expects a number"),
    ("algorithms.0.alpha0=1e300", "algorithms[0].alpha0: 1e+300 is beyond float32"),
    ("engine.max_chunk_mb=.inf", "engine.max_chunk_mb: Input should be a finite number"),
    ("algorithms.1.lr=1e39", "algorithms[1].lr: 1e+39 is beyond float32"),
    ("seed=" + "9" * 30, "an integer of 30 digits"),
])
def test_lax_numbers_are_refused_with_the_key(override, fragment):
    with pytest.raises(UserError, match=None) as err:
        small_scenario([override])
    assert fragment in str(err.value)


def test_an_integer_written_as_an_exponent_in_a_file_gets_the_digits(scenario_file):
    path = scenario_file(small_doc(population={"num_devices": "1e9"}))
    with pytest.raises(UserError, match=r"population.num_devices: .*write 1000000000"):
        load_scenario(str(path))


# ---- the YAML reader ----------------------------------------------------------------------------
BOMB = "scenario: quickstart\na: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n" for a, b in zip("abcdefg", "bcdefgh")) \
    + "grid: {x: *h}\n"


@pytest.mark.parametrize("what", ["sweep file", "scenario", "tune file"])
def test_an_alias_bomb_is_refused_while_parsing(tmp_path, what):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    assert len(BOMB) < 600  # 10^8 values once expanded
    start = time.perf_counter()
    with pytest.raises(UserError, match=r"more than 1,000,000 values once its aliases"):
        catalog.read_yaml(path, what)
    assert time.perf_counter() - start < 1.0


def test_duplicate_keys_are_refused_naming_the_key_and_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("name: x\nchannel: seed002-cell\npopulation:\n  num_devices: 5\n"
                    "  num_devices: 6\n")
    with pytest.raises(UserError, match=r"line 5, column 3: .*duplicate key 'num_devices'"):
        catalog.read_yaml(path, "scenario")
    # merge keys may be overridden: that is YAML's rule, not a duplicate
    path.write_text("base: &b {rounds: 3}\nalgorithm: {<<: *b, rounds: 5}\n")
    assert catalog.read_yaml(path, "scenario")["algorithm"] == {"rounds": 5}


def test_depth_and_self_reference_are_refused_while_parsing(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(UserError, match="nested more than 32 levels"):
        catalog.read_yaml(path, "scenario")
    path.write_text("a: &a [1, *a]\n")
    with pytest.raises(UserError, match="refers to a node that contains it"):
        catalog.read_yaml(path, "scenario")
    assert safe_yaml.load("a: [[1]]") == {"a": [[1]]}


def test_a_deep_set_value_is_one_error():
    doc = small_doc()
    with pytest.raises(UserError, match=r"--set x: .*nested more than 32 levels"):
        apply_override(doc, "x=" + "[" * 5000 + "]" * 5000)
    with pytest.raises(UserError, match="NUL byte"):
        apply_override(doc, "name=a\0b")


# ---- names and labels ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["/abs/path", "../../x", "a/b", "a..b", "", " x", "x" * 101,
                                  "a\0b", "-x"])
def test_unsafe_names_are_refused(name):
    assert names.name_problem(name) is not None


@pytest.mark.parametrize("name", ["quickstart", "seed002-digits28", "a.b_c+d", "X" * 100])
def test_safe_names_pass(name):
    assert names.name_problem(name) is None


def test_a_name_from_an_unsafe_file_stem_is_made_safe():
    assert names.safe_name("my scenario (v2)") == "my-scenario--v2-"
    assert names.safe_name("..") == "scenario"


@pytest.mark.parametrize("changes, fragment", [
    ({"name": "../../x"}, "cannot name a folder"),
    ({"name": "/abs/path"}, "cannot name a folder"),
    ({"description": "a\0b"}, "description: the text holds the control character '\\x00'"),
    ({"algorithms": [{"name": "dzofl", "label": "a\x1b[31mred"}]}, "algorithms[0].label"),
    ({"algorithms": [{"name": "dzofl", "label": "x" * 101}]}, "at most 100"),
])
def test_names_and_labels_are_refused_at_input(changes, fragment):
    with pytest.raises(UserError) as err:
        scenario_from_document(small_doc(**changes), "s.yaml")
    assert fragment in str(err.value)


# ---- pre-run checks -----------------------------------------------------------------------------
SMALL_N = 8  # population of the small scenario (tests/conftest.py)


@pytest.mark.parametrize("changes, fragment", [
    ({"algorithms": [{"name": "fedmsa"}]}, "fedmsa needs a multi-sequence problem"),
    ({"algorithms": [{"name": "fednest"}]}, "fednest needs a bilevel problem"),
    ({"algorithms": [{"name": "fgdro-cvar", "k": SMALL_N + 1}]}, f"exceeds the {SMALL_N} devices"),
    ({"algorithms": [{"name": "gd"}]}, "lr defaults to 1/L, but this problem does not know L"),
    ({"algorithms": [{"name": "dane", "lr": 0.1}]}, "lam defaults to delta_A"),
    ({"algorithms": [{"name": "scaffnew", "lr": 0.1}]}, "p defaults to sqrt(mu / L)"),
    ({"algorithms": [{"name": "zo-hfl"}]}, "needs a loss held by the base station"),
    ({"algorithms": [{"name": "fedavg", "server_data": True}]}, "base station"),
    ({"model": {"name": "resnet18-cifar"}}, "model 'resnet18-cifar' needs image inputs"),
    ({"model": {"name": "seed002-cnn"}}, "model 'seed002-cnn' needs image inputs"),
    ({"data": {"name": "mnist", "root": "/nonexistent-folder"}}, "does not exist"),
    ({"data": {"name": "digits", "classes": [3, 12]}}, "label(s) [12]"),
    ({"partition": {"scheme": "label-skew", "classes_per_device": 11}}, "exceeds the 10 classes"),
])
def test_check_runnable_refuses_what_the_run_would_meet_later(changes, fragment):
    scenario = scenario_from_document(small_doc(**changes), "s.yaml")
    with pytest.raises(UserError) as err:
        checks.check_runnable(scenario)
    assert fragment in str(err.value)


def test_a_population_larger_than_the_data_is_runnable():
    """2,000 devices on the 1,347 training samples are no longer refused: each device draws its
    samples with replacement (learning/partition.py, docs/scenarios.md "Large populations")."""
    scenario = scenario_from_document(small_doc(population={"num_devices": 2000}), "s.yaml")
    checks.check_runnable(scenario)


def test_fedred_lr_needs_lam_when_the_scenario_is_read():
    with pytest.raises(UserError, match="with lr set, also set lam"):
        small_scenario(algorithms=[{"name": "fedred", "lr": 0.1}])
    with pytest.raises(UserError, match="lr \\* lam must be at most 1"):
        small_scenario(algorithms=[{"name": "fedred", "lr": 0.5, "lam": 3}])


def test_checkpoints_need_the_vectorized_engine():
    scenario = small_scenario(["engine.mode=processes"])
    with pytest.raises(UserError, match="checkpoints need engine.mode: vectorized"):
        checks.check_runnable(scenario, checkpoint_every=2)
    assert checks.check_runnable(scenario) == []


def test_every_shipped_scenario_is_runnable_and_plausible():
    """No false alarm on what ships (the MNIST-format sets and CIFAR-10 need their files: skipped
    here)."""
    for name, path in catalog.entries("scenarios").items():
        doc = catalog.read_yaml(path, "scenario")
        if "scenario" in doc or doc.get("data", {}).get("name") in ("mnist", "fashionmnist",
                                                                   "cifar10"):
            continue
        assert checks.check_runnable(load_scenario(name)) == [], name


@pytest.mark.parametrize("override, field, unit", [
    ("channel.uplink.bandwidth_hz=2", "channel.uplink.bandwidth_hz = 2 Hz", "e.g. 1e6 for 1 MHz"),
    ("energy.rx_power_w=100000", "energy.rx_power_w = 100000 W", "e.g. 0.1 for 100 mW"),
    ("channel.cell_radius_m=1e6", "channel.cell_radius_m = 1e+06 m", "500"),
    ("energy.battery_j=1e-5", "energy.battery_j = 1e-05 J", "4e4"),
])
def test_implausible_units_warn_naming_field_unit_and_example(override, field, unit):
    warnings = checks.check_runnable(small_scenario([override]))
    assert len(warnings) == 1 and warnings[0].startswith(field) and unit in warnings[0]


@pytest.mark.parametrize("key", ["algorithms.FedAvg.local_steps", "algorithms.2.local_steps"])
def test_local_steps_a_round_are_bounded_as_rounds_are(key, capsys):
    """9007199254740993 local steps were accepted and the run never ended; a million is the
    bound (algorithms/base.py MAX_STEPS_PER_ROUND), one more is one error line naming the key."""
    from wirelessfl import cli
    from wirelessfl.algorithms.base import MAX_STEPS_PER_ROUND

    assert cli.main(["validate", "quickstart", "--set", f"{key}={MAX_STEPS_PER_ROUND}"]) == 0
    capsys.readouterr()
    assert cli.main(["validate", "quickstart", "--set", f"{key}=9007199254740993"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --set {key}=9007199254740993: ")
    assert "local_steps = 9,007,199,254,740,993 is more local steps a round than the 1,000,000" \
        in err[0]


def test_every_steps_count_of_every_algorithm_is_bounded():
    """The rule reads any ``*_steps`` field, so each family's own counts (K, I, E, H caps) are
    bounded without a list to keep."""
    from pydantic import ValidationError

    from wirelessfl.algorithms.base import MAX_STEPS_PER_ROUND
    from wirelessfl.plugins import ALGORITHMS

    checked = 0
    for name, cls in ALGORITHMS.load_builtins().items():
        for key in cls.Params.model_fields:
            if not key.endswith("_steps"):
                continue
            with pytest.raises(ValidationError, match=f"{key} = "):
                cls.Params(name=name, **{key: MAX_STEPS_PER_ROUND + 1})
            checked += 1
    assert checked >= 8
