"""Federated loss-function tuning (fedmsa.md Sec. 4.2 / 5.2): the long tail, the q-partition, the
bilevel maps of the loss tuning with the linear softmax model and with the authors' ReLU MLP, and
runs of FedMSA and FedNest on it.

Truths used: counts worked out from the spec's formulas; finite differences of the inner and
outer losses written out again in numpy (for grad_w g, the Hessian-vector product, the mixed
Jacobian-vector product and grad_w f); sklearn's balanced_accuracy_score."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score

from tests.conftest import small_doc
from tests.test_datasets import make_idx_folder
from wirelessfl.errors import UserError
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.memory import problem_facts
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.problems.loss_tuning import LossTuning, long_tail, model_size, q_partition
from wirelessfl.scenario.loader import scenario_from_document


def test_long_tail_counts_follow_the_geometric_profile():
    y = np.repeat(np.arange(10), 200)
    keep = long_tail(y, 0.01, np.random.default_rng(0))
    counts = np.bincount(y[keep], minlength=10)
    assert counts.tolist() == [math.ceil(200 * 0.01 ** (c / 9)) for c in range(10)]


def test_q_partition_gives_each_client_its_share_of_its_class():
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(4), [400, 200, 100, 50])
    shards = q_partition(y, 4, 0.5, rng)
    quota = len(y) // 4
    assert [len(s) for s in shards] == [quota] * 4
    assert len(np.unique(np.concatenate(shards))) == 4 * quota  # disjoint
    own = [int((y[s] == c).sum()) for c, s in enumerate(shards)]
    # client c takes round(q * quota) = 94 of class c when it has them (class 3 has only 50);
    # the uniform fill can add more of class c on top
    assert own[0] >= 94 and own[1] >= 94 and own[2] >= 94 and own[3] == 50


def _problem(seed=0, hidden=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((600, 5))
    y = rng.integers(0, 3, 600)
    xt = rng.standard_normal((90, 5))
    yt = np.repeat(np.arange(3), 30)
    return LossTuning(x, y, xt, yt, 3, 6, np.random.default_rng(seed), imbalance_ratio=0.3,
                      heterogeneity_q=0.5, weight_decay=0.05, hidden_units=hidden,
                      init_rng=np.random.default_rng(seed + 1))


def _numpy_logits(prob, a, w):
    """z(a; w) in numpy: W^T a, or W2^T [relu(W1^T a); 1] (loss_tuning's docstring)."""
    c, h = prob.num_classes, prob.hidden
    if not h:
        return a @ w.reshape(prob.dim, c)
    w1 = w[:prob.dim * h].reshape(prob.dim, h)
    w2 = w[prob.dim * h:].reshape(h + 1, c)
    hidden = np.maximum(a @ w1, 0)
    return np.c_[hidden, np.ones(len(a))] @ w2


def _numpy_losses(prob, m, x, w):
    """Client m's inner and outer losses from its raw rows, in numpy."""
    a, y, mask = (t[m].numpy() for t in prob.train)
    rows = mask > 0
    a, y = a[rows], y[rows]
    c = prob.num_classes

    def ce(logits, labels):
        z = logits - logits.max(1, keepdims=True)
        return -(z[np.arange(len(labels)), labels] - np.log(np.exp(z).sum(1)))

    scale = 1 / (1 + np.exp(-x[:c]))
    inner = (ce(scale * _numpy_logits(prob, a, w) + x[c:], y).mean()
             + 0.5 * prob.weight_decay * (w**2).sum())
    av, yv, mv = (t[m].numpy() for t in prob.val)
    av, yv = av[mv > 0], yv[mv > 0]
    weight = prob.omega.numpy()[yv]
    outer = (ce(_numpy_logits(prob, av, w), yv) * weight).sum() / weight.sum()
    return inner, outer


@pytest.mark.parametrize("hidden", [0, 4], ids=["linear", "mlp"])
def test_maps_match_finite_differences_of_the_two_losses(hidden):
    prob = _problem(hidden=hidden)
    rng = np.random.default_rng(3)
    m = 4
    x = 0.3 * rng.standard_normal(prob.dx)
    w = 0.3 * rng.standard_normal(prob.dw)
    v = rng.standard_normal(prob.dw)
    got = prob.maps(torch.as_tensor(np.r_[x, w, v])[None], torch.tensor([m]))[0].numpy()
    eps = 1e-5

    def grad(fun, z):
        return np.array([(fun(z + eps * e) - fun(z - eps * e)) / (2 * eps)
                         for e in np.eye(len(z))])

    g_w = grad(lambda z: _numpy_losses(prob, m, x, z)[0], w)
    f_w = grad(lambda z: _numpy_losses(prob, m, x, z)[1], w)
    # Hessian-vector product and mixed product: directional differences of grad_w g
    grad_w = lambda xx, ww: grad(lambda z: _numpy_losses(prob, m, xx, z)[0], ww)
    h = 1e-4
    hvp = (grad_w(x, w + h * v) - grad_w(x, w - h * v)) / (2 * h)
    jvp = np.array([(grad_w(x + h * e, w) @ v - grad_w(x - h * e, w) @ v) / (2 * h)
                    for e in np.eye(prob.dx)])
    np.testing.assert_allclose(got[prob.dx:prob.dx + prob.dw], g_w, atol=1e-7)
    np.testing.assert_allclose(got[prob.dx + prob.dw:], hvp - f_w, atol=2e-5)
    np.testing.assert_allclose(got[:prob.dx], -jvp, atol=2e-5)  # grad_x f = 0 here


def test_mlp_sizes_and_start():
    """d_w of the authors' 784-200-10 MLP is fedmsa.md 3.5's 159,010; the MLP starts where
    torch.nn.Linear starts (weights and biases within 1/sqrt(fan_in)), x and v at zero, and the
    start is the seed's; the linear model starts at W = 0."""
    assert model_size(784, 200, 10) == 159_010
    assert model_size(784, 0, 10) == 785 * 10
    prob = _problem(hidden=4)
    assert prob.dw == 6 * 4 + 5 * 3
    theta = prob.initial().double().numpy()
    x, w, v = np.split(theta, [prob.dx, prob.dx + prob.dw])
    assert not x.any() and not v.any()
    first = prob.dim * 4
    assert 0 < np.abs(w[:first]).max() <= 1 / math.sqrt(5)
    assert 0 < np.abs(w[first:]).max() <= 1 / math.sqrt(4)
    assert np.abs(w[:first]).max() > 0.8 / math.sqrt(5)  # spread over its range, not tiny
    np.testing.assert_array_equal(theta, _problem(hidden=4).initial().double().numpy())
    assert not _problem(hidden=0).initial().any()


@pytest.mark.parametrize("hidden", [0, 4], ids=["linear", "mlp"])
def test_balanced_accuracy_is_sklearns(hidden):
    prob = _problem(hidden=hidden)
    theta = torch.as_tensor(np.random.default_rng(9).standard_normal(prob.d))
    logits = prob._test_logits(theta).numpy()
    acc, _ = prob.evaluate(theta)
    assert acc == pytest.approx(balanced_accuracy_score(prob.test_y.numpy(), logits.argmax(1)))


def _digits(algorithm: dict, **problem):
    doc = small_doc(problem={"name": "loss-tuning", "imbalance_ratio": 0.1, **problem},
                    population={"num_devices": 10}, quantization_bits=32,
                    channel={"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}},
                    algorithms=[{"eval_every": 10, **algorithm}])
    doc.pop("model")
    return scenario_from_document(doc, "loss-tuning.yaml")


@pytest.mark.parametrize("algorithm", [
    {"name": "fedmsa", "rounds": 40, "local_steps": 5, "alpha": 0.5, "beta": 0.5},
    {"name": "fednest", "rounds": 25, "alpha": 0.5, "beta": 0.5, "eta": 0.5, "inner_rounds": 3,
     "outer_steps": 3},
], ids=["fedmsa", "fednest"])
def test_tuning_on_long_tailed_digits_learns(algorithm):
    """From W = 0 (balanced accuracy 0.1) both methods learn a classifier whose balanced test
    accuracy passes 0.7 within a few hundred exchanges."""
    sc = _digits(algorithm)
    world = build_world(sc)
    run = run_algorithm(world, sc.algorithms[0])
    rows = pd.DataFrame(run.rows)
    assert rows.test_accuracy.iloc[0] == pytest.approx(0.1)
    assert rows.test_accuracy.iloc[-1] > 0.7
    assert rows.hessian_vector_products.iloc[-1] > 0


def test_mlp_tuning_on_long_tailed_digits_learns():
    """The MLP (64-16-10 here) starts near chance and FedMSA trains it past 0.7 balanced
    accuracy; the memory estimate's parameter count is the built model's."""
    sc = _digits({"name": "fedmsa", "rounds": 40, "local_steps": 5, "alpha": 0.5,
                  "beta": 0.5}, hidden_units=16)
    world = build_world(sc)
    assert world.evaluator.dw == 65 * 16 + 17 * 10
    assert problem_facts(sc).d == world.evaluator.dw
    rows = pd.DataFrame(run_algorithm(world, sc.algorithms[0]).rows)
    assert rows.test_accuracy.iloc[0] < 0.3
    assert rows.test_accuracy.iloc[-1] > 0.7


def test_mnist_scenario_builds_from_an_idx_folder(tmp_path):
    doc = small_doc(problem={"name": "loss-tuning", "imbalance_ratio": 0.5},
                    population={"num_devices": 10},
                    data={"name": "mnist", "root": str(make_idx_folder(tmp_path / "m", True))},
                    algorithms=[{"name": "fedmsa", "rounds": 2}])
    doc.pop("model")
    world = build_world(scenario_from_document(doc, "x.yaml"))
    assert world.evaluator.dim == 5 * 5 + 1  # the folder's 5x5 images, flattened, + bias
    assert world.evaluator.d == 20 + 2 * 26 * 10


def test_clean_errors():
    with pytest.raises(UserError, match="must be a multiple of the 10 classes"):
        build_world(_digits({"name": "fedmsa", "rounds": 1}).model_copy(
            update={"population": _digits({"name": "fedmsa", "rounds": 1}).population
                    .model_copy(update={"num_devices": 15})}))
    with pytest.raises(UserError, match="model: not read by problem 'loss-tuning'"):
        scenario_from_document(small_doc(problem={"name": "loss-tuning"}), "x.yaml")
