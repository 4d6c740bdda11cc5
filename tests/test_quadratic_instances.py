"""fedred.md Fig. 1's three instances of the synthetic problem (Sec. 4.1), each against a truth
computed here: the non-convex instance's constants (L and the most negative curvature, beta term
included) by eigen-decompositions and SVDs of Hessians taken by torch.autograd; the general
convex instance's spectrum (all A_i PSD, the flat eigenvalues near 0) by numpy.linalg; gradients
and losses with the beta term against the objective written out again in numpy (finite
differences) and torch.autograd; the general convex f* and x* against scipy.optimize; GD through
the engine on each instance; the strongly convex default against the numbers recorded before the
instances existed (docs/data/seed004-quadratic/facts.json)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import optimize, stats

from tests.conftest import quadratic_noise_draws, small_doc
from wirelessfl.errors import UserError
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.problems.quadratic import QuadraticProblem, fedred_quadratic
from wirelessfl.scenario.loader import load_scenario, resolved_document, scenario_from_document

ROOT = Path(__file__).resolve().parents[1]
RELIABLE = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}}
PHI_MAX, PHI_MIN = 2.0, -0.5  # the range of phi''(t), phi(t) = t^2 / (1 + t^2)


def instance_scenario(problem: dict, algorithms: list[dict] | None = None):
    """A quadratic scenario (lossless 32-bit uplink, no data sections) of ``problem``'s keys."""
    algorithms = algorithms or [{"name": "gd", "rounds": 1}]
    doc = small_doc(channel=RELIABLE, quantization_bits=32, algorithms=algorithms,
                    problem={"name": "quadratic", **problem})
    for key in ("data", "model", "population"):
        doc.pop(key)
    return scenario_from_document(doc, "instances.yaml")


def built(problem: dict) -> QuadraticProblem:
    return build_world(instance_scenario(problem)).evaluator


def numpy_objective(a, c, beta, x):
    """f_i(x) = 1/2 x^T A_i x - c_i^T x + beta sum_k x_k^2 / (1 + x_k^2) for every client [n]."""
    return (0.5 * np.einsum("j,njk,k->n", x, a, x) - c @ x
            + beta * np.sum(x**2 / (1 + x**2)))


def torch_objective(a, c, beta, i, x):
    return 0.5 * x @ a[i] @ x - c[i] @ x + beta * torch.sum(x**2 / (1 + x**2))


def client_hessians(p: QuadraticProblem, x: np.ndarray) -> np.ndarray:
    """grad^2 f_i(x) [n, d, d] by torch.autograd."""
    a, c = torch.as_tensor(p.a_np), torch.as_tensor(p.c_np)
    point = torch.as_tensor(x, dtype=torch.float64)
    return np.stack([torch.autograd.functional.hessian(
        lambda y, i=i: torch_objective(a, c, p.beta, i, y), point).numpy()
        for i in range(p.num_devices)])


# ---- the non-convex instance's constants --------------------------------------------------------
def test_non_convex_constants_match_eigendecompositions_of_autograd_hessians():
    p = built({"instance": "non-convex"})  # defaults: d = 100, L = 100, mu = -2.5, beta = 400
    print("\nnon-convex constants (d = 100):", p.describe())
    beta, c = p.beta, p.constants
    assert beta == 400.0
    eig = np.linalg.eigvalsh(p.a_np)
    # The quadratic part: indefinite A_i (every one has a negative eigenvalue), the most negative
    # of them the requested mu, max ||A_i|| = L (SVD), and a positive definite mean.
    assert (eig[:, 0] < 0).all() and (eig[:, -1] > 0).all()
    assert eig.min() == pytest.approx(-2.5, abs=1e-10)
    assert p.describe()["quadratic_mu"] == pytest.approx(eig.min(), abs=1e-12)
    assert max(np.linalg.norm(a_i, 2) for a_i in p.a_np) == pytest.approx(100.0, rel=1e-12)
    assert np.linalg.eigvalsh(p.a_np.mean(0))[0] > 0
    # f_i's constants, beta included, from the Hessians themselves: at x = 0 the beta term adds
    # 2 beta I (its largest curvature), at x = (+-1, ..., +-1) it adds -beta/2 I (its smallest).
    top = np.linalg.eigvalsh(client_hessians(p, np.zeros(p.d)))[:, -1].max()
    signs = np.random.default_rng(0).choice([-1.0, 1.0], p.d)
    low = np.linalg.eigvalsh(client_hessians(p, signs))[:, 0].min()
    assert c["L"] == pytest.approx(top, rel=1e-12)
    assert c["L"] == pytest.approx(eig[:, -1].max() + 2 * beta, rel=1e-12)
    assert c["mu"] == pytest.approx(low, rel=1e-12)
    assert c["mu"] == pytest.approx(eig.min() - beta / 2, rel=1e-12)
    assert c["mu"] < 0
    # Nowhere else is the curvature outside [mu, L]: Hessians at random points, by SVD.
    rng = np.random.default_rng(1)
    for x in (rng.normal(0, s, p.d) for s in (0.3, 1.0, 3.0)):
        h = client_hessians(p, x)
        assert max(np.linalg.norm(h_i, 2) for h_i in h) <= c["L"] * (1 + 1e-12)
        assert np.linalg.eigvalsh(h)[:, 0].min() >= c["mu"] * (1 + 1e-12)
        # The beta term is the same on every client: the dissimilarity of the Hessians at any x
        # is the A_i's (delta_A, delta_B of fedred.md Sec. 4.1, spectral norms by SVD).
        dev = [np.linalg.norm(h_i - h.mean(0), 2) for h_i in h]
        assert math.sqrt(np.mean(np.square(dev))) == pytest.approx(c["delta_A"], rel=1e-9)
        assert max(dev) == pytest.approx(c["delta_B"], rel=1e-9)
    assert c["delta_A"] == pytest.approx(5.0, rel=1e-12)
    # f* is unknown: no optimum, suboptimality NaN, ||grad f||^2 the measure (A14).
    assert p.optimum is None and p.optimum_value is None
    assert math.isnan(p.suboptimality(p.initial()))
    assert p.grad_norm_sq(p.initial()) > 0


def test_general_convex_instance_is_psd_with_shared_eigenvalues_near_zero():
    p = built({"instance": "general-convex"})  # d = 100: 10 flat directions at 1e-3, bulk >= 1
    print("\ngeneral-convex constants (d = 100):", p.describe())
    eig = np.linalg.eigvalsh(p.a_np)
    scale = np.abs(eig).max()
    assert (eig >= -1e-12 * scale).all()  # every A_i PSD
    assert scale == pytest.approx(100.0, rel=1e-12)
    # 10 eigenvalues of every A_i at 1e-3 (close to 0), the rest from 1 up
    np.testing.assert_allclose(eig[:, :10], 1e-3, rtol=1e-8)
    assert eig[:, 10:].min() == pytest.approx(1.0, rel=1e-10)
    # the flat directions are shared: the mean Hessian, so f, is flat there too
    mean_eig = np.linalg.eigvalsh(p.a_np.mean(0))
    np.testing.assert_allclose(mean_eig[:10], 1e-3, rtol=1e-8)
    assert mean_eig[10] > 1.0
    c = p.constants
    assert c["mu"] == pytest.approx(1e-3, rel=1e-8) and c["L"] == pytest.approx(100.0, rel=1e-12)
    dev = [np.linalg.norm(a_i - p.a_np.mean(0), 2) for a_i in p.a_np]
    assert c["delta_A"] == pytest.approx(math.sqrt(np.mean(np.square(dev))), rel=1e-12)
    assert c["delta_A"] == pytest.approx(5.0, rel=1e-12)
    assert c["delta_B"] == pytest.approx(max(dev), rel=1e-12)
    assert p.beta == 0 and p.optimum_value is not None
    # (the strongly convex instance, for the record)
    print("strongly-convex constants (d = 100):", built({}).describe())


# ---- gradients and losses with the beta term ----------------------------------------------------
def test_beta_term_gradients_and_losses_match_numpy_finite_differences_and_autograd():
    n, d, beta = 4, 6, 400.0
    a, c = fedred_quadratic(n, d, 10.0, -0.5, 1.0, np.random.default_rng(3), indefinite=True)
    p = QuadraticProblem(a, c, beta=beta)
    sc = QuadraticProblem(a, c, beta=beta, server_loss=True)
    gen = torch.Generator().manual_seed(0)
    # points across the beta term's convex (|x| < 1/sqrt 3) and concave parts
    models = 1.5 * torch.randn(n, d, generator=gen, dtype=torch.float64)
    idx = p.sample(gen, 3)[0]
    grads, losses = p.stacked_gradients(models, idx), p.stacked_losses(models, idx)
    theta = models[0]
    full, each = p.full_gradients(theta), p.full_gradients(models)
    h, eye = 1e-6, np.eye(d)
    for i in range(n):
        x = models[i].numpy()
        assert float(losses[i]) == pytest.approx(numpy_objective(a, c, beta, x)[i], rel=1e-12)
        fd = [(numpy_objective(a, c, beta, x + h * e)[i]
               - numpy_objective(a, c, beta, x - h * e)[i]) / (2 * h) for e in eye]
        np.testing.assert_allclose(grads[i].numpy(), fd, rtol=1e-7, atol=1e-6)
        np.testing.assert_allclose(each[i].numpy(), fd, rtol=1e-7, atol=1e-6)
        y = theta.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(torch_objective(p.A, p.c, beta, i, y), y)
        torch.testing.assert_close(full[i], g, rtol=1e-12, atol=1e-10)
    x = theta.numpy()

    def mean(z):
        return numpy_objective(a, c, beta, z).mean()

    fd = np.array([(mean(x + h * e) - mean(x - h * e)) / (2 * h) for e in eye])
    assert p.objective(theta) == pytest.approx(mean(x), rel=1e-12)
    np.testing.assert_allclose(p.objective_gradient(theta).numpy(), fd, rtol=1e-7, atol=1e-6)
    assert p.grad_norm_sq(theta) == pytest.approx(float(fd @ fd), rel=1e-6)
    np.testing.assert_allclose(sc.server_gradient(theta, gen, 4).numpy(), fd, rtol=1e-7,
                               atol=1e-6)
    assert sc.server_objective(theta) == pytest.approx(mean(x), rel=1e-12)
    # float32 in, float32 out (models on the air); float64 kept (the algorithms' compute dtype)
    assert p.stacked_gradients(models.float(), idx).dtype == torch.float32
    assert p.stacked_losses(models.float(), idx).dtype == torch.float32
    assert p.objective_gradient(theta.float()).dtype == torch.float32
    assert grads.dtype == torch.float64


def test_minibatch_noise_keeps_its_law_and_keys_with_the_beta_term():
    sigma, b, d, beta = 2.0, 4, 50, 400.0
    a, c = fedred_quadratic(4, d, 20.0, -1.0, 2.0, np.random.default_rng(5), indefinite=True)
    p = QuadraticProblem(a, c, sigma, beta=beta)
    theta, idx, noise, row, fd = quadratic_noise_draws(p, b)
    # Assumption 1 (fedred.md Sec. 1.4): unbiased, E||g - grad f_i||^2 = sigma^2 / b, Gaussian
    assert np.mean(np.sum(noise**2, 1)) == pytest.approx(sigma**2 / b, rel=0.03)
    assert stats.kstest(noise.ravel() / (sigma / math.sqrt(b * d)), "norm").pvalue > 1e-3
    # the noisy minibatch loss is consistent with its gradient (finite differences)
    torch.testing.assert_close(row, fd, rtol=1e-6, atol=1e-5)
    # the same keys give the same gradients however devices are chunked
    small = QuadraticProblem(a, c, sigma, max_chunk_mb=1e-6, beta=beta)
    assert len(list(small.chunks(b, own_model=True))) == 4

    def gathered(problem):
        return torch.cat([g for _, g in problem.device_gradients(theta, idx[0])])

    torch.testing.assert_close(gathered(small), gathered(p), rtol=1e-13, atol=1e-12)


# ---- f* and x* of the general convex instance ----------------------------------------------------
@pytest.mark.parametrize("mu", [1e-3, 0.0])
def test_general_convex_optimum_matches_scipy(mu):
    """mu = 1e-3: A positive definite, x* = A^{-1} c (scipy's trust-region Newton); mu = 0: A
    singular, x* the minimum-norm minimiser (least squares), f* still exact: scipy's CG from 0
    stays in A's range (Krylov), so it finds that point, and Newton one that differs from it by a
    null vector of A only."""
    p = built({"instance": "general-convex", "dimension": 12, "flat_directions": 3, "mu": mu,
               "L": 30.0, "delta": 2.0})
    a, c = p.a_np.mean(0), p.c_np.mean(0)
    assert np.linalg.eigvalsh(a)[0] == pytest.approx(mu, abs=1e-12)
    result = optimize.minimize(lambda x: 0.5 * x @ a @ x - c @ x, np.zeros(12),
                               jac=lambda x: a @ x - c, method="CG",
                               options={"gtol": 1e-12, "maxiter": 100000})
    exact = optimize.minimize(lambda x: 0.5 * x @ a @ x - c @ x, np.zeros(12),
                              jac=lambda x: a @ x - c, hess=lambda x: a, method="trust-exact",
                              options={"gtol": 1e-13})
    # CG certifies its own point whatever rounding stopped it ("precision loss" on some BLAS):
    # f(x) - f* <= ||grad f(x)||^2 / (2 lambda), lambda the least eigenvalue of A on its range
    curvature = mu if mu > 0 else min(e for e in np.linalg.eigvalsh(a) if e > 1e-9)
    gap, rounding = result.fun - p.optimum_value, 1e-12 * abs(p.optimum_value)
    assert -rounding <= gap <= np.linalg.norm(result.jac) ** 2 / (2 * curvature) + rounding
    assert p.optimum_value == pytest.approx(exact.fun, rel=1e-12)
    x_star = p.optimum.numpy()
    if mu > 0:
        np.testing.assert_allclose(x_star, exact.x, rtol=1e-8, atol=1e-9)
    else:
        np.testing.assert_allclose(x_star, result.x, rtol=1e-6, atol=1e-6)
        null = np.linalg.eigh(a)[1][:, :3]  # the 3 flat directions
        assert np.abs(null.T @ x_star).max() < 1e-8
        assert np.abs(a @ (x_star - exact.x)).max() < 1e-6
        assert np.linalg.norm(x_star) <= np.linalg.norm(exact.x)
    assert p.suboptimality(torch.as_tensor(exact.x)) < 1e-10
    assert p.suboptimality(torch.zeros(12)) == pytest.approx(-p.optimum_value, rel=1e-12)


# ---- GD on each instance -------------------------------------------------------------------------
@pytest.mark.parametrize("problem", [{}, {"instance": "general-convex"},
                                     {"instance": "non-convex"},
                                     {"instance": "non-convex", "minimizer_std": 30.0}],
                         ids=["strongly-convex", "general-convex", "non-convex",
                              "non-convex-far"])
def test_gd_decreases_the_objective_and_the_measure_of_each_instance(problem):
    """GD with its default step 1/L (L of the constants, 2 beta included) on d = 100: f falls at
    every round (the descent lemma), and so does the instance's measure (A14): f - f* for the
    convex instances, ||grad f||^2 for the non-convex one. minimizer_std = 30 puts the
    stationary points in the beta term's concave region (|x_k| > 1/sqrt 3)."""
    sc = instance_scenario(problem, [{"name": "gd", "rounds": 300, "eval_every": 10}])
    world = build_world(sc)
    run = run_algorithm(world, sc.algorithms[0])
    assert run.status == "complete", run.message
    rows = pd.DataFrame(run.rows)
    f = rows.test_loss.to_numpy()
    assert (np.diff(f) <= 1e-9 * np.abs(f[1:]).max()).all()
    grad = rows.grad_norm_sq.to_numpy()
    if world.evaluator.beta:
        assert rows.suboptimality.isna().all()
        assert grad[-1] < 1e-3 * grad[0]
    else:
        gap = rows.suboptimality.to_numpy()
        assert (np.diff(gap) <= 1e-9 * gap[0]).all()
        assert gap[-1] < 1e-5 * gap[0]
        np.testing.assert_allclose(f - world.evaluator.optimum_value, gap, atol=1e-6 * gap[0])


# ---- the keys -----------------------------------------------------------------------------------
def test_instance_defaults_are_filled_recorded_and_read_back():
    expected = {"strongly-convex": {"mu": 1.0, "beta": 0.0},
                "general-convex": {"mu": 1e-3, "beta": 0.0, "flat_directions": 10,
                                   "bulk_mu": 1.0},
                "non-convex": {"mu": -2.5, "beta": 400.0}}
    for instance, values in expected.items():
        sc = instance_scenario({"instance": instance})
        document = resolved_document(sc)["problem"]
        assert {k: document[k] for k in values} == values
        assert ("flat_directions" in document) == (instance == "general-convex")
        again = instance_scenario({k: v for k, v in document.items() if k != "name"})
        assert again.problem == sc.problem
    assert instance_scenario({}).problem.instance == "strongly-convex"
    assert instance_scenario({"instance": "general-convex", "dimension": 7}
                             ).problem.flat_directions == 1
    assert instance_scenario({"instance": "non-convex", "delta": 2.0}).problem.mu == -1.0


@pytest.mark.parametrize("problem, message", [
    ({"mu": -1.0}, r"mu \(-1\) must be >= 0 for instance: strongly-convex"),
    ({"instance": "non-convex", "mu": 0.5}, r"must be negative"),
    ({"instance": "non-convex", "mu": -150.0}, r">= -L \(-100\)"),
    ({"beta": 10.0}, r"beta: 10 makes f non-convex, but instance is strongly-convex"),
    ({"instance": "general-convex", "beta": 1.0}, r"set instance: non-convex"),
    ({"flat_directions": 3}, r"flat_directions is only read with instance: general-convex"),
    ({"instance": "non-convex", "bulk_mu": 2.0}, r"bulk_mu is only read"),
    ({"instance": "general-convex", "mu": 1.0}, r"below bulk_mu \(1\)"),
    ({"instance": "general-convex", "flat_directions": 99}, r"at least 2"),
    ({"mu": 200.0}, r"L \(100\) must be larger than mu \(200\)"),
    ({"instance": "non-convex", "delta": 0.0}, r"must be negative.*set delta > 0"),
    ({"instance": "non-convex", "dimension": 6}, r"needs dimension >= clients \+ 2"),
])
def test_a_section_an_instance_cannot_have_is_refused_in_one_line(problem, message):
    with pytest.raises(Exception, match=message):
        instance_scenario(problem)


def test_a_non_convex_instance_unbounded_below_is_refused_with_the_bound_to_respect():
    """At delta = 5 the clients' smallest eigenvalues reach only about 4-5.5 below the mean's
    (d = 100), so mu = -8 leaves the mean Hessian indefinite and f unbounded below (the beta term
    is bounded by beta d): refused at build time with the mu that would do; that mu builds."""
    with pytest.raises(UserError, match=r"unbounded below.*must stay above about") as info:
        built({"instance": "non-convex", "mu": -8.0})
    bound = float(str(info.value).split("above about ")[1].split(" ")[0])
    assert -8.0 < bound < -2.5
    p = built({"instance": "non-convex", "mu": 0.95 * bound})
    assert np.linalg.eigvalsh(p.a_np.mean(0))[0] > 0


def test_the_default_instance_is_the_problem_recorded_before_instances_existed():
    """seed004-quadratic (the strongly convex default) builds the problem recorded in
    docs/data/seed004-quadratic/facts.json: the same constants, f* and ||x*||."""
    recorded = json.loads((ROOT / "docs/data/seed004-quadratic/facts.json").read_text())["problem"]
    sc = load_scenario(str(ROOT / "scenarios/seed004-quadratic.yaml"))
    assert sc.problem.instance == "strongly-convex" and sc.problem.beta == 0
    described = build_world(sc).evaluator.describe()
    assert set(described) == set(recorded)
    for key, value in recorded.items():
        if isinstance(value, float):
            assert described[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert described[key] == value, key
