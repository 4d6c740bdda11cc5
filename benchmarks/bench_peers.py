"""FedAvg rounds in wirelessfl against Apple's pfl-research (``pfl``): host time and peak memory.

Both simulators run the same FedAvg on the same data from the same initial weights: E = 5 local
SGD steps on minibatches of 10, the server taking the plain mean of the uploaded deltas
(wirelessfl: ``average: uniform``, server_lr 1; pfl: ``FederatedAveraging`` with a central
``torch.optim.SGD`` of lr 1 on its unweighted statistics), float32 uploads (quantization_bits 32:
no quantisation), a perfect channel (``PERFECT_CHANNEL``: every upload and broadcast arrives, the
channel sets only simulated airtime), no differential privacy, no evaluation in the timed rounds.

Per case, a preparation process builds the wirelessfl world of the case's scenario
(``wirelessfl.load_scenario(dict)``) and saves its training and test arrays, each device's sample
indices (``World.shards``) and theta_0; pfl's users are those devices, holding those samples, and
its model gets that theta_0. Then the two simulators run one after the other, each in a fresh
process (``--repeats`` times, interleaved, alternating which goes first), with a time limit per
process (``--case-timeout``); a process that fails or runs out of time is recorded as ``null``
with the reason, and the benchmark goes on. Each process reports host ms per round and its peak
resident memory (``ru_maxrss``); the JSON keeps every repeat and the medians.

Timing: both simulators call a hook at the end of every round, which records ``perf_counter``
(wirelessfl: the runner's ``on_round``, the hook its progress bar uses: ``pipeline.runner.
run_to_record``, which ``wirelessfl.run`` calls; pfl: a callback's ``after_central_iteration``).
ms per round = (end of round R - end of round 1) / (R - 1): building the world or loading the
data, round 1 (warm-up: pfl evaluates each user before and after training in its iteration 0)
and wirelessfl's evaluations at rounds 0 and R are outside. pfl's process loads the prepared
arrays from .npy files; wirelessfl's process builds its world itself (data generation included
in its peak memory).

pfl specifics [D]: users are sampled by pfl's ``get_user_sampler`` ('minimize_reuse' when all
take part, so every user trains once a round; 'random' otherwise, uniform draws that may pick a
user twice in a round, where wirelessfl draws its participants without replacement: the same
work per round), ``send_metrics_to_platform`` off (no metrics printed per round), torch's
intra-op threads = ``--pfl-threads`` (default ``--threads``); wirelessfl runs one intra-op thread
and a pool of ``--threads`` (its design, host/threads.py). pfl's ``local_num_steps`` stops at
the end of a user's data (one pass), so a user holding fewer than E x b = 50 samples gets its
samples repeated cyclically up to 50: five full minibatches of 10 distinct samples, as
wirelessfl's E = 5 minibatches of b = 10 drawn without replacement.

Equivalence (``equivalence`` in the JSON, run first): 20 devices holding exactly b = 10 samples
each, all taking part, 3 rounds: every minibatch is then a device's whole data (in any order),
so both simulators compute the same models up to float32 summation order; the test loss at
round 0 and at the end and the final parameter norm must agree to ``EQUIVALENCE_RTOL``. In every
case the test loss of theta_0 must agree the same way (same data, same initial weights), and
the final test losses must be finite and differ by at most ``LOSS_TOLERANCE`` times the loss at
theta_0 (the minibatches and the sampled users differ, so only closeness is expected).

    /work/venv-pfl/bin/python benchmarks/bench_peers.py [--out benchmarks/bench_peers.json]
        [--repeats 3] [--quick] [--only CASE ...] [--case-timeout 600] [--threads N]
        [--pfl-threads N] [--simulators wirelessfl pfl] [--skip-equivalence]

pfl is not a dependency of wirelessfl; install it on the side (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent

LOCAL_STEPS, BATCH_SIZE = 5, 10  # E and b of the issue's comparison
CHANNEL_PROFILE, ENERGY = "seed002-cell", "seed002-accelerator"
# A perfect channel: adaptive rate always delivers (channel/link.py), no fading, and the
# seed-002 cell's broadcast is reliable (downlink.loss false). The channel sets airtime only.
PERFECT_CHANNEL = {"profile": CHANNEL_PROFILE, "uplink": {"mode": "adaptive"},
                   "fading": {"model": "none"}, "downlink": {"loss": False}}
FULL_PRECISION_BITS = 32  # quantization_bits 32: floats travel as they are
SEED = 0
# [D] synthetic cases: 64 features, 10 classes (16 informative, as bench_rounds.py's synthetic
# MLP), SAMPLES_PER_DEVICE training samples per device from a data set of at most
# MAX_TRAIN_SAMPLES (= 20 x 10,000, the largest population of the issue's table); larger
# populations share it (per-device index sets into one data set).
SAMPLES_PER_DEVICE = 20
MAX_TRAIN_SAMPLES = 200_000
TEST_SAMPLES = 2_000  # [D] test set of the synthetic cases (evaluated outside the timed rounds)
TEST_FRACTION = 0.25  # data.test_fraction's default
SYNTHETIC = {"num_features": 64, "num_classes": 10, "informative": 16}
QUICK_MAX_DEVICES = 1_000  # --quick: populations up to this size
# [D] the model-size axis: MLPs 64-[hidden]-10 on the synthetic data, 100 clients all taking part,
# d = 1,210 ... 8,546,314 (about 10^3 to 10^7); fewer rounds as a round grows (>= 2 timed)
SIZE_AXIS = ((16,), (256,), (1024,), (1024, 1024), (2048, 2048, 2048))  # (64,): mlp_synthetic_n100_k100
QUICK_MAX_PARAMETERS = 100_000  # --quick: sizes up to this d
SIZE_LR = 0.05
# [D] agreement: float32 summation order over a few rounds stays well inside 1e-4 (relative);
# final test losses of the two simulators within 10 % of the loss at theta_0 of each other.
EQUIVALENCE_RTOL = 1e-4
LOSS_TOLERANCE = 0.1
DEFAULT_TIMEOUT_S = 600
SIMULATORS = ("wirelessfl", "pfl")


def _bench_rounds():
    """benchmarks/bench_rounds.py (its matmul peak, FLOP accounting and case data), by path."""
    name = "bench_rounds"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH_DIR / "bench_rounds.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# ---- the cases ----------------------------------------------------------------------------------
def synthetic_data(devices: int, per_device: int = SAMPLES_PER_DEVICE,
                   max_train: int = MAX_TRAIN_SAMPLES) -> dict:
    """The ``data`` section of a synthetic case: per_device training samples a device, in a data
    set of at most max_train training samples and TEST_SAMPLES test samples."""
    train = min(devices * per_device, max_train)
    total = math.ceil(train / (1 - TEST_FRACTION)) + 4  # the split rounds the test share up
    return {"name": "synthetic", "synthetic": {"num_samples": total, **SYNTHETIC},
            "max_train_samples": train, "max_test_samples": TEST_SAMPLES}


def case_specs(quick: bool = False) -> list[dict]:
    """The cases of the issue's table (digits MLP and CNN data as bench_rounds.py's cases), then
    the cross-device populations. ``sampled``: users asked per round (= registered: all)."""
    rounds_cases = {s["case"]: s for s in _bench_rounds().case_specs(True)}
    mlp, cnn = rounds_cases["mlp_fedavg"], rounds_cases["cnn_fedavg"]
    specs = [
        {"case": "mlp_digits_n50", "title": "50 clients all taking part, MLP 64-64-10",
         "registered": 50, "sampled": 50, "rounds": 20, "data": mlp["data"],
         "model": mlp["model"], "lr": mlp["algorithm"]["lr"]},
        {"case": "softmax_digits_n50", "title": "50 clients all taking part, softmax",
         "registered": 50, "sampled": 50, "rounds": 20, "data": mlp["data"],
         "model": {"name": "logistic"}, "lr": mlp["algorithm"]["lr"]},
        # [D] 12 rounds (11 timed): a round of ~0.4 s varies by +-20 % on a shared host,
        # and 4 timed rounds left the ratio to pfl within that noise
        {"case": "cnn_digits28_n10", "title": "seed-002 CNN, 10 clients", "registered": 10,
         "sampled": 10, "rounds": 12, "data": cnn["data"], "model": cnn["model"],
         "lr": cnn["algorithm"]["lr"]},
    ]
    for hidden in SIZE_AXIS:
        d = mlp_parameters(SYNTHETIC["num_features"], hidden, SYNTHETIC["num_classes"])
        if quick and d > QUICK_MAX_PARAMETERS:
            continue
        rounds = 8 if d <= 100_000 else 4 if d <= 2_000_000 else 3
        widths = "-".join(str(w) for w in (SYNTHETIC["num_features"], *hidden,
                                           SYNTHETIC["num_classes"]))
        specs.append({"case": f"mlp_size_d{d}", "title": f"MLP {widths} (d = {d:,}), 100 "
                                                          "clients all taking part (synthetic)",
                      "registered": 100, "sampled": 100, "rounds": rounds, "d": d,
                      "data": synthetic_data(100), "model": {"name": "mlp", "hidden": list(hidden)},
                      "lr": SIZE_LR})
    populations = ((100, 100, 20), (1_000, 100, 10), (10_000, 100, 5), (100_000, 100, 4),
                   (100_000, 1_000, 4), (1_000_000, 100, 4), (1_000_000, 1_000, 4))
    for registered, sampled, rounds in populations:
        if quick and registered > QUICK_MAX_DEVICES:
            continue
        who = ("all take part" if sampled == registered else f"{sampled:,} sampled")
        spec = {"case": f"mlp_synthetic_n{registered}_k{sampled}",
                "title": f"{registered:,} registered, {who}, MLP 64-64-10 (synthetic)",
                "registered": registered, "sampled": sampled, "rounds": rounds,
                "data": synthetic_data(registered), "model": {"name": "mlp", "hidden": [64]},
                "lr": 0.1}
        if registered * SAMPLES_PER_DEVICE > MAX_TRAIN_SAMPLES:
            # a population larger than the data set draws its devices' samples from it (with
            # replacement): 20 a device, never fewer than the minibatch
            spec["partition"] = {"scheme": "iid", "samples_per_device": SAMPLES_PER_DEVICE}
        specs.append(spec)
    return specs


def mlp_parameters(features: int, hidden: tuple[int, ...], classes: int) -> int:
    """d of the MLP features-[hidden]-classes (weights and biases)."""
    widths = (features, *hidden, classes)
    return sum(a * b + b for a, b in itertools.pairwise(widths))


def equivalence_spec() -> dict:
    """20 devices of exactly b samples, all taking part: deterministic minibatches."""
    return {"case": "equivalence_n20", "title": "equivalence: 20 devices of 10 samples",
            "registered": 20, "sampled": 20, "rounds": 3, "lr": 0.1,
            "data": synthetic_data(20, per_device=BATCH_SIZE),
            "model": {"name": "mlp", "hidden": [64]}}


def scenario_doc(spec: dict) -> dict:
    """The wirelessfl scenario of a case: FedAvg with E = 5, b = 10, uniform average, server_lr
    1, float32 uploads, the perfect channel, ``participation`` = sampled / registered,
    evaluated at rounds 0 and R only."""
    return {
        "name": spec["case"].replace("_", "-"), "seed": SEED, "channel": PERFECT_CHANNEL,
        "energy": ENERGY, "quantization_bits": FULL_PRECISION_BITS,
        "data": spec["data"], "model": spec["model"],
        "population": {"num_devices": spec["registered"]},
        **({"partition": spec["partition"]} if "partition" in spec else {}),
        "algorithms": [{"name": "fedavg", "local_steps": LOCAL_STEPS, "batch_size": BATCH_SIZE,
                        "lr": spec["lr"], "server_lr": 1.0, "average": "uniform",
                        "rounds": spec["rounds"], "eval_every": spec["rounds"] + 1,
                        "participation": spec["sampled"] / spec["registered"]}],
    }


# ---- helpers shared by the processes ----------------------------------------------------------
def peak_rss_mb() -> float:
    """This process's peak resident memory [MiB] (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def per_round_ms(stamps: list[float]) -> tuple[float, list[float]]:
    """ms per round from the end-of-round times of rounds 1..R: (mean over rounds 2..R, each)."""
    if len(stamps) < 2:
        raise ValueError(f"need at least 2 rounds to time, got {len(stamps)}")
    each = [1e3 * (b - a) for a, b in itertools.pairwise(stamps)]
    return 1e3 * (stamps[-1] - stamps[0]) / (len(stamps) - 1), each


def user_indices(order: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, user: int,
                 least: int = LOCAL_STEPS * BATCH_SIZE) -> np.ndarray:
    """Sample indices of pfl user ``user`` (= wirelessfl device ``user``): the device's own, in
    order, repeated cyclically up to ``least`` when it holds fewer (see the module docstring)."""
    own = order[offsets[user]:offsets[user] + sizes[user]]
    return np.resize(own, least) if len(own) < least else own


def _save_arrays(folder: Path, **arrays) -> None:
    for name, value in arrays.items():
        np.save(folder / f"{name}.npy", value)


def _load(folder: Path, name: str) -> np.ndarray:
    return np.load(folder / f"{name}.npy")


# ---- the child processes ------------------------------------------------------------------------
def child_prepare(spec: dict, folder: Path) -> dict:
    """Build the case's wirelessfl world; save what pfl's process needs; return the facts."""
    import wirelessfl as wf
    from wirelessfl.algorithms.participation import participant_count
    from wirelessfl.pipeline.build import build_world

    scenario = wf.load_scenario(scenario_doc(spec))
    world = build_world(scenario)
    ds = world.dataset
    sizes = np.array([len(s) for s in world.shards], dtype=np.int64)
    _save_arrays(folder, x_train=ds.x_train, y_train=ds.y_train, x_test=ds.x_test,
                 y_test=ds.y_test, order=np.concatenate(world.shards).astype(np.int64),
                 sizes=sizes, theta0=world.initial().cpu().numpy())
    params = scenario.algorithms[0]
    participants = participant_count(params.participation, world.num_devices)
    macs = _bench_rounds().round_macs(world.model_profile, params, participants)
    return {"d": int(world.flat.d), "input_shape": list(ds.input_shape),
            "num_classes": int(ds.num_classes), "participants": participants,
            "train_samples": len(ds.y_train), "test_samples": len(ds.y_test),
            "samples_per_device": [int(sizes.min()), int(sizes.max())],
            "gflop_per_round": 2 * macs / 1e9, "peak_rss_mb": peak_rss_mb()}


def child_wirelessfl(spec: dict, threads: int) -> dict:
    """Run the case's scenario in wirelessfl (the Python API's runner, in memory) and time it."""
    import wirelessfl as wf
    from wirelessfl.pipeline.runner import run_to_record

    scenario = wf.load_scenario(scenario_doc(spec))
    stamps: list[float] = []
    status, _, record = run_to_record(scenario, None, threads=threads,
                                      on_round=lambda _: stamps.append(time.perf_counter()))
    entry = record.manifest["algorithms"]["fedavg"]
    if entry.get("status") != "complete":
        raise RuntimeError(entry.get("message") or f"run {status}")
    rows = record.rounds
    ms, each = per_round_ms(stamps)
    return {"ms_per_round": ms, "round_ms": each, "peak_rss_mb": peak_rss_mb(),
            "initial_test_loss": float(rows["test_loss"].iloc[0]),
            "final_test_loss": float(rows["test_loss"].iloc[-1]),
            "final_param_norm": float(rows["param_norm"].iloc[-1]),
            "delivered_fraction": float(rows["delivered_fraction"].iloc[-1]),
            "threads": record.manifest.get("threads")}


def child_pfl(spec: dict, folder: Path, threads: int) -> dict:
    """Run the same FedAvg in pfl on the prepared data from the prepared theta_0, and time it."""
    import torch
    import torch.nn.functional as F
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel

    from wirelessfl.learning.models import build_model

    torch.set_num_threads(threads)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    facts = json.loads((folder / "facts.json").read_text())
    x, y = torch.from_numpy(_load(folder, "x_train")), torch.from_numpy(_load(folder, "y_train"))
    x_test = torch.from_numpy(_load(folder, "x_test"))
    y_test = torch.from_numpy(_load(folder, "y_test"))
    order, sizes = _load(folder, "order"), _load(folder, "sizes")
    offsets = np.cumsum(sizes) - sizes

    class Net(torch.nn.Module):
        """wirelessfl's model, with the ``loss`` and ``metrics`` PyTorchModel asks for."""

        def __init__(self):
            super().__init__()
            model = spec["model"]
            self.net = build_model(model["name"], facts["input_shape"], facts["num_classes"],
                                   model.get("hidden", (64,)), seed=SEED)

        def forward(self, inputs):
            return self.net(inputs)

        def loss(self, inputs, labels, eval=False):  # pfl passes eval=
            return F.cross_entropy(self(inputs), labels)

        @torch.no_grad()
        def metrics(self, inputs, labels, eval=False):
            loss = F.cross_entropy(self(inputs), labels, reduction="sum")
            return {"loss": Weighted(float(loss), len(labels))}

    net = Net()
    torch.nn.utils.vector_to_parameters(torch.from_numpy(_load(folder, "theta0")),
                                        net.parameters())

    @torch.no_grad()
    def test_loss() -> float:
        return float(F.cross_entropy(net(x_test), y_test))

    def make_user(user):
        idx = torch.from_numpy(user_indices(order, offsets, sizes, user))
        return Dataset((x[idx], y[idx]), user_id=user)

    registered, sampled = spec["registered"], facts["participants"]
    kind = "minimize_reuse" if sampled == registered else "random"
    users = FederatedDataset(make_user, get_user_sampler(kind, range(registered)))
    model = PyTorchModel(net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    train = NNTrainHyperParams(local_learning_rate=spec["lr"], local_num_epochs=None,
                               local_num_steps=LOCAL_STEPS, local_batch_size=BATCH_SIZE)
    rounds = spec["rounds"]
    algo = NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=rounds + 1,
                             train_cohort_size=sampled, val_cohort_size=None)
    stamps: list[float] = []

    class Stamp(TrainingProcessCallback):
        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            stamps.append(time.perf_counter())
            return False, Metrics()

    initial = test_loss()
    FederatedAveraging().run(algorithm_params=algo, backend=SimulatedBackend(users, users),
                             model=model, model_train_params=train, callbacks=[Stamp()],
                             send_metrics_to_platform=False)
    ms, each = per_round_ms(stamps)
    norm = float(torch.cat([p.detach().reshape(-1) for p in net.parameters()]).double().norm())
    return {"ms_per_round": ms, "round_ms": each, "peak_rss_mb": peak_rss_mb(),
            "initial_test_loss": initial, "final_test_loss": test_loss(),
            "final_param_norm": norm, "threads": torch.get_num_threads()}


def child_main(args) -> None:
    """One child process: prepare, wirelessfl or pfl; its result as JSON in ``args.result``."""
    spec = json.loads(Path(args.spec).read_text())
    folder = Path(args.data)
    if args.child == "prepare":
        result = child_prepare(spec, folder)
        (folder / "facts.json").write_text(json.dumps(result))
    elif args.child == "wirelessfl":
        result = child_wirelessfl(spec, args.threads)
    else:
        result = child_pfl(spec, folder, args.threads)
    Path(args.result).write_text(json.dumps(result))


# ---- the parent ------------------------------------------------------------------------------
def child_env() -> dict:
    """The children's environment: this checkout's wirelessfl first, pfl's torch on the CPU."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + path if path else "")
    env["PFL_PYTORCH_DEVICE"] = "cpu"
    return env


def failure_reason(stderr: str, code: int) -> str:
    """The last non-empty line of a failed child's stderr (the exception or UserError line)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1][:500] if lines else f"exit status {code}"


def run_child(command: list[str], result: Path, timeout_s: float,
              env: dict | None = None) -> tuple[dict | None, str | None]:
    """Run one child to completion or ``timeout_s``: (its JSON result, None) or (None, why)."""
    result.unlink(missing_ok=True)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              env=env, check=False)
    except subprocess.TimeoutExpired:
        return None, f"timeout {timeout_s:g} s"
    if done.returncode != 0 or not result.exists():
        return None, failure_reason(done.stderr, done.returncode)
    return json.loads(result.read_text()), None


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def compare(spec: dict, facts: dict | None, sides: dict) -> dict:
    """A case's row of the JSON: per simulator the repeats and their medians (null with the
    reason when it failed), the pfl / wirelessfl ratio, achieved GFLOP/s and the loss checks."""
    row = {key: spec[key] for key in ("case", "title", "registered", "sampled", "rounds")}
    row["rounds_timed"] = spec["rounds"] - 1
    row["facts"] = facts
    for name, (runs, error) in sides.items():
        if error is not None or not runs:
            row[name] = {"ms_per_round": None, "peak_rss_mb": None, "error": error or "not run"}
            continue
        row[name] = {
            "ms_per_round": statistics.median(r["ms_per_round"] for r in runs),
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
            "error": None, "repeats": runs,
            **{k: runs[-1][k] for k in ("initial_test_loss", "final_test_loss",
                                        "final_param_norm", "threads")}}
    ours, theirs = row["wirelessfl"]["ms_per_round"], row["pfl"]["ms_per_round"]
    row["pfl_over_wirelessfl"] = theirs / ours if ours and theirs else None
    gflop = facts["gflop_per_round"] if facts else None
    row["achieved_gflops"] = {name: (gflop / (row[name]["ms_per_round"] / 1e3)
                                     if gflop and row[name]["ms_per_round"] else None)
                              for name in sides}
    row["checks"] = loss_checks(row["wirelessfl"], row["pfl"])
    return row


def loss_checks(ours: dict, theirs: dict) -> dict | None:
    """Same data and theta_0: equal test loss at round 0; then finite, close final losses."""
    if ours.get("error") is not None or theirs.get("error") is not None:
        return None
    start = ours["initial_test_loss"]
    a, b = ours["final_test_loss"], theirs["final_test_loss"]
    return {"initial_loss_rel_diff": _relative(start, theirs["initial_test_loss"]),
            "initial_loss_match": _relative(start, theirs["initial_test_loss"])
            <= EQUIVALENCE_RTOL,
            "final_losses_finite": bool(math.isfinite(a) and math.isfinite(b)),
            "final_loss_diff_over_initial": abs(a - b) / start,
            "final_losses_close": bool(math.isfinite(a) and math.isfinite(b)
                                       and abs(a - b) <= LOSS_TOLERANCE * start)}


def equivalence_verdict(row: dict) -> dict:
    """The equivalence case's check: round-0 loss, final loss and parameter norm agree."""
    ours, theirs = row["wirelessfl"], row["pfl"]
    if ours.get("error") is not None or theirs.get("error") is not None:
        return {"passed": False, "error": ours.get("error") or theirs.get("error")}
    diffs = {key: _relative(ours[key], theirs[key])
             for key in ("initial_test_loss", "final_test_loss", "final_param_norm")}
    return {"passed": all(v <= EQUIVALENCE_RTOL for v in diffs.values()),
            "rtol": EQUIVALENCE_RTOL, "rel_diffs": diffs,
            "wirelessfl": {k: ours[k] for k in diffs}, "pfl": {k: theirs[k] for k in diffs}}


def run_spec(spec: dict, repeats: int, timeout_s: float, threads: dict, work: Path) -> dict:
    """Prepare one case, then time the simulators ``repeats`` times, interleaved; ``threads``:
    host threads per simulator (those absent are not run)."""
    folder = work / spec["case"]
    folder.mkdir(parents=True, exist_ok=True)
    spec_file, result = folder / "spec.json", folder / "result.json"
    spec_file.write_text(json.dumps(spec))
    env = child_env()

    def command(kind: str) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--spec",
                str(spec_file), "--data", str(folder), "--result", str(result),
                "--threads", str(threads.get(kind, 1))]

    facts, error = run_child(command("prepare"), result, timeout_s, env)
    sides: dict[str, tuple[list, str | None]] = {
        "wirelessfl": ([], None), "pfl": ([], None if facts else f"no data: prepare: {error}")}
    if facts is None:
        sides["wirelessfl"] = ([], f"prepare: {error}")
    for name in SIMULATORS:
        if name not in threads:
            sides[name] = ([], "not run (--simulators)")
    for r in range(repeats):
        for name in (SIMULATORS if r % 2 == 0 else SIMULATORS[::-1]):
            runs, failed = sides[name]
            if failed is not None:
                continue  # a failure or timeout is not repeated
            out, failed = run_child(command(name), result, timeout_s, env)
            sides[name] = (runs + [out] if out else runs, failed)
    shutil.rmtree(folder, ignore_errors=True)
    return compare(spec, facts, sides)


def pfl_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pfl")
    except PackageNotFoundError:
        return None


def machine_facts(threads: dict) -> dict:
    import torch

    return {"platform": platform.platform(), "processor": platform.processor(),
            "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "cpus_available": len(os.sched_getaffinity(0)), "threads": threads,
            "torch": torch.__version__, "pfl": pfl_version()}


def summary(results: list[dict], equivalence: dict | None, peak: float, args,
            load_before: float) -> dict:
    """The JSON written to --out; ``load_before``: the 1-minute load average at the start (the
    machine's own load is recorded with the timings: they need a quiet machine)."""
    for row in results:
        rates = row["achieved_gflops"]
        row["peak_fraction"] = {k: (v / peak if v else None) for k, v in rates.items()}
    machine = machine_facts({"wirelessfl": args.threads, "pfl": args.pfl_threads})
    machine["load_average"] = [load_before, os.getloadavg()[0]]
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "benchmarks/bench_peers.py " + " ".join(sys.argv[1:]),
        "machine": machine,
        "settings": {"local_steps": LOCAL_STEPS, "batch_size": BATCH_SIZE,
                     "quantization_bits": FULL_PRECISION_BITS, "channel": PERFECT_CHANNEL,
                     "energy": ENERGY, "seed": SEED, "samples_per_device": SAMPLES_PER_DEVICE,
                     "max_train_samples": MAX_TRAIN_SAMPLES, "repeats": args.repeats,
                     "case_timeout_s": args.case_timeout, "quick": args.quick,
                     "simulators": list(args.simulators),
                     "timing": "end of round 1 to end of round R over R - 1 (round hooks)"},
        "matmul_peak_gflops": peak,
        "equivalence": equivalence,
        "cases": results,
    }


def _fmt(value, spec: str, none: str = "null") -> str:
    return none if value is None else format(value, spec)


def print_row(row: dict) -> None:
    ours, theirs = row["wirelessfl"], row["pfl"]
    checks = row["checks"] or {}
    print(f"{row['case']:<30} wirelessfl {_fmt(ours['ms_per_round'], '9.2f')} ms "
          f"{_fmt(ours['peak_rss_mb'], '6.0f')} MB | pfl {_fmt(theirs['ms_per_round'], '9.2f')} ms "
          f"{_fmt(theirs['peak_rss_mb'], '6.0f')} MB | pfl/wirelessfl "
          f"{_fmt(row['pfl_over_wirelessfl'], '6.2f')}x | theta_0 loss match "
          f"{checks.get('initial_loss_match')}, final close {checks.get('final_losses_close')}",
          flush=True)
    for name in ("wirelessfl", "pfl"):
        if row[name]["error"]:
            print(f"    {name}: {row[name]['error']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/bench_peers.json")
    parser.add_argument("--repeats", type=int, default=None,
                        help="processes per simulator and case (default 3, --quick 1)")
    parser.add_argument("--quick", action="store_true",
                        help=f"populations up to {QUICK_MAX_DEVICES:,} devices only (smoke test)")
    parser.add_argument("--only", nargs="+", metavar="CASE", help="run only these cases")
    parser.add_argument("--case-timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="time limit of each process [s]")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="host threads of each simulator (default: the CPUs available)")
    parser.add_argument("--pfl-threads", type=int, default=None,
                        help="torch intra-op threads of pfl's processes (default: --threads)")
    parser.add_argument("--simulators", nargs="+", choices=SIMULATORS, default=SIMULATORS,
                        help="run only these simulators (the others are recorded as not run)")
    parser.add_argument("--skip-equivalence", action="store_true")
    parser.add_argument("--child", choices=("prepare", "wirelessfl", "pfl"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return
    if pfl_version() is None:
        sys.exit("pfl is not installed in this Python; see benchmarks/README.md "
                 "(bench_peers.py) for installing it on the side")
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.pfl_threads = args.pfl_threads or args.threads
    threads = {name: n for name, n in (("wirelessfl", args.threads), ("pfl", args.pfl_threads))
               if name in args.simulators}
    specs = case_specs(args.quick)
    if args.only:
        known = {s["case"] for s in case_specs()}
        unknown = sorted(set(args.only) - known)
        if unknown:
            sys.exit(f"--only: unknown case(s) {unknown}; the cases are {sorted(known)}")
        specs = [s for s in case_specs() if s["case"] in args.only]
    import torch

    load_before = os.getloadavg()[0]
    torch.set_num_threads(args.threads)
    bench_rounds = _bench_rounds()
    peak = bench_rounds.matmul_peak_gflops(threads=args.threads)
    print(f"float32 matmul peak: {peak:.1f} GFLOP/s ({args.threads} threads); pfl "
          f"{pfl_version()}, torch {torch.__version__}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    try:
        equivalence = None
        if not args.skip_equivalence and len(threads) == len(SIMULATORS):
            row = run_spec(equivalence_spec(), 1, args.case_timeout, threads, work)
            equivalence = equivalence_verdict(row)
            print(f"equivalence (20 devices of 10 samples, 3 rounds): {equivalence}", flush=True)
        results = []
        for spec in specs:
            row = run_spec(spec, args.repeats, args.case_timeout, threads, work)
            # Re-measured between cases: fractions against the best rate seen.
            peak = max(peak, bench_rounds.matmul_peak_gflops(sizes=(1024,), repeats=5,
                                                             threads=args.threads))
            results.append(row)
            print_row(row)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    with open(args.out, "w") as fh:
        json.dump(summary(results, equivalence, peak, args, load_before), fh, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
