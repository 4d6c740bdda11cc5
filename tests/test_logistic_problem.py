"""The logistic regression problem (fedred.md Sec. 4.2) against independent truths: gradients
against torch.autograd on the loss written out again, x* and f* against scipy L-BFGS-B on a numpy
loss, the constants against numpy.linalg, unbiased minibatch gradients (exactly, by enumerating
all batches, and by many keyed draws), chunking invariance, then the scenario section, the
engine and the command line."""

from __future__ import annotations

import copy
import itertools
import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import optimize

from tests.conftest import small_doc
from wirelessfl.cli import main
from wirelessfl.errors import UserError
from wirelessfl.learning.partition import partition
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.problems import logistic as logistic_module
from wirelessfl.problems.data import split_data
from wirelessfl.problems.logistic import LogisticProblem
from wirelessfl.scenario.loader import resolved_document, scenario_from_document

RELIABLE = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}}
N, D = 4, 5


def make_data(seed=0, n_train=90, n_test=40, d=D):
    """Gaussian features with class-dependent means (fedred.md Sec. 5.2's recipe, small), labels
    {0, 1}, unequal Dirichlet shards; feature scale 3 so that row normalisation matters."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n_train + n_test)
    mean = rng.standard_normal(d)
    x = 3.0 * (rng.standard_normal((n_train + n_test, d)) + np.where(y[:, None] == 1, mean, -mean))
    shards = partition("dirichlet", y[:n_train], N, np.random.default_rng(seed + 1), alpha=0.5,
                       min_samples=3)
    return x[:n_train], y[:n_train], shards, x[n_train:], y[n_train:]


@pytest.fixture(scope="module")
def data():
    return make_data()


@pytest.fixture(scope="module")
def problem(data):
    return LogisticProblem(*data)


class Truth:
    """The paper's f_i written out again in numpy/torch float64 from the raw arrays."""

    def __init__(self, x_train, y_train, shards, x_test, y_test, l2=None):
        rows = np.concatenate(shards)
        self.scale = 1.0 / np.linalg.norm(x_train[rows], axis=1).mean()
        self.blocks = [x_train[s] * self.scale for s in shards]
        self.labels = [2.0 * y_train[s] - 1.0 for s in shards]
        self.n, self.M = len(shards), len(rows)
        self.l2 = 1.0 / self.M if l2 is None else l2
        self.a, self.y = np.concatenate(self.blocks), np.concatenate(self.labels)
        self.a_test, self.y_test = x_test * self.scale, 2.0 * y_test - 1.0

    def f_i(self, i, x: torch.Tensor) -> torch.Tensor:
        a, y = (torch.from_numpy(v) for v in (self.blocks[i], self.labels[i]))
        return (self.n / self.M) * torch.log1p(torch.exp(-y * (a @ x))).sum() \
            + 0.5 * self.l2 * x @ x

    def grad_f_i(self, i, x) -> np.ndarray:
        leaf = torch.as_tensor(np.asarray(x, np.float64)).clone().requires_grad_(True)
        return torch.autograd.grad(self.f_i(i, leaf), leaf)[0].numpy()

    def f(self, x: np.ndarray) -> float:
        return float(np.logaddexp(0.0, -self.y * (self.a @ x)).mean() + 0.5 * self.l2 * x @ x)

    def grad_f(self, x: np.ndarray) -> np.ndarray:
        s = 1.0 / (1.0 + np.exp(self.y * (self.a @ x)))
        return -(self.a.T @ (self.y * s)) / self.M + self.l2 * x


@pytest.fixture(scope="module")
def truth(data):
    return Truth(*data)


def random_theta(seed, shape=(D,), scale=1.0):
    return scale * torch.randn(shape, generator=torch.Generator().manual_seed(seed),
                               dtype=torch.float64)


# ---- gradients and losses ---------------------------------------------------------------------
def test_full_gradients_match_autograd_at_a_shared_point_and_at_own_models(problem, truth):
    theta = random_theta(1)
    expected = np.stack([truth.grad_f_i(i, theta) for i in range(N)])
    np.testing.assert_allclose(problem.full_gradients(theta).numpy(), expected, rtol=1e-12,
                               atol=1e-14)
    models = random_theta(2, (N, D))
    own = problem.full_gradients(models)
    for i in range(N):
        np.testing.assert_allclose(own[i].numpy(), truth.grad_f_i(i, models[i]), rtol=1e-12,
                                   atol=1e-14)
        # Row i is the shared-point gradient at that row's model.
        np.testing.assert_allclose(own[i].numpy(), problem.full_gradients(models[i])[i].numpy(),
                                   rtol=1e-13, atol=1e-15)


def test_mean_of_local_gradients_is_the_objective_gradient_and_f_is_their_mean(problem, truth):
    theta = random_theta(3)
    np.testing.assert_allclose(problem.full_gradients(theta).mean(0).numpy(),
                               problem.objective_gradient(theta).numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(problem.objective_gradient(theta).numpy(),
                               truth.grad_f(theta.numpy()), rtol=1e-12, atol=1e-15)
    mean_fi = np.mean([float(truth.f_i(i, theta)) for i in range(N)])
    assert problem.objective(theta) == pytest.approx(mean_fi, rel=1e-13)
    assert problem.objective(theta) == pytest.approx(truth.f(theta.numpy()), rel=1e-13)
    # Finite differences of f, independently of any gradient code.
    h, x = 1e-6, theta.numpy()
    fd = [(truth.f(x + h * e) - truth.f(x - h * e)) / (2 * h) for e in np.eye(D)]
    np.testing.assert_allclose(problem.objective_gradient(theta).numpy(), fd, rtol=1e-6,
                               atol=1e-9)


def test_stacked_gradients_and_losses_are_the_weighted_minibatch_loss(problem, truth):
    idx = problem.sample(torch.Generator().manual_seed(5), 3)[0]
    models = random_theta(6, (N, D))
    grads = problem.stacked_gradients(models, idx)
    losses = problem.stacked_losses(models, idx)
    offsets = problem.offsets.numpy()
    for i in range(N):
        local = idx[i].numpy() - offsets[i]
        a = torch.from_numpy(truth.blocks[i][local])
        y = torch.from_numpy(truth.labels[i][local])
        leaf = models[i].clone().requires_grad_(True)
        m_i = len(truth.blocks[i])
        value = (N * m_i / truth.M) * torch.log1p(torch.exp(-y * (a @ leaf))).mean() \
            + 0.5 * truth.l2 * leaf @ leaf
        (g,) = torch.autograd.grad(value, leaf)
        torch.testing.assert_close(grads[i], g, rtol=1e-12, atol=1e-15)
        assert float(losses[i]) == pytest.approx(float(value.detach()), rel=1e-13)
    theta = models[0]
    torch.testing.assert_close(problem.device_losses(theta, idx),
                               problem.stacked_losses(theta.expand(N, -1), idx), rtol=0, atol=0)
    both = problem.stacked_losses_and_gradients(models, idx)
    assert torch.equal(both[0], losses) and torch.equal(both[1], grads)


def test_results_come_back_in_thetas_dtype(problem):
    theta = problem.initial()
    assert theta.dtype == torch.float32 and theta.shape == (D,) and not theta.any()
    idx = problem.sample(torch.Generator().manual_seed(1), 2)[0]
    assert problem.full_gradients(theta).dtype == torch.float32
    assert problem.full_gradients(theta.expand(N, -1)).dtype == torch.float32
    assert problem.objective_gradient(theta).dtype == torch.float32
    assert problem.stacked_gradients(theta.expand(N, -1), idx).dtype == torch.float32
    assert problem.device_losses(theta, idx).dtype == torch.float32
    # At x = 0 every margin is 0: f = log 2 exactly.
    assert problem.objective(theta) == pytest.approx(np.log(2.0), rel=1e-15)


# ---- minibatches ----------------------------------------------------------------------------------
def test_sample_draws_distinct_samples_of_each_device_deterministically(problem):
    idx = problem.sample(torch.Generator().manual_seed(7), 3, steps=4)
    assert idx.shape == (4, N, 3)
    lo = problem.offsets[None, :, None]
    hi = lo + problem.sizes[None, :, None]
    assert ((idx >= lo) & (idx < hi)).all()
    assert all(len(set(row.tolist())) == 3 for row in idx.reshape(-1, 3))  # b <= min m_i
    assert torch.equal(idx, problem.sample(torch.Generator().manual_seed(7), 3, steps=4))
    np.testing.assert_array_equal(problem.full_batch_sizes(), problem.sizes.numpy())


def test_minibatch_gradient_is_exactly_unbiased_over_all_batches(problem, truth):
    """Every b-subset of a device's samples is equally likely (b <= m_i), so the mean over all
    subsets is the expectation: it must equal grad f_i exactly (up to rounding)."""
    theta = random_theta(8)
    b = 2
    for i in range(N):
        lo, m = int(problem.offsets[i]), int(problem.sizes[i])
        batches = torch.tensor(list(itertools.combinations(range(lo, lo + m), b)))
        grads = problem.stacked_gradients(theta.expand(len(batches), -1), batches)
        np.testing.assert_allclose(grads.mean(0).numpy(), truth.grad_f_i(i, theta),
                                   rtol=1e-11, atol=1e-14)


def test_minibatch_gradients_average_to_the_full_gradient_over_many_keyed_draws(problem):
    theta = random_theta(9).float()
    draws, b = 4000, 3  # b <= min m_i = 3 (min_samples): uniform b-subsets, unbiased
    idx = problem.sample(torch.Generator().manual_seed(11), b, steps=draws)
    grads = torch.stack([problem.stacked_gradients(theta.expand(N, -1), idx[k])
                         for k in range(draws)]).double()
    mean, sem = grads.mean(0), grads.std(0) / draws**0.5
    full = problem.full_gradients(theta).double()
    assert ((mean - full).abs() <= 5 * sem + 1e-6).all()


# ---- the optimum ----------------------------------------------------------------------------------
def test_optimum_matches_scipy_lbfgsb_on_an_independent_numpy_loss(problem, truth):
    """scipy to gtol 1e-11: f is l2-strongly convex, so ||x - x*|| <= ||grad f(x)|| / l2
    (l2 = 1/M ~ 1e-2): the two minimisers agree to 1e-7, the values to 1e-12."""
    result = optimize.minimize(lambda x: (truth.f(x), truth.grad_f(x)), np.zeros(D), jac=True,
                               method="L-BFGS-B", options={"gtol": 1e-11, "ftol": 0.0,
                                                           "maxiter": 10000})
    assert np.linalg.norm(truth.grad_f(result.x)) < 1e-9
    np.testing.assert_allclose(problem.optimum.numpy(), result.x, rtol=0, atol=1e-7)
    assert problem.optimum_value == pytest.approx(result.fun, rel=0, abs=1e-12)
    assert problem.optimum_value <= result.fun + 1e-15  # Newton is at least as good
    assert problem.optimum_gradient_norm < 1e-12
    assert np.linalg.norm(truth.grad_f(problem.optimum.numpy())) < 1e-12
    assert problem.optimum.dtype == torch.float64


def test_suboptimality_has_no_cancellation_near_the_optimum(problem, truth):
    x_star = problem.optimum
    assert abs(problem.suboptimality(x_star)) < 1e-18
    theta = random_theta(12)
    assert problem.suboptimality(theta) == pytest.approx(
        truth.f(theta.numpy()) - problem.optimum_value, rel=1e-12, abs=1e-15)
    # 1e-7 away, f - f* ~ 1e-15 is below what f(x) - f* can resolve; the second-order model
    # 1/2 e^T H(x*) e (Hessian in numpy) is exact up to O(||e||^3).
    e = random_theta(13, scale=1e-7)
    s = 1.0 / (1.0 + np.exp(-truth.y * (truth.a @ x_star.numpy())))
    hessian = (truth.a.T * (s * (1 - s))) @ truth.a / truth.M + truth.l2 * np.eye(D)
    quadratic = 0.5 * e.numpy() @ hessian @ e.numpy()
    assert problem.suboptimality(x_star + e) == pytest.approx(quadratic, rel=1e-6)
    # Far away (|t| >= 1 for most samples), the direct branch.
    far = random_theta(14, scale=30.0)
    assert problem.suboptimality(far) == pytest.approx(
        truth.f(far.numpy()) - problem.optimum_value, rel=1e-12)


def test_lbfgsb_fallback_and_lanczos_for_large_d(data, problem, monkeypatch):
    """Above DENSE_HESSIAN_MAX_D: x* by L-BFGS-B (same x* as Newton), L by Lanczos, no delta."""
    dense_L = problem.constants["L"]  # (cached before the patch)
    monkeypatch.setattr(logistic_module, "DENSE_HESSIAN_MAX_D", 3)
    big = LogisticProblem(*data)
    np.testing.assert_allclose(big.optimum.numpy(), problem.optimum.numpy(), atol=1e-7)
    assert big.optimum_value == pytest.approx(problem.optimum_value, abs=1e-13)
    assert set(big.constants) == {"L", "mu"}
    assert big.constants["L"] == pytest.approx(dense_L, rel=1e-10)


# ---- constants ---------------------------------------------------------------------------------------
def test_constants_are_the_hessians_at_zero(problem, truth):
    hessians = [N / (4 * truth.M) * b.T @ b + truth.l2 * np.eye(D) for b in truth.blocks]
    mean = np.mean(hessians, axis=0)
    top = max(np.linalg.eigvalsh(h)[-1] for h in hessians)
    dev_norms = [np.linalg.norm(h - mean, 2) for h in hessians]
    c = problem.constants
    assert c["L"] == pytest.approx(top, rel=1e-12)
    assert c["mu"] == truth.l2 == pytest.approx(1.0 / truth.M)
    assert c["delta_B"] == pytest.approx(max(dev_norms), rel=1e-10)
    assert c["delta_A"] == pytest.approx(np.sqrt(np.mean(np.square(dev_norms))), rel=1e-10)
    exact = np.linalg.eigvalsh(sum((h - mean) @ (h - mean) for h in hessians) / N)[-1]
    assert c["delta_A_exact"] == pytest.approx(np.sqrt(exact), rel=1e-8)
    # Rows with mean norm 1 (fedred.md Sec. 5.2): (n/(4M)) ||A_i||^2 + l2 stays near 1/4.
    assert np.linalg.norm(truth.a, axis=1).mean() == pytest.approx(1.0)
    assert problem.row_scale == pytest.approx(truth.scale)
    assert 0.0 < c["L"] < 1.0
    facts = problem.describe()
    assert facts["name"] == "logistic" and facts["clients"] == N and facts["d"] == D
    assert facts["M"] == truth.M and facts["optimum_value"] == problem.optimum_value
    assert facts["l2"] == truth.l2 and facts["L"] == c["L"]
    json.dumps(facts)


def test_model_profile_is_a_dot_product(problem):
    p = problem.model_profile
    assert (p.params, p.macs_per_sample, p.activations_per_sample, p.input_size) == (D, D, 1, D)


def test_without_row_normalisation_and_with_a_given_l2(data):
    p = LogisticProblem(*data, l2=0.5, normalize_rows=False)
    t = Truth(*data, l2=0.5)
    assert p.row_scale == 1.0 and p.l2 == 0.5
    theta = random_theta(15, scale=0.1)
    a, y = t.a / t.scale, t.y  # raw rows
    expected = np.logaddexp(0, -y * (a @ theta.numpy())).mean() + 0.25 * theta.numpy() @ theta.numpy()
    assert p.objective(theta) == pytest.approx(expected, rel=1e-13)


def test_evaluate_is_test_accuracy_and_mean_log_loss(problem, truth):
    theta = random_theta(16)
    scores = truth.a_test @ theta.numpy()
    accuracy, loss = problem.evaluate(theta)
    assert accuracy == pytest.approx(np.mean(np.where(scores > 0, 1.0, -1.0) == truth.y_test))
    assert loss == pytest.approx(np.logaddexp(0, -truth.y_test * scores).mean(), rel=1e-13)
    accuracy, loss = problem.evaluate(problem.optimum.float())
    assert accuracy > 0.8  # class-dependent means: easy


def test_device_accuracy_reweights_the_test_set_to_each_devices_label_mix(problem, truth):
    theta = random_theta(21)
    accuracy, loss, devices = problem.evaluate_devices(theta)
    assert (accuracy, loss) == problem.evaluate(theta)
    right = np.where(truth.a_test @ theta.numpy() > 0, 1.0, -1.0) == truth.y_test
    per_class = [right[truth.y_test == c].mean() for c in (-1.0, 1.0)]
    for i in range(N):
        share = np.mean(truth.labels[i] > 0)
        assert devices[i] == pytest.approx((1 - share) * per_class[0] + share * per_class[1])


# ---- chunking ------------------------------------------------------------------------------------
def test_a_tiny_memory_bound_gives_identical_results(data, problem):
    small = LogisticProblem(*data, max_chunk_mb=1e-4)  # one device per chunk, 1-2 rows a block
    assert small._rows_per_block() < 5 and len(list(small.chunks(3, own_model=True))) == N
    theta = random_theta(17).float()
    models = random_theta(18, (N, D)).float()
    assert torch.equal(small.full_gradients(theta), problem.full_gradients(theta))
    assert torch.equal(small.full_gradients(models), problem.full_gradients(models))
    idx = problem.sample(torch.Generator().manual_seed(19), 3, steps=2)
    assert torch.equal(small.device_losses(theta, idx[0]), problem.device_losses(theta, idx[0]))
    one = torch.cat([g for _, g in small.device_gradients(theta, idx[0])])
    assert torch.equal(one, problem.stacked_gradients(theta.expand(N, -1), idx[0]))
    a = torch.cat([m for _, m in small.local_sgd(theta, idx, 0.5)])
    b = torch.cat([m for _, m in problem.local_sgd(theta, idx, 0.5)])
    assert torch.equal(a, b)
    assert torch.equal(small.optimum, problem.optimum)
    assert small.objective(theta) == problem.objective(theta)
    assert small.suboptimality(theta) == problem.suboptimality(theta)
    assert torch.equal(small.objective_gradient(theta), problem.objective_gradient(theta))


def test_server_gradient_of_a_one_sample_base_station(data, truth):
    x_train, y_train, shards, _, _ = data
    rows = np.concatenate(shards)
    spare = np.setdiff1d(np.arange(len(y_train)), rows)
    keep = spare[:1] if len(spare) else rows[:1]
    p = LogisticProblem(*data, server=keep)
    theta = random_theta(20)
    a = x_train[keep[0]] * truth.scale
    y = 2.0 * y_train[keep[0]] - 1.0
    expected = -y * a / (1 + np.exp(y * a @ theta.numpy())) + truth.l2 * theta.numpy()
    got = p.server_gradient(theta, torch.Generator().manual_seed(0), 5)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-13)
    with pytest.raises(UserError, match="base station"):
        LogisticProblem(*data).server_gradient(theta, torch.Generator(), 5)


def test_non_binary_labels_are_refused(data):
    x_train, y_train, shards, x_test, y_test = data
    with pytest.raises(UserError, match="binary"):
        LogisticProblem(x_train, y_train * 2, shards, x_test, y_test)


# ---- scenario, engine, command line --------------------------------------------------------------
def logistic_doc(algorithms=None, **changes) -> dict:
    """A scenario document for logistic regression on breast_cancer, Dirichlet split, no model
    section, lossless 32-bit uplink; top-level keys replaced by ``changes``."""
    base = {"channel": RELIABLE, "quantization_bits": 32, "population": {"num_devices": 5},
            "data": {"name": "breast_cancer"}, "partition": {"scheme": "dirichlet", "alpha": 0.5},
            "problem": {"name": "logistic"},
            "algorithms": algorithms or [{"name": "fedsgd", "rounds": 40, "eval_every": 10,
                                          "batch_size": 16, "lr": 2.0}]}
    doc = small_doc(**{**base, **changes})
    if "model" not in changes:
        doc.pop("model")
    return doc


def test_a_logistic_scenario_runs_and_records_suboptimality():
    sc = scenario_from_document(logistic_doc(), "l.yaml")
    assert sc.problem.name == "logistic" and sc.problem.normalize_rows is True
    assert sc.problem.l2 is None
    again = scenario_from_document(resolved_document(sc), "l.yaml")
    assert again.problem == sc.problem
    world = build_world(sc)
    ev = world.evaluator
    assert isinstance(ev, LogisticProblem) and world.flat is None
    assert ev.l2 == pytest.approx(1.0 / ev.M)
    # The split is the classifier's (split_data): same shards for the same scenario.
    split = split_data(sc)
    assert all(np.array_equal(a, b) for a, b in zip(world.shards, split.shards))
    record = world.partition_record()
    assert record["scheme"] == "dirichlet" and np.sum(record["label_counts"]) == ev.M
    assert world.problem_record()["name"] == "logistic"
    assert world.model_profile.macs_per_sample == ev.d == 30
    rows = pd.DataFrame(run_algorithm(world, sc.algorithms[0]).rows)
    gap = rows.suboptimality.to_numpy()
    assert gap[0] == pytest.approx(np.log(2.0) - ev.optimum_value)
    assert gap[-1] < 0.05 * gap[0] and (gap > 0).all()
    assert rows.test_accuracy.iloc[-1] > 0.9


def test_logistic_on_digits_with_positive_classes_and_a_given_l2():
    sc = scenario_from_document(logistic_doc(data={"name": "digits", "positive_classes": [0]},
                                             partition={"scheme": "iid"},
                                             problem={"name": "logistic", "l2": 0.01}), "l.yaml")
    world = build_world(sc)
    assert world.evaluator.l2 == 0.01 and world.evaluator.d == 64
    assert world.evaluator.optimum_gradient_norm < 1e-12


BAD = [
    ({"problem": {"name": "quadratic", "l2": 0.1}},
     r"problem: 'l2' is only read by problem 'logistic' but name is 'quadratic'"),
    ({"problem": {"name": "classification", "normalize_rows": False}},
     r"problem: 'normalize_rows' is only read by problem 'logistic'"),
    ({"problem": {"name": "logistic", "l2": 0}}, r"problem\.l2: Input should be greater than 0"),
    ({"data": {"name": "digits"}},
     (r"data: problem 'logistic' is binary but dataset 'digits' has 10 classes; set "
      r"data\.positive_classes")),
    ({"data": {"name": "synthetic", "synthetic": {"num_classes": 3}}},
     r"dataset 'synthetic' has 3 classes"),
    ({"data": {"name": "digits", "classes": [1, 2, 3]}},
     r"data\.classes=\[1, 2, 3\] keeps 3 labels but problem 'logistic' is binary"),
    ({"model": {"name": "logistic", "l2": 0.1}}, r"model: not read by problem 'logistic'"),
]


@pytest.mark.parametrize("changes, message", BAD)
def test_a_bad_logistic_section_gives_one_line_naming_the_key(changes, message):
    doc = logistic_doc()
    doc.update(copy.deepcopy(changes))
    with pytest.raises(UserError, match=message) as err:
        scenario_from_document(doc, "l.yaml")
    assert "\n" not in str(err.value)


def test_a_libsvm_file_with_three_classes_is_refused_at_build(tmp_path):
    lines = [f"{k % 3 + 1} 1:{k} 2:{k % 5}" for k in range(60)]
    (tmp_path / "three").write_text("\n".join(lines) + "\n")
    sc = scenario_from_document(logistic_doc(data={"name": "libsvm", "root": str(tmp_path),
                                                   "file": "three"}), "l.yaml")
    with pytest.raises(UserError, match=r"dataset 'libsvm' has 3 classes; set "
                                        r"data\.positive_classes") as err:
        build_world(sc)
    assert "\n" not in str(err.value)


def test_validate_and_run_from_the_command_line(tmp_path, scenario_file, capsys):
    doc = logistic_doc([{"name": "fedsgd", "rounds": 6, "eval_every": 3, "lr": 2.0},
                        {"name": "fedavg", "rounds": 3, "eval_every": 3, "local_steps": 2}])
    path = scenario_file(doc)
    assert main(["validate", str(path)]) == 0
    assert "valid" in capsys.readouterr().out
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--no-report", "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["problem"]["name"] == "logistic"
    assert manifest["partition"]["scheme"] == "dirichlet"
    rounds = pd.read_parquet(out / "rounds.parquet")
    assert set(rounds.algorithm) == {"fedsgd", "fedavg"}
    assert rounds.suboptimality.notna().all()
