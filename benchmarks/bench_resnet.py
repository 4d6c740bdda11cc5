"""ResNet-18 (CIFAR variant, d = 11,173,962, batch norm per device) on 32x32x3 inputs: FedAvg's
on-device work of one round in wirelessfl against a plain torch loop doing the same work.

The work: 10 devices, each taking E = 2 SGD steps on minibatches of b = 32 of its own 64
samples (synthetic images, 10 classes), from the same theta_0; the devices' models summed as they
come (FedAvg's aggregation). Three ways, timed interleaved in one process (``--repeats``, best
and median kept):

* ``wirelessfl``: the evaluator's ``local_sgd(reuse=True)`` as FedAvg calls it (learning/stacked.py,
  the per-device strategy; each device normalising with its own minibatch's statistics), its
  devices spread over the run's thread pool (``threads`` pool threads of one intra-op thread
  each, host/threads.py) within each chunk of the default memory bound (``engine.max_chunk_mb``
  1,024: one device a chunk here);
* ``wirelessfl, max_chunk_mb 8192``: the same with a bound that holds all 10 devices at once;
* ``plain loop``: what a user writes: one torch module in training mode, each device's theta
  loaded into it in turn, ``torch.optim.SGD`` and autograd, torch's own intra-op threads
  (``torch.set_num_threads(threads)``).

Each is run with 1 and with 2 threads. The two sums must agree (max |difference| / (10 max
|theta|) below ``AGREEMENT``: channels-last and NCHW kernels sum in other orders). GFLOP/s counts
2 x MACs, the backward pass as twice the forward's (555,422,720 MACs a sample, docs/energy.md).

    python benchmarks/bench_resnet.py [--out benchmarks/resnet.json] [--repeats 2]
        [--device cuda]

``--device cuda`` runs all three on the GPU, timed between ``torch.cuda.synchronize`` calls, with
one host thread (the threads setting is a CPU one; ``--out benchmarks/resnet_cuda.json`` records
it; there is no GPU in CI).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from wirelessfl.energy.profiler import profile_model
from wirelessfl.host import threads
from wirelessfl.learning.flat_model import FlatModel
from wirelessfl.learning.models import build_model
from wirelessfl.learning.seeds import keyed_generator
from wirelessfl.pipeline.build import deterministic_gpu
from wirelessfl.problems.classifier import BatchedEvaluator, DeviceData

BENCH_DIR = Path(__file__).resolve().parent
DEVICES, SAMPLES, LOCAL_STEPS, BATCH = 10, 64, 2, 32  # [D] 10 devices as issue 36 asks
SHAPE, CLASSES, LR = (3, 32, 32), 10, 0.05  # LR: also bench_model_size.summed's
MACS_PER_SAMPLE = 555_422_720  # tests/test_profiler.py derives it by hand
# [D] a memory bound that holds all 10 devices in one chunk (the default 1,024 MB holds one at
# b = 32: the rule counts three copies of each of the 1.23M activations a sample), so the pool's
# threads can take devices side by side
WIDE_CHUNK_MB = 8192.0
WIDE = "wirelessfl, max_chunk_mb 8192"
AGREEMENT = 1e-3  # [D] max |difference| / (DEVICES max |theta|) after 2 float32 steps


def evaluator(max_chunk_mb: float = 1024.0, device: str = "cpu") -> BatchedEvaluator:
    """The case's devices and model, the evaluator sized as a run sizes it (the profiler's
    activations a sample, ``engine.max_chunk_mb``)."""
    gen = torch.Generator().manual_seed(0)
    total = DEVICES * SAMPLES
    x = torch.rand((total, *SHAPE), generator=gen).numpy()
    y = torch.randint(0, CLASSES, (total,), generator=gen).numpy()
    shards = [np.arange(i * SAMPLES, (i + 1) * SAMPLES) for i in range(DEVICES)]
    data = DeviceData.from_shards(x, y, shards, x[:8], y[:8], device)
    model = build_model("resnet18-cifar", SHAPE, CLASSES, seed=0)
    activations = profile_model(model, SHAPE).activations_per_sample
    model = model.to(device)
    return BatchedEvaluator(FlatModel(model), data, activations_per_sample=activations,
                            input_size=int(np.prod(SHAPE)), max_chunk_mb=max_chunk_mb)


def _bench_model_size():
    spec = importlib.util.spec_from_file_location("bench_model_size",
                                                  BENCH_DIR / "bench_model_size.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_setting(reference, evs: dict[str, BatchedEvaluator], theta: torch.Tensor,
                idx: torch.Tensor, count: int, repeats: int) -> dict:
    """Both ways at ``count`` threads; ``reference`` is bench_model_size (its summed local SGD
    and plain loop, at its LR: this one's, 0.05)."""
    ev = evs["default"]
    net = copy.deepcopy(ev.flat.model).train()  # the plain loop's one module

    def ours(ev: BatchedEvaluator):
        threads.configure(used=count)
        return reference.summed(ev, theta, idx)  # local SGD as FedAvg consumes it

    def plain():
        threads.configure(used=1)
        torch.set_num_threads(count)
        try:
            return reference.plain_loop(ev, theta, idx, net=net)
        finally:
            torch.set_num_threads(1)

    calls = {"wirelessfl": lambda: ours(evs["default"]),
             WIDE: lambda: ours(evs["wide"]), "plain loop": plain}
    results = {name: call() for name, call in calls.items()}  # warm-up, compared
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            times[name].append(reference.timed(call, theta.device.type))
    scale = float(theta.abs().max()) * DEVICES
    agreement = max(float((results[name] - results["plain loop"]).abs().max()) / scale
                    for name in ("wirelessfl", WIDE))
    flop = 2 * 3 * MACS_PER_SAMPLE * DEVICES * LOCAL_STEPS * BATCH
    ms = {name: {"best": 1e3 * min(t), "median": 1e3 * statistics.median(t),
                 "repeats": [1e3 * v for v in t], "gflops": flop / 1e9 / min(t)}
          for name, t in times.items()}
    return {"threads": count, "ms": ms,
            "chunk_devices": {name: evs[key].chunk_size(BATCH, own_model=True)
                              for name, key in (("wirelessfl", "default"), (WIDE, "wide"))},
            "ratio_plain_over_ours": ms["plain loop"]["best"] / ms["wirelessfl"]["best"],
            "agreement": agreement, "agree": agreement <= AGREEMENT}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/resnet.json")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    if args.device == "cuda":  # as a run on the GPU computes (no TF32)
        deterministic_gpu()
    threads.configure(used=1)
    reference = _bench_model_size()
    evs = {"default": evaluator(device=args.device),
           "wide": evaluator(WIDE_CHUNK_MB, args.device)}
    ev = evs["default"]
    assert ev.stacked.strategy == "per-device" and ev.threaded
    theta = ev.flat.initial()
    idx = ev.sample(keyed_generator(0, "bench", 0), BATCH, steps=LOCAL_STEPS)
    load = os.getloadavg()
    print(f"ResNet-18 d = {ev.flat.d:,}; load average {load[0]:.2f}", flush=True)
    settings = []
    for count in (1, 2) if args.device == "cpu" else (1,):
        case = run_setting(reference, evs, theta, idx, count, args.repeats)
        settings.append(case)
        print(f"{count} thread(s): " + "  ".join(
            f"{name} {side['best']:9.0f} ms ({side['gflops']:5.1f} GFLOP/s)"
            for name, side in case["ms"].items())
            + f"  plain/ours {case['ratio_plain_over_ours']:.2f}x, agree {case['agree']}",
            flush=True)
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
           "command": "benchmarks/bench_resnet.py " + " ".join(sys.argv[1:]),
           "machine": reference.machine_facts(load),
           "settings": {"device": args.device, "model": "resnet18-cifar", "d": ev.flat.d, "devices": DEVICES,
                        "samples_per_device": SAMPLES, "local_steps": LOCAL_STEPS,
                        "batch_size": BATCH, "lr": LR, "repeats": args.repeats,
                        "agreement_tolerance": AGREEMENT},
           "cases": settings}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    if not all(c["agree"] for c in settings):
        sys.exit("wirelessfl and the plain loop disagree beyond the tolerance: see the JSON")


if __name__ == "__main__":
    main()
