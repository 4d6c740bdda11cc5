"""``mean_cross_entropy_gradient`` (learning/minibatch.py) against autograd through the graph it
replaces (F.cross_entropy, then ``minibatch_mean``): exactly equal, with full and short rows
(padding weighted 0), one to ten samples, two to ten classes, large and equal logits, float32
and float64. ``sample_cross_entropy`` against torch's own kernel (exactly, on this host's
vectors and, in a child process, on AVX2's) and against a float64 log-sum-exp; ``minibatch_mean``
with a leading lane axis against each lane alone."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from wirelessfl.learning import minibatch
from wirelessfl.learning.minibatch import (
    _short_row_lanes,
    mean_cross_entropy_gradient,
    minibatch_mean,
    sample_cross_entropy,
)


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


def _cross_entropy_cases(seed: int):
    """(logits [n, C] float32, target [n]) over C = 2..20 (both sides of one vector), n from one
    row to past the log-softmax kernel's chunk of rows, scales from 1e-3 to 1e3, an offset, equal
    logits and one dominant class."""
    gen = torch.Generator().manual_seed(seed)
    for classes in range(2, 21):
        for trial, n in enumerate((1, 7, 15, 16, 17, 100, 500, 3264, 3265, 7000)):
            scale = 10.0 ** (trial % 7 - 3)
            logits = scale * torch.randn((n, classes), generator=gen) + 3 * scale * trial
            if trial == 4:
                logits[::3] = 0.0  # every class equally likely
            if trial == 5:
                logits[:, 0] += 80.0  # one class dominates: exp underflows for the others
            yield logits, torch.randint(0, classes, (n,), generator=gen)


def test_sample_cross_entropy_is_torchs_kernel_bit_for_bit(monkeypatch):
    """Every case equal to F.cross_entropy(..., reduction="none") exactly, with and without a
    graph to differentiate; the transposed form is taken wherever this host's vectors allow
    (torch's kernel hidden from it there)."""
    capability = torch.backends.cpu.get_cpu_capability()
    assert _short_row_lanes() == {"AVX512": 16, "AVX2": 8}.get(capability, 0)
    if _short_row_lanes():
        with monkeypatch.context() as patch:
            patch.setattr(minibatch, "F", SimpleNamespace(pad=F.pad))
            logits, target = torch.randn(30, 3), torch.randint(0, 3, (30,))
            assert torch.equal(sample_cross_entropy(logits, target),
                               F.cross_entropy(logits, target, reduction="none"))
    for logits, target in _cross_entropy_cases(0):
        ours = sample_cross_entropy(logits, target)
        assert torch.equal(ours, F.cross_entropy(logits, target, reduction="none")), \
            (capability, logits.shape)
    leaf = torch.randn(40, 10).requires_grad_(True)
    target = torch.randint(0, 10, (40,))
    (grad,) = torch.autograd.grad(sample_cross_entropy(leaf, target).sum(), leaf)
    (ref,) = torch.autograd.grad(F.cross_entropy(leaf, target, reduction="sum"), leaf)
    assert torch.equal(grad, ref)


def test_sample_cross_entropy_is_the_log_sum_exp():
    """The independent truth: logsumexp(x) - x_y in float64, to float32 rounding."""
    for logits, target in _cross_entropy_cases(1):
        x = logits.double()
        expected = torch.logsumexp(x, 1) - x.gather(1, target[:, None])[:, 0]
        torch.testing.assert_close(sample_cross_entropy(logits, target).double(), expected,
                                   rtol=1e-5, atol=1e-5 * float(x.abs().max()))


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                    reason="AVX2 kernels are emulated only on an AVX-512 host")
def test_sample_cross_entropy_is_torchs_kernel_with_avx2_vectors():
    """The same exact comparison in a process whose torch runs its AVX2 kernels, where the
    transposed form is taken below 8 classes and torch's kernel above."""
    code = ("import torch, torch.nn.functional as F, sys; sys.path.insert(0, 'tests');"
            "from test_minibatch import _cross_entropy_cases;"
            "from wirelessfl.learning.minibatch import sample_cross_entropy, _short_row_lanes;"
            "assert torch.backends.cpu.get_cpu_capability() == 'AVX2' and _short_row_lanes() == 8;"
            "bad = [tuple(x.shape) for x, y in _cross_entropy_cases(2) if not torch.equal("
            "sample_cross_entropy(x, y), F.cross_entropy(x, y, reduction='none'))];"
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2"},
                          cwd=os.path.dirname(os.path.dirname(__file__)), check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_minibatch_mean_of_lanes_is_each_lane_alone():
    gen = torch.Generator().manual_seed(3)
    values = torch.randn((5, 300, 10), generator=gen) * 7.0
    counts = torch.randint(1, 11, (300,), generator=gen)
    for row_counts in (None, counts):
        together = minibatch_mean(values, row_counts)
        for lane in range(5):
            assert torch.equal(together[lane], minibatch_mean(values[lane], row_counts))
