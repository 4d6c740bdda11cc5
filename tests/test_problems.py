"""Learning problems against independent truths: the quadratic's gradients against torch.autograd
and finite differences, x* against scipy.optimize, its constants against numpy.linalg, FedSGD and
FedAvg driving the recorded suboptimality to zero, the logistic reference optimum approached by
full-batch gradient descent, gradient-evaluation counts, and one-line errors for a bad section."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from scipy import optimize, stats
from torch.func import functional_call

from tests.conftest import quadratic_noise_draws, small_doc, small_scenario
from wirelessfl.errors import UserError
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.problems.base import Problem
from wirelessfl.problems.quadratic import QuadraticProblem, fedred_quadratic
from wirelessfl.results.records import ROUND_COLUMNS, RunWriter, read_run
from wirelessfl.scenario.loader import resolved_document, scenario_from_document

RELIABLE = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}}


def quadratic_doc(problem: dict, algorithms: list[dict], **changes) -> dict:
    """A scenario document for a quadratic: no data/model sections, lossless 32-bit uplink."""
    doc = small_doc(channel=RELIABLE, quantization_bits=32, algorithms=algorithms,
                    problem={"name": "quadratic", **problem}, **changes)
    for key in ("data", "model", "population"):
        if key not in changes:
            doc.pop(key)
    return doc


def make_quadratic(noise_std=0.0, n=4, d=6, L=10.0, mu=0.5, delta=1.0, seed=1):
    a, c = fedred_quadratic(n, d, L, mu, delta, np.random.default_rng(seed))
    return QuadraticProblem(a, c, noise_std)


def f_i(problem: QuadraticProblem, i: int, x: torch.Tensor) -> torch.Tensor:
    """f_i(x) = 1/2 x^T A_i x - c_i^T x, written out again."""
    return 0.5 * x @ problem.A[i] @ x - problem.c[i] @ x


# ---- the quadratic's numerics -------------------------------------------------------------------
def test_quadratic_gradients_match_autograd_and_finite_differences():
    p = make_quadratic()
    gen = torch.Generator().manual_seed(0)
    models = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    idx = p.sample(gen, 3)[0]
    grads = p.stacked_gradients(models, idx)
    losses = p.stacked_losses(models, idx)
    theta = models[0]
    full = p.full_gradients(theta)
    for i in range(4):
        x = models[i].clone().requires_grad_(True)
        value = f_i(p, i, x)
        (g,) = torch.autograd.grad(value, x)
        torch.testing.assert_close(grads[i], g, rtol=1e-12, atol=1e-10)
        assert float(losses[i]) == pytest.approx(float(value.detach()), rel=1e-12)
        x = theta.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(f_i(p, i, x), x)
        torch.testing.assert_close(full[i], g, rtol=1e-12, atol=1e-10)
    x = theta.clone().requires_grad_(True)
    mean = sum(f_i(p, i, x) for i in range(4)) / 4
    (g,) = torch.autograd.grad(mean, x)
    torch.testing.assert_close(p.objective_gradient(theta), g, rtol=1e-12, atol=1e-10)
    assert p.objective(theta) == pytest.approx(float(mean.detach()), rel=1e-12)
    h, eye = 1e-5, torch.eye(6, dtype=torch.float64)
    fd = torch.tensor([(p.objective(theta + h * e) - p.objective(theta - h * e)) / (2 * h)
                       for e in eye], dtype=torch.float64)
    torch.testing.assert_close(p.objective_gradient(theta), fd, rtol=1e-7, atol=1e-7)
    assert p.grad_norm_sq(theta) == pytest.approx(float(g @ g), rel=1e-12)


def test_quadratic_noise_is_unbiased_with_the_declared_variance_and_keyed_by_idx():
    sigma, b, d = 2.0, 4, 50
    p = make_quadratic(noise_std=sigma, d=d, L=20.0, delta=2.0)
    theta, idx, noise, row, fd = quadratic_noise_draws(p, b)
    # Assumption 1 (fedred.md Sec. 1.4): E||g - grad f_i||^2 = sigma^2 / b, Gaussian, mean 0.
    assert np.mean(np.sum(noise**2, 1)) == pytest.approx(sigma**2 / b, rel=0.03)
    assert abs(noise.mean()) < 4 * sigma / math.sqrt(b * d * noise.size)
    scaled = noise.ravel() / (sigma / math.sqrt(b * d))
    assert stats.kstest(scaled, "norm").pvalue > 1e-3
    # A loss consistent with its gradient: finite differences of the noisy minibatch loss.
    torch.testing.assert_close(row, fd, rtol=1e-6, atol=1e-6)
    # The same idx gives the same noise, however devices are chunked (bmm may round the
    # products differently by batch size); another key gives other noise.
    small = QuadraticProblem(p.a_np, p.c_np, sigma, max_chunk_mb=1e-6)
    assert len(list(small.chunks(b, own_model=True))) == 4

    def gathered(problem):
        return torch.cat([g for _, g in problem.device_gradients(theta, idx[0])])

    torch.testing.assert_close(gathered(small), gathered(p), rtol=1e-13, atol=1e-12)
    assert not torch.equal(p.stacked_gradients(theta[None], idx[0, :1]),
                           p.stacked_gradients(theta[None], idx[1, :1]))


def test_quadratic_optimum_matches_scipy_minimize():
    p = make_quadratic(n=5, d=12, L=30.0, mu=1.0, delta=3.0, seed=4)
    a, c = p.a_np.mean(0), p.c_np.mean(0)
    result = optimize.minimize(lambda x: 0.5 * x @ a @ x - c @ x, np.zeros(12),
                               jac=lambda x: a @ x - c, method="BFGS", options={"gtol": 1e-12})
    np.testing.assert_allclose(p.optimum.numpy(), result.x, rtol=1e-7, atol=1e-8)
    assert p.optimum_value == pytest.approx(result.fun, rel=1e-12)
    assert p.suboptimality(torch.as_tensor(result.x)) < 1e-14
    assert p.suboptimality(torch.zeros(12)) == pytest.approx(-p.optimum_value, rel=1e-12)


@pytest.mark.parametrize("n, d, L, mu, delta", [(5, 40, 100.0, 1.0, 5.0), (3, 15, 10.0, 0.1, 0.5),
                                                (2, 8, 4.0, 1.0, 0.0)])
def test_constructed_hessians_have_the_requested_L_mu_and_delta(n, d, L, mu, delta):
    a, _ = fedred_quadratic(n, d, L, mu, delta, np.random.default_rng(7))
    np.testing.assert_array_equal(a, a.transpose(0, 2, 1))
    norms = [np.linalg.norm(a_i, 2) for a_i in a]
    mean = a.mean(0)
    dissimilarity = [np.linalg.norm(a_i - mean, 2) for a_i in a]
    assert max(norms) == pytest.approx(L, rel=1e-9)
    assert min(np.linalg.eigvalsh(a_i)[0] for a_i in a) == pytest.approx(mu, rel=1e-9, abs=1e-12)
    # fedred.md Sec. 4.1: delta_A = sqrt(mean_i ||A_i - A||^2), delta_B = max_i ||A_i - A||.
    assert math.sqrt(np.mean(np.square(dissimilarity))) == pytest.approx(delta, abs=1e-9)
    assert max(dissimilarity) >= delta - 1e-9


# ---- runs through the engine ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def quadratic_runs(tmp_path_factory):
    """FedSGD on a heterogeneous quadratic (delta = 1), FedAvg on one with equal Hessians
    (delta = 0, where local steps keep x* a fixed point) and on the heterogeneous one, DZOFL."""
    lr = 0.1  # = 1 / L
    runs = {}
    for delta, algorithms in (
            (1.0, [{"name": "fedsgd", "rounds": 150, "eval_every": 30, "lr": lr},
                   {"name": "fedavg", "label": "fedavg-hetero", "rounds": 40, "eval_every": 20,
                    "lr": lr, "local_steps": 5},
                   {"name": "dzofl", "rounds": 20, "eval_every": 10, "alpha0": 0.1}]),
            (0.0, [{"name": "fedavg", "rounds": 40, "eval_every": 5, "lr": lr,
                    "local_steps": 5}])):
        sc = scenario_from_document(quadratic_doc(
            {"dimension": 10, "L": 10.0, "mu": 1.0, "delta": delta}, algorithms), "q.yaml")
        world = build_world(sc)
        out = tmp_path_factory.mktemp(f"quadratic-{delta}")
        writer = RunWriter(out, resolved_document(sc), sc.seed, partition=world.partition_record())
        for params in sc.algorithms:
            run = run_algorithm(world, params)
            assert run.status == "complete", run.message
            writer.add(run.label, run.rows, run.device_rows(world), {})
        writer.finish()
        for label, group in read_run(out).rounds.groupby("algorithm"):
            runs[label] = (world, group.sort_values("round").reset_index(drop=True))
    return runs


def test_fedsgd_and_fedavg_drive_the_recorded_suboptimality_below_1e_6(quadratic_runs):
    for label in ("fedsgd", "fedavg"):
        world, rows = quadratic_runs[label]
        assert list(rows.columns) == ROUND_COLUMNS
        assert rows.suboptimality.iloc[0] > 1.0
        assert rows.suboptimality.iloc[-1] < 1e-6, label
        assert (np.diff(rows.suboptimality) <= 1e-12).all(), label
        assert rows.grad_norm_sq.iloc[-1] < 1e-5
        assert rows.test_accuracy.isna().all()
        f_star = world.evaluator.optimum_value
        np.testing.assert_allclose(rows.test_loss - f_star, rows.suboptimality, atol=1e-4)
    # Without drift correction, local steps on dissimilar clients stop short of x*
    # (fedred.md Sec. 5.1: FedAvg/FedProx with K >= 5 stall at a heterogeneity floor).
    _, hetero = quadratic_runs["fedavg-hetero"]
    assert hetero.suboptimality.iloc[-1] > 1e-3


def test_gradient_evaluations_count_backward_passes_per_device(quadratic_runs):
    _, fedavg = quadratic_runs["fedavg"]
    np.testing.assert_array_equal(fedavg.gradient_evaluations, fedavg["round"] * 5)
    _, fedsgd = quadratic_runs["fedsgd"]
    np.testing.assert_array_equal(fedsgd.gradient_evaluations, fedsgd["round"])
    _, dzofl = quadratic_runs["dzofl"]
    assert (dzofl.gradient_evaluations == 0).all()  # forward passes only
    assert np.isfinite(dzofl.test_loss).all()


def test_quadratic_compute_is_costed_as_hessian_vector_products(quadratic_runs):
    world, rows = quadratic_runs["fedsgd"]
    profile = world.model_profile
    assert (profile.params, profile.macs_per_sample, profile.activations_per_sample) == (10, 100, 10)
    assert rows.energy_compute_backward_j.iloc[-1] > 0


# ---- the classifier as a Problem ----------------------------------------------------------------
def test_logistic_reference_optimum_is_approached_by_full_batch_gradient_descent():
    l2 = 0.1
    sc = small_scenario(channel=RELIABLE, quantization_bits=32, population={"num_devices": 5},
                        data={"name": "synthetic", "synthetic": {"num_samples": 400,
                                                                 "num_features": 5,
                                                                 "num_classes": 3}},
                        model={"name": "logistic", "l2": l2},
                        algorithms=[{"name": "fedsgd", "rounds": 120, "eval_every": 20,
                                     "batch_size": 60}])
    world = build_world(sc)
    ev = world.evaluator
    assert ev.data.sizes.tolist() == [60] * 5  # batch 60 = every sample: full-batch gradients
    assert ev.optimum_value is not None and ev.optimum_value < ev.objective(world.initial())
    assert ev.grad_norm_sq(ev.optimum.float()) < 1e-10
    # Softmax cross-entropy: Hessian <= 1/2 E[x x^T] (x with the bias input) + l2 I.
    x = np.hstack([world.dataset.x_train, np.ones((len(world.dataset.x_train), 1))])
    lipschitz = 0.5 * np.linalg.eigvalsh(x.T @ x / len(x))[-1] + l2
    params = sc.algorithms[0].model_copy(update={"lr": 1 / lipschitz})
    rows = pd.DataFrame(run_algorithm(world, params).rows)
    gap = rows.suboptimality.to_numpy()
    assert gap[0] > 0.1
    assert (np.diff(gap[:3]) < 0).all()
    assert -1e-6 < gap[-1] < 1e-4


def test_classifier_exact_gradients_match_per_device_autograd():
    """Unequal shards (quantity skew) and a chunk bound that splits devices into sample blocks."""
    docs = {mb: small_scenario([f"engine.max_chunk_mb={mb}"], model={"name": "mlp", "l2": 0.01,
                                                                     "hidden": [6]},
                               partition={"scheme": "quantity-skew", "beta": 0.5},
                               population={"num_devices": 4}) for mb in (1024, 0.002)}
    worlds = {mb: build_world(sc) for mb, sc in docs.items()}
    ev = worlds[1024].evaluator
    data, flat = ev.data, ev.flat
    assert len(set(data.sizes.tolist())) > 1
    theta = flat.initial() + 0.1 * torch.randn(flat.d, generator=torch.Generator().manual_seed(2))
    per_device, objective = [], 0.0
    for i in range(4):
        lo, m = int(data.offsets[i]), int(data.sizes[i])
        leaf = theta.clone().requires_grad_(True)
        logits = functional_call(flat.model, flat.unflatten(leaf), (data.x[lo:lo + m],))
        value = F.cross_entropy(logits, data.y[lo:lo + m]) + 0.005 * leaf @ leaf
        per_device.append(torch.autograd.grad(value, leaf)[0])
        objective += float(value.detach()) / 4
    expected = torch.stack(per_device)
    for world in worlds.values():
        torch.testing.assert_close(world.evaluator.full_gradients(theta), expected,
                                   rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(world.evaluator.objective_gradient(theta), expected.mean(0),
                                   rtol=1e-4, atol=1e-6)
        assert world.evaluator.objective(theta) == pytest.approx(objective, rel=1e-5)
    assert math.isnan(ev.suboptimality(theta))  # f* unknown for a neural network
    assert worlds[0.002].evaluator._samples_per_chunk() < int(data.sizes.max())


@pytest.mark.parametrize("max_chunk_mb", [1024, 0.002])
def test_held_full_batches_gather_once_and_give_the_same_bits(max_chunk_mb):
    """``holding_full_batches`` (ZO-HFL's best responses): within the block, full gradients over
    every device gather the devices' samples on the first call only, and every call gives the
    bits of the same call outside the block, at a shared point and at own models, also when the
    chunk bound splits devices into sample blocks; a subset asked inside the block is gathered
    anew; the held copy is released when the outermost block ends."""
    sc = small_scenario([f"engine.max_chunk_mb={max_chunk_mb}"],
                        model={"name": "mlp", "l2": 0.01, "hidden": [6]},
                        partition={"scheme": "quantity-skew", "beta": 0.5},
                        population={"num_devices": 4})
    ev = build_world(sc).evaluator
    g = torch.Generator().manual_seed(3)
    points = [ev.flat.initial() + 0.1 * torch.randn(ev.d, generator=g),
              ev.flat.initial() + 0.1 * torch.randn(4, ev.d, generator=g)]
    plain = [ev.full_gradients(theta) for theta in points]
    subset = ev.full_gradients(points[0], np.array([1, 3]))
    gathers = []
    original = ev.data.inputs
    ev.data.inputs = lambda positions: gathers.append(1) or original(positions)
    try:
        with ev.holding_full_batches():
            first = [ev.full_gradients(theta) for theta in points]
            per_pass = len(gathers)
            with ev.holding_full_batches():  # a nested block keeps the outer one's copy
                again = [ev.full_gradients(theta) for theta in points]
            assert len(gathers) == per_pass
            assert ev._held_batches
            inside_subset = ev.full_gradients(points[0], np.array([1, 3]))
            assert len(gathers) > per_pass
        assert ev._held_batches is None
        after = ev.full_gradients(points[1])
    finally:
        ev.data.inputs = original
    width = min(int(ev.data.sizes.max()), ev._samples_per_chunk())
    blocks = sum(-(-int(ev.data.sizes[rows].max()) // width)
                 for rows in ev.row_chunks(4, width, own_model=True))
    assert per_pass == blocks  # one gather per sample block, for the first call only
    for held in (first, again):
        for a, b in zip(held, plain):
            assert torch.equal(a, b)
    assert torch.equal(inside_subset, subset)
    assert torch.equal(subset, plain[0][[1, 3]])
    assert torch.equal(after, plain[1])
    # The independent truth: each device's mean cross-entropy (+ l2) by autograd.
    data, flat = ev.data, ev.flat
    for i in range(4):
        lo, m = int(data.offsets[i]), int(data.sizes[i])
        leaf = points[1][i].clone().requires_grad_(True)
        logits = functional_call(flat.model, flat.unflatten(leaf), (data.x[lo:lo + m],))
        value = F.cross_entropy(logits, data.y[lo:lo + m]) + 0.005 * leaf @ leaf
        torch.testing.assert_close(first[1][i], torch.autograd.grad(value, leaf)[0],
                                   rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("problem", ["classification", "quadratic"])
def test_stacked_losses_equal_device_losses_when_all_models_are_equal(problem):
    if problem == "quadratic":
        ev = make_quadratic(noise_std=1.0, n=6, d=9)
        theta = torch.randn(9, generator=torch.Generator().manual_seed(1))
    else:
        ev = build_world(small_scenario(model={"name": "logistic", "l2": 0.05})).evaluator
        theta = ev.initial() + 0.05 * torch.randn(ev.d, generator=torch.Generator().manual_seed(1))
    assert isinstance(ev, Problem)
    idx = ev.sample(torch.Generator().manual_seed(9), 7)[0]
    n = ev.num_devices
    torch.testing.assert_close(ev.stacked_losses(theta.expand(n, -1), idx),
                               ev.device_losses(theta, idx), rtol=1e-5, atol=1e-6)


# ---- the scenario section -------------------------------------------------------------------------
def test_quadratic_devices_follow_clients_or_population():
    algos = [{"name": "fedsgd", "rounds": 1}]
    sc = scenario_from_document(quadratic_doc({"clients": 7}, algos), "q.yaml")
    assert sc.population.num_devices == 7
    sc = scenario_from_document(quadratic_doc({}, algos, population={"num_devices": 6}), "q.yaml")
    assert sc.problem.clients == 6
    again = scenario_from_document(resolved_document(sc), "q.yaml")
    assert again.problem == sc.problem and again.population == sc.population
    assert scenario_from_document(quadratic_doc({}, algos), "q.yaml").problem.clients == 5
    assert small_scenario().problem.name == "classification"


BAD = [
    ({"problem": {"name": "quad"}},
     (r"problem\.name: Input should be 'classification', 'quadratic', 'logistic', "
      r"'bilevel-quadratic', 'risk-averse-mco' or 'loss-tuning'")),
    ({"problem": {"name": "quadratic", "delta": -1}}, r"problem\.delta: Input should be greater"),
    ({"problem": {"name": "quadratic", "L": 1, "mu": 2}}, r"problem: L \(1\) must be larger than mu"),
    ({"problem": {"name": "quadratic", "bogus": 1}}, r"problem\.bogus: unknown key"),
    ({"problem": {"name": "classification", "delta": 1}},
     r"problem: 'delta' is only read by problem 'quadratic'"),
    ({"problem": {"name": "quadratic", "clients": 5}},
     r"problem\.clients is 5 but population\.num_devices is 8"),
    ({"problem": {"name": "quadratic", "clients": 8}}, r"model: not read by problem 'quadratic'"),
]


@pytest.mark.parametrize("changes, message", BAD)
def test_a_bad_problem_section_gives_one_line_naming_the_key(changes, message):
    with pytest.raises(UserError, match=message) as err:
        small_scenario(**copy.deepcopy(changes))
    assert "\n" not in str(err.value)


def test_an_infeasible_quadratic_is_refused_at_build_in_one_line():
    doc = quadratic_doc({"L": 3.0, "mu": 1.0, "delta": 5.0}, [{"name": "fedsgd", "rounds": 1}])
    with pytest.raises(UserError, match=r"problem\.delta: 5 is too large") as err:
        build_world(scenario_from_document(doc, "q.yaml"))
    assert "\n" not in str(err.value)
