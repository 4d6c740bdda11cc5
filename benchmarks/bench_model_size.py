"""Devices' local SGD against model size: the stacked path, the device-by-device chain and a plain
per-device torch loop of the same work, on one thread.

The work is FedAvg's on-device part of one round: 100 devices, each taking E = 5 SGD steps on
minibatches of b = 10 of its own 20 samples (synthetic, 64 features, 10 classes), from the same
theta_0, for MLPs 64-[hidden]-10 of d from ~10^3 to ~10^7 parameters. Three ways, timed
interleaved in one process (``--repeats`` rounds, best and median kept), one intra-op thread and
no worker pool:

* ``stacked``: every device at once, one batched matrix product per layer for all devices
  (learning/stacked.py, the ``linear`` strategy, forced);
* ``per-device``: device by device as a chain (learning/conv_chain.py, forced), each device's
  steps in turn, its model and gradient in the core's cache;
* ``plain loop``: what a user writes (and what pfl-research runs per user): one torch module, the
  device's theta loaded into it, ``torch.optim.SGD`` and autograd, step after step.

Each way's devices' models are summed as they come (FedAvg's aggregation: wirelessfl's chunks
with ``local_sgd(reuse=True)``, as FedAvg asks for them), so no way holds all 100 models at once.
``chosen`` is the strategy wirelessfl takes for that d (``stacked.PER_DEVICE_MIN_PARAMETERS``):
this benchmark is where that constant comes from. The three sums must agree (max |difference|
over 100 x max |theta| below ``AGREEMENT``: float32 summation orders differ). GFLOP/s counts 2 x MACs,
a backward pass as twice the forward's MACs, against the one-thread float32 matmul peak measured
in the same process (benchmarks/bench_rounds.py).

    python benchmarks/bench_model_size.py [--out benchmarks/model_size.json] [--repeats 3]
        [--quick] [--device cuda]

``--device cuda`` runs the three ways on the GPU (timed between ``torch.cuda.synchronize``
calls, against the GPU's float32 matmul peak measured in the same process) and the stacked way at
every d: the GPU holds all devices' models at once (``--out benchmarks/model_size_cuda.json`` records it;
there is no GPU in CI).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from wirelessfl.learning import stacked
from wirelessfl.learning.flat_model import FlatModel
from wirelessfl.learning.models import build_model
from wirelessfl.learning.seeds import keyed_generator
from wirelessfl.pipeline.build import deterministic_gpu
from wirelessfl.problems.classifier import BatchedEvaluator, DeviceData

BENCH_DIR = Path(__file__).resolve().parent
DEVICES, SAMPLES, LOCAL_STEPS, BATCH = 100, 20, 5, 10  # [D] the 100-client MLP case
FEATURES, CLASSES, LR = 64, 10, 0.05
# [D] hidden widths: d = 1,210 ... 8,546,314 (about 10^3 to 10^7)
WIDTHS = ((16,), (64,), (256,), (128, 128), (256, 256), (1024,), (512, 512), (1024, 1024),
          (2048, 2048, 2048))
QUICK_WIDTHS = ((16,), (256,), (1024,))
# [D] above this d the stacked path is not run: n d floats several times over (3.4 GB a copy at
# 8.5M parameters and 100 devices) and minutes a repeat, where it is slower long before
STACKED_MAX_D = 2_000_000
AGREEMENT = 1e-4  # [D] max |difference| / max |theta| after 5 float32 steps
# wirelessfl's own thresholds, read before ``evaluator`` sets the module's for each forced path
PER_DEVICE_MIN_PARAMETERS = stacked.PER_DEVICE_MIN_PARAMETERS
PER_DEVICE_MIN_PARAMETERS_GPU = stacked.PER_DEVICE_MIN_PARAMETERS_GPU


def _bench_rounds():
    spec = importlib.util.spec_from_file_location("bench_rounds", BENCH_DIR / "bench_rounds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mlp_macs(hidden: tuple[int, ...]) -> int:
    """Multiply-adds of one sample's forward pass through 64-[hidden]-10."""
    widths = (FEATURES, *hidden, CLASSES)
    return sum(a * b for a, b in itertools.pairwise(widths))


def evaluator(hidden: tuple[int, ...], thresholds: tuple[int, int | None],
              device: str = "cpu") -> BatchedEvaluator:
    """The case's devices and model on ``device``, with the strategy thresholds ``thresholds``
    (on a CPU, on a GPU: stacked.PER_DEVICE_MIN_PARAMETERS and its _GPU)."""
    stacked.PER_DEVICE_MIN_PARAMETERS, stacked.PER_DEVICE_MIN_PARAMETERS_GPU = thresholds
    gen = torch.Generator().manual_seed(0)
    total = DEVICES * SAMPLES
    x = torch.randn(total, FEATURES, generator=gen).numpy()
    y = torch.randint(0, CLASSES, (total,), generator=gen).numpy()
    shards = [np.arange(i * SAMPLES, (i + 1) * SAMPLES) for i in range(DEVICES)]
    data = DeviceData.from_shards(x, y, shards, x[:5], y[:5], device)
    model = build_model("mlp", (FEATURES,), CLASSES, hidden=hidden, seed=0).to(device)
    ev = BatchedEvaluator(FlatModel(model), data, activations_per_sample=sum(hidden) + CLASSES,
                          input_size=FEATURES)
    ev.hidden = hidden
    return ev


def plain_loop(ev: BatchedEvaluator, theta: torch.Tensor, idx: torch.Tensor,
               net: torch.nn.Module | None = None) -> torch.Tensor:
    """Each device in turn: load theta into one module (``net``, default the case's MLP),
    E steps of torch.optim.SGD; the sum of the devices' models (what FedAvg aggregates)."""
    if net is None:
        net = build_model("mlp", (FEATURES,), CLASSES, hidden=ev.hidden, seed=0).to(theta.device)
    params = list(net.parameters())
    out = torch.zeros(len(theta), device=theta.device)
    for i in range(idx.shape[1]):
        with torch.no_grad():  # a copy: vector_to_parameters would make them views of theta
            for p, value in zip(params, ev.flat.unflatten(theta).values()):
                p.copy_(value)
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        for e in range(idx.shape[0]):
            rows = idx[e, i]
            loss = F.cross_entropy(net(ev.data.inputs(rows)), ev.data.labels(rows))
            opt.zero_grad()
            loss.backward()
            opt.step()
        out += torch.nn.utils.parameters_to_vector(net.parameters()).detach()
    return out


def summed(ev: BatchedEvaluator, theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """wirelessfl's local SGD, chunk after chunk as FedAvg consumes it (``reuse``), summed."""
    out = torch.zeros(len(theta), device=theta.device)
    for _, models in ev.local_sgd(theta, idx, LR, reuse=True):
        out += models.sum(0)
    return out


def timed(call: Callable[[], object], device: str) -> float:
    """Seconds ``call`` takes, the GPU's queued work included (synchronised before and after)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    call()
    sync()
    return time.perf_counter() - start


def cuda_matmul_peak_gflops(size: int = 8192, repeats: int = 10) -> float:
    """Best float32 matmul rate on the GPU (torch's default: no TF32)."""
    a = torch.randn(size, size, device="cuda")
    b = torch.randn(size, size, device="cuda")
    for _ in range(3):
        a @ b
    return 2 * size**3 / min(timed(lambda: a @ b, "cuda") for _ in range(repeats)) / 1e9


def run_case(hidden: tuple[int, ...], repeats: int, device: str = "cpu") -> dict:
    evs = {"stacked": evaluator(hidden, (10**15, None), device),
           "per-device": evaluator(hidden, (0, 0), device)}
    chosen_ev = evaluator(hidden, (PER_DEVICE_MIN_PARAMETERS, PER_DEVICE_MIN_PARAMETERS_GPU),
                          device)
    d = chosen_ev.flat.d
    assert evs["stacked"].stacked.strategy == "linear"
    assert evs["per-device"].stacked.strategy == "per-device"
    theta = chosen_ev.flat.initial()
    idx = chosen_ev.sample(keyed_generator(0, "bench", 0), BATCH, steps=LOCAL_STEPS)
    calls = {"stacked": lambda: summed(evs["stacked"], theta, idx),
             "per-device": lambda: summed(evs["per-device"], theta, idx),
             "plain loop": lambda: plain_loop(chosen_ev, theta, idx)}
    if d > STACKED_MAX_D and device == "cpu":
        calls.pop("stacked")
    times: dict[str, list[float]] = {name: [] for name in calls}
    results = {}
    for name, call in calls.items():  # warm-up, and the results compared
        results[name] = call()
    for _ in range(repeats):
        for name, call in calls.items():
            times[name].append(timed(call, device))
    scale = float(theta.abs().max()) * DEVICES  # the results are sums over the devices
    reference = results["plain loop"]
    agreement = {name: float((r - reference).abs().max()) / scale
                 for name, r in results.items() if name != "plain loop"}
    flop = 2 * 3 * mlp_macs(hidden) * DEVICES * LOCAL_STEPS * BATCH
    return {"hidden": list(hidden), "d": d, "gflop": flop / 1e9,
            "chosen": "per-device" if chosen_ev.stacked.strategy == "per-device" else "stacked",
            "ms": {name: {"best": 1e3 * min(t), "median": 1e3 * statistics.median(t),
                          "repeats": [1e3 * v for v in t]} for name, t in times.items()},
            "not_run": ({"stacked": f"d above {STACKED_MAX_D:,} [D]"}
                        if "stacked" not in calls else {}),
            "agreement": agreement, "agree": all(v <= AGREEMENT for v in agreement.values())}


def machine_facts(load: tuple[float, ...]) -> dict:
    """The recording machine, and its load average at the start (``load``) and now."""
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "load_average_start": load[0], "load_average_end": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/model_size.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="three small sizes (smoke test)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    if args.device == "cuda":  # as a run on the GPU computes (no TF32)
        deterministic_gpu()
    torch.set_num_threads(1)
    peak = (cuda_matmul_peak_gflops() if args.device == "cuda"
            else _bench_rounds().matmul_peak_gflops(threads=1))
    load = os.getloadavg()
    print(f"{args.device} float32 matmul peak: {peak:.1f} GFLOP/s; load average {load[0]:.2f}",
          flush=True)
    cases = []
    for hidden in QUICK_WIDTHS if args.quick else WIDTHS:
        case = run_case(hidden, args.repeats, args.device)
        for side in case["ms"].values():
            side["gflops"] = case["gflop"] / (side["best"] / 1e3)
            side["peak_fraction"] = side["gflops"] / peak
        cases.append(case)
        print(f"d = {case['d']:>10,}  " + "  ".join(
            f"{name} {side['best']:9.1f} ms ({100 * side['peak_fraction']:4.1f} %)"
            for name, side in case["ms"].items())
            + f"  chosen {case['chosen']}, agree {case['agree']}", flush=True)
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
           "command": "benchmarks/bench_model_size.py " + " ".join(sys.argv[1:]),
           "machine": machine_facts(load),
           "settings": {"device": args.device, "devices": DEVICES, "samples_per_device": SAMPLES,
                        "local_steps": LOCAL_STEPS, "batch_size": BATCH, "lr": LR,
                        "repeats": args.repeats, "threads": 1, "agreement_tolerance": AGREEMENT,
                        "stacked_max_d": STACKED_MAX_D},
           "per_device_min_parameters": PER_DEVICE_MIN_PARAMETERS,
           "per_device_min_parameters_gpu": PER_DEVICE_MIN_PARAMETERS_GPU,
           "matmul_peak_gflops_one_thread": peak,  # the GPU's with --device cuda
           "cases": cases}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    if not all(c["agree"] for c in cases) or any(math.isnan(v) for c in cases
                                                 for v in c["agreement"].values()):
        sys.exit("the strategies disagree beyond the tolerance: see the JSON")


if __name__ == "__main__":
    main()
