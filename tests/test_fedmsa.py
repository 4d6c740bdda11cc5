"""FedMSA (fedmsa.md, seed 001) on the federated bilevel quadratic.

Truths used: the spec's closed-form maps (Sec. 2.4: p = mu x + B^T v, s_w = A w - B x,
s_v = A v - (w - c)) and solution (Sec. 5.1) written out again here in numpy, central finite
differences of the outer objective F(x) = (1/M) sum_m f^m(x, w*(x)) for the hypergradient, and a
numpy re-implementation of Algorithm 1's pseudocode (eqs. 5 and 6) run on the same client draws."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import run_recording_thetas, small_doc
from wirelessfl.contract.payload import Cost, Payload
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_generator, keyed_rng
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.problems.bilevel import BilevelQuadratic, bilevel_quadratic
from wirelessfl.scenario.loader import scenario_from_document

PROBLEM = {"name": "bilevel-quadratic", "clients": 5, "dimension_x": 3, "dimension_w": 4,
           "heterogeneity": 0.3}
LOSSLESS = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}}


def _scenario(algorithm: dict, channel=None, **problem):
    doc = small_doc(problem={**PROBLEM, **problem}, channel=channel or LOSSLESS,
                    quantization_bits=32, algorithms=[{"name": "fedmsa", "eval_every": 1,
                                                       **algorithm}])
    for key in ("data", "model"):
        doc.pop(key)
    doc.pop("population")
    return scenario_from_document(doc, "fedmsa.yaml")


def _numpy_maps(a, b, c, mu, x, w, v):
    """Sec. 2.4's closed form, per client: [M, d_x + 2 d_w] at one state."""
    p = mu * x + np.einsum("mij,mi->mj", b, np.broadcast_to(v, c.shape))
    s_w = np.einsum("mij,j->mi", a, w) - np.einsum("mij,j->mi", b, x)
    s_v = np.einsum("mij,j->mi", a, v) - (w - c)
    return np.concatenate([p, s_w, s_v], axis=1)


def _problem(seed=1, m=4, dx=3, dw=5, h=0.5, mu=0.7, noise=0.0):
    a, b, c = bilevel_quadratic(m, dx, dw, h, np.random.default_rng(seed))
    return BilevelQuadratic(a, b, c, mu=mu, noise_std=noise), a, b, c


def test_double_backward_maps_match_the_closed_form():
    prob, a, b, c = _problem()
    rng = np.random.default_rng(7)
    states = rng.standard_normal((4, prob.d))
    got = prob.maps(torch.as_tensor(states), torch.arange(4)).numpy()
    for m in range(4):
        x, w, v = np.split(states[m], [3, 8])
        want = _numpy_maps(a, b, c, 0.7, x, w, v)[m]
        np.testing.assert_allclose(got[m], want, rtol=1e-12, atol=1e-12)
    # any subset of clients, in any order, at their own states
    rows = torch.tensor([3, 1])
    np.testing.assert_allclose(prob.maps(torch.as_tensor(states[[3, 1]]), rows).numpy(),
                               got[[3, 1]], rtol=1e-14)


def test_hypergradient_matches_finite_differences():
    """At a test point x, the mean map p at (x, w*(x), v*(x)) is the hypergradient: it equals
    central differences of F(x) = (1/M) sum_m [1/2 ||w*(x) - c_m||^2 + mu/2 ||x||^2]."""
    prob, a, b, c = _problem()
    am, bm, cm = a.mean(0), b.mean(0), c.mean(0)

    def outer(x):
        w = np.linalg.solve(am, bm @ x)
        return np.mean(0.5 * ((w - c) ** 2).sum(1)) + 0.35 * x @ x

    x = np.random.default_rng(3).standard_normal(3)
    eps = 1e-6
    fd = np.array([(outer(x + eps * e) - outer(x - eps * e)) / (2 * eps) for e in np.eye(3)])
    w = np.linalg.solve(am, bm @ x)
    v = np.linalg.solve(am, w - cm)
    state = torch.as_tensor(np.concatenate([x, w, v]))
    maps = prob.maps(state.expand(4, -1), torch.arange(4)).mean(0).numpy()
    np.testing.assert_allclose(maps[:3], fd, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(maps[3:], 0, atol=1e-12)  # (w, v) is the lower fixed point
    np.testing.assert_allclose(prob.objective_gradient(state).numpy(), fd, rtol=1e-7, atol=1e-9)


def test_known_solution_zeroes_the_averaged_maps():
    prob, a, b, c = _problem()
    am, bm, cm = a.mean(0), b.mean(0), c.mean(0)
    gain = np.linalg.solve(am, bm)
    x_star = np.linalg.solve(gain.T @ gain + 0.7 * np.eye(3), gain.T @ cm)
    np.testing.assert_allclose(prob.solution.numpy(), x_star, rtol=1e-12)
    mean = prob.maps(prob.fixed_point.expand(4, -1), torch.arange(4)).mean(0)
    np.testing.assert_allclose(mean.numpy(), 0, atol=1e-12)
    assert prob.relative_error(prob.fixed_point) == 0
    assert prob.relative_error(torch.zeros(prob.d)) == pytest.approx(1.0)


def test_noisy_oracle_is_keyed_and_unbiased():
    prob, *_ = _problem(noise=0.1)
    state = torch.as_tensor(np.random.default_rng(0).standard_normal(prob.d)).expand(4, -1)
    keys = np.arange(4, dtype=np.uint64) + 11
    one = prob.maps(state, torch.arange(4), keys)
    np.testing.assert_array_equal(one.numpy(), prob.maps(state, torch.arange(4), keys).numpy())
    assert not torch.allclose(one, prob.maps(state, torch.arange(4), keys + 100))
    exact = prob.maps(state, torch.arange(4)).numpy()
    draws = np.stack([prob.maps(state, torch.arange(4), keys + 4 * t).numpy()
                      for t in range(1, 400)])
    err = draws.mean(0) - exact
    assert np.abs(err).max() < 5 * draws.std(0).max() / np.sqrt(399)


def _reference(a, b, c, mu, alpha, beta, rho, steps, clients, rounds, seed, refresh=True,
               noisy=None):
    """fedmsa.md Algorithm 1 (eqs. 5, 6) in numpy; the direction and model that cross the air
    rounded to float32; Phase-B clients drawn as the algorithm draws them. Exact oracles (the
    closed form), or with ``noisy`` (the problem) its keyed stochastic maps, one sample per
    client in Phase A and a fresh one per local step, each used at both points."""
    m, dw, dx = b.shape
    rates = np.r_[np.full(dx, alpha), np.full(2 * dw, beta)]
    keys = {}

    def maps(state, rows):
        if noisy is not None:
            rows = np.arange(m) if isinstance(rows, slice) else np.atleast_1d(rows)
            key = keys["now"][rows]
            out = noisy.maps(torch.as_tensor(state).expand(len(rows), -1),
                             torch.as_tensor(rows), key).numpy()
            return out if len(rows) > 1 else out[0]
        x, w, v = np.split(state, [dx, dx + dw])
        return _numpy_maps(a, b, c, mu, x, w, v)[rows]

    def draw(r, k):
        if noisy is not None:
            keys["now"] = noisy.sample_keys(keyed_generator(seed, "fedmsa-sample", r, k))

    theta = np.zeros(dx + 2 * dw, dtype=np.float32).astype(np.float64)
    out = [theta.copy()]
    prev = h_prev = None
    for r in range(rounds):
        rho_r, k_r = (1.0, 1) if r == 0 else (rho, steps)
        draw(r, 0)
        local = maps(theta, slice(None))
        if rho_r < 1:
            local = local + (1 - rho_r) * (h_prev - maps(prev, slice(None)))
        h = local.astype(np.float32).mean(0).astype(np.float64)
        prev, h_prev = theta, h
        chosen = np.sort(keyed_rng(seed, "fedmsa-select", r).choice(np.arange(m), clients,
                                                                    replace=False))
        finals = []
        for i in chosen:
            cur, last, d = theta.copy(), theta.copy(), h.copy()
            for k in range(1, k_r + 1):
                if k > 1 and refresh:
                    draw(r, k)
                    d = maps(cur, i) + d - maps(last, i)
                last, cur = cur, cur - rates * d
            finals.append(cur.astype(np.float32))
        theta = np.mean(finals, axis=0).astype(np.float32).astype(np.float64)
        out.append(theta.copy())
    return out


@pytest.mark.parametrize("params", [
    {"local_steps": 4, "local_clients": 1, "rho": 0.5},
    {"local_steps": 3, "local_clients": 3, "rho": 0.2},
    {"local_steps": 5, "local_clients": 1, "rho": 1.0},
    {"local_steps": 4, "local_clients": 2, "rho": 0.5, "refresh": False},
    {"local_steps": 4, "local_clients": 1, "rho": 0.3, "full_batch": False},
], ids=["alg1", "multi-client", "no-momentum", "frozen", "noisy-oracles"])
def test_rounds_match_numpy_reference_of_algorithm_1(monkeypatch, params):
    rounds = 12
    noisy = params.get("full_batch", True) is False
    sc = _scenario({"rounds": rounds, "alpha": 0.05, "beta": 0.2, **params},
                   noise_std=0.1 if noisy else 0.0)
    world, thetas, run = run_recording_thetas(monkeypatch, sc)
    prob = world.evaluator
    ref = _reference(prob.a_np, prob.b_np, prob.c_np, prob.mu, 0.05, 0.2, params["rho"],
                     params["local_steps"], params["local_clients"], rounds, sc.seed,
                     params.get("refresh", True), prob if noisy else None)
    assert len(thetas) == rounds + 1
    for r, (got, want) in enumerate(zip(thetas, ref, strict=True)):
        np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-6,
                                   err_msg=f"round {r}")
    assert not np.allclose(ref[-1], ref[1])  # the iterates moved
    rows = pd.DataFrame(run.rows)
    k = params["local_steps"]
    assert rows.local_steps.tolist() == [0] + [1 + k * r for r in range(rounds)]
    assert rows.exchanges.tolist() == [2 * r for r in range(rounds + 1)]


def test_converges_to_the_known_solution(monkeypatch):
    """fedmsa.md Sec. 5.1's problem (M = 10, d_x = 10, d_w = 20, h = 0.3) with K = 20: the
    whole state (x, w, v) reaches the closed-form fixed point, drift-free."""
    doc = small_doc(problem={"name": "bilevel-quadratic"}, channel=LOSSLESS, quantization_bits=32,
                    algorithms=[{"name": "fedmsa", "rounds": 120, "eval_every": 120,
                                 "local_steps": 20}])
    for key in ("data", "model", "population"):
        doc.pop(key)
    sc = scenario_from_document(doc, "fedmsa.yaml")
    world, thetas, run = run_recording_thetas(monkeypatch, sc)
    prob = world.evaluator
    a, b, c = prob.a_np.mean(0), prob.b_np.mean(0), prob.c_np.mean(0)
    gain = np.linalg.solve(a, b)
    x_star = np.linalg.solve(gain.T @ gain + np.eye(10), gain.T @ c)
    w_star = gain @ x_star
    v_star = np.linalg.solve(a, w_star - c)
    final = thetas[-1].double().numpy()
    assert np.linalg.norm(final[:10] - x_star) <= 1e-4 * np.linalg.norm(x_star)
    star = np.concatenate([x_star, w_star, v_star])
    assert np.linalg.norm(final - star) <= 1e-4 * np.linalg.norm(star)
    rows = pd.DataFrame(run.rows)
    assert rows.suboptimality.iloc[-1] == pytest.approx(
        np.linalg.norm(final[:10] - x_star) / np.linalg.norm(x_star), rel=1e-6)
    assert rows.suboptimality.iloc[0] == pytest.approx(1.0)


def test_payloads_and_hessian_vector_products_per_client(monkeypatch):
    """Alg. 1 (S = 1): every client sends its direction (P values) and hears the direction and
    the new model (2P); the selected client also sends its final iterate. HVPs: one map
    evaluation per client in round 0, two from then on (momentum), plus 2 (K - 1) on the
    selected client."""
    rounds, k, m = 5, 4, 5
    sc = _scenario({"rounds": rounds, "local_steps": k, "rho": 0.5})
    world, _, run = run_recording_thetas(monkeypatch, sc)
    p = world.evaluator.d
    assert p == 3 + 2 * 4
    vec = Payload.vectors(p, 32).bits
    selected = np.zeros(m, dtype=int)
    for r in range(rounds):
        selected[keyed_rng(sc.seed, "fedmsa-select", r).choice(np.arange(m), 1)] += 1
    led = run.ledger
    np.testing.assert_array_equal(led.bits_up, vec * (rounds + selected))
    np.testing.assert_array_equal(led.bits_down, vec * 2 * rounds)
    hvps = 1 + 2 * (rounds - 1) + np.zeros(m)
    for r in range(1, rounds):
        hvps[keyed_rng(sc.seed, "fedmsa-select", r).choice(np.arange(m), 1)] += 2 * (k - 1)
    np.testing.assert_array_equal(led.hvp_passes, hvps)
    np.testing.assert_array_equal(led.backward_passes, 2 * hvps)
    rows = pd.DataFrame(run.rows)
    assert rows.hessian_vector_products.iloc[-1] == pytest.approx(hvps.mean())


def test_a_hessian_vector_product_is_priced_as_one_forward_and_one_backward_pass():
    world = build_world(_scenario({"rounds": 1}))
    compute = world.compute_model(32)
    hvp = Cost(forward_passes=2, backward_passes=2, hvp_passes=1)
    fwd, bwd = hvp.priced_passes(3)
    np.testing.assert_array_equal(fwd, [3, 3, 3])
    np.testing.assert_array_equal(bwd, [3, 3, 3])
    assert hvp.per_device(3)[1].tolist() == [2, 2, 2]  # gradient evaluations exclude the HVP
    energy = compute.energy_j(fwd, bwd, 1)
    np.testing.assert_allclose(energy, 3 * compute.forward_energy_j(1)
                               + 3 * compute.backward_energy_j(1), rtol=1e-15)


def test_fedmsa_is_deterministic_with_noisy_minibatch_oracles():
    sc = _scenario({"rounds": 6, "local_steps": 3, "full_batch": False}, noise_std=0.1)
    runs = [pd.DataFrame(run_algorithm(build_world(sc), sc.algorithms[0]).rows)
            for _ in range(2)]
    pd.testing.assert_frame_equal(*runs)
    exact = _scenario({"rounds": 6, "local_steps": 3})
    other = pd.DataFrame(run_algorithm(build_world(exact), exact.algorithms[0]).rows)
    assert not np.allclose(runs[0].suboptimality, other.suboptimality)


def test_clean_errors():
    with pytest.raises(UserError, match="fedmsa needs a multi-sequence problem"):
        sc = scenario_from_document(small_doc(algorithms=[{"name": "fedmsa", "rounds": 1}]),
                                    "x.yaml")
        run_algorithm(build_world(sc), sc.algorithms[0])
    with pytest.raises(UserError, match="local_clients .6. exceeds the 5 clients"):
        sc = _scenario({"rounds": 1, "local_clients": 6})
        run_algorithm(build_world(sc), sc.algorithms[0])
    with pytest.raises(UserError, match="no single loss f_i to take gradients of; run it with "
                                        "algorithm 'fedmsa'"):
        sc = _scenario({"rounds": 1})
        doc = small_doc(problem=PROBLEM, algorithms=[{"name": "fedavg", "rounds": 1}])
        for key in ("data", "model", "population"):
            doc.pop(key)
        sc = scenario_from_document(doc, "x.yaml")
        run_algorithm(build_world(sc), sc.algorithms[0])
    with pytest.raises(UserError, match="'dimension_w' is only read by problem "
                                        "'bilevel-quadratic'"):
        scenario_from_document(small_doc(problem={"name": "quadratic", "dimension_w": 3}),
                               "x.yaml")
    with pytest.raises(UserError, match="rho"):
        _scenario({"rounds": 1, "rho": 1.5})


def test_a_diverging_run_stops_with_a_message():
    """fedmsa.md Sec. 2.6 [S]: alpha = beta too large diverges; the run stops cleanly."""
    sc = _scenario({"rounds": 200, "alpha": 1.5, "beta": 1.5, "local_steps": 5})
    run = run_algorithm(build_world(sc), sc.algorithms[0])
    assert run.status == "diverged"
    assert "lower its learning rate" in run.message
