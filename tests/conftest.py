"""Shared fixtures: small scenarios that run in well under a second; the two tiers of the suite.

``python3 -m pytest`` runs the fast tier; ``python3 -m pytest --slow`` runs everything: also the
tests marked ``@pytest.mark.slow`` (fresh interpreters, worker processes, Dask clusters, end-to-end
studies, compression bombs), which the fast tier leaves out and counts in one line at its end."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
from pathlib import Path

import pytest
import yaml

from wirelessfl.scenario.loader import scenario_from_document

SLOW_HINT = "run everything with: python3 -m pytest --slow"
_LEFT_OUT = pytest.StashKey[int]()


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (fresh interpreters, worker processes, "
                          "Dask clusters, end-to-end studies, compression bombs): the whole "
                          "suite; with -m slow, only those")


def pytest_collection_modifyitems(config, items):
    """Without --slow, the tests marked slow are deselected (and counted)."""
    if config.getoption("--slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]
    config.stash[_LEFT_OUT] = len(slow)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    left_out = config.stash.get(_LEFT_OUT, 0)
    if left_out:
        terminalreporter.write_line(
            f"{left_out} slow tests left out (fresh interpreters, worker processes, Dask "
            f"clusters, end-to-end studies, compression bombs); {SLOW_HINT}")


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread():
    """One intra-op thread for torch and the BLAS libraries, as the package sets for every run
    (engine/threads.py). Tests that drive the engine directly (build_world, run_algorithm) would
    otherwise run on torch's default threads until the first command of the session set them,
    their CPU time depending on the order the tests run in: on 2 busy cores, DZOFL's 1,500
    quickstart iterations took 21 s of CPU alone, 2.5 s after a command had run."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(limits=1, user_api="blas")


@contextlib.contextmanager
def runs_in_this_process(before_each=None):
    """Sweeps, tunes and reproductions on the local executor run their points one after another
    in this process, through ``run_task`` (what a worker process runs for each task), instead
    of in 'spawn' worker processes that each start a fresh interpreter and import torch (seconds
    of CPU each). For tests of what a study does with its runs' results; the executors
    themselves (worker processes, their deaths and signals, Dask) are tested with real processes
    in the slow tier (tests/test_sweep.py, tests/test_hostile_procs.py, tests/test_tune.py).
    ``before_each(k, task)``, when given, is called before the k-th run (from 0). Each run's
    progress events go straight to the sweep's printer (``on_event``)."""
    from wirelessfl.sweep import executors
    from wirelessfl.sweep.worker import run_task

    def one_by_one(tasks, workers, on_event=None):
        for k, task in enumerate(tasks):
            if before_each is not None:
                before_each(k, task)
            yield run_task(task, on_event)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(executors, "run_local", one_by_one)
        yield


@pytest.fixture
def in_process_runs():
    """``runs_in_this_process`` for one test."""
    with runs_in_this_process():
        yield


# Where the runs of a study on the local executor execute: in this process, or in worker
# processes (slow).
RUNS_WHERE = ["in-process", pytest.param("worker-processes", marks=pytest.mark.slow)]


@contextlib.contextmanager
def runs_at(where: str):
    """``runs_in_this_process`` for "in-process"; nothing changed for "worker-processes"."""
    if where == "in-process":
        with runs_in_this_process():
            yield
    else:
        yield


@pytest.fixture(params=RUNS_WHERE)
def runs_where(request):
    """The test runs twice: its studies' runs in this process, and (slow) in the local
    executor's worker processes."""
    with runs_at(request.param):
        yield request.param

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


def tiny_tune_file(folder: Path) -> Path:
    """A tune file of seconds (``folder/tiny-tune.yaml``, its scenario beside it): FedSGD on the
    small scenario (6 rounds, its own step size 0.2), two step sizes on one tuning seed (2
    runs), then the choice and the scenario's own step size on two evaluation seeds (4 runs)."""
    fedsgd = {"name": "fedsgd", "label": "FedSGD", "rounds": 6, "eval_every": 2, "lr": 0.2}
    (folder / "base.yaml").write_text(yaml.safe_dump(small_doc(algorithms=[fedsgd])))
    path = folder / "tiny-tune.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", "scenario": "base.yaml",
                                    "objective": "energy_to_target", "tuning_seeds": [100],
                                    "evaluation_seeds": [0, 1],
                                    "search": {"FedSGD": {"lr": [0.1, 0.5]}}}))
    return path


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
# Algorithms that need a compositional problem (centralized SGD) and the small one they get.
COMPOSITIONAL_ALGORITHMS = {"centralized-sgd", "centralized-stsa"}
SMALL_COMPOSITIONAL = {"name": "risk-averse-mco", "dimension": 3, "samples": 40,
                       "sample_batch": 10}


def algorithm_scenario(algorithm: dict, overrides=()):
    """The small scenario running ``algorithm`` (with what it needs) on a problem it runs on;
    overrides of the data split are dropped for a problem without data."""
    name = algorithm["name"]
    algorithm = {**ALGORITHM_NEEDS.get(name, {}), **algorithm}
    if name not in MSA_ALGORITHMS | COMPOSITIONAL_ALGORITHMS:
        return small_scenario(overrides, algorithms=[algorithm])
    problem = SMALL_COMPOSITIONAL if name in COMPOSITIONAL_ALGORITHMS else SMALL_BILEVEL
    doc = small_doc(problem=problem, algorithms=[algorithm])
    for key in ("data", "model"):
        doc.pop(key)
    kept = [o for o in overrides if not o.startswith(("partition", "data"))]
    return scenario_from_document(doc, "small.yaml", kept)


def small_quadratic(algorithm: dict, delivery: float = 1.0, seed: int | None = None,
                    overrides=()):
    """Five quadratic clients f_i(x) = 1/2 x^T A_i x - c_i^T x in 4 dimensions (one device each),
    exact gradients, 32-bit values, the pinned channel delivering uploads with ``delivery``:
    the problem the algorithms' numpy transcriptions run on (tests/test_fgdro.py, test_drfa.py)."""
    doc = small_doc(problem={"name": "quadratic", "clients": 5, "dimension": 4, "L": 4.0,
                             "mu": 1.0, "delta": 1.0, "minimizer_std": 1.0},
                    channel={"profile": "seed002-pinned",
                             "uplink": {"delivery_probability": delivery}},
                    quantization_bits=32, algorithms=[{"eval_every": 10**6, **algorithm}])
    for key in ("data", "model"):
        doc.pop(key)
    doc["population"] = {"num_devices": 5}
    if seed is not None:
        doc["seed"] = seed
    return scenario_from_document(doc, "quadratic.yaml", list(overrides))


def quadratic_noise_draws(problem, batch: int = 4, steps: int = 200):
    """What the quadratic's noise tests measure (tests/test_problems.py and
    tests/test_quadratic_instances.py): (theta, idx, noise [steps * n, d]: each step's minibatch gradients less the exact ones, row: one
    device's minibatch gradient at theta, fd: its central finite differences of the minibatch
    loss, h = 1e-5), on fixed generator seeds."""
    import torch

    d = problem.d
    theta = torch.randn(d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    idx = problem.sample(torch.Generator().manual_seed(5), batch, steps=steps)
    exact = problem.full_gradients(theta)
    n = exact.shape[0]
    noise = torch.cat([problem.stacked_gradients(theta.expand(n, -1), idx[s]) - exact
                       for s in range(steps)]).numpy()
    h, eye = 1e-5, torch.eye(d, dtype=torch.float64)
    row = problem.stacked_gradients(theta[None], idx[0, :1])[0]
    fd = torch.stack([(problem.stacked_losses((theta + h * e)[None], idx[0, :1])
                       - problem.stacked_losses((theta - h * e)[None], idx[0, :1]))[0] / (2 * h)
                      for e in eye])
    return theta, idx, noise, row, fd


def write_yaml(folder: Path, doc, name: str = "scenario.yaml") -> Path:
    """Write a document (or a text as it is) to ``folder/name`` as YAML; returns the path."""
    path = Path(folder) / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False) if not isinstance(doc, str) else doc)
    return path


@pytest.fixture
def scenario_file(tmp_path):
    """Write a scenario document to a YAML file and return its path."""
    return lambda doc, name="scenario.yaml": write_yaml(tmp_path, doc, name)


def _contents(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def small_run(tmp_path_factory):
    """The small scenario run once for the whole session by `wirelessfl run` without figures,
    under umask 002 (its files are 0664: tests/test_hostile_outputs.py): (run folder, scenario
    file). Shared by several modules: never change it (copy it first); the session's end checks
    that nothing in it changed."""
    from wirelessfl.cli import main

    root = tmp_path_factory.mktemp("small-run")
    scenario = write_yaml(root, small_doc(), "small.yaml")
    previous = os.umask(0o002)
    try:
        assert main(["run", str(scenario), "--out", str(root / "run"), "--quiet",
                     "--no-report"]) == 0
    finally:
        os.umask(previous)
    before = _contents(root)
    yield root / "run", scenario
    assert _contents(root) == before, "a test changed the shared small_run folder"


def cli(capsys, *argv) -> tuple[int, str, str]:
    """``wirelessfl ARGV`` in this process: (exit code, stdout, stderr)."""
    from wirelessfl.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def table_right_edges(page: Path, window: int = 1280) -> list[int] | None:
    """The right edge, in pixels, of every table of the report ``page`` in a ``window`` px wide
    headless Chromium; None where Chromium is not installed. A copy of the page (beside it, its
    Content-Security-Policy removed) runs a script that writes the edges into the DOM."""
    import re
    import shutil
    import subprocess

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return None
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    probe = ('<script>document.body.insertAdjacentHTML("beforeend", "<pre id=widths>"'
             ' + Array.from(document.querySelectorAll("table")).map(t => '
             'Math.ceil(t.getBoundingClientRect().right)).join(",") + "</pre>")</script>')
    measured = page.with_name(f"measured-{page.name}")
    measured.write_text(text.replace("</body>", probe + "</body>"))
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          f"--window-size={window},900", "--dump-dom", measured.as_uri()],
                         check=False, capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="widths">([\d,]+)</pre>', dom)
    assert found, dom[-500:]
    return [int(w) for w in found.group(1).split(",")]


def run_recording_thetas(monkeypatch, scenario):
    """Run the scenario's first algorithm; return (world, theta after every round, the run)."""
    from wirelessfl.engine.context import RunContext
    from wirelessfl.pipeline.build import build_world
    from wirelessfl.pipeline.simulation import run_algorithm

    seen = []
    # the unpatched method, so a second call in the same test records into its own list only
    original = getattr(RunContext.end_round, "__wrapped__", RunContext.end_round)

    def record(self, completed, theta, *objective):
        seen.append(theta.clone())
        return original(self, completed, theta, *objective)

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
