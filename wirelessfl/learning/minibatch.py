"""Minibatch sampling shared by the problems whose minibatches are sets of stored samples.

Devices hold their samples one after another (device i: global indices offsets[i] ..
offsets[i] + sizes[i] - 1), so a minibatch is an index tensor into that array.

Full local batches [D] (issue 19): a batch at least as large as a device's data means the whole
local data, once. Index tensors are dense ([steps, N, w], one width for every device), so a row
of a device with m_i < w holds its m_i samples in its first m_i slots and padding after them; the
problems weight the padding 0 and each real sample 1/m_i (``minibatch_mean``,
``minibatch_scale``). The row's real count is read from the index itself (``batch_counts``: the
size of the device owning its first slot), so every caller that passes rows of ``sample``'s
output, in any order or subset, gets the right weights without carrying a mask along.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from wirelessfl.learning.seeds import counter_uniform


def sample_minibatches(generator: torch.Generator, sizes: torch.Tensor, offsets: torch.Tensor,
                       batch_size: int, steps: int = 1,
                       device: torch.device | str | None = None) -> torch.Tensor:
    """Global sample indices [steps, N, w], w = min(b, max_i m_i), without replacement.

    ``sizes`` and ``offsets`` [N] (CPU, int64) place each device's samples. Each device ranks
    its samples by uniform keys drawn from ``generator`` and takes the b smallest, so every
    b-subset of a device's samples is equally likely (b <= m_i). A device with m_i < b takes all
    of its samples, once each, in random order, in slots 0..m_i-1; its slots m_i..w-1 are
    padding (its first stored sample) that ``minibatch_mean`` weights 0. The keys are drawn on
    the CPU, in one call whatever the torch device, so the indices are the same everywhere; the
    draw does not depend on which devices are short, so a device with m_i >= b gets the same
    indices as before full local batches existed.
    """
    largest = int(sizes.max())
    keys = torch.rand((steps, len(sizes), max(largest, batch_size)), generator=generator)
    return _smallest_keys(keys, sizes, offsets, batch_size, largest, device)


def sample_device_minibatches(seed: int, stream: str, keys: tuple[int, ...], devices: np.ndarray,
                              sizes: torch.Tensor, offsets: torch.Tensor, batch_size: int,
                              steps: int = 1, device: torch.device | str | None = None
                              ) -> torch.Tensor:
    """As ``sample_minibatches`` for the devices ``devices`` only [steps, n, w], with each
    device's keys from its own counter-based stream (seed, stream, keys, device)
    (``counter_uniform``): a device gets the same minibatches whichever other devices are drawn
    for, so a cross-device round samples for its participants alone (``sizes`` and
    ``offsets`` are the whole population's: w, like the shared draw's, is fixed by them)."""
    largest = int(sizes.max())
    width = max(largest, batch_size)  # keys per device per step, as the shared draw's
    rows = torch.as_tensor(np.asarray(devices, dtype=np.int64))
    uniforms = counter_uniform(seed, stream, keys, np.asarray(devices), steps * width)
    ranks = torch.from_numpy(uniforms).view(len(rows), steps, width).transpose(0, 1)
    return _smallest_keys(ranks.contiguous(), sizes[rows], offsets[rows], batch_size, largest,
                          device)


def _smallest_keys(keys: torch.Tensor, sizes: torch.Tensor, offsets: torch.Tensor,
                   batch_size: int, largest: int, device) -> torch.Tensor:
    """Each row's b samples of smallest key [steps, n, w] (keys [steps, n, width]; a row of a
    short device: all of its samples, then padding with its first sample)."""
    width = keys.shape[2]
    keys.masked_fill_(torch.arange(width) >= sizes[:, None], 2.0)
    take = min(batch_size, largest)  # every device short: no slot beyond the largest device
    local = keys.topk(take, dim=2, largest=False).indices
    local = torch.where(torch.arange(take) < sizes[:, None], local, 0)
    out = offsets[:, None] + local
    return out if device is None else out.to(device)


def real_batch_sizes(sizes: np.ndarray, batch_size: int) -> np.ndarray:
    """[N] samples a minibatch of ``batch_size`` really holds on each device: min(b, m_i)."""
    return np.minimum(np.asarray(sizes, dtype=np.int64), int(batch_size))


def owner_sizes(sizes: torch.Tensor) -> torch.Tensor:
    """[M] for every stored sample, the number of samples its device holds (what
    ``batch_counts`` looks a row's device size up in)."""
    return sizes.repeat_interleave(sizes)


def batch_counts(idx: torch.Tensor, sample_owner_sizes: torch.Tensor, smallest: int = 0
                 ) -> torch.Tensor | None:
    """[n] real samples of each minibatch row idx [n, w]: min(w, m of the row's device); None
    when every row is full because no device holds fewer than w samples (``smallest``: the
    fewest any device holds), which ``minibatch_mean`` takes as a plain mean: the same bits
    with none of the mask's tensor ops (run on every local step)."""
    if idx.shape[1] <= smallest:
        return None
    return sample_owner_sizes[idx[:, 0]].clamp(max=idx.shape[1])


def counts_of(counts: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    """``batch_counts`` of the rows ``rows`` (None stays None: every row full)."""
    return None if counts is None else counts[rows]


def minibatch_scale(counts: torch.Tensor, width: int, dtype: torch.dtype
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask [n, w] of the real slots, scale [n] = w / count in ``dtype``): the mean over the w
    slots with the padding zeroed, times the scale, is the mean over the real samples. A full
    row has an all-true mask and scale exactly 1.0, so its arithmetic (a mean over w, a
    product with 1.0) gives the same bits as a plain mean."""
    mask = torch.arange(width, device=counts.device) < counts[:, None]
    return mask, (width / counts.double()).to(dtype)


def minibatch_mean(values: torch.Tensor, counts: torch.Tensor | None) -> torch.Tensor:
    """[..., n] mean of values [..., n, w] over each row's real slots (``minibatch_scale``);
    counts None: every row is full, the plain mean (the same bits as the masked one, see
    minibatch_scale). A leading axis (runs in lockstep: one slice a lane) gives each slice the
    bits it gets alone, as every operation here is per row."""
    if counts is None:
        return values.mean(-1)
    mask, scale = minibatch_scale(counts, values.shape[-1], values.dtype)
    return torch.where(mask, values, 0.0).mean(-1) * scale


# Classes fewer than one SIMD vector of float32 holds, per torch CPU capability: where torch's
# softmax kernel over the last dim reduces lane by lane (``sample_cross_entropy``).
_SHORT_ROW_LANES = {"AVX512": 16, "AVX2": 8}


@functools.cache
def _short_row_lanes() -> int:
    """Float32 lanes of torch's CPU vectors where ``sample_cross_entropy``'s transposed form is
    known to give torch's bits (0: elsewhere, torch's own kernel)."""
    return _SHORT_ROW_LANES.get(torch.backends.cpu.get_cpu_capability(), 0)


def sample_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[n] cross-entropy of each row of logits [n, C] against target [n]: the bits of
    ``F.cross_entropy(logits, target, reduction="none")``, several times faster for few classes.

    Why: torch's CPU log-softmax over a last dim shorter than one vector (C < 16 float32 lanes
    with AVX-512, C < 8 with AVX2) loads each row as a partial vector and adds its C
    exponentials one at a time through vector stores and loads, several times slower per
    element than its AVX2 kernel (benchmarks/lockstep.json, ``cross_entropy_us``). That
    was most of a DZOFL lane's loss pass (10 classes, two loss passes an iteration,
    benchmarks/README.md "Runs in lockstep"). Over any other dim the same kernel does the same
    arithmetic (the row's max; the vector exp of x - max; the sum in class order starting from
    the first class; the vector log; x - max - log) vectorised across rows instead. So the log-
    softmax of the transposed [C, n] tensor gives each element the same bits, provided no row
    falls in that kernel's scalar tail (std::exp in place of the vector exp): the rows are
    padded to whole vectors. tests/test_minibatch.py compares the two exactly for every C and
    many n and scales. Elsewhere (more classes, other CPUs, GPUs, float64, a graph to
    differentiate) it is torch's own kernel."""
    lanes = _short_row_lanes()
    if (logits.shape[1] >= lanes or logits.dtype != torch.float32 or logits.device.type != "cpu"
            or (logits.requires_grad and torch.is_grad_enabled())):
        return F.cross_entropy(logits, target, reduction="none")
    n = logits.shape[0]
    by_class = F.pad(logits.t(), (0, -n % lanes))  # [C, whole vectors], contiguous
    log_p = torch.log_softmax(by_class, 0)
    return log_p.gather(0, target.view(1, n)).view(n).neg()


def mean_cross_entropy_gradient(logits: torch.Tensor, target: torch.Tensor,
                                counts: torch.Tensor | None) -> torch.Tensor:
    """d/d logits [1, w, C] of ``minibatch_mean(cross_entropy(logits, target [1, w]), counts)``
    (one device's row; counts [1] or None), bit for bit what autograd gives.

    It runs the kernels autograd's engine runs for that graph, in its order
    (torch/csrc/autograd/FunctionsManual.cpp and tools/autograd/derivatives.yaml): the sum's and
    the product's backward (the seed 1.0 times ``scale``), the mean's (expanded, divided by
    w), the mask's ``where(mask, grad, 0)``, ``nll_loss_backward`` and
    ``_log_softmax_backward_data``. A local SGD step of the convolutional chain
    (StackedForward.chain_local_sgd) takes it instead of building the loss's graph and calling
    the engine, whose graph building and call were the largest cost of a seed-002 CNN step
    outside its convolutions when this was written (on a pool of two threads every step's
    Python holds the interpreter the other thread's step also needs). tests/test_minibatch.py
    compares it with autograd exactly."""
    aten = torch.ops.aten
    flat, labels = logits.flatten(0, 1), target.flatten()
    width = target.shape[1]
    log_probs = aten._log_softmax(flat, 1, False)
    seed = torch.ones((1, 1), dtype=logits.dtype, device=logits.device)
    if counts is not None:
        mask, scale = minibatch_scale(counts, width, logits.dtype)
        seed = seed * scale[:, None]
    per_sample = seed.expand(1, width) / width
    if counts is not None:
        per_sample = torch.where(mask, per_sample, 0)
    grad = aten.nll_loss_backward(per_sample.reshape(-1), log_probs, labels, None, 0, -100,
                                  log_probs.new_empty(()))
    return aten._log_softmax_backward_data(grad, log_probs, 1, logits.dtype).view(logits.shape)
