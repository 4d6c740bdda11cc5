"""``mean_cross_entropy_gradient`` (learning/minibatch.py) against autograd through the graph it
replaces (F.cross_entropy, then ``minibatch_mean``): exactly equal, with full and short rows
(padding weighted 0), one to ten samples, two to ten classes, large and equal logits, float32
and float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from wirelessfl.learning.minibatch import mean_cross_entropy_gradient, minibatch_mean


def autograd_gradient(logits, target, counts):
    leaf = logits.detach().requires_grad_(True)
    losses = F.cross_entropy(leaf.flatten(0, 1), target.flatten(), reduction="none")
    (grad,) = torch.autograd.grad(minibatch_mean(losses.view(target.shape), counts).sum(), leaf)
    return grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width,classes", [(1, 2), (6, 3), (10, 2), (10, 10), (7, 5)])
def test_equals_autograd_exactly(width, classes, dtype):
    gen = torch.Generator().manual_seed(width * 100 + classes)
    for trial in range(20):
        scale = (0.1, 1.0, 30.0, 300.0)[trial % 4]
        logits = (scale * torch.randn((1, width, classes), generator=gen)).to(dtype)
        if trial == 5:
            logits.zero_()  # every class equally likely
        target = torch.randint(0, classes, (1, width), generator=gen)
        for counts in (None, *(torch.tensor([c]) for c in range(1, width + 1))):
            ours = mean_cross_entropy_gradient(logits, target, counts)
            ref = autograd_gradient(logits, target, counts)
            assert ours.shape == ref.shape and ours.dtype == ref.dtype
            assert torch.equal(ours, ref), (trial, counts)
            if counts is not None:  # the padding slots get no gradient
                assert not ours[0, int(counts):].any()


def test_full_row_is_the_textbook_gradient():
    """(softmax - one-hot) / w, the closed form, to rounding."""
    logits = torch.tensor([[[2.0, -1.0, 0.5], [0.0, 0.0, 3.0]]], dtype=torch.float64)
    target = torch.tensor([[0, 1]])
    expected = (torch.softmax(logits, -1) - F.one_hot(target, 3)) / 2
    torch.testing.assert_close(mean_cross_entropy_gradient(logits, target, None), expected,
                               rtol=1e-15, atol=1e-15)
