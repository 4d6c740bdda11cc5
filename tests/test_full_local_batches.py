"""Full local batches (issue 19): a minibatch at least as large as a device's data is the whole
local data, once. Checked against independent truths: the pre-change sampler written out again
(devices with enough samples draw the same indices), per-device autograd and the paper's f_i
written out in numpy over all of a device's samples (a short device's loss and gradient), a
numpy full-batch gradient descent (FedProx with one local step, mu = 0 and a batch above every
device's data), and the energy model at the real batch min(b, m_i)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import run_recording_thetas, small_doc
from wirelessfl.algorithms.fedavg import FedProxParams
from wirelessfl.engine.ledger import KIND_INDEX
from wirelessfl.learning.flat_model import FlatModel
from wirelessfl.learning.minibatch import batch_counts, sample_minibatches
from wirelessfl.learning.models import build_model
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.problems.classifier import BatchedEvaluator, DeviceData
from wirelessfl.problems.logistic import LogisticProblem
from wirelessfl.scenario.loader import scenario_from_document

RELIABLE = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}}
SIZES = [3, 8, 12, 5]  # devices 0 and 3 are short of a batch of 6


def layout(sizes):
    sizes = torch.tensor(sizes, dtype=torch.int64)
    return sizes, torch.cumsum(sizes, 0) - sizes


def old_sampler(generator, sizes, offsets, batch_size, steps):
    """The sampler before full local batches, as it was written: b smallest keys, a short
    device's missing slots wrapped around its samples (cyclically)."""
    n = len(sizes)
    width = max(int(sizes.max()), batch_size)
    keys = torch.rand((steps, n, width), generator=generator)
    keys.masked_fill_(torch.arange(width) >= sizes[:, None], 2.0)
    local = keys.topk(batch_size, dim=2, largest=False).indices
    return offsets[:, None] + torch.remainder(local, sizes[:, None])


# ---- the sampler ------------------------------------------------------------------------------------
def test_a_device_with_enough_samples_draws_the_same_indices_as_before():
    sizes, offsets = layout(SIZES)
    new = sample_minibatches(torch.Generator().manual_seed(4), sizes, offsets, 6, steps=30)
    old = old_sampler(torch.Generator().manual_seed(4), sizes, offsets, 6, steps=30)
    assert new.shape == old.shape == (30, 4, 6)
    enough = sizes >= 6
    assert torch.equal(new[:, enough], old[:, enough])
    assert not torch.equal(new[:, ~enough], old[:, ~enough])  # the short ones changed
    # No device short of data: the whole draw is the old one.
    same = sample_minibatches(torch.Generator().manual_seed(5), sizes, offsets, 3, steps=30)
    assert torch.equal(same, old_sampler(torch.Generator().manual_seed(5), sizes, offsets, 3, 30))


@pytest.mark.parametrize("batch_size", [6, 20])
def test_a_short_device_gets_each_of_its_samples_exactly_once_per_step(batch_size):
    sizes, offsets = layout(SIZES)
    idx = sample_minibatches(torch.Generator().manual_seed(9), sizes, offsets, batch_size, 40)
    width = min(batch_size, max(SIZES))  # a batch above every device: no slot beyond the largest
    assert idx.shape == (40, 4, width)
    orders = set()
    for i, (m, lo) in enumerate(zip(SIZES, offsets.tolist())):
        if m >= batch_size:
            continue
        for row in idx[:, i]:
            assert sorted(row[:m].tolist()) == list(range(lo, lo + m))  # each sample once
            assert (row[m:] == lo).all()  # padding: the device's first sample, weighted 0
            orders.add(tuple(row[:m].tolist()))
    assert len(orders) > 10  # in random order, not a fixed one
    again = sample_minibatches(torch.Generator().manual_seed(9), sizes, offsets, batch_size, 40)
    assert torch.equal(idx, again)  # same seed, same indices


# ---- the torch classifier -------------------------------------------------------------------------
def make_evaluator(model_name):
    shape = (1, 16, 16) if model_name == "seed002-cnn" else (12,)
    model = build_model(model_name, shape, 3, hidden=(7, 5), seed=3)
    gen = torch.Generator().manual_seed(0)
    total = sum(SIZES)
    x = torch.randn((total, *shape), generator=gen).numpy()
    y = torch.randint(0, 3, (total,), generator=gen).numpy()
    bounds = np.cumsum([0] + SIZES)
    shards = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(SIZES))]
    data = DeviceData.from_shards(x, y, shards, x[:5], y[:5], "cpu")
    return BatchedEvaluator(FlatModel(model), data, activations_per_sample=100, input_size=12)


def whole_device_reference(ev, theta, device):
    """Mean cross-entropy over all of the device's samples and its gradient, by ordinary
    autograd on the torch module."""
    lo, m = int(ev.data.offsets[device]), int(ev.data.sizes[device])
    params = {name: p.detach().clone().requires_grad_(True)
              for name, p in ev.flat.unflatten(theta.clone()).items()}
    logits = torch.func.functional_call(ev.flat.model, params, (ev.data.x[lo:lo + m],))
    loss = F.cross_entropy(logits, ev.data.y[lo:lo + m])
    grads = torch.autograd.grad(loss, list(params.values()))
    return float(loss.detach()), torch.cat([g.reshape(-1) for g in grads])


@pytest.mark.parametrize("strategy", [None, "vmap"])
@pytest.mark.parametrize("model_name", ["logistic", "mlp", "seed002-cnn"])
def test_classifier_minibatch_of_a_short_device_is_its_whole_data(model_name, strategy):
    ev = make_evaluator(model_name)
    if strategy is not None:  # the generic path, available to every model
        ev.stacked.strategy = strategy
    theta = ev.flat.initial() + 0.05 * torch.randn(ev.d, generator=torch.Generator().manual_seed(1))
    idx = ev.sample(torch.Generator().manual_seed(2), 6)[0]
    losses = ev.device_losses(theta, idx)
    grads = torch.cat([g for _, g in ev.device_gradients(theta, idx)])
    own_losses = ev.stacked_losses(theta.expand(4, -1), idx)
    for i, m in enumerate(SIZES):
        if m >= 6:
            continue
        loss, grad = whole_device_reference(ev, theta, i)
        assert losses[i].item() == pytest.approx(loss, rel=1e-5)
        assert own_losses[i].item() == pytest.approx(loss, rel=1e-5)
        torch.testing.assert_close(grads[i], grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(grads[i], ev.full_gradients(theta)[i], rtol=1e-4, atol=1e-6)
    # Rows passed in another order and as a subset (as FGDRO passes them) keep their weights.
    rows = torch.tensor([3, 0])
    sub = ev.stacked_gradients(theta.expand(2, -1), idx[rows])
    torch.testing.assert_close(sub, grads[rows], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(ev.minibatch_sizes(6), [3, 6, 6, 5])


@pytest.mark.parametrize("model_name", ["logistic", "mlp", "seed002-cnn"])
def test_batches_no_device_is_short_of_take_the_plain_mean_with_the_same_bits(model_name):
    """SIZES' smallest device holds 3 samples: a batch of 3 is full everywhere, so the counts
    are skipped (None) and the losses and gradients are a plain mean, bit for bit what the
    masked mean (counts forced) gives; a batch of 4 keeps the counts."""
    ev = make_evaluator(model_name)
    theta = ev.flat.initial() + 0.05 * torch.randn(ev.d, generator=torch.Generator().manual_seed(1))
    idx = ev.sample(torch.Generator().manual_seed(2), 3, steps=2)
    assert batch_counts(idx[0], ev._owner_sizes, ev._smallest) is None
    assert batch_counts(ev.sample(torch.Generator().manual_seed(2), 4)[0], ev._owner_sizes,
                        ev._smallest).tolist() == [3, 4, 4, 4]
    fast = (ev.device_losses(theta, idx[0]), ev.stacked_losses(theta.expand(4, -1), idx[0]),
            torch.cat([m for _, m in ev.local_sgd(theta, idx, 0.3)]))
    ev._smallest = 0  # every batch counted and masked, as before the shortcut
    masked = (ev.device_losses(theta, idx[0]), ev.stacked_losses(theta.expand(4, -1), idx[0]),
              torch.cat([m for _, m in ev.local_sgd(theta, idx, 0.3)]))
    for a, b in zip(fast, masked, strict=True):
        assert torch.equal(a, b)
    for i in range(4):  # and both are the plain mean over the device's 3 drawn samples
        params = ev.flat.unflatten(theta)
        logits = torch.func.functional_call(ev.flat.model, params, (ev.data.x[idx[0, i]],))
        plain = F.cross_entropy(logits, ev.data.y[idx[0, i]])
        assert fast[0][i].item() == pytest.approx(plain.item(), rel=1e-6)


# ---- logistic regression -----------------------------------------------------------------------------
def logistic_truth_gradient(a, y, n, total, l2, x):
    """grad f_i(x) = (n/M) sum_j -y_j sigmoid(-y_j a_j^T x) a_j + l2 x over all of a device's
    samples (fedred.md Sec. 4.2), numpy float64."""
    return (n / total) * (a.T @ (-y / (1.0 + np.exp(y * (a @ x))))) + l2 * x


def test_logistic_minibatch_of_a_short_device_is_its_exact_local_gradient():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 4))
    labels = rng.integers(0, 2, 40)
    bounds = np.cumsum([0] + SIZES)
    shards = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(SIZES))]
    problem = LogisticProblem(x[:28], labels[:28], shards, x[28:], labels[28:])
    models = torch.from_numpy(rng.standard_normal((4, 4)))
    idx = problem.sample(torch.Generator().manual_seed(3), 6)[0]
    losses, grads = problem.stacked_losses_and_gradients(models, idx)
    scale = 1.0 / np.linalg.norm(x[:28], axis=1).mean()
    for i, m in enumerate(SIZES):
        if m >= 6:
            continue
        a, y = x[shards[i]] * scale, 2.0 * labels[shards[i]] - 1.0
        w = models[i].numpy()
        want = logistic_truth_gradient(a, y, 4, 28, 1 / 28, w)
        np.testing.assert_allclose(grads[i].numpy(), want, rtol=1e-12, atol=1e-15)
        loss = (4 / 28) * np.logaddexp(0.0, -y * (a @ w)).sum() + 0.5 / 28 * w @ w
        assert losses[i].item() == pytest.approx(loss, rel=1e-12)
    np.testing.assert_array_equal(problem.minibatch_sizes(6), [3, 6, 6, 5])


# ---- FedProx with a batch above every device's data is gradient descent ------------------------------
def logistic_scenario(algorithm: dict):
    doc = small_doc(channel=RELIABLE, quantization_bits=32, population={"num_devices": 5},
                    data={"name": "breast_cancer"},
                    partition={"scheme": "dirichlet", "alpha": 0.5},
                    problem={"name": "logistic"}, algorithms=[algorithm])
    doc.pop("model")
    return scenario_from_document(doc, "fullbatch.yaml")


def numpy_gradient_descent(world, lr: float, rounds: int, weights: np.ndarray) -> np.ndarray:
    """Iterates x_0 = 0, ..., x_rounds of x_{k+1} = x_k - lr sum_i weights_i grad f_i(x_k), with
    f_i the paper's local objective over all of device i's samples, from the raw data and the
    split."""
    x_raw, labels = world.dataset.x_train, world.dataset.y_train
    shards = world.shards
    rows = np.concatenate(shards)
    scale = 1.0 / np.linalg.norm(x_raw[rows], axis=1).mean()
    n, total = len(shards), len(rows)
    blocks = [(x_raw[s] * scale, 2.0 * labels[s] - 1.0) for s in shards]
    x = np.zeros(x_raw.shape[1])
    out = [x]
    for _ in range(rounds):
        g = sum(w * logistic_truth_gradient(a, y, n, total, 1.0 / total, x)
                for w, (a, y) in zip(weights, blocks))
        x = x - lr * g
        out.append(x)
    return np.array(out)


def averaging_cases() -> list[tuple[dict, str]]:
    """FedProx's averaging of the devices' models: uniform over the delivered devices (the rule
    before a sample-count option existed); where the ``average`` option exists, also its
    default, weighted by sample count (McMahan et al.'s m_i / M on the devices' mean losses)."""
    if "average" in FedProxParams.model_fields:
        return [({"average": "uniform"}, "uniform"), ({}, "samples")]
    return [({}, "uniform")]


@pytest.mark.parametrize("option, rule", averaging_cases())
def test_fedprox_one_step_mu_zero_full_batches_is_gradient_descent(monkeypatch, option, rule):
    rounds, lr = 25, 2.0
    sc = logistic_scenario({"name": "fedprox", "rounds": rounds, "eval_every": 5,
                            "local_steps": 1, "mu": 0.0, "lr": lr, "batch_size": 1000,
                            **option})
    world, thetas, _ = run_recording_thetas(monkeypatch, sc)
    sizes = world.evaluator.minibatch_sizes(1000)
    assert (world.evaluator.sizes_np < 1000).all() and (sizes == world.evaluator.sizes_np).all()
    m = world.evaluator.sizes_np
    # Both rules weigh the f_i equally: f_i = (n m_i / M) F_i already carries device i's share
    # m_i / M of the samples (F_i its mean loss), so the sample-weighted average of the F_i is
    # the uniform mean of the f_i (LogisticProblem.sample_weights); both runs are gradient
    # descent on f = (1/n) sum_i f_i, the mean loss over all samples.
    assert rule in ("uniform", "samples") and m.max() > 2 * m.min()
    weights = np.full(len(m), 1.0 / len(m))
    want = numpy_gradient_descent(world, lr, rounds, weights)
    got = torch.stack(thetas).double().numpy()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    assert np.linalg.norm(want[-1] - want[0]) > 0.1  # it moved: the check has teeth


def test_a_short_device_is_charged_for_its_real_batch():
    b = 60
    sc = logistic_scenario({"name": "fedprox", "rounds": 2, "eval_every": 1, "local_steps": 3,
                            "lr": 1.0, "batch_size": b})
    world = build_world(sc)
    m = world.evaluator.sizes_np
    assert (m < b).any() and (m >= b).any()
    run = run_algorithm(world, sc.algorithms[0])
    cm = world.compute_model(32)
    real = np.minimum(m, b)
    want = [2 * 3 * (cm.forward_energy_j(int(r)) + cm.backward_energy_j(int(r))) for r in real]
    led = run.ledger.energy_j
    got = led[:, KIND_INDEX["compute_forward"]] + led[:, KIND_INDEX["compute_backward"]]
    np.testing.assert_allclose(got, want, rtol=1e-12)
