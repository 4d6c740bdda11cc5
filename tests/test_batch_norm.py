"""Batch norm, per device (learning/flat_model.py, problems/classifier.py): every training pass
normalises with ONE device's minibatch statistics (never pooled across devices), and the global
model is evaluated in eval mode with population statistics re-estimated on fixed training
samples. Checked against a plain torch loop over the devices (each device's model in training
mode on its own batch), against the statistics and logits worked in float64 numpy for a
one-layer model, and for independence from the thread count."""

from __future__ import annotations

import copy
from itertools import pairwise

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from wirelessfl.errors import UserError
from wirelessfl.host import threads
from wirelessfl.learning.flat_model import NORMALISATION_BATCH, FlatModel
from wirelessfl.learning.models import build_model
from wirelessfl.learning.seeds import keyed_generator
from wirelessfl.problems.classifier import BatchedEvaluator, DeviceData


class NormMLP(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> Linear: the statistics' input is the first layer's output,
    which no normalisation precedes (so numpy can compute them directly)."""

    def __init__(self, inputs=4, hidden=5, classes=3, track=True):
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden)
        self.bn = nn.BatchNorm1d(hidden, track_running_stats=track)
        self.fc2 = nn.Linear(hidden, classes)
        with torch.no_grad():  # affine parameters away from (1, 0), so they matter
            self.bn.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
            self.bn.bias.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(2))

    def forward(self, x):
        return self.fc2(self.bn(self.fc1(x)).relu())


class NormCNN(nn.Module):
    """Conv -> BatchNorm2d -> ReLU -> Flatten -> Linear (channels-last per-device path)."""

    def __init__(self, classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.bn(self.conv(x)).relu(), 1))


def evaluator(model, shape, sizes, classes=3, seed=0, test=40):
    gen = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    x = torch.randn((total + test, *shape), generator=gen)
    y = torch.randint(0, classes, (total + test,), generator=gen)
    starts = [sum(sizes[:k]) for k in range(len(sizes) + 1)]
    shards = [torch.arange(a, b).numpy() for a, b in pairwise(starts)]
    data = DeviceData.from_shards(x[:total].numpy(), y[:total].numpy(), shards,
                                  x[total:].numpy(), y[total:].numpy(), "cpu")
    return BatchedEvaluator(FlatModel(model), data, activations_per_sample=100,
                            input_size=x[0].numel())


def plain_device_loss(model, theta, x, y):
    """A device's minibatch loss through the torch module itself, in training mode."""
    twin = copy.deepcopy(model).train()
    torch.nn.utils.vector_to_parameters(theta, twin.parameters())
    with torch.no_grad():
        return float(F.cross_entropy(twin(x), y))


@pytest.mark.parametrize("make, shape", [(NormMLP, (4,)), (NormCNN, (1, 6, 6))])
def test_shared_model_losses_normalise_each_device_alone(make, shape):
    model = make()
    ev = evaluator(model, shape, sizes=(7, 5, 9, 6))
    theta = ev.initial() + 0.1 * torch.randn(ev.d, generator=torch.Generator().manual_seed(3))
    idx = ev.sample(keyed_generator(0, "bn", 1), 4)[0]
    got = ev.device_losses(theta, idx)
    want = [plain_device_loss(model, theta, ev.data.inputs(idx[i]), ev.data.labels(idx[i]))
            for i in range(len(idx))]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)
    # pooling the devices' samples into one batch (the pre-fix path) gives other numbers
    pooled = F.cross_entropy(ev.flat.predict(theta, ev.data.inputs(idx.reshape(-1))),
                             ev.data.labels(idx.reshape(-1)), reduction="none")
    assert not np.allclose(pooled.view(len(idx), -1).mean(1).numpy(), want, rtol=1e-3)


def test_local_sgd_equals_a_plain_torch_loop_per_device():
    model = NormCNN()
    ev = evaluator(model, (1, 6, 6), sizes=(7, 5, 9))
    theta = ev.initial()
    idx = ev.sample(keyed_generator(0, "bn", 2), 4, steps=3)
    got = torch.cat([m for _, m in ev.local_sgd(theta, idx, 0.05)])
    for i in range(idx.shape[1]):
        twin = copy.deepcopy(model).train()
        torch.nn.utils.vector_to_parameters(theta.clone(), twin.parameters())
        opt = torch.optim.SGD(twin.parameters(), lr=0.05)
        for e in range(idx.shape[0]):
            opt.zero_grad()
            F.cross_entropy(twin(ev.data.inputs(idx[e, i])), ev.data.labels(idx[e, i])).backward()
            opt.step()
        want = torch.nn.utils.parameters_to_vector(twin.parameters()).detach()
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-6)


def test_evaluation_uses_population_statistics_worked_in_numpy():
    model = NormMLP()
    ev = evaluator(model, (4,), sizes=(130, 150, 120, 200), test=60)  # 600: 3 batches of <=256
    theta = ev.initial() + 0.2 * torch.randn(ev.d, generator=torch.Generator().manual_seed(4))
    acc, loss = ev.evaluate(theta)
    p = {n: v.double().numpy() for n, v in ev.flat.unflatten(theta).items()}
    calib = ev.data.inputs(ev._normalisation_positions).double().numpy()
    assert len(calib) == 600
    h = calib @ p["fc1.weight"].T + p["fc1.bias"]
    batches = [h[lo:lo + NORMALISATION_BATCH] for lo in range(0, len(h), NORMALISATION_BATCH)]
    mean = np.mean([b.mean(0) for b in batches], axis=0)  # torch's cumulative average of
    var = np.mean([b.var(0, ddof=1) for b in batches], axis=0)  # batch means, unbiased vars
    x, y = ev.data.x_test.double().numpy(), ev.data.y_test.numpy()
    z = (x @ p["fc1.weight"].T + p["fc1.bias"] - mean) / np.sqrt(var + model.bn.eps)
    logits = np.maximum(z * p["bn.weight"] + p["bn.bias"], 0) @ p["fc2.weight"].T + p["fc2.bias"]
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    assert acc == pytest.approx(float(np.mean(logits.argmax(1) == y)), abs=1e-12)
    assert loss == pytest.approx(float(-logp[np.arange(len(y)), y].mean()), rel=1e-5)
    # the test batch's own statistics (training mode) would give another loss
    train_mode = F.cross_entropy(ev.flat.predict(theta, ev.data.x_test), ev.data.y_test)
    assert abs(float(train_mode) - loss) > 1e-4
    # no state carried from one evaluation (or training pass) to the next
    ev.device_losses(theta + 1.0, ev.sample(keyed_generator(0, "bn", 8), 4)[0])
    assert ev.evaluate(theta) == (acc, loss)


def test_results_do_not_depend_on_the_thread_count():
    ev = evaluator(NormCNN(), (1, 6, 6), sizes=(7, 5, 9, 6, 8))
    assert ev.stacked.strategy == "per-device" and ev.threaded
    theta = ev.initial()
    idx = ev.sample(keyed_generator(0, "bn", 5), 4, steps=2)
    results = []
    try:
        for used in (1, 2, 3):
            threads.configure(used=used)
            sgd = torch.cat([m for _, m in ev.local_sgd(theta, idx, 0.1)])
            results.append((sgd, ev.device_losses(theta, idx[0]), ev.evaluate(sgd.mean(0))))
    finally:
        threads.configure(used=1)
    for sgd, losses, evaluation in results[1:]:
        assert torch.equal(sgd, results[0][0]) and torch.equal(losses, results[0][1])
        assert evaluation == results[0][2]


def test_a_normalised_mlp_runs_per_device_not_under_vmap():
    ev = evaluator(NormMLP(), (4,), sizes=(6, 6))
    assert ev.stacked.strategy == "per-device"
    models = ev.initial().expand(2, -1).clone()
    idx = ev.sample(keyed_generator(0, "bn", 6), 4)[0]
    losses, grads = ev.stacked_losses_and_gradients(models, idx)
    want = [plain_device_loss(ev.flat.model, models[i], ev.data.inputs(idx[i]),
                              ev.data.labels(idx[i])) for i in range(2)]
    np.testing.assert_allclose(losses.numpy(), want, rtol=1e-5)
    assert torch.isfinite(grads).all() and grads.abs().sum() > 0


def test_batch_norm_without_running_statistics_is_refused():
    with pytest.raises(UserError, match="track_running_stats=True"):
        FlatModel(NormMLP(track=False))


def test_resnet18_device_losses_normalise_per_device():
    model = build_model("resnet18-cifar", (3, 8, 8), 10)
    ev = evaluator(model, (3, 8, 8), sizes=(3, 4), classes=10, test=4)
    theta = ev.initial()
    idx = ev.sample(keyed_generator(0, "bn", 7), 3)[0]
    got = ev.device_losses(theta, idx)
    want = [plain_device_loss(model, theta, ev.data.inputs(idx[i]), ev.data.labels(idx[i]))
            for i in range(2)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4)
    acc, loss = ev.evaluate(theta)
    assert 0.0 <= acc <= 1.0 and np.isfinite(loss)
