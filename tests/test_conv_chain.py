"""The layer-by-layer pass of chains (learning/conv_chain.py: convolutional, and MLPs, which
have no convolutional head) against
ordinary autograd through the torch module (``FlatModel.forward``: functional_call in
channels-last layout, the per-device path the chain replaces): losses, gradients, local SGD,
full-data gradients and shared-model predictions must be EXACTLY equal (shipped results depend on every bit), with short
devices (padded minibatches), one and three input channels, padded, strided and dilated
convolutions, overlapping pools and a two-layer tail, and whatever the thread pool's size."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from torch import nn

from wirelessfl.host import threads
from wirelessfl.learning import stacked
from wirelessfl.learning.conv_chain import VECTOR_FLOATS, ConvChain
from wirelessfl.learning.flat_model import FlatModel
from wirelessfl.learning.models import build_model
from wirelessfl.learning.seeds import keyed_generator
from wirelessfl.learning.stacked import StackedForward, rowwise_update_exact
from wirelessfl.problems.classifier import BatchedEvaluator, DeviceData


class Odd(nn.Module):
    """A chain with every option the chain passes on: padding, stride, dilation, an overlapping
    pool, a ReLU after the pool, a grouped bias-free convolution and a two-layer tail."""

    def __init__(self, shape, classes):
        super().__init__()
        self.c1 = nn.Conv2d(shape[0], 4, 3, padding=1, stride=2)
        self.r1 = nn.ReLU()
        self.p1 = nn.MaxPool2d(3, stride=1, padding=1)
        self.c2 = nn.Conv2d(4, 6, 3, dilation=2, bias=False, groups=2)
        self.r2 = nn.ReLU()
        self.flatten = nn.Flatten()
        side = (shape[1] + 1) // 2 - 4
        self.fc1 = nn.Linear(6 * side * side, 5)
        self.r3 = nn.ReLU()
        self.fc2 = nn.Linear(5, classes)

    def layers(self):
        return [self.c1, self.r1, self.p1, self.c2, self.r2, self.flatten, self.fc1, self.r3,
                self.fc2]

    def forward(self, x):
        h = self.layers()
        for layer in h:
            x = layer(x)
        return x


class Unfilled(nn.Module):
    """A chain whose convolutions have input channels that do not fill vector registers, the
    padded input gradient (ConvChain._padded_width) flowing into another such convolution's
    backward, into a pool's and into a ReLU's."""

    def __init__(self, shape, classes):
        super().__init__()
        self.c1 = nn.Conv2d(shape[0], 12, 3)
        self.r1 = nn.ReLU()
        self.c2 = nn.Conv2d(12, 20, 3)
        self.c3 = nn.Conv2d(20, 20, 3, padding=1)
        self.p1 = nn.MaxPool2d(2)
        self.c4 = nn.Conv2d(20, 6, 3)
        self.r2 = nn.ReLU()
        self.flatten = nn.Flatten()
        side = (shape[1] - 4) // 2 - 2
        self.fc = nn.Linear(6 * side * side, classes)

    def layers(self):
        return [self.c1, self.r1, self.c2, self.c3, self.p1, self.c4, self.r2, self.flatten,
                self.fc]

    def forward(self, x):
        for layer in self.layers():
            x = layer(x)
        return x


def evaluator(model, shape, sizes=(9, 4, 9, 7, 9), seed=0):
    gen = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    x = torch.rand((total, *shape), generator=gen)
    x[x < 0.3] = 0.0  # image-like: exact zeros in the background
    y = torch.randint(0, 3, (total,), generator=gen)
    starts = [sum(sizes[:k]) for k in range(len(sizes) + 1)]
    shards = [torch.arange(a, b).numpy() for a, b in pairwise(starts)]
    data = DeviceData.from_shards(x.numpy(), y.numpy(), shards, x[:4].numpy(), y[:4].numpy(),
                                  "cpu")
    return BatchedEvaluator(FlatModel(model), data, activations_per_sample=100,
                            input_size=x[0].numel())


def autograd_twin(ev):
    """The same evaluator's stacking, but each device's pass through autograd (no chain)."""
    twin = StackedForward(ev.flat)
    twin.chain = None
    return twin


MODELS = {
    "seed002-cnn, 1x28x28": lambda: (build_model("seed002-cnn", (1, 28, 28), 3, seed=2),
                                     (1, 28, 28)),
    "seed002-cnn, 3x16x16": lambda: (build_model("seed002-cnn", (3, 16, 16), 3, seed=2),
                                     (3, 16, 16)),
    "odd chain, 1x13x13": lambda: (Odd((1, 13, 13), 3), (1, 13, 13)),
    "odd chain, 2x13x13": lambda: (Odd((2, 13, 13), 3), (2, 13, 13)),
    "unfilled chain, 1x14x14": lambda: (Unfilled((1, 14, 14), 3), (1, 14, 14)),
    # no convolution: run device by device only when large (stacked.PER_DEVICE_MIN_PARAMETERS,
    # lowered to 0 for these tests), a two-layer tail on features and on flattened images
    "mlp, 12 features": lambda: (build_model("mlp", (12,), 3, hidden=(7, 5), seed=2), (12,)),
    "mlp, 2x5x5": lambda: (build_model("mlp", (2, 5, 5), 3, hidden=(9,), seed=2), (2, 5, 5)),
}


@pytest.fixture(autouse=True)
def _mlps_device_by_device(monkeypatch):
    monkeypatch.setattr(stacked, "PER_DEVICE_MIN_PARAMETERS", 0)


def perturbed(ev, scale=0.05, count=5):
    gen = torch.Generator().manual_seed(7)
    return ev.flat.initial() + scale * torch.randn(count, ev.flat.d, generator=gen)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_chain_losses_and_gradients_equal_autograd_exactly(name):
    torch.manual_seed(0)
    ev = evaluator(*MODELS[name]())
    assert ev.stacked.strategy == "per-device" and ev.stacked.chain is not None
    models = perturbed(ev)
    idx = ev.sample(keyed_generator(0, "chain", 0), 6)[0]  # device 1 is short: padded rows
    losses, grads = ev.stacked_losses_and_gradients(models, idx)
    ev.stacked = autograd_twin(ev)
    ref_losses, ref_grads = ev.stacked_losses_and_gradients(models, idx)
    assert torch.equal(losses, ref_losses)
    assert torch.equal(grads, ref_grads)
    assert grads.abs().sum(1).min() > 0  # every device's gradient is a real one


@pytest.mark.parametrize("name", sorted(MODELS))
def test_chain_forward_equals_the_module(name):
    ev = evaluator(*MODELS[name]())
    models = perturbed(ev)
    idx = ev.sample(keyed_generator(0, "chain", 1), 6)[0]
    chained = ev.stacked_losses(models, idx)
    ev.stacked = autograd_twin(ev)
    assert torch.equal(chained, ev.stacked_losses(models, idx))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_predict_equals_the_module(name):
    """Shared-model passes (DZOFL's queries, the test set) against the module itself."""
    ev = evaluator(*MODELS[name]())
    assert ev.flat.chain is not None
    theta = perturbed(ev)[0]
    with torch.no_grad():
        for rows in (slice(0, 7), slice(3, 4), slice(0, 38)):
            assert torch.equal(ev.flat.predict(theta, ev.data.x[rows]),
                               ev.flat.forward(theta, ev.data.x[rows]))


def test_local_sgd_and_full_gradients_equal_autograd_exactly():
    ev = evaluator(*MODELS["seed002-cnn, 1x28x28"]())
    theta = ev.flat.initial()
    idx = ev.sample(keyed_generator(0, "chain", 2), 6, steps=3)
    steps = torch.tensor([3, 0, 1, 2, 3])
    sgd = torch.cat([m for _, m in ev.local_sgd(theta, idx, 0.1, steps)])
    full = ev.full_gradients(perturbed(ev))
    ev.stacked = autograd_twin(ev)
    assert torch.equal(sgd, torch.cat([m for _, m in ev.local_sgd(theta, idx, 0.1, steps)]))
    assert torch.equal(full, ev.full_gradients(perturbed(ev)))


def test_thread_pool_size_changes_nothing():
    ev = evaluator(*MODELS["seed002-cnn, 1x28x28"]())
    models = perturbed(ev)
    idx = ev.sample(keyed_generator(0, "chain", 3), 6)[0]
    results = []
    try:
        for used in (1, 2, 3):
            threads.configure(used=used)
            results.append(ev.stacked_losses_and_gradients(models, idx))
    finally:
        threads.configure(used=1)
    for losses, grads in results[1:]:
        assert torch.equal(losses, results[0][0]) and torch.equal(grads, results[0][1])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_device_taking_its_steps_in_one_task_equals_stepping_all_together(name):
    """The chain's local SGD (each device's steps one task of the pool,
    StackedForward.chain_local_sgd) against Problem.local_sgd's loop (every device's gradient,
    then one [n, d] update, step by step), with an l2 term, short devices (padded minibatches),
    devices stopping early (none, one or all steps) and pools of 1 and 3 threads: exactly
    equal. The one-task path runs where a row's update gives the [n, d] update's bits
    (``rowwise_update_exact``, true on the kernels of this machine's torch)."""
    from wirelessfl.problems.base import Problem

    ev = evaluator(*MODELS[name]())
    ev.l2 = 0.01
    theta = ev.flat.initial()
    idx = ev.sample(keyed_generator(0, "chain", 4), 6, steps=3)
    steps = torch.tensor([3, 0, 1, 2, 3])
    assert rowwise_update_exact(ev.flat.d, theta.dtype, "cpu", 0.1, 0.01)
    together = torch.cat([m for _, m in Problem.local_sgd(ev, theta, idx, 0.1, steps)])
    try:
        for used in (1, 3):
            threads.configure(used=used)
            own = torch.cat([m for _, m in ev.local_sgd(theta, idx, 0.1, steps)])
            assert torch.equal(own, together)
    finally:
        threads.configure(used=1)
    assert torch.equal(together[1], theta)  # no step taken


class WithBuffer(Odd):
    def __init__(self, shape, classes):
        super().__init__(shape, classes)
        self.register_buffer("seen", torch.zeros(1))


class BatchNormed(Odd):
    def layers(self):
        return [self.c1, nn.BatchNorm2d(4), *super().layers()[1:]]


class NoFlatten(Odd):
    def layers(self):
        return [self.c1, self.r1, self.fc2]


class ConvInTail(Odd):
    def layers(self):
        return [self.c1, self.flatten, self.c2]


class UnusedParameter(Odd):
    def __init__(self, shape, classes):
        super().__init__(shape, classes)
        self.extra = nn.Linear(2, 2)


@pytest.mark.parametrize("cls", [WithBuffer, BatchNormed, NoFlatten, ConvInTail,
                                 UnusedParameter])
def test_models_outside_the_chain_shape_keep_autograd(cls):
    assert ConvChain.of(FlatModel(cls((1, 13, 13), 3))) is None
    assert ConvChain.of(FlatModel(Odd((1, 13, 13), 3))) is not None
    assert ConvChain.of(FlatModel(build_model("mlp", (12,), 3))) is not None  # no head


def test_small_mlps_stay_stacked_and_large_ones_run_device_by_device(monkeypatch):
    """The strategy follows the model's size alone: the same scenario always takes the same
    arithmetic path."""
    monkeypatch.setattr(stacked, "PER_DEVICE_MIN_PARAMETERS", 100)
    small = evaluator(build_model("mlp", (12,), 3, hidden=(4,), seed=2), (12,))
    large = evaluator(build_model("mlp", (12,), 3, hidden=(9,), seed=2), (12,))
    assert small.flat.d < 100 <= large.flat.d
    assert small.stacked.strategy == "linear" and small.stacked.chain is None
    assert large.stacked.strategy == "per-device" and large.stacked.chain is not None


@pytest.mark.parametrize("faster", [True, False])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_padded_input_gradient_keeps_autograd_bits(name, faster, monkeypatch):
    """A convolution whose input channels are not a multiple of the vector width may take its
    input gradient from a zero-padded weight (ConvChain._padded_width): taken where the bits
    are the plain call's and the timing says it is faster. Forced either way, every gradient
    and every local SGD step stays exactly autograd's; the seed-002 CNN's 20-channel second
    convolution is the case it exists for (the bits check passes there)."""
    monkeypatch.setattr(ConvChain, "_faster", staticmethod(lambda candidate, incumbent: faster))
    ev = evaluator(*MODELS[name]())
    models = perturbed(ev)
    idx = ev.sample(keyed_generator(0, "chain", 5), 6)[0]
    steps_idx = ev.sample(keyed_generator(0, "chain", 6), 6, steps=2)
    theta = ev.flat.initial()
    losses, grads = ev.stacked_losses_and_gradients(models, idx)
    sgd = torch.cat([m for _, m in ev.local_sgd(theta, idx=steps_idx, lr=0.1)])
    chain = ev.stacked.chain
    ev.stacked = autograd_twin(ev)
    ref_losses, ref_grads = ev.stacked_losses_and_gradients(models, idx)
    assert torch.equal(losses, ref_losses) and torch.equal(grads, ref_grads)
    assert torch.equal(sgd, torch.cat([m for _, m in ev.local_sgd(theta, idx=steps_idx,
                                                                   lr=0.1)]))
    widths = set(chain._padded.values())
    if name.startswith(("odd", "mlp")):
        assert widths <= {None}  # the odd chain's second convolution is grouped; no MLP pads
    elif not faster:
        assert widths == {None}
    elif VECTOR_FLOATS == 8:
        # AVX2: 20 channels padded to 24; the unfilled chain's 12-channel convolution gets
        # the 20-channel one's padded gradient, a strided view, and runs as it is
        assert widths == {24}
