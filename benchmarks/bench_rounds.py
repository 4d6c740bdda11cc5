"""Host cost of simulated rounds: wirelessfl against a plain per-device loop of the same learning work.

For each case, in one process and interleaved (loop, wirelessfl, loop, wirelessfl, ...), it times
(a) a plain Python loop over devices doing the learning work with ordinary autograd (the way a
notebook would) and (b) the project's full simulated round (engine, channel, energy, ledger
included). It reports per-round host time, achieved GFLOP/s against a measured float32 matmul peak,
the ratio (a)/(b), the engine overhead (share of a round spent outside learning compute) and the
process's peak memory. Each case runs in a fresh process, so peak memory is the case's own. For
FedAvg on the seed-002 CNN it also times (c), interleaved, the round's convolution kernels alone
(the same calls on the devices' own activations, on the same pool): the fraction of the peak the
round could reach were nothing but those kernels to take time, and the share of that bound the
round reaches.

    python benchmarks/bench_rounds.py [--out results.json] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import time

import torch
import torch.nn.functional as F

CHANNEL, ENERGY = "seed002-cell", "seed002-accelerator"


def case_specs(quick: bool) -> list[dict]:
    digits_mlp = {"data": {"name": "digits"}, "model": {"name": "mlp", "hidden": [64]}}
    digits_cnn = {"data": {"name": "digits28", "positive_classes": [1, 3, 5, 7, 9]},
                  "model": {"name": "seed002-cnn"}}
    specs = [
        {"case": "mlp_fedavg", "n": 50, "rounds": 20, **digits_mlp,
         "algorithm": {"name": "fedavg", "local_steps": 5, "batch_size": 10, "lr": 0.1}},
        {"case": "cnn_fedavg", "n": 10, "rounds": 5, **digits_cnn,
         "algorithm": {"name": "fedavg", "local_steps": 5, "batch_size": 10, "lr": 0.05}},
        {"case": "cnn_dzofl", "n": 50, "rounds": 3, **digits_cnn,
         "algorithm": {"name": "dzofl", "batch_size": 10}},
    ]
    for n, rounds in ((10, 100), (100, 50), (1000, 10), (10000, 3)):
        if quick and n > 1000:
            continue
        specs.append({"case": f"mlp_dzofl_n{n}", "n": n, "rounds": rounds,
                      "data": {"name": "synthetic", "synthetic": {
                          "num_samples": max(4000, 25 * n), "num_features": 64,
                          "num_classes": 10, "informative": 16}},
                      "model": {"name": "mlp", "hidden": [64]},
                      "algorithm": {"name": "dzofl", "batch_size": 10}})
    # The same 1,000-device round on a shared pool (100 sub-bands, round-robin): the scheduler's
    # cost in the engine's budget.
    shared = dict(specs[-1] if quick else specs[-2])
    shared.update(case="mlp_dzofl_n1000_shared", channel={
        "profile": CHANNEL, "uplink": {"spectrum": {
            "mode": "shared", "pool_bandwidth_hz": 200e6, "channels": 100}}})
    specs.append(shared)
    return specs


def matmul_peak_gflops(sizes=(1024, 2048), repeats: int = 20, threads: int | None = None
                       ) -> float:
    """Best float32 matmul rate over square sizes and repeats (a noisy neighbour only lowers
    it), with ``threads`` intra-op threads (default: the CPUs this process may use, all a run's
    pool of single-threaded workers can use together), whatever the caller's own setting
    (restored after). The one peak of bench_rounds.py and bench_peers.py: a fraction measured
    against a one-thread rate (a run's own setting, host/threads.py) would be inflated."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    try:
        rates = []
        for size in sizes:
            a, b = torch.randn(size, size), torch.randn(size, size)
            for _ in range(3):
                a @ b
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                a @ b
                best = min(best, time.perf_counter() - start)
            rates.append(2 * size**3 / best / 1e9)
    finally:
        torch.set_num_threads(before)
    return max(rates)


def _loop_round(world, params, k: int) -> float:
    """(a): the same learning work as one round, device by device, with ordinary autograd and
    torch's own intra-op threads on every core (as a notebook runs it)."""
    from wirelessfl.host.threads import cpu_count

    torch.set_num_threads(cpu_count())
    try:
        return _plain_loop(world, params, k)
    finally:
        torch.set_num_threads(1)  # back to what the project's rounds use


def _plain_loop(world, params, k: int) -> float:
    from wirelessfl.learning.seeds import keyed_generator

    ev, flat, model = world.evaluator, world.flat, world.flat.model
    theta = flat.initial()
    start = time.perf_counter()
    if params.name == "fedavg":
        idx = ev.sample(keyed_generator(0, "batch", k), params.batch_size, params.local_steps)
        for i in range(world.num_devices):
            torch.nn.utils.vector_to_parameters(theta.clone(), model.parameters())
            for p in model.parameters():
                p.requires_grad_(True)
            opt = torch.optim.SGD(model.parameters(), lr=params.lr)
            for e in range(params.local_steps):
                opt.zero_grad()
                F.cross_entropy(model(ev.data.x[idx[e, i]]), ev.data.y[idx[e, i]]).backward()
                opt.step()
            _ = torch.nn.utils.parameters_to_vector(model.parameters()) - theta
    else:  # dzofl: two forward passes per device at theta +- gamma phi
        idx = ev.sample(keyed_generator(0, "batch", k), params.batch_size)[0]
        phi = torch.randn(flat.d)
        with torch.no_grad():
            for i in range(world.num_devices):
                for sign in (1.0, -1.0):
                    torch.nn.utils.vector_to_parameters(theta + sign * 1e-3 * phi,
                                                        model.parameters())
                    F.cross_entropy(model(ev.data.x[idx[i]]), ev.data.y[idx[i]])
    return time.perf_counter() - start


def _kernel_round(world, params, k: int):
    """(c), for FedAvg on a model run as a convolutional chain (learning/conv_chain.py; None
    otherwise): a timer of the round's convolution kernels alone. The same calls the chain's
    local SGD makes (its forward ``F.conv2d`` and its backward ``_conv_backward``, layouts
    included, on one device's minibatch each), on the devices' own recorded activations, E
    steps a device, a device a task of the run's pool. With nothing else in the round taking
    time it would reach this rate: the bound the kernels set. (DZOFL's passes at the shared
    model take several devices' samples a call, so a per-device replay would not be its
    kernels.) Preparation (recording the activations) is outside the returned timer."""
    from wirelessfl.host.threads import parallel_map
    from wirelessfl.learning.conv_chain import _Conv
    from wirelessfl.learning.seeds import keyed_generator
    from wirelessfl.learning.stacked import to_channels_last

    ev, chain = world.evaluator, world.evaluator.stacked.chain
    if chain is None or params.name != "fedavg":
        return None
    theta = world.flat.initial()
    idx = ev.sample(keyed_generator(0, "batch", k), params.batch_size)[0]
    convs = [(j, step) for j, step in enumerate(chain.head) if isinstance(step, _Conv)]

    def prepare(i: int) -> list:
        with torch.no_grad():
            saved = chain.record(theta, ev.data.inputs(idx[i]))[0]
        work = []
        for j, step in convs:
            h, weight = saved[j]
            bias = None if step.bias is None else theta[step.bias]
            args = (step.stride, step.padding, step.dilation, step.groups)
            out = F.conv2d(h, weight, bias, *args)
            work.append((step, h, weight, bias, args, to_channels_last(torch.randn(out.shape))))
        return work

    devices = parallel_map(prepare, range(world.num_devices))

    @torch.no_grad()
    def device(work: list) -> None:
        grad = torch.empty(world.flat.d)
        for _ in range(params.local_steps):
            for step, h, weight, bias, args, g in work:
                F.conv2d(h, weight, bias, *args)
                chain._conv_backward(step, g, h, weight, grad)

    def timed() -> float:
        start = time.perf_counter()
        parallel_map(device, devices)
        return time.perf_counter() - start

    return timed


def _project_rounds(world, params) -> tuple[float, float]:
    """(b): the full simulated rounds; returns (host s per round, learning-compute s per round)."""
    from wirelessfl.pipeline.simulation import run_algorithm

    ev = world.evaluator
    eval_start, compute_at_start = time.perf_counter(), ev.compute_s
    ev.metrics(world.flat.initial())
    # evaluated at round 0 and the last round: its host time and the compute it adds to the
    # evaluator's clock (the training loss's pass) are taken out of both figures
    evaluation = time.perf_counter() - eval_start
    compute_before = ev.compute_s
    eval_compute = compute_before - compute_at_start
    start = time.perf_counter()
    run_algorithm(world, params)
    total = time.perf_counter() - start - 2 * evaluation
    compute = ev.compute_s - compute_before - 2 * eval_compute
    return total / params.rounds, compute / params.rounds


def round_macs(profile, params, devices: int) -> int:
    """MACs of one round's learning work on ``devices`` devices (2 x MACs = FLOPs): FedAvg runs
    E local steps of a forward and a backward pass (a backward pass = 2 x forward MACs) on b
    samples each; DZOFL two forward passes on b samples. ``profile``: the world's model_profile;
    ``params``: the algorithm's parameters (name, batch_size, local_steps)."""
    b = params.batch_size
    if params.name == "fedavg":
        return devices * params.local_steps * 3 * profile.macs(b)
    return devices * 2 * profile.macs(b)


def run_case(spec: dict, repeats: int, peak: float) -> dict:
    from wirelessfl.host import threads
    from wirelessfl.pipeline.build import build_world
    from wirelessfl.scenario.loader import scenario_from_document

    algo = {**spec["algorithm"], "rounds": spec["rounds"], "eval_every": spec["rounds"]}
    doc = {"name": spec["case"], "channel": spec.get("channel", CHANNEL), "energy": ENERGY,
           "data": spec["data"], "model": spec["model"], "population": {"num_devices": spec["n"]},
           "algorithms": [algo]}
    scenario = scenario_from_document(doc, spec["case"])
    threads.configure()  # as `wirelessfl run`: one intra-op thread, a pool on the free CPUs
    world = build_world(scenario)
    params = scenario.algorithms[0]
    _loop_round(world, params, 0)  # warm-up of both paths
    _project_rounds(world, params.model_copy(update={"rounds": 1, "eval_every": 1}))
    kernels = _kernel_round(world, params, 0)
    if kernels is not None:
        kernels()  # warm-up
    loop_times, project_times, compute_times, kernel_times = [], [], [], []
    for r in range(repeats):
        loop_times.append(_loop_round(world, params, r))
        per_round, compute = _project_rounds(world, params)
        project_times.append(per_round)
        compute_times.append(compute)
        if kernels is not None:
            kernel_times.append(statistics.fmean(kernels() for _ in range(params.rounds)))
        # The peak is re-measured between repeats: the fraction is taken against the best rate
        # this process saw, so a slow start of the machine cannot inflate it.
        peak = max(peak, matmul_peak_gflops(sizes=(1024,), repeats=5))
    n = world.num_devices
    macs = round_macs(world.model_profile, params, n)
    project = statistics.median(project_times)
    compute = statistics.median(compute_times)
    loop = statistics.median(loop_times)
    gflops = 2 * macs / project / 1e9
    kernel = statistics.median(kernel_times) if kernel_times else None
    bound = {} if kernel is None else {
        "kernels_s_per_round": kernel, "kernel_bound_fraction": 2 * macs / kernel / 1e9 / peak,
        "share_of_kernel_bound": kernel / project}
    return {
        "case": spec["case"], "devices": n, "d": world.flat.d, "rounds_timed": params.rounds,
        "per_device_strategy": world.evaluator.stacked.strategy,
        "repeats": repeats, "loop_s_per_round": loop, "wirelessfl_s_per_round": project,
        "learning_compute_s_per_round": compute, "speedup_vs_loop": loop / project,
        "gflop_per_round": 2 * macs / 1e9, "achieved_gflops": gflops,
        "peak_fraction": gflops / peak, "matmul_peak_gflops": peak,
        "engine_overhead_fraction": max(0.0, 1 - compute / project),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **bound,
    }


def strategy_comparison(repeats: int, peak: float) -> list[dict]:
    """Per-device model strategies (wirelessfl/learning/stacked.py) on one local step of each
    zoo model: the structural choice against torch.func.vmap, interleaved, medians."""
    from wirelessfl.host import threads
    from wirelessfl.learning.seeds import keyed_generator
    from wirelessfl.pipeline.build import build_world
    from wirelessfl.scenario.loader import scenario_from_document

    threads.configure()
    rows = []
    peak = max(peak, matmul_peak_gflops(sizes=(1024,), repeats=5))
    for spec in case_specs(True)[:2]:  # mlp_fedavg (50 devices), cnn_fedavg (10 devices)
        doc = {"name": spec["case"], "channel": CHANNEL, "energy": ENERGY, "data": spec["data"],
               "model": spec["model"], "population": {"num_devices": spec["n"]},
               "algorithms": [{"name": "fedavg"}]}
        world = build_world(scenario_from_document(doc, spec["case"]))
        ev = world.evaluator
        chosen = ev.stacked.strategy
        idx = ev.sample(keyed_generator(0, "batch", 0), spec["algorithm"]["batch_size"])[0]
        models = world.flat.initial().expand(world.num_devices, -1).clone()
        times: dict[str, list[float]] = {chosen: [], "vmap": []}
        for _ in range(repeats + 1):  # the first pass of each warms up
            for strategy, samples in times.items():
                ev.stacked.strategy = strategy
                start = time.perf_counter()
                for _ in range(5):
                    ev.stacked_gradients(models, idx)
                samples.append((time.perf_counter() - start) / 5)
        ev.stacked.strategy = chosen
        macs = world.num_devices * 3 * world.model_profile.macs(spec["algorithm"]["batch_size"])
        for strategy, ts in times.items():
            t = statistics.median(ts[1:])
            rows.append({"model": spec["model"]["name"], "devices": world.num_devices,
                         "strategy": strategy, "chosen": strategy == chosen,
                         "ms_per_step": 1e3 * t, "peak_fraction": 2 * macs / t / 1e9 / peak})
    return rows


def _worker(args):
    spec, repeats, peak = args
    return run_case(spec, repeats, peak)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="skip the 10,000-device case")
    args = parser.parse_args()
    peak = matmul_peak_gflops()
    print(f"float32 matmul peak: {peak:.1f} GFLOP/s ({len(os.sched_getaffinity(0))} threads)")
    results = []
    ctx = mp.get_context("spawn")
    for spec in case_specs(args.quick):
        with ctx.Pool(1) as pool:
            res = pool.map(_worker, [(spec, args.repeats, peak)])[0]
        results.append(res)
        print(f"{res['case']:<18} N={res['devices']:<6} loop {res['loop_s_per_round']*1e3:9.2f} ms"
              f"  wirelessfl {res['wirelessfl_s_per_round']*1e3:9.2f} ms"
              f"  x{res['speedup_vs_loop']:6.2f}  {res['achieved_gflops']:6.1f} GFLOP/s"
              f" ({100*res['peak_fraction']:4.1f}% of peak)"
              f"  overhead {100*res['engine_overhead_fraction']:5.1f}%"
              f"  peak RSS {res['peak_rss_mb']:7.0f} MB", flush=True)
        if "kernel_bound_fraction" in res:
            print(f"{'':<18} its convolution kernels alone: {res['kernels_s_per_round']*1e3:.1f}"
                  f" ms ({100*res['kernel_bound_fraction']:4.1f}% of peak); the round runs at"
                  f" {100*res['share_of_kernel_bound']:4.1f}% of that bound", flush=True)
    with ctx.Pool(1) as pool:
        strategies = pool.apply(strategy_comparison, (args.repeats, peak))
    for row in strategies:
        print(f"step of {row['model']:<12} x{row['devices']:<3} {row['strategy']:<10}"
              f" {row['ms_per_step']:8.2f} ms  {100 * row['peak_fraction']:5.1f}% of peak"
              f"{'  (chosen)' if row['chosen'] else ''}", flush=True)
    by_case = {r["case"]: r for r in results}
    summary = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "threads": torch.get_num_threads(), "torch": torch.__version__},
        "matmul_peak_gflops": max([peak] + [r["matmul_peak_gflops"] for r in results]),
        "mlp_fedavg_speedup_vs_loop": by_case["mlp_fedavg"]["speedup_vs_loop"],
        "cnn_fedavg_peak_fraction": by_case["cnn_fedavg"]["peak_fraction"],
        "cnn_dzofl_peak_fraction": by_case["cnn_dzofl"]["peak_fraction"],
        "cnn_fedavg_kernel_bound_fraction": by_case["cnn_fedavg"]["kernel_bound_fraction"],
        "engine_overhead_fraction": max(r["engine_overhead_fraction"] for r in results),
        "cases": results,
        "per_device_model_strategies": strategies,
    }
    with open(args.out, "w") as fh:
        json.dump(summary, fh, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
