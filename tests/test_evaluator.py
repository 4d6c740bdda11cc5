"""The batched evaluator against a plain per-device reference (ordinary autograd, one model at a
time): losses, gradients and local SGD agree within float32 tolerance for every kernel strategy,
and chunking never changes the numbers."""

import pytest
import torch
import torch.nn.functional as F

from wirelessfl.learning.flat_model import FlatModel
from wirelessfl.learning.models import build_model
from wirelessfl.learning.seeds import keyed_generator
from wirelessfl.learning.stacked import linear_plan
from wirelessfl.problems.classifier import BatchedEvaluator, DeviceData

CASES = {  # model name -> (input shape, expected strategy)
    "mlp": ((12,), "linear"),
    "logistic": ((12,), "linear"),
    "seed002-cnn": ((1, 16, 16), "per-device"),
}


def make_evaluator(model_name, n=6, per_device=9, max_chunk_mb=1024.0):
    shape, _ = CASES[model_name]
    model = build_model(model_name, shape, 3, hidden=(7, 5), seed=3)
    gen = torch.Generator().manual_seed(0)
    total = n * per_device
    x = torch.randn((total, *shape), generator=gen).numpy()
    y = torch.randint(0, 3, (total,), generator=gen).numpy()
    shards = [list(range(i * per_device, (i + 1) * per_device)) for i in range(n)]
    data = DeviceData.from_shards(x, y, [torch.tensor(s).numpy() for s in shards], x[:5], y[:5],
                                  "cpu")
    flat = FlatModel(model)
    return BatchedEvaluator(flat, data, activations_per_sample=100, input_size=12,
                            max_chunk_mb=max_chunk_mb)


def reference_grad(ev, theta, idx_row):
    """One device's minibatch gradient with ordinary autograd on the torch module."""
    model = ev.flat.model
    ref = {name: p.detach().clone().requires_grad_(True)
           for name, p in ev.flat.unflatten(theta.clone()).items()}
    logits = torch.func.functional_call(model, ref, (ev.data.x[idx_row],))
    loss = F.cross_entropy(logits, ev.data.y[idx_row])
    grads = torch.autograd.grad(loss, list(ref.values()))
    return torch.cat([g.reshape(-1) for g in grads]), float(loss.detach())


@pytest.mark.parametrize("model_name", sorted(CASES))
def test_strategy_follows_the_model_structure(model_name):
    ev = make_evaluator(model_name)
    assert ev.stacked.strategy == CASES[model_name][1]
    assert (linear_plan(ev.flat) is not None) == (CASES[model_name][1] == "linear")


@pytest.mark.parametrize("strategy", [None, "vmap"])
@pytest.mark.parametrize("model_name", sorted(CASES))
def test_losses_and_gradients_match_per_device_autograd(model_name, strategy):
    ev = make_evaluator(model_name)
    if strategy is not None:  # the generic path, available to every model
        ev.stacked.strategy = strategy
    theta = ev.flat.initial() + 0.01 * torch.randn(ev.flat.d, generator=torch.Generator().manual_seed(1))
    idx = ev.sample(keyed_generator(0, "t", 0), 4)[0]
    losses = ev.device_losses(theta, idx)
    grads = torch.cat([g for _, g in ev.device_gradients(theta, idx)])
    for i in range(ev.num_devices):
        g_ref, loss_ref = reference_grad(ev, theta, idx[i])
        assert losses[i].item() == pytest.approx(loss_ref, rel=1e-5, abs=1e-6)
        torch.testing.assert_close(grads[i], g_ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("model_name", sorted(CASES))
def test_local_sgd_matches_per_device_loop_with_step_masks(model_name):
    ev = make_evaluator(model_name)
    theta = ev.flat.initial()
    idx = ev.sample(keyed_generator(0, "t", 1), 3, steps=4)  # [E, N, b]
    steps = torch.tensor([4, 0, 1, 2, 3, 4])
    lr = 0.2
    out = torch.cat([m for _, m in ev.local_sgd(theta, idx, lr, steps)])
    for i in range(ev.num_devices):
        ref = theta.clone()
        for e in range(int(steps[i])):
            g, _ = reference_grad(ev, ref, idx[e, i])
            ref = ref - lr * g
        torch.testing.assert_close(out[i], ref, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(out[1], theta)  # zero steps: the broadcast model


@pytest.mark.parametrize("model_name", sorted(CASES))
def test_chunking_gives_identical_numbers(model_name):
    whole = make_evaluator(model_name)
    tiny = make_evaluator(model_name, max_chunk_mb=1e-6)  # one device per chunk
    assert tiny.chunk_size(3, own_model=True) == 1
    theta = whole.flat.initial()
    idx = whole.sample(keyed_generator(0, "t", 2), 3, steps=2)
    a = torch.cat([m for _, m in whole.local_sgd(theta, idx, 0.1)])
    b = torch.cat([m for _, m in tiny.local_sgd(theta, idx, 0.1)])
    if whole.stacked.strategy == "per-device":
        assert torch.equal(a, b)  # the same kernels device by device
    else:
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert torch.equal(whole.device_losses(theta, idx[0]), whole.device_losses(theta, idx[0]))


@pytest.mark.parametrize("model_name", ["mlp", "logistic"])
def test_linear_gradients_are_autograds_bits_without_its_slice_backward(model_name):
    """The linear strategy's hand-ordered backward (autograd's formulas for baddbmm, relu and
    reshape, written into the rows of [n, d]) against autograd through the same forward on one
    [n, d] leaf: exactly equal."""
    ev = make_evaluator(model_name)
    assert ev.stacked.strategy == "linear"
    gen = torch.Generator().manual_seed(4)
    models = ev.flat.initial() + 0.1 * torch.randn(ev.num_devices, ev.flat.d, generator=gen)
    idx = ev.sample(keyed_generator(0, "t", 3), 4)[0]
    losses, grads = ev.stacked_losses_and_gradients(models, idx)
    y = ev.data.labels(idx)
    with torch.enable_grad():
        leaf = models.clone().requires_grad_(True)
        logits = ev.stacked(leaf, ev.data.inputs(idx))
        ref = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
        ref = ref.view(y.shape).mean(1)
        (ref_grads,) = torch.autograd.grad(ref.sum(), leaf)
    assert torch.equal(losses, ref.detach())
    assert torch.equal(grads, ref_grads)
