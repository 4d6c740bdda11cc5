"""ZO-HFL (seed 000) against a per-device reference written from Algorithms 1-2 of the spec, and
its two payload modes against each other."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from tests.conftest import run_recording_thetas, small_scenario
from wirelessfl.engine.build import build_world
from wirelessfl.engine.context import RunContext
from wirelessfl.engine.simulation import run_algorithm
from wirelessfl.learning.seeds import keyed_generator

EXACT = ["channel=seed002-pinned", "channel.uplink.delivery_probability=1.0",
         "quantization_bits=32", "data.server_fraction=0.3"]


def _run(monkeypatch, overrides=(), **params):
    algo = {"name": "zo-hfl", "rounds": 2, "eval_every": 1, "tau": 2, "gamma0": 0.5,
            "batch_size": 8, "server_batch_size": 8, **params}
    sc = small_scenario([*EXACT, *overrides], algorithms=[algo])
    return run_recording_thetas(monkeypatch, sc)


def _ce_grad(world, theta, x, y):
    leaf = {n: p.detach().clone().requires_grad_(True)
            for n, p in world.flat.unflatten(theta.clone()).items()}
    loss = F.cross_entropy(torch.func.functional_call(world.flat.model, leaf, (x,)), y)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(leaf.values()))])


def test_matches_a_per_device_reference(monkeypatch):
    world, thetas, _ = _run(monkeypatch)
    ev, n, d = world.evaluator, world.num_devices, world.flat.d
    eta, lam, mu, lr0, b = 0.1, 1.0, 1.0, 0.1, 8
    sizes = ev.data.sizes.double()
    w = (sizes / sizes.sum()).float()
    theta = thetas[0]
    for r in range(2):
        steps = math.ceil(2 * math.sqrt(r + 1))
        z = torch.randn((n, d), generator=keyed_generator(3, "zo-hfl-v", r))
        v = z / z.norm(dim=1, keepdim=True)
        plus = ev.sample(keyed_generator(3, "batch", r), b, steps)
        minus = ev.sample(keyed_generator(3, "batch-minus", r), b, steps)
        pick = torch.randint(len(ev.data.y_server), (8,),
                             generator=keyed_generator(3, "zo-hfl-server", r))
        g = _ce_grad(world, theta, ev.data.x_server[pick], ev.data.y_server[pick])
        for i in range(n):
            f = []
            for sign, idx in ((1.0, plus), (-1.0, minus)):
                x = theta + sign * eta * v[i]
                y = x.clone()
                for t in range(steps):
                    batch = idx[t, i]
                    y = y - lr0 / (t + 1) * (_ce_grad(world, y, ev.data.x[batch], ev.data.y[batch])
                                             + mu * (y - x))
                f.append(0.5 * lam * float((x - y).double().square().sum()))
            g = g + w[i] * (d / (2 * eta)) * (f[0] - f[1]) * v[i]
        theta = theta - 0.5 / math.sqrt(r + 1) * g
        torch.testing.assert_close(thetas[r + 1], theta, rtol=1e-4, atol=1e-5)


def test_seed_mode_gives_the_paper_update_at_full_precision(monkeypatch):
    _, models, run_m = _run(monkeypatch, payload="models")
    _, seeds, run_s = _run(monkeypatch, payload="seed")
    for a, b in zip(models, seeds):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # ... with a fraction of the uplink: one 32-bit scalar instead of two d-vectors
    assert run_s.ledger.bits_up.sum() * 2 * 650 == run_m.ledger.bits_up.sum()


def test_without_coupling_it_is_server_sgd(monkeypatch):
    world, thetas, run = _run(monkeypatch, lam=0.0)
    ev = world.evaluator
    theta = thetas[0]
    for r in range(2):
        pick = torch.randint(len(ev.data.y_server), (8,),
                             generator=keyed_generator(3, "zo-hfl-server", r))
        g = _ce_grad(world, theta, ev.data.x_server[pick], ev.data.y_server[pick])
        theta = theta - 0.5 / math.sqrt(r + 1) * g
        torch.testing.assert_close(thetas[r + 1], theta, rtol=1e-5, atol=1e-6)
    # the clients still did (and paid for) their two solves of ceil(2 sqrt(r+1)) steps
    assert np.all(run.ledger.energy_j[:, 1] > 0)


def test_server_data_is_kept_off_the_devices(monkeypatch):
    world, _, _ = _run(monkeypatch)
    ev = world.evaluator
    total = len(world.dataset.y_train)
    assert len(ev.data.y_server) == round(0.3 * total)
    assert len(ev.data.y_server) + int(ev.data.sizes.sum()) == total


def _quadratic_bilevel(rounds, payload="models", bits=32):
    from tests.conftest import small_doc
    from wirelessfl.scenario.loader import scenario_from_document

    doc = small_doc(problem={"name": "quadratic", "clients": 3, "dimension": 4, "L": 4.0,
                             "mu": 1.0, "delta": 0.5, "server_loss": True},
                    channel={"profile": "seed002-pinned",
                             "uplink": {"delivery_probability": 1.0}},
                    quantization_bits=bits,
                    algorithms=[{"name": "zo-hfl", "rounds": rounds, "eval_every": rounds,
                                 "tau": 8, "gamma0": 0.5, "inner_lr0": 0.5, "payload": payload}])
    for key in ("data", "model"):
        doc.pop(key)
    doc["population"] = {"num_devices": 3}
    return scenario_from_document(doc, "bilevel.yaml")


def test_converges_to_the_closed_form_bilevel_solution_on_quadratic_clients(monkeypatch):
    """f_i(y) = 1/2 y^T A_i y - c_i^T y, lower level y_i(x) = argmin f_i(y) + (mu/2)||y - x||^2
    = (A_i + mu I)^-1 (c_i + mu x); upper level f_1(x) (the clients' mean quadratic) +
    (lam / m) sum_i (1/2) ||x - y_i(x)||^2, a quadratic in x solved exactly here. The two-point
    estimate of a quadratic is exact along v, so only the direction sampling (d = 4) and the inner
    solvers' finite steps keep ZO-HFL (step gamma0 / sqrt(r+1)) away from it: 5 % after 200
    rounds, from 100 % at x_0 = 0."""
    seen = []
    original = RunContext.end_round
    monkeypatch.setattr(RunContext, "end_round",
                        lambda self, c, t: (seen.append(t.clone()), original(self, c, t))[1])
    sc = _quadratic_bilevel(200)
    world = build_world(sc)
    run_algorithm(world, sc.algorithms[0])
    prob = world.evaluator
    a, c = prob.a_np, prob.c_np
    m, d = c.shape
    eye, mu, lam = np.eye(d), 1.0, 1.0
    hess, rhs = a.mean(0).copy(), c.mean(0).copy()
    for a_i, c_i in zip(a, c):
        b_i = np.linalg.inv(a_i + mu * eye)
        k_i = eye - mu * b_i  # x - y_i(x) = k_i x - b_i c_i
        hess += lam / m * k_i.T @ k_i
        rhs += lam / m * k_i.T @ b_i @ c_i
    x_bilevel = np.linalg.solve(hess, rhs)
    x_r = seen[-1].double().numpy()
    assert np.linalg.norm(seen[0].double().numpy() - x_bilevel) == np.linalg.norm(x_bilevel)
    assert np.linalg.norm(x_r - x_bilevel) / np.linalg.norm(x_bilevel) < 0.08


def test_payload_modes_agree_on_quadratic_clients(monkeypatch):
    runs = []
    for payload in ("models", "seed"):
        seen = []
        original = RunContext.end_round
        monkeypatch.setattr(RunContext, "end_round",
                            lambda self, c, t, seen=seen, original=original:
                            (seen.append(t.clone()), original(self, c, t))[1])
        sc = _quadratic_bilevel(20, payload)
        run_algorithm(build_world(sc), sc.algorithms[0])
        runs.append(seen)
        monkeypatch.undo()
    torch.testing.assert_close(runs[0][-1], runs[1][-1], rtol=1e-6, atol=1e-7)


def test_seed_mode_scalars_in_the_float_format_track_full_precision(monkeypatch):
    """Seed mode at M = 16 sends F+ - F- as a stochastic float (1 sign, 6 exponent, 9 mantissa
    bits; relative error variance at most sigma(16) ~ 9.5e-7, docs/algorithms.md): nothing
    clips, every upload is counted, and after 20 rounds x stays within 1e-3 [D] (relative) of
    the unquantised seed mode's."""
    runs = []
    for bits in (32, 16):
        seen = []
        original = RunContext.end_round
        monkeypatch.setattr(RunContext, "end_round",
                            lambda self, c, t, seen=seen, original=original:
                            (seen.append(t.clone()), original(self, c, t))[1])
        sc = _quadratic_bilevel(20, "seed", bits)
        assert sc.algorithms[0].scalar_format == "float"
        run = run_algorithm(build_world(sc), sc.algorithms[0])
        runs.append((seen, pd.DataFrame(run.rows).iloc[-1]))
        monkeypatch.undo()
    (full, _), (quantised, last) = runs
    assert last.quantized_up == 3 * 20 and last.clipped_up == 0
    gap = (quantised[-1] - full[-1]).norm() / full[-1].norm()
    assert 0 < gap < 1e-3
