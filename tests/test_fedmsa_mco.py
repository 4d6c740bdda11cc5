"""FedMSA on the compositional (MCO) instance: fedmsa.md Sec. 4.1's risk-averse problem, N = 2.

Truths used: the layer chain's derivatives written out by hand in numpy (the maps are a chain of
vector-Jacobian products by autodiff in the code), and the composed objective's value."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import run_recording_thetas, small_doc
from wirelessfl.problems.mco import RiskAverseMCO, risk_averse_data
from wirelessfl.scenario.loader import scenario_from_document

LAM, DELTA = 0.1, 0.1


def _numpy_maps(a, b, x, z1, z2):
    """One client's (p, s^1, s^2) on all its data, derivatives by hand (fedmsa.md Sec. 2.5)."""
    def u_and_grad(v):
        t = a @ v
        u = (b - t**2) ** 2
        return u, (-4 * (b - t**2) * t)[:, None] * a

    u0, du0 = u_and_grad(x)
    f0 = np.r_[x, u0.mean()]
    x1, y = z1[:-1], z1[-1]
    u1, du1 = u_and_grad(x1)
    gap = np.maximum(0, u1 - y)
    f1 = np.r_[y, (gap**2).mean()]
    g2 = np.r_[1.0, LAM / (2 * np.sqrt(z2[1] + DELTA))]
    g1 = np.r_[g2[1] * (2 * gap[:, None] * du1).mean(0), g2[0] - g2[1] * (2 * gap).mean()]
    p = g1[:-1] + g1[-1] * du0.mean(0)
    return np.r_[p, z1 - f0, z2 - f1]


def _problem(clients=2, samples=60, d=4):
    a, b, x_true = risk_averse_data(samples, d, 1e-3, np.random.default_rng(5))
    return RiskAverseMCO(a, b, x_true, clients, LAM, DELTA), a, b


def test_maps_are_the_layer_chain_of_sec_2_5():
    prob, a, b = _problem()
    rng = np.random.default_rng(2)
    states = rng.standard_normal((2, prob.d)) * 0.5
    states[:, -1] = np.abs(states[:, -1])  # s >= 0 inside the square root
    got = prob.maps(torch.as_tensor(states), torch.arange(2)).numpy()
    for m in range(2):
        rows = slice(30 * m, 30 * (m + 1))
        x, z1, z2 = np.split(states[m], [4, 9])
        np.testing.assert_allclose(got[m], _numpy_maps(a[rows], b[rows], x, z1, z2),
                                   rtol=1e-10, atol=1e-12)


def test_objective_is_the_composition_and_its_gradient_matches_finite_differences():
    prob, a, b = _problem()
    x = np.random.default_rng(4).standard_normal(4)

    def objective(v):
        u = (b - (a @ v) ** 2) ** 2
        return u.mean() + LAM * np.sqrt((np.maximum(0, u - u.mean()) ** 2).mean() + DELTA)

    theta = torch.as_tensor(np.r_[x, np.zeros(prob.d - 4)])
    assert prob.objective(theta) == pytest.approx(objective(x), rel=1e-12)
    eps = 1e-6
    fd = [(objective(x + eps * e) - objective(x - eps * e)) / (2 * eps) for e in np.eye(4)]
    np.testing.assert_allclose(prob.objective_gradient(theta).numpy(), fd, rtol=1e-6)
    # the error is measured up to sign (fedmsa.md A15)
    star = prob.solution
    assert prob.relative_error(torch.cat([-star, torch.zeros(prob.d - 4, dtype=star.dtype)])) == 0


def _scenario(algorithm: dict, **problem):
    doc = small_doc(problem={"name": "risk-averse-mco", **problem}, quantization_bits=32,
                    channel={"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}},
                    algorithms=[{"name": "fedmsa", **algorithm}])
    for key in ("data", "model", "population"):
        doc.pop(key)
    return scenario_from_document(doc, "mco.yaml")


def test_fedmsa_lowers_the_risk_averse_objective_and_tracks_the_layers(monkeypatch):
    """Exact oracles, M = 2, S = 1: the objective falls from x_0 = 0.1 * 1 (fedmsa.md 4.5 [C])
    by orders of magnitude, and the trackers end at their layers' values over all data:
    z^1 = F^0(x), z^2 = F^1(z^1) within 1e-3 (x still moves, by about 2 units in all, and the
    trackers follow it at rate beta)."""
    sc = _scenario({"rounds": 150, "eval_every": 150, "alpha": 1e-3, "beta": 0.3,
                    "local_steps": 5})
    world, thetas, run = run_recording_thetas(monkeypatch, sc)
    rows = pd.DataFrame(run.rows)
    assert run.status == "complete"
    assert rows.test_loss.iloc[-1] < 1e-3 * rows.test_loss.iloc[0]
    assert rows.suboptimality.iloc[-1] < 0.5 * rows.suboptimality.iloc[0]
    prob = world.evaluator
    a = prob.a.reshape(-1, prob.dim).numpy()
    b = prob.b.reshape(-1).numpy()
    x, z1, z2 = np.split(thetas[-1].double().numpy(), [prob.dim, 2 * prob.dim + 1])
    u = (b - (a @ x) ** 2) ** 2
    np.testing.assert_allclose(z1, np.r_[x, u.mean()], rtol=1e-3, atol=1e-3)
    u1 = (b - (a @ z1[:-1]) ** 2) ** 2
    np.testing.assert_allclose(z2, [z1[-1], (np.maximum(0, u1 - z1[-1]) ** 2).mean()],
                               rtol=1e-3, atol=1e-3)


def _centralized_run(monkeypatch, algorithm: dict):
    """(scenario, world, theta after each round, run) of a centralized reference on the small
    risk-averse problem (d = 4, 60 samples over 2 clients), evaluated every round."""
    doc = small_doc(problem={"name": "risk-averse-mco", "dimension": 4, "samples": 60,
                             "sample_batch": 10},
                    population={"num_devices": 2},
                    algorithms=[{**algorithm, "eval_every": 1}])
    for key in ("data", "model"):
        doc.pop(key, None)
    sc = scenario_from_document(doc, "centralized.yaml")
    return (sc, *run_recording_thetas(monkeypatch, sc))


def test_centralized_sgd_is_numpys_minibatch_sgd_on_the_pooled_objective(monkeypatch):
    """The centralized reference (algorithms/centralized.py) against a numpy re-implementation
    of the notebook's loop (fedmsa.md 4.5 [C]): each step draws ``batch`` of the M clients'
    pooled samples (with replacement, keyed per step), takes the plug-in gradient of
    F = mean U + lambda sqrt(mean max(0, U - mean U)^2 + delta) on them, derived by hand, and
    steps x by -lr times it; the trackers never move, nothing crosses the air, and one round is
    one update."""
    from wirelessfl.contract.problem import KEY_LIMIT
    from wirelessfl.learning.seeds import keyed_rng

    rounds, lr, batch = 6, 0.05, 16
    sc, world, thetas, run = _centralized_run(monkeypatch, {
        "name": "centralized-sgd", "rounds": rounds, "lr": lr, "batch_size": batch})
    problem = world.evaluator
    a = problem.a.reshape(-1, 4).numpy()
    b = problem.b.reshape(-1).numpy()
    x = thetas[0][:4].double().numpy()
    for k in range(rounds):
        key = int(keyed_rng(sc.seed, "centralized-batch", k).integers(0, KEY_LIMIT))
        idx = np.random.default_rng(key).integers(0, len(b), batch)
        ak, bk = a[idx], b[idx]
        t = ak @ x
        u = (bk - t**2) ** 2
        du = (-4 * (bk - t**2) * t)[:, None] * ak
        gap = np.maximum(0, u - u.mean())
        dm = du.mean(0)
        ds = (2 * gap[:, None] * (du - dm)).mean(0)
        grad = dm + LAM / (2 * np.sqrt((gap**2).mean() + DELTA)) * ds
        x = (x - lr * grad).astype(np.float32).astype(np.float64)
        got = thetas[k + 1].double().numpy()
        np.testing.assert_allclose(got[:4], x, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(got[4:], thetas[0][4:].double().numpy())
    rows = pd.DataFrame(run.rows)
    assert run.status == "complete" and rows.local_steps.tolist() == list(range(rounds + 1))
    assert (rows[["energy_j", "bits_up", "bits_down", "sim_time_s"]] == 0).all().all()
    assert rows.suboptimality.iloc[-1] != rows.suboptimality.iloc[0]


def test_centralized_stsa_is_fedmsas_tracking_recipe_on_the_pooled_data(monkeypatch):
    """Centralized STSA (algorithms/centralized.py) against a numpy re-implementation of
    FedMSA's updates with one client holding every sample and K = 1 (fedmsa.md Sec. 2.1): each
    step draws ``batch`` pooled samples (with replacement, keyed per step) and evaluates the
    maps, derived by hand (``_numpy_maps``), at the state and, with momentum, at the previous
    state on the same samples; d_k = maps_k + (1 - rho) (d_{k-1} - maps_{k-1}) (rho_0 = 1);
    the state steps by -alpha d on x and -beta d on the trackers. Nothing crosses the air."""
    from wirelessfl.contract.problem import KEY_LIMIT
    from wirelessfl.learning.seeds import keyed_rng

    rounds, alpha, beta, rho, batch = 6, 0.02, 0.3, 0.4, 16
    sc, world, thetas, run = _centralized_run(monkeypatch, {
        "name": "centralized-stsa", "rounds": rounds, "alpha": alpha, "beta": beta, "rho": rho,
        "batch_size": batch})
    problem = world.evaluator
    a = problem.a.reshape(-1, 4).numpy()
    b = problem.b.reshape(-1).numpy()
    steps = np.r_[np.full(4, alpha), np.full(5 + 2, beta)]
    state = thetas[0].double().numpy()
    previous = direction = None
    for k in range(rounds):
        key = int(keyed_rng(sc.seed, "stsa-batch", k).integers(0, KEY_LIMIT))
        idx = np.random.default_rng(key).integers(0, len(b), batch)
        here = _numpy_maps(a[idx], b[idx], *np.split(state, [4, 9]))
        if direction is None:
            new_direction = here
        else:
            before = _numpy_maps(a[idx], b[idx], *np.split(previous, [4, 9]))
            new_direction = here + (1 - rho) * (direction - before)
        previous, direction = state, new_direction
        state = (state - steps * direction).astype(np.float32).astype(np.float64)
        np.testing.assert_allclose(thetas[k + 1].double().numpy(), state, rtol=1e-6, atol=1e-7)
    rows = pd.DataFrame(run.rows)
    assert run.status == "complete" and rows.local_steps.tolist() == list(range(rounds + 1))
    assert (rows[["energy_j", "bits_up", "bits_down", "sim_time_s"]] == 0).all().all()
