"""FedNest (seed 001's baseline, fedmsa.md Sec. 3.6 / 4.5 [C]) as the FedMSA authors' code runs it.

Truths used: the Neumann series in closed form on the federated bilevel quadratic, whose Hessian
is the client mean A of A_m: sum_{n=0..N} (I - eta A)^n u = (eta A)^{-1} (I - (I - eta A)^{N+1}) u,
so the truncation error against the limit (eta A)^{-1} u is -(eta A)^{-1} (I - eta A)^{N+1} u
(numpy's inverse and matrix power); the authors' accumulation re-enacted step by step in numpy
(a list of uploads that is never emptied, as ucr-optml/FedMSA core/ClientManage.py ``fedIHGP``
keeps it, each client holding its own power as core/Client.py ``hvp_iter`` does) and its closed
form u + sum_n (1/n) mean_m (I - eta A_m)^n u; the fixed points in closed form
(x* = (G^T G + mu I)^{-1} G^T c, and x_eta = (G^T G + eta mu I)^{-1} G^T c when the series is
not scaled by eta); a numpy re-implementation of the outer iteration (FedInn, FedIHGP, the
hypergradient, FedOut); a numpy minibatch-SVRG epoch with the linear-softmax gradient of
fedmsa.md Sec. 2.4 written out again; pass counts worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import run_recording_thetas, small_doc
from wirelessfl.algorithms.fednest import FedNest, svrg_epoch
from wirelessfl.contract.payload import Payload
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.problems.loss_tuning import LossTuning
from wirelessfl.scenario.loader import scenario_from_document

PROBLEM = {"name": "bilevel-quadratic", "clients": 5, "dimension_x": 3, "dimension_w": 4,
           "heterogeneity": 0.3}
LOSSLESS = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}}
FEDNEST = {"name": "fednest", "alpha": 0.05, "beta": 0.2, "eta": 0.2, "inner_rounds": 2,
           "inner_epochs": 3, "neumann_terms": 4, "outer_steps": 3, "full_batch": True}
f32 = lambda z: np.asarray(z).astype(np.float32).astype(np.float64)


def _scenario(algorithm: dict, population=None, **problem):
    doc = small_doc(problem={**PROBLEM, **problem}, channel=LOSSLESS, quantization_bits=32,
                    algorithms=[{"eval_every": 1, **algorithm}])
    for key in ("data", "model"):
        doc.pop(key)
    doc.pop("population")
    if population:
        doc["population"] = {"num_devices": population}
    return scenario_from_document(doc, "fednest.yaml")


def _neumann_sum(a_mean, u, eta, terms):
    """sum_{n=0..N} (I - eta A)^n u in closed form, and its limit (eta A)^{-1} u."""
    eye = np.eye(len(u))
    limit = np.linalg.solve(eta * a_mean, u)
    return limit - np.linalg.solve(eta * a_mean, np.linalg.matrix_power(eye - eta * a_mean,
                                                                        terms + 1) @ u), limit


def _authors_accumulation(a, u, eta, terms):
    """The authors' fedIHGP (global_batch) re-enacted: client m keeps c_m <- c_m - eta A_m c_m
    from c_m = u; at each term it uploads p + c_m; the server's p is the mean of all uploads so
    far (the list is not emptied between terms)."""
    counters = [u.copy() for _ in a]
    uploads, p = [], u.copy()
    for _ in range(terms):
        fresh = []
        for m, a_m in enumerate(a):
            counters[m] = counters[m] - eta * a_m @ counters[m]
            fresh.append(p + counters[m])
        uploads.extend(fresh)
        p = np.mean(uploads, axis=0)
    return p


def _reference(a, b, c, mu, alpha, beta, eta, inner_rounds, epochs, terms, outer_steps, rounds,
               form="sum", stages=None):
    """FedNest's outer iterations in numpy with the closed-form derivatives g_w = A w - B x,
    H u = A u, grad^2_xw g u = -B^T u, f_x = mu x, f_w = w - c: FedInn (full-batch SVRG steps),
    FedIHGP (``form``), the hypergradient, FedOut. ``stages[r][s]``: the clients of stage s of
    round r (default all); every mean that crosses the air rounded to float32."""
    m, dw, dx = b.shape
    x, w, v = np.zeros(dx), np.zeros(dw), np.zeros(dw)
    out = [np.concatenate([x, w, v])]
    everyone = [np.arange(m)] * (inner_rounds + 1)
    for r in range(rounds):
        clients = everyone if stages is None else stages[r]
        for t in range(inner_rounds):
            rows = clients[t]
            grads = np.einsum("mij,j->mi", a[rows], w) - np.einsum("mij,j->mi", b[rows], x)
            q = f32(grads.mean(0))
            local = np.tile(w, (len(rows), 1))
            for _ in range(epochs):
                g = np.einsum("mij,mj->mi", a[rows], local) - np.einsum("mij,j->mi", b[rows], x)
                local = local - beta * (g - grads + q)
            w = f32(local.mean(0))
        rows = clients[inner_rounds]
        u = f32((w - c[rows]).mean(0))
        if form == "authors-code":
            counters, uploads, v = np.tile(u, (len(rows), 1)), [], u
            for _ in range(terms):
                counters = counters - eta * np.einsum("mij,mj->mi", a[rows], counters)
                uploads.extend(f32(v + counters))
                v = f32(np.mean(uploads, axis=0))
        else:
            term, v = u, u.copy()
            for _ in range(terms):
                term = term - eta * f32(np.einsum("mij,j->mi", a[rows], term).mean(0))
                v = v + term
            v = eta * v if form == "scaled" else v
        h = f32((mu * x + np.einsum("mij,i->mj", b[rows], v)).mean(0))
        local = np.tile(x, (len(rows), 1))
        for _ in range(outer_steps):
            local = local - alpha * (mu * local - mu * x + h)
        x = f32(local.mean(0))
        out.append(np.concatenate([x, w, v]))
    return out


# ---- FedIHGP: the Neumann series and its truncation ------------------------------------------
@pytest.mark.parametrize("terms", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("form", ["sum", "scaled"])
def test_neumann_series_and_its_truncation_error_are_the_closed_form(monkeypatch, terms, form):
    """After one round (x_0 = 0, one outer step), v is the N-term series of the global Hessian at
    the round's w, the hypergradient h = -x_1 / alpha is mean_m B_m^T v, and v misses the
    series' limit by exactly -(eta A)^{-1} (I - eta A)^{N+1} u (times eta when scaled)."""
    eta, alpha = 0.3, 0.05
    sc = _scenario({**FEDNEST, "rounds": 1, "eta": eta, "alpha": alpha, "outer_steps": 1,
                    "neumann_terms": terms, "neumann_form": form})
    world, thetas, _ = run_recording_thetas(monkeypatch, sc)
    prob = world.evaluator
    dx, dw = prob.dx, prob.dw
    a_mean, b_mean, c_mean = prob.a_np.mean(0), prob.b_np.mean(0), prob.c_np.mean(0)
    assert max(abs(np.linalg.eigvalsh(np.eye(dw) - eta * a_mean))) < 1  # the series converges
    state = thetas[-1].double().numpy()
    x1, w1, v1 = state[:dx], state[dx:dx + dw], state[dx + dw:]
    u = w1 - c_mean  # mean_m grad_w f^m at (0, w_1)
    series, limit = _neumann_sum(a_mean, u, eta, terms)
    scale = eta if form == "scaled" else 1.0
    np.testing.assert_allclose(v1, scale * series, rtol=1e-5, atol=1e-6 * np.abs(series).max())
    predicted = -np.linalg.solve(eta * a_mean, np.linalg.matrix_power(
        np.eye(dw) - eta * a_mean, terms + 1) @ u)
    np.testing.assert_allclose(v1 - scale * limit, scale * predicted,
                               atol=2e-6 * np.abs(limit).max())
    np.testing.assert_allclose(-x1 / alpha, b_mean.T @ v1, rtol=1e-5, atol=1e-6)
    assert np.linalg.norm(predicted) > 1e-3 * np.linalg.norm(limit)  # a truncation to see


def test_authors_code_form_is_their_running_mean_of_local_powers(monkeypatch):
    """neumann_form authors-code: v = u + sum_{n=1..N} (1/n) mean_m (I - eta A_m)^n u, the
    list accumulation of their fedIHGP with per-client hvp_iter counters; not the sum form."""
    eta, terms = 0.3, 3
    sc = _scenario({**FEDNEST, "rounds": 1, "eta": eta, "neumann_terms": terms,
                    "neumann_form": "authors-code"}, heterogeneity=1.0)
    world, thetas, _ = run_recording_thetas(monkeypatch, sc)
    prob = world.evaluator
    dx, dw = prob.dx, prob.dw
    state = thetas[-1].double().numpy()
    u = state[dx:dx + dw] - prob.c_np.mean(0)
    eye = np.eye(dw)
    closed = u + sum(np.mean([np.linalg.matrix_power(eye - eta * a_m, n) @ u
                              for a_m in prob.a_np], axis=0) / n for n in range(1, terms + 1))
    enacted = _authors_accumulation(prob.a_np, u, eta, terms)
    np.testing.assert_allclose(enacted, closed, rtol=1e-12)
    np.testing.assert_allclose(state[dx + dw:], closed, rtol=1e-5, atol=1e-6)
    series, _ = _neumann_sum(prob.a_np.mean(0), u, eta, terms)
    assert np.abs(series - closed).max() > 0.05 * np.abs(series).max()


# ---- the whole outer iteration ---------------------------------------------------------------
@pytest.mark.parametrize("form", ["sum", "scaled", "authors-code"])
@pytest.mark.parametrize("full_batch", [True, False])
def test_rounds_match_numpy_reference(monkeypatch, form, full_batch):
    """The quadratic has one sample per client, so a minibatch epoch is one SVRG step on it
    (full_batch false) and gives the same iterates as a full-batch step."""
    rounds = 6
    sc = _scenario({**FEDNEST, "rounds": rounds, "neumann_form": form, "full_batch": full_batch})
    world, thetas, run = run_recording_thetas(monkeypatch, sc)
    prob = world.evaluator
    ref = _reference(prob.a_np, prob.b_np, prob.c_np, prob.mu, 0.05, 0.2, 0.2, 2, 3, 4, 3,
                     rounds, form)
    for r, (got, want) in enumerate(zip(thetas, ref, strict=True)):
        np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-6,
                                   err_msg=f"round {r}")
    assert not np.allclose(ref[-1], ref[1])
    # every client: 2T + N + 1 vectors of d_w and 2 of d_x up, the same down, per round
    vec_w, vec_x = Payload.vectors(4, 32).bits, Payload.vectors(3, 32).bits
    per_round = (2 * 2 + 4 + 1) * vec_w + 2 * vec_x
    np.testing.assert_array_equal(run.ledger.bits_up, per_round * rounds)
    np.testing.assert_array_equal(run.ledger.bits_down, per_round * rounds)
    assert run.ledger.exchanges == (2 * 2 + 4 + 3) * rounds
    # HVPs per client per round: N Neumann terms + 1 for the hypergradient
    np.testing.assert_array_equal(run.ledger.hvp_passes, (4 + 1) * rounds)
    # backward passes per client per round: T (1 snapshot + 3 epochs, each 1 full-batch step or
    # a minibatch step at 2 gradients) + 1 outer gradient + N + 1 (with the HVPs) + K outer steps
    svrg = 3 if full_batch else 6
    np.testing.assert_array_equal(run.ledger.backward_passes,
                                  (2 * (1 + svrg) + 1 + 5 + 3) * rounds)


def test_clients_are_drawn_anew_for_every_stage(monkeypatch):
    """participation 0.2 of 10 clients: 2 per stage, a fresh draw for each inner round and for
    the outer stage; each round equals the numpy reference run on those clients."""
    drawn = {}
    original = FedNest.participants

    def spy(self, k, *stage):
        mask = original(self, k, *stage)
        drawn.setdefault((k, self.stage), mask.copy())
        assert (drawn[(k, self.stage)] == mask).all()  # one draw per stage
        return mask

    monkeypatch.setattr(FedNest, "participants", spy)
    rounds, t = 4, 2
    sc = _scenario({**FEDNEST, "rounds": rounds, "participation": 0.2}, population=10,
                   clients=10)
    world, thetas, run = run_recording_thetas(monkeypatch, sc)
    stages = [[np.flatnonzero(drawn[(r, s)]) for s in range(t + 1)] for r in range(rounds)]
    assert all(len(rows) == 2 for stage in stages for rows in stage)
    assert len({tuple(rows) for stage in stages for rows in stage}) > rounds  # not per round
    prob = world.evaluator
    ref = _reference(prob.a_np, prob.b_np, prob.c_np, prob.mu, 0.05, 0.2, 0.2, t, 3, 4, 3,
                     rounds, stages=stages)
    for r, (got, want) in enumerate(zip(thetas, ref, strict=True)):
        np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-6,
                                   err_msg=f"round {r}")
    # one upload per asked client per phase: 2 per inner round, N + 3 in the outer stage
    expected = np.zeros(10, dtype=np.int64)
    for stage in stages:
        for s, rows in enumerate(stage):
            expected[rows] += 2 if s < t else 4 + 3
    np.testing.assert_array_equal(run.ledger.packets_delivered, expected)
    assert run.ledger.exchanges == (2 * t + 4 + 3) * rounds


def test_fixed_points_with_a_long_series(monkeypatch):
    """With many Neumann terms the scaled series is the inverse-Hessian product and FedNest
    reaches x*; the authors' unscaled sum weighs the indirect term by 1 / eta, whose fixed point
    is x_eta = (G^T G + eta mu I)^{-1} G^T c (mu -> eta mu), biased whenever grad_x f is not 0."""
    eta, ends = 0.8, {}  # I - eta A contracts by 0.59 on this problem: 20 terms leave 2e-5
    for form in ("scaled", "sum"):
        sc = _scenario({**FEDNEST, "rounds": 60, "eval_every": 60, "alpha": 0.05, "eta": eta,
                        "neumann_terms": 20, "inner_rounds": 3, "neumann_form": form})
        world, thetas, _ = run_recording_thetas(monkeypatch, sc)
        ends[form] = thetas[-1][:3].double().numpy()
    prob = world.evaluator
    gain = np.linalg.solve(prob.a_np.mean(0), prob.b_np.mean(0))
    c_mean = prob.c_np.mean(0)
    x_star = np.linalg.solve(gain.T @ gain + prob.mu * np.eye(3), gain.T @ c_mean)
    x_eta = np.linalg.solve(gain.T @ gain + eta * prob.mu * np.eye(3), gain.T @ c_mean)
    np.testing.assert_allclose(ends["scaled"], x_star, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ends["sum"], x_eta, rtol=1e-4, atol=1e-5)
    assert np.linalg.norm(x_eta - x_star) > 1e-2 * np.linalg.norm(x_star)


# ---- FedInn: one local epoch of minibatch SVRG -----------------------------------------------
def _loss_tuning(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((700, 4))
    y = rng.integers(0, 3, 700)
    return LossTuning(x, y, x[:30], y[:30], 3, 6, np.random.default_rng(seed),
                      imbalance_ratio=0.3, heterogeneity_q=0.5, weight_decay=0.05)


def _numpy_inner_gradient(a, y, x, w, decay, classes):
    """grad_W g on samples (a [b, D+1], y [b]) of fedmsa.md Sec. 2.4: mean_i a_i ((pi_i - e_y)
    * s)^T + lambda W, logits s * W^T a + l, s = sigmoid(kappa)."""
    kappa, shift = x[:classes], x[classes:]
    s = 1 / (1 + np.exp(-kappa))
    logits = s * (a @ w) + shift
    pi = np.exp(logits - logits.max(1, keepdims=True))
    pi /= pi.sum(1, keepdims=True)
    residual = (pi - np.eye(classes)[y]) * s
    return a.T @ residual / len(y) + decay * w


def test_epoch_batches_partition_each_clients_samples():
    prob = _loss_tuning()
    rows = torch.tensor([4, 1, 3])
    batches, steps = prob.epoch_batches(torch.Generator().manual_seed(5), 7, rows)
    sizes = prob.full_batch_sizes()[[4, 1, 3]]
    np.testing.assert_array_equal(steps, [math.ceil(m / 7) for m in sizes])
    for i, m in enumerate(sizes):
        seen = np.concatenate([b.positions[i][b.weights[i] > 0].numpy() for b in batches])
        assert sorted(seen.tolist()) == list(range(m))  # every sample once per epoch
        counts = [int(b.weights[i].sum()) for b in batches]
        assert counts[:steps[i]] == [7] * (steps[i] - 1) + [m - 7 * (steps[i] - 1)]
        assert sum(counts[steps[i]:]) == 0
    again, _ = prob.epoch_batches(torch.Generator().manual_seed(5), 7, rows)
    assert all(torch.equal(p.positions, q.positions) for p, q in zip(batches, again, strict=True))


def test_svrg_epoch_matches_numpy():
    """One epoch of w <- w - beta (grad g_B(w) - grad g_B(w_0) + q) over the minibatches, per
    client, against numpy's linear-softmax gradients on the same samples."""
    prob = _loss_tuning(1)
    rng = np.random.default_rng(2)
    rows = torch.tensor([0, 5, 2])
    x = rng.standard_normal(prob.dx)
    w0 = 0.3 * rng.standard_normal(prob.dw)
    q = 0.1 * rng.standard_normal(prob.dw)
    beta, b = 0.4, 6
    batches, steps = prob.epoch_batches(torch.Generator().manual_seed(8), b, rows)
    got = svrg_epoch(prob, torch.as_tensor(x), torch.as_tensor(w0), torch.as_tensor(q), rows,
                     batches, steps, beta).numpy()
    shape = (prob.dim, prob.num_classes)
    for i, m in enumerate(rows.tolist()):
        a_all, y_all = prob.train[0][m].numpy(), prob.train[1][m].numpy()
        w = w0.reshape(shape).copy()
        for j in range(steps[i]):
            pick = batches[j].positions[i][batches[j].weights[i] > 0].numpy()
            a, y = a_all[pick], y_all[pick]
            step = (_numpy_inner_gradient(a, y, x, w, prob.weight_decay, prob.num_classes)
                    - _numpy_inner_gradient(a, y, x, w0.reshape(shape), prob.weight_decay,
                                            prob.num_classes) + q.reshape(shape))
            w = w - beta * step
        np.testing.assert_allclose(got[i], w.ravel(), rtol=1e-10, atol=1e-12)
    assert steps.min() > 1 and not np.allclose(got[0], w0 - beta * q)  # more than one step


def test_minibatch_epochs_are_priced_per_step():
    """On loss tuning (10 clients of m_i training samples, batch 10): per round and client,
    T (1 snapshot + 2 ceil(m_i / 10)) + 1 + (N + 1) + K backward passes, with the minibatch
    steps at 10 samples and the rest at m_i."""
    doc = small_doc(problem={"name": "loss-tuning", "imbalance_ratio": 0.1},
                    population={"num_devices": 10}, quantization_bits=32, channel=LOSSLESS,
                    algorithms=[{"name": "fednest", "rounds": 2, "eval_every": 1,
                                 "inner_rounds": 2, "neumann_terms": 3, "outer_steps": 4,
                                 "alpha": 0.5, "beta": 0.1, "eta": 0.5}])
    doc.pop("model")
    sc = scenario_from_document(doc, "loss-tuning.yaml")
    world = build_world(sc)
    run = run_algorithm(world, sc.algorithms[0])
    sizes = world.evaluator.full_batch_sizes()
    steps = -(-sizes // 10)
    np.testing.assert_array_equal(run.ledger.backward_passes,
                                  2 * (2 * (1 + 2 * steps) + 1 + 4 + 4))
    np.testing.assert_array_equal(run.ledger.hvp_passes, 2 * 4)
    rows = pd.DataFrame(run.rows)
    assert rows.test_accuracy.iloc[-1] > rows.test_accuracy.iloc[0]
