"""Shared fixtures: small scenarios that run in well under a second."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from wirelessfl.scenario.loader import scenario_from_document

SMALL = {
    "name": "small",
    "seed": 3,
    "channel": "seed002-cell",
    "energy": "seed002-accelerator",
    "population": {"num_devices": 8},
    "data": {"name": "digits"},
    "model": {"name": "logistic"},
    "quantization_bits": 16,
    "target_accuracy": 0.5,
    "algorithms": [
        {"name": "dzofl", "rounds": 30, "eval_every": 10},
        {"name": "fedsgd", "rounds": 6, "eval_every": 2, "lr": 0.5},
        {"name": "fedavg", "rounds": 4, "eval_every": 2, "local_steps": 3},
    ],
}


def small_doc(**changes) -> dict:
    """A copy of the small scenario document with top-level keys replaced."""
    doc = copy.deepcopy(SMALL)
    doc.update(copy.deepcopy(changes))
    return doc


def small_scenario(overrides=(), **changes):
    return scenario_from_document(small_doc(**changes), "small.yaml", list(overrides))


# Parameters an algorithm needs on the small scenarios: the drift-corrected family's default rules
# read the problem's L or delta, which a neural network does not know (fedred.md).
ALGORITHM_NEEDS = {"gd": {"lr": 0.1}, "scaffold-cv": {"lr": 0.1},
                   "scaffnew": {"lr": 0.1, "p": 0.5},
                   "dane-plus": {"lam": 1.0, "lr": 0.1, "max_local_steps": 5},
                   "dane": {"lam": 1.0, "lr": 0.1, "max_local_steps": 5},
                   "fedred": {"p": 0.5, "eta": 10.0}, "fedmsa": {"local_steps": 3}}
# Algorithms that run on a multi-sequence (bilevel) problem, not on a classifier, and the small
# problem they get (fedmsa.md Sec. 5.1's quadratic, one client per device).
MSA_ALGORITHMS = {"fedmsa", "fednest"}
SMALL_BILEVEL = {"name": "bilevel-quadratic", "dimension_x": 3, "dimension_w": 4}


def algorithm_scenario(algorithm: dict, overrides=()):
    """The small scenario running ``algorithm`` (with what it needs) on a problem it runs on;
    overrides of the data split are dropped for a problem without data."""
    name = algorithm["name"]
    algorithm = {**ALGORITHM_NEEDS.get(name, {}), **algorithm}
    if name not in MSA_ALGORITHMS:
        return small_scenario(overrides, algorithms=[algorithm])
    doc = small_doc(problem=SMALL_BILEVEL, algorithms=[algorithm])
    for key in ("data", "model"):
        doc.pop(key)
    kept = [o for o in overrides if not o.startswith(("partition", "data"))]
    return scenario_from_document(doc, "small.yaml", kept)


def write_yaml(folder: Path, doc, name: str = "scenario.yaml") -> Path:
    """Write a document (or a text as it is) to ``folder/name`` as YAML; returns the path."""
    path = Path(folder) / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False) if not isinstance(doc, str) else doc)
    return path


@pytest.fixture
def scenario_file(tmp_path):
    """Write a scenario document to a YAML file and return its path."""
    return lambda doc, name="scenario.yaml": write_yaml(tmp_path, doc, name)


def cli(capsys, *argv) -> tuple[int, str, str]:
    """``wirelessfl ARGV`` in this process: (exit code, stdout, stderr)."""
    from wirelessfl.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_recording_thetas(monkeypatch, scenario):
    """Run the scenario's first algorithm; return (world, theta after every round, the run)."""
    from wirelessfl.pipeline.build import build_world
    from wirelessfl.engine.context import RunContext
    from wirelessfl.pipeline.simulation import run_algorithm

    seen = []
    # the unpatched method, so a second call in the same test records into its own list only
    original = getattr(RunContext.end_round, "__wrapped__", RunContext.end_round)

    def record(self, completed, theta):
        seen.append(theta.clone())
        return original(self, completed, theta)

    record.__wrapped__ = original
    monkeypatch.setattr(RunContext, "end_round", record)
    world = build_world(scenario)
    return world, seen, run_algorithm(world, scenario.algorithms[0])


def record_collects(monkeypatch, extract) -> list:
    """Patch ``Algorithm.collect`` to append ``extract(algorithm, result)`` of each collect to
    the returned list."""
    from wirelessfl.algorithms.base import Algorithm

    seen = []
    original = Algorithm.collect

    def recording(self, cost, payload, active=None):
        result = yield from original(self, cost, payload, active)
        seen.append(extract(self, result))
        return result

    monkeypatch.setattr(Algorithm, "collect", recording)
    return seen


def record_delivered(monkeypatch) -> list:
    """Patch ``Algorithm.collect`` to append each collect's delivered mask ([N] bool) to the
    returned list."""
    import numpy as np

    def mask(algorithm, result):  # results asked by index too
        delivered = np.zeros(algorithm.ctx.num_devices, dtype=bool)
        delivered[result.delivered_devices] = True
        return delivered

    return record_collects(monkeypatch, mask)
