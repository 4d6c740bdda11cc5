"""Plugins (wirelessfl/plugins.py, docs/plugins.md): parts of every kind defined outside the
package, in a package the test writes into a temporary folder with a ``mypkg-0.1.dist-info``
beside it (what pip would install: importlib.metadata finds its entry points once the folder is
on sys.path), found by entry-point name and by ``module:attribute`` reference alike, by
``validate``, ``run``, ``list``, a local sweep and a Dask sweep.

Each plugin is checked against an independent truth: a plugin that re-implements a built-in
(FedSGD under another name, the logistic model as an nn.Sequential, the digits set loaded by
hand, |h|^2 = 1 fading) must give exactly the built-in's rounds.parquet; a compute plugin
charging constant joules per pass must give passes x constant. Bad plugins are one ``error:``
line naming the key and the plugin.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import cli as _cli
from tests.conftest import small_doc
from tests.conftest import write_yaml as _write
from wirelessfl.plugins import ALGORITHMS, FADING, registries

ROOT = Path(__file__).resolve().parents[1]
FEDSGD = {"name": "fedsgd", "label": "FedSGD", "rounds": 4, "eval_every": 2, "lr": 0.5}
N = 8  # the small scenario's devices

PARTS = '''
import math

import numpy as np
from torch import nn

from wirelessfl.algorithms.fedavg import FedSGD
from wirelessfl.energy.profile import EnergyProfile


class MyFedSGD(FedSGD):
    """FedSGD under another name."""
    name = "my-fedsgd"


def tiny_linear(input_shape, num_classes, bias=True):
    """The logistic model (flatten, one linear layer) as an nn.Sequential."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes, bias=bias))


def digits_copy(seed):
    """scikit-learn's digits in [0, 1], flat, split by wirelessfl (no test set returned)."""
    from sklearn.datasets import load_digits
    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0).reshape(len(bunch.images), -1)
    return x, bunch.target, None, None


digits_copy.facts = lambda: {"input_shape": (64,), "classes": 10, "train_samples": 1797}


class UnitFading:
    """|h|^2 = 1, without touching the generator (what fading 'none' does)."""
    def power(self, n, rng):
        return np.ones(n)

    def cdf(self, x):
        return (np.asarray(x) >= 1.0).astype(float)


class PerPass(EnergyProfile):
    """A constant price per pass."""
    forward_j: float = 1e-3
    backward_j: float = 2e-3

    def pass_costs(self, model, batch, bits):
        return self.forward_j, self.backward_j, 0.0, 0.0
'''

REGISTERED = '''
from wirelessfl.algorithms.fedavg import FedSGD
from wirelessfl.plugins import ALGORITHMS


class RegisteredFedSGD(FedSGD):
    name = "registered-fedsgd"


ALGORITHMS.register(RegisteredFedSGD)
'''

BAD = '''
import numpy as np
from torch import nn

from wirelessfl.energy.profile import EnergyProfile


def not_an_algorithm():
    pass


def model_raises(input_shape, num_classes):
    raise RuntimeError("no weights today")


def model_returns_int(input_shape, num_classes):
    return 3


def dataset_float_labels(seed):
    return np.zeros((20, 3), np.float32), np.linspace(0, 1, 20), None, None


def dataset_raises(seed, path="nowhere"):
    raise FileNotFoundError(path)


class HalfFading:
    def power(self, n, rng):
        return np.full(n, 0.5)


class RaisingFading:
    def power(self, n, rng):
        raise ValueError("cannot draw")


class NegativePrice(EnergyProfile):
    def pass_costs(self, model, batch, bits):
        return -1.0, 0.0, 0.0, 0.0


class NoPrice(EnergyProfile):
    pass
'''

ENTRY_POINTS = '''
[wirelessfl.algorithms]
my-fedsgd = mypkg.parts:MyFedSGD

[wirelessfl.models]
tiny-linear = mypkg.parts:tiny_linear
broken = mypkg.broken:anything

[wirelessfl.datasets]
digits-copy = mypkg.parts:digits_copy

[wirelessfl.fading]
unit = mypkg.parts:UnitFading

[wirelessfl.compute]
per-pass = mypkg.parts:PerPass
'''


@pytest.fixture(scope="module")
def plugin_folder(tmp_path_factory) -> Path:
    """A folder holding the package ``mypkg`` and its dist-info (entry points)."""
    folder = tmp_path_factory.mktemp("site")
    pkg = folder / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "parts.py").write_text(PARTS)
    (pkg / "registered.py").write_text(REGISTERED)
    (pkg / "bad.py").write_text(BAD)
    (pkg / "broken.py").write_text("raise ImportError('a dependency is missing')\n")
    info = folder / "mypkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return folder


def _rescan() -> None:
    for registry in registries().values():
        registry.rescan()


@pytest.fixture
def installed(plugin_folder, monkeypatch):
    """``mypkg`` installed: on sys.path here and on PYTHONPATH for processes started from here
    (sweep workers), entry points read again, and references allowed (the opt-in,
    docs/plugins.md; tests/test_hostile_references.py checks the refusal); everything undone
    afterwards."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(plugin_folder), str(ROOT)]))
    monkeypatch.setenv("WIRELESSFL_ALLOW_REFERENCES", "1")
    sys.path.insert(0, str(plugin_folder))
    _rescan()
    yield plugin_folder
    sys.path.remove(str(plugin_folder))
    ALGORITHMS.unregister("registered-fedsgd")
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]
    _rescan()




def _run(capsys, folder: Path, doc: dict, tag: str) -> pd.DataFrame:
    """``wirelessfl validate`` then ``wirelessfl run`` of ``doc``: its rounds table."""
    path = _write(folder, doc, f"{tag}.yaml")
    code, _, err = _cli(capsys, "validate", path)
    assert code == 0, err
    code, _, err = _cli(capsys, "run", path, "--out", folder / tag, "--no-report", "--quiet")
    assert code == 0, err
    return pd.read_parquet(folder / tag / "rounds.parquet")


@pytest.fixture
def builtin_rounds(tmp_path, capsys):
    """The truth: FedSGD on the small scenario (logistic model, digits, Rayleigh cell)."""
    return _run(capsys, tmp_path, small_doc(algorithms=[FEDSGD]), "builtin")


def test_list_names_every_kind_and_where_it_comes_from(installed, capsys):
    code, out, _ = _cli(capsys, "list")
    assert code == 0
    kinds = [line[:-1] for line in out.splitlines() if line and not line.startswith(" ")]
    assert kinds[:5] == ["algorithms", "models", "datasets", "fading", "compute"]
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert lines["my-fedsgd"].endswith("[plugin mypkg (mypkg.parts:MyFedSGD)]")
    assert "[plugin mypkg (mypkg.parts:tiny_linear)]" in lines["tiny-linear"]
    assert "[plugin mypkg (mypkg.parts:PerPass)]" in lines["per-pass"]
    assert "fails to load" in lines["broken"] and "a dependency is missing" in lines["broken"]
    assert "[" not in lines["fedavg"] and "[" not in lines["mlp"]  # built-ins carry no origin


@pytest.mark.parametrize("names", [
    {"algorithm": "my-fedsgd", "model": "tiny-linear"},
    {"algorithm": "mypkg.parts:MyFedSGD", "model": "mypkg.parts:tiny_linear"},
], ids=["entry-points", "references"])
def test_plugin_algorithm_and_model_give_the_builtins_numbers(installed, builtin_rounds, names,
                                                              tmp_path, capsys):
    """FedSGD under another name, and the logistic model as an nn.Sequential (same layer, same
    seeded initial weights): every number equals the built-ins'."""
    doc = small_doc(algorithms=[{**FEDSGD, "name": names["algorithm"]}],
                    model={"name": names["model"]})
    rounds = _run(capsys, tmp_path, doc, "plugin")
    pd.testing.assert_frame_equal(rounds, builtin_rounds)
    # Without a label a reference shows the class's own name, an entry point its name.
    del doc["algorithms"][0]["label"]
    rounds = _run(capsys, tmp_path, doc, "unlabelled")
    assert set(rounds["algorithm"]) == {"my-fedsgd"}


def test_plugin_model_options_reach_the_builder(installed, tmp_path, capsys):
    doc = small_doc(algorithms=[FEDSGD], model={"name": "tiny-linear", "options": {"bias": False}})
    path = _write(tmp_path, doc)
    code, _, err = _cli(capsys, "run", path, "--out", tmp_path / "run", "--no-report", "--quiet")
    assert code == 0, err
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["scenario"]["model"]["options"] == {"bias": False}
    assert manifest["model"]["d"] == 64 * 10  # the 8x8 digits' 64 inputs, 10 classes, no bias


def test_dataset_fading_and_compute_plugins_against_their_truths(installed, builtin_rounds,
                                                                  tmp_path, capsys):
    # the digits loaded by the plugin, split by wirelessfl: the built-in digits exactly
    rounds = _run(capsys, tmp_path, small_doc(algorithms=[FEDSGD], data={"name": "digits-copy"}),
                  "dataset")
    pd.testing.assert_frame_equal(rounds, builtin_rounds)
    # |h|^2 = 1 from a plugin: fading 'none' exactly
    none = small_doc(algorithms=[FEDSGD], channel={"profile": "seed002-cell", "fading": "none"})
    unit = small_doc(algorithms=[FEDSGD],
                     channel={"profile": "seed002-cell", "fading": {"model": "unit"}})
    pd.testing.assert_frame_equal(_run(capsys, tmp_path, unit, "unit"),
                                  _run(capsys, tmp_path, none, "none"))
    # 1 mJ per forward and 2 mJ per backward pass: FedSGD makes one of each per device per round
    energy = {"model": "mypkg.parts:PerPass", "forward_j": 1e-3, "backward_j": 2e-3}
    rounds = _run(capsys, tmp_path, small_doc(algorithms=[FEDSGD], energy=energy), "compute")
    assert rounds["energy_compute_forward_j"].tolist() == pytest.approx(
        [r * N * 1e-3 for r in rounds["round"]], rel=1e-12)
    assert rounds["energy_compute_j"].tolist() == pytest.approx(
        [r * N * 3e-3 for r in rounds["round"]], rel=1e-12)


def test_fading_plugin_link_budget_uses_its_cdf_or_monte_carlo(installed):
    """channel/analysis.py: with a CDF the closed form; without one, Monte Carlo over its
    draws. For |h|^2 = 1 both are the no-fading budget."""
    from wirelessfl.channel.analysis import budget_method, link_budget
    from wirelessfl.channel.config import ChannelConfig
    from wirelessfl.scenario.catalog import load_mapping

    doc = load_mapping("channels", "seed002-cell", "channel")
    none = ChannelConfig.model_validate({**doc, "fading": "none"})
    unit = ChannelConfig.model_validate({**doc, "fading": {"model": "unit"}})
    assert budget_method(unit) == "closed form"
    assert link_budget(unit, 300.0, 1e4) == link_budget(none, 300.0, 1e4)
    class NoCdf:
        def power(self, n, rng):
            return np.ones(n)

    FADING.register(NoCdf, "no-cdf")
    try:
        plain = ChannelConfig.model_validate({**doc, "fading": {"model": "no-cdf"}})
        assert budget_method(plain) == "monte-carlo"
        mc = link_budget(plain, 300.0, 1e4, samples=200)
        assert mc["expected_airtime_s"] == pytest.approx(
            link_budget(none, 300.0, 1e4)["expected_airtime_s"], rel=1e-12)
    finally:
        FADING.unregister("no-cdf")


def test_a_checkpoint_holds_and_restores_plugin_state(installed, tmp_path):
    """A plugin algorithm (with state of its own: FedAvgM's velocity, examples/) over a fading
    plugin, block-correlated so the fading process holds state too: resumed from the checkpoint
    after round 3 it records exactly the rows and ledger of the run that wrote it, as the
    built-ins do (tests/test_interruption.py; pipeline/state_tree.py holds plugin objects)."""
    from wirelessfl.pipeline.build import build_world
    from wirelessfl.pipeline.checkpoint import CHECKPOINT_NAME, read_checkpoint
    from wirelessfl.pipeline.simulation import run_algorithm
    from wirelessfl.scenario.loader import scenario_from_document

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        doc = small_doc(algorithms=[{"name": "my_algorithm:FedAvgM", "rounds": 5,
                                     "eval_every": 1, "lr": 0.05}],
                        channel={"profile": "seed002-cell", "fading": {
                            "model": "unit", "correlation": "block", "coherence_time_s": 0.01}})
        sc = scenario_from_document(doc, "checkpoint.yaml")
        full = run_algorithm(build_world(sc), sc.algorithms[0], checkpoint_every=3,
                             checkpoint_path=tmp_path / CHECKPOINT_NAME)
        state = read_checkpoint(tmp_path / CHECKPOINT_NAME)
        assert state.completed == 3
        resumed = run_algorithm(build_world(sc), sc.algorithms[0], resume=state)
    finally:
        sys.path.remove(str(ROOT / "examples"))
    pd.testing.assert_frame_equal(pd.DataFrame(full.rows), pd.DataFrame(resumed.rows))
    assert (full.ledger.energy_j == resumed.ledger.energy_j).all()


def _sweep(folder: Path, capsys, executor: str, algorithm: str, model: str) -> Path:
    base = small_doc(algorithms=[{**FEDSGD, "name": algorithm},
                                 {**FEDSGD, "name": "registered-fedsgd", "label": "Registered"}],
                     model={"name": model})
    _write(folder, base, "base.yaml")
    path = _write(folder, {"scenario": "base.yaml",
                           "grid": {"channel.uplink.tx_power_dbm": [10, 23]}, "seeds": [3]},
                  f"sweep-{executor}.yaml")
    out = folder / f"out-{executor}"
    code, _, err = _cli(capsys, "sweep", path, "--out", out, "--executor", executor,
                        "--workers", "2", "--quiet", "--no-compare")
    assert code == 0, err
    return out


@pytest.mark.slow
def test_local_and_dask_sweeps_resolve_the_same_plugins(installed, tmp_path, capsys,
                                                          monkeypatch):
    """Entry points (local sweep) and references from the folder the user runs in (Dask
    LocalCluster), plus a part registered in this process (``registered_modules``: the workers
    import mypkg.registered): every run equals the built-in FedSGD's at the same point."""
    import mypkg.registered  # noqa: F401 - registers 'registered-fedsgd' here

    local = _sweep(tmp_path, capsys, "local", "my-fedsgd", "tiny-linear")
    pytest.importorskip("distributed")
    monkeypatch.chdir(installed)  # references import from the current folder
    dask = _sweep(tmp_path, capsys, "dask", "mypkg.parts:MyFedSGD", "mypkg.parts:tiny_linear")
    runs = sorted(p.name for p in (local / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        frames = [pd.read_parquet(out / "runs" / run / "rounds.parquet") for out in (local, dask)]
        pd.testing.assert_frame_equal(*frames)
        one = frames[0].set_index(["algorithm", "round"])
        pd.testing.assert_frame_equal(one.loc["FedSGD"], one.loc["Registered"])
    # a point of the sweep is FedSGD + logistic run by hand at that point
    run = next(r for r in runs if r.startswith("tx_power_dbm=23_seed=3"))
    doc = small_doc(algorithms=[FEDSGD], channel={"profile": "seed002-cell",
                                                  "uplink": {"tx_power_dbm": 23}})
    truth = _run(capsys, tmp_path, doc, "point")
    swept = pd.read_parquet(local / "runs" / run / "rounds.parquet")
    pd.testing.assert_frame_equal(swept[swept["algorithm"] == "FedSGD"].reset_index(drop=True),
                                  truth)


BAD_CASES = [
    ("algorithms", [{"name": "nopkg.algo:Algo"}], "algorithms[0].name", "cannot import module"),
    ("algorithms", [{"name": "mypkg.bad:not_an_algorithm"}], "algorithms[0].name",
     "is not an algorithm"),
    ("model", {"name": "broken"}, "model.name", "'broken' (mypkg.broken:anything) failed to load"),
    ("model", {"name": "mypkg.broken:x"}, "model.name", "a dependency is missing"),
    ("model", {"name": "mypkg.bad:model_raises"}, "model.name",
     "'mypkg.bad:model_raises' failed to build"),
    ("model", {"name": "mypkg.bad:model_returns_int"}, "model.name", "returned a int"),
    ("model", {"name": "mlp", "options": {"x": 1}}, "model", "plugin models only"),
    ("data", {"name": "mypkg.bad:dataset_float_labels"}, "data.name", "integer labels"),
    ("data", {"name": "mypkg.bad:dataset_raises", "options": {"path": "/no/such"}}, "data.name",
     "FileNotFoundError: /no/such"),
    ("channel", {"profile": "seed002-cell", "fading": {"model": "mypkg.bad:HalfFading"}},
     "fading", "mean 0.5"),
    ("channel", {"profile": "seed002-cell", "fading": {"model": "mypkg.bad:RaisingFading"}},
     "fading", "cannot draw"),
    ("channel", {"profile": "seed002-cell", "fading": {"model": "unit", "correlation":
                                                       "gauss-markov", "doppler_hz": 5}},
     "fading", "'gauss-markov'"),
    ("energy", {"model": "mypkg.bad:NoPrice"}, "energy.model", "is not a compute model"),
    ("energy", {"model": "mypkg.bad:NegativePrice"}, "energy.model", "four finite numbers >= 0"),
]


@pytest.mark.parametrize("key, value, where, message", BAD_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CASES)])
def test_a_bad_plugin_is_one_error_line(installed, tmp_path, capsys, key, value, where, message):
    """``validate`` refuses what it can know without running; ``run`` the rest (a dataset is
    loaded, a pass priced only then), before any round."""
    path = _write(tmp_path, small_doc(**{"algorithms": [FEDSGD], key: value}))
    code, _, err = _cli(capsys, "validate", path)
    if code == 0:
        code, _, err = _cli(capsys, "run", path, "--out", tmp_path / "run", "--no-report", "--quiet")
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert where in errors[0] and message in errors[0], errors[0]


@pytest.fixture
def fresh_plugin_imports(monkeypatch):
    """sys.path and the imported modules as they were after the test (an in-process command
    puts the current folder on sys.path and imports the plugins it names); the registries
    forget what they resolved."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if not name.startswith(("wirelessfl", "torch", "numpy", "pandas", "matplotlib")):
            del sys.modules[name]
    _rescan()


@pytest.mark.parametrize("runner", ["in-process",
                                    pytest.param("subprocess", marks=pytest.mark.slow)])
def test_tutorial_runs_from_the_examples_folder(tmp_path, runner, fresh_plugin_imports,
                                                 monkeypatch):
    """docs/plugins.md's tutorial, as written: ``wirelessfl run my-algorithm.yaml
    --allow-references`` in examples/ (shortened; the flag alone opts in); FedAvgM with
    momentum 0 is FedAvg, to the last bit. In process (the
    current folder examples/), and (slow) in a fresh interpreter as a user runs it."""
    from tests.hostile import RUNNERS

    examples = ROOT / "examples"
    short = ["--set", "algorithms.FedAvgM.rounds=4", "--set", "algorithms.FedAvg.rounds=4",
             "--set", "algorithms.FedAvgM.momentum=0", "--set", "algorithms.FedAvgM.lr=0.2"]
    monkeypatch.delenv("WIRELESSFL_ALLOW_REFERENCES", raising=False)
    done = RUNNERS[runner]("run", "my-algorithm.yaml", "--allow-references", "--out",
                           tmp_path / "run", "--no-report",
                           "--quiet", *short, cwd=examples, timeout=300)
    assert done.returncode == 0, done.stderr
    rounds = pd.read_parquet(tmp_path / "run" / "rounds.parquet").set_index(["algorithm", "round"])
    pd.testing.assert_frame_equal(rounds.loc["FedAvgM"], rounds.loc["FedAvg"])
    assert "FedAvgM" in done.stdout
    docs = (ROOT / "docs" / "plugins.md").read_text()
    assert "wirelessfl run my-algorithm.yaml --allow-references" in docs
    assert "examples/my_algorithm.py" in docs


def test_a_module_whose_own_import_fails_is_not_called_missing(tmp_path, monkeypatch):
    """A module that exists but imports a missing dependency (whose name is a prefix of the
    module's own) is reported as failing to import, with the dependency named, not as absent."""
    from wirelessfl.errors import UserError
    from wirelessfl.plugins import import_reference

    (tmp_path / "depx_plugin.py").write_text("import depx\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError) as err:
        import_reference("depx_plugin:Algo", "algorithms[0].name")
    assert "importing 'depx_plugin'" in str(err.value) and "depx" in str(err.value)
    assert "cannot import module" not in str(err.value)
