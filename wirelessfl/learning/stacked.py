"""Forward passes of n devices' own models at once: device i's parameters are row i of [n, d].

Per-device gradients then come from ONE autograd call on the sum of the per-device losses (device
i's loss depends only on row i, so d(sum)/d(row i) is device i's gradient), or from one per device.
Which kernels run is chosen from the model's structure, never from timings or thread counts, so
a scenario always takes the same arithmetic path (same seed, same numbers):

* ``linear``: a chain of Flatten / Linear / ReLU (the zoo's mlp and logistic, through their
  ``layers()``) of fewer than ``PER_DEVICE_MIN_PARAMETERS`` becomes one batched matrix product
  per layer for all devices (torch.baddbmm), its gradients written by autograd's own formulas
  straight into the rows of [n, d]; a larger one runs ``per-device`` as a chain with no
  convolutional head (learning/conv_chain.py), each device's model in cache over its steps;
* ``per-device``: models with 2-D convolutions run device by device in channels-last layout.
  Each device's pass is large (the seed-002 CNN: 10^7 MACs per sample), so the Python loop is
  negligible, and mkldnn's channels-last convolutions beat the grouped convolution that vmap
  produces (measured in benchmarks/README.md, "per-device model strategies"; a grouped
  convolution over the devices' channel-stacked inputs gives the same bits but was ~15 % slower
  on one thread). Each device's forward (and backward) is one task of the run's thread pool
  (host/threads.py) when the model holds no buffers (its private copy per thread then
  computes exactly what the original would); results are written in device order, so they
  never depend on the thread count. A model whose ``layers()`` are Conv2d / ReLU / MaxPool2d
  steps followed by Flatten and a Linear / ReLU tail (the seed-002 CNN) takes its passes layer
  by layer (learning/conv_chain.py): the kernels autograd would call, the same numbers, without
  the work autograd and the layouts cost around them. A model with batch norm runs per device
  too, whatever its layers: each pass normalises with one device's own minibatch;
* ``vmap``: any other model, torch.func.vmap of functional_call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.func import vmap
from torch.nn.modules.batchnorm import _BatchNorm

from wirelessfl.host.threads import parallel_map

if TYPE_CHECKING:  # evaluator imports this module
    from wirelessfl.learning.flat_model import FlatModel

CHANNELS_LAST = torch.channels_last
# [D] A linear chain of at least this many parameters runs device by device (as a chain,
# learning/conv_chain.py) instead of stacked: each step of the stacked path streams all n
# devices' models through memory (n d floats, several times), while one device's model and
# gradient stay in the core's cache over its local steps. On one thread the two took the same
# time at d ~ 51,000 (100 devices, 5 steps of 10 samples; the stacked path 1.7x slower at 85,000,
# 1.3x faster at 26,000: benchmarks/bench_model_size.py, benchmarks/README.md "model size"): fixed
# here, never timed at run time, so a scenario always takes the same arithmetic path.
PER_DEVICE_MIN_PARAMETERS = 60_000
# [D] On a GPU no threshold (None): every linear chain runs stacked. There one batched product of
# all devices was 5x to 90x faster than device after device at every d from 10^3 to 10^7 (an
# H200, benchmarks/model_size_cuda.json): a step's cost is kernel launches, not memory traffic.
PER_DEVICE_MIN_PARAMETERS_GPU: int | None = None


def uses_convolutions(model: nn.Module) -> bool:
    """True when the model has 2-D convolutions (they run faster in channels-last layout)."""
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def thread_safe_copies(model: nn.Module) -> bool:
    """True when private copies of the model compute what it computes: no buffers but batch
    norm's running statistics, which no pass reads (learning/flat_model.py: training passes
    normalise with the batch's statistics, evaluation loads re-estimated ones first); any
    other buffer could drift apart between the copies."""
    norms = {id(b) for m in model.modules() if isinstance(m, _BatchNorm)
             for b in m.buffers(recurse=False)}
    return all(id(b) in norms for b in model.buffers())


def device_row(models: torch.Tensor, i: int) -> torch.Tensor:
    """Device i's parameters (row i of [n, d]) for a pass of their own: on a CPU the row itself;
    on a GPU a fresh copy. A row of [n, d] starts at byte 4 i d, 8 bytes off a 16-byte boundary
    for odd i when d = 2 mod 4 (ResNet-18 for 10 classes), and cuDNN's backward pass failed on
    such rows (CUDNN_STATUS_EXECUTION_FAILED_CUDART on an H200); at d = 0 mod 4, rows 1 and 2
    of [3, d] gave gradients off the CPU's in the second digit while row 0, at the start of its
    allocation, agreed to float32 roundings (benchmarks/README.md "GPU"). A copy from torch's
    caching allocator starts an allocation; with it every row agrees (tests/test_cuda.py). It
    costs a copy of d floats beside a pass of a network that size."""
    row = models[i]
    return row.clone() if row.is_cuda else row


def to_channels_last(t: torch.Tensor) -> torch.Tensor:
    """A 4-D tensor in channels-last layout (same values); other tensors unchanged."""
    return t.contiguous(memory_format=CHANNELS_LAST) if t.dim() == 4 else t


# [D] a multiple of every vector loop's step (16 floats x unrolling): rows this long plus d's
# remainder end in the same tail as rows of d (``rowwise_update_exact``)
CHECK_WIDTH = 4096


@functools.lru_cache(maxsize=16)
def rowwise_update_exact(d: int, dtype: torch.dtype, device: str, lr: float, l2: float) -> bool:
    """True when an SGD update ``model -= lr (g + l2 model)`` of one row [d] gives the bits of
    the same update of all rows [n, d] at once. Elementwise kernels take a vectorised loop and a
    scalar one for the tail (a row's last d mod width values, the whole tensor's last few);
    where the two round alike (fused multiply-adds in both) every value is the same. Checked
    once on random data: the kernels' rounding does not depend on the values. Rows of
    ``CHECK_WIDTH + d mod CHECK_WIDTH`` values (at most d) stand in for rows of d: the same
    tail after every vector width and unrolling, without allocating a large model's rows
    several times over (45 MB at d = 1.1M, kept by the heap for the rest of the run)."""
    d = min(d, CHECK_WIDTH + d % CHECK_WIDTH)
    gen = torch.Generator().manual_seed(0)
    models = torch.randn(3, d, generator=gen).to(device=device, dtype=dtype)
    grads = torch.randn(3, d, generator=gen).to(device=device, dtype=dtype)

    def update(model: torch.Tensor, g: torch.Tensor) -> None:
        model.sub_(g + l2 * model if l2 else g, alpha=lr)

    whole, rows = models.clone(), models.clone()
    update(whole, grads)
    for i in range(len(rows)):
        update(rows[i], grads[i])
    return torch.equal(whole, rows)


def linear_plan(flat: FlatModel) -> list[tuple] | None:
    """The model as ("flatten",) / ("relu",) / ("linear", w_offset, b_offset|None, out, in) steps
    over the flat parameter vector, or None when it is not such a chain."""
    layers = getattr(flat.model, "layers", None)
    if not callable(layers):
        return None
    offsets, start = {}, 0
    for p, numel in zip(flat.model.parameters(), flat.numels):
        offsets[id(p)] = start
        start += numel
    plan: list[tuple] = []
    for layer in layers():
        if isinstance(layer, nn.Flatten) and layer.start_dim == 1 and layer.end_dim == -1:
            plan.append(("flatten",))
        elif isinstance(layer, nn.ReLU):
            plan.append(("relu",))
        elif isinstance(layer, nn.Linear):
            bias = offsets[id(layer.bias)] if layer.bias is not None else None
            plan.append(("linear", offsets[id(layer.weight)], bias, layer.out_features,
                         layer.in_features))
        else:
            return None
    return plan


class StackedForward:
    """logits [n, b, C] of n models (rows of ``models`` [n, d]) on their inputs x [n, b, ...]."""

    def __init__(self, flat: FlatModel):
        self.flat = flat
        self.plan = linear_plan(flat)
        threshold = (PER_DEVICE_MIN_PARAMETERS_GPU if flat.device.type == "cuda"
                     else PER_DEVICE_MIN_PARAMETERS)
        if self.plan is not None and (flat.chain is None or threshold is None
                                      or flat.d < threshold):
            self.strategy = "linear"
        elif (uses_convolutions(flat.model) or flat.normalised
              or (self.plan is not None and flat.chain is not None)):
            # batch norm: one device's batch a pass (vmap cannot update running statistics)
            self.strategy = "per-device"
        else:
            self.strategy = "vmap"
        # Per-device passes go to the thread pool (each on a private copy of the module).
        self.threaded = thread_safe_copies(flat.model)
        self.chain = flat.chain if self.strategy == "per-device" else None
        self._vmapped = vmap(flat.functional)

    def _each_device(self, fn: Callable[[int], torch.Tensor | tuple], n: int) -> list:
        return parallel_map(fn, range(n)) if self.threaded else [fn(i) for i in range(n)]

    def __call__(self, models: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.strategy == "linear":
            return self._linear(models, x)
        if self.strategy == "per-device":
            forward = self.flat.forward
            if self.chain is not None and not (torch.is_grad_enabled() and models.requires_grad):
                forward = self.chain.forward
            return torch.stack(self._each_device(
                lambda i: forward(device_row(models, i), x[i]), len(models)))
        return self._vmapped(models, x)

    def losses_and_gradients(self, models: torch.Tensor, x: torch.Tensor,
                             device_losses: Callable[[torch.Tensor, slice], torch.Tensor]
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """(device_losses(logits, all rows) [n], d(loss i)/d(models[i]) [n, d]) for every i.

        ``device_losses(logits, rows)`` maps the logits [m, b, C] of the devices ``rows`` (a
        slice of 0..n) to their losses [m]. The batched strategies take one autograd call on
        the sum of the losses (device i's loss depends only on row i, so d(sum)/d(row i) is
        device i's gradient); the per-device strategy takes one forward and backward per device
        (one leaf each: rows of a single [n, d] leaf would make autograd zero-fill and add an
        [n, d] buffer per device, n^2 d work), spread over the thread pool.
        """
        if self.strategy == "per-device" and self.chain is not None:
            return self._by_layer(models, x, device_losses)
        if self.strategy == "per-device":
            flat, grads = self.flat, models.new_empty(models.shape)

            def one(i: int) -> torch.Tensor:
                # one leaf per parameter tensor, each gradient copied straight into its slice
                # of row i: the bits of a [d] leaf's gradient, without autograd concatenating
                # the parameters' gradients into [d] and the rows being stacked into [n, d]
                # (a quarter of a ResNet-18 step at small batches)
                with torch.enable_grad():
                    leaves = {name: p.detach().requires_grad_(True)
                              for name, p in flat.layout(
                                  flat.unflatten(device_row(models, i))).items()}
                    loss = device_losses(flat.forward_at(leaves, x[i])[None], slice(i, i + 1))
                    grad = torch.autograd.grad(loss.sum(), list(leaves.values()))
                flat.write_gradient(grads[i], grad)
                return loss.detach()

            return torch.cat(self._each_device(one, len(models))), grads
        if self.strategy == "linear":
            return self._linear_losses_and_gradients(models, x, device_losses)
        with torch.enable_grad():
            leaf = models.detach().requires_grad_(True)
            losses = device_losses(self(leaf, x), slice(0, len(models)))
            (grad,) = torch.autograd.grad(losses.sum(), leaf)
        return losses.detach(), grad

    def _linear_losses_and_gradients(self, models: torch.Tensor, x: torch.Tensor,
                                     device_losses: Callable[[torch.Tensor, slice], torch.Tensor]
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """``losses_and_gradients`` of a linear chain, all devices at once: ``_linear``'s
        forward keeping each step's input, ONE autograd call for the losses at the logits, then
        autograd's own formulas, step by step, each parameter's gradient written straight into
        its columns of the [n, d] result. The same kernels on the same operands as autograd
        through ``_linear``, so the same numbers; what goes is autograd's backward of the
        parameter slices of one [n, d] leaf, which zero-fills an [n, d] buffer per parameter
        tensor and adds it to the rest (80 % of a step of a d = 1.1M MLP before this,
        benchmarks/README.md "model size")."""
        n, b = x.shape[:2]
        models = models.detach()
        saved: list = []  # per step: the input's shape (flatten), output (relu), input (linear)
        h = x
        with torch.no_grad():
            for step in self.plan:
                if step[0] == "flatten":
                    saved.append(h.shape)
                    h = h.reshape(n, b, -1)
                elif step[0] == "relu":
                    h = h.relu()
                    saved.append(h)
                else:
                    saved.append(h)
                    h = self._linear_step(models, h, step)
        with torch.enable_grad():
            logits = h.requires_grad_(True)
            losses = device_losses(logits, slice(0, n))
            (g,) = torch.autograd.grad(losses.sum(), logits)
        grads = models.new_empty(models.shape)
        first = next(k for k, step in enumerate(self.plan) if step[0] == "linear")
        with torch.no_grad():
            for k in range(len(self.plan) - 1, first - 1, -1):
                step = self.plan[k]
                if step[0] == "flatten":
                    g = g.reshape(saved[k])
                elif step[0] == "relu":
                    g = torch.ops.aten.threshold_backward(g, saved[k], 0)
                else:  # baddbmm / bmm's formulas (tools/autograd/derivatives.yaml)
                    _, w_at, b_at, out, inp = step
                    weight = models[:, w_at:w_at + out * inp].unflatten(1, (out, inp))
                    if b_at is not None:  # the broadcast bias [n, 1, out]: sum_to over the batch
                        grads[:, b_at:b_at + out].copy_(g.sum(1, keepdim=True).squeeze(1))
                    gw = saved[k].transpose(1, 2).bmm(g)  # d/d(weight^T) [n, in, out]
                    grads[:, w_at:w_at + out * inp].unflatten(1, (out, inp)).copy_(
                        gw.transpose(1, 2))
                    if k > first:  # the input of the first linear layer needs no gradient
                        g = g.bmm(weight)
        return losses.detach(), grads

    def _by_layer(self, models: torch.Tensor, x: torch.Tensor,
                  device_losses: Callable[[torch.Tensor, slice], torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """``losses_and_gradients`` of a convolutional chain (learning/conv_chain.py): each
        device's forward pass (a task of the pool), ONE autograd call for the losses of all the
        devices' logits (each logit's gradient comes from its own row's loss, the kernels
        work row by row: the numbers of one call per device), each device's backward pass."""
        chain, n = self.chain, len(models)
        models = models.detach()
        with torch.no_grad():  # the pool's tasks take the caller's grad mode
            runs = self._each_device(lambda i: chain.record(models[i], x[i]), n)
        with torch.enable_grad():
            logits = torch.stack([outs[-1] for _, outs in runs]).requires_grad_(True)
            losses = device_losses(logits, slice(0, n))
            (g,) = torch.autograd.grad(losses.sum(), logits)
        grads = models.new_empty(models.shape)
        with torch.no_grad():
            self._each_device(lambda i: chain.backward(models[i], runs[i], g[i], grads[i]), n)
        return losses.detach(), grads

    def chain_local_sgd(self, models: torch.Tensor, steps: list[int],
                        inputs: Callable[[int, int], torch.Tensor],
                        logit_gradient: Callable[[int, int, torch.Tensor], torch.Tensor],
                        lr: float, l2: float) -> None:
        """SGD of a convolutional chain's devices, in place on ``models`` [n, d]: device i takes
        ``steps[i]`` steps, step e on ``inputs(e, i)``, descending the loss whose gradient at
        the logits [1, b, C] is ``logit_gradient(e, i, logits)`` (the bits autograd gives for
        that loss: the caller's promise, minibatch.mean_cross_entropy_gradient for the
        evaluator's) plus (l2 / 2)|model|^2. Each device's steps are one task of the pool
        (forward, the loss's gradient, backward, update, step after step), so its model and
        activations stay in its core's cache and the pool waits once, not twice a step (a few
        % of a seed-002 CNN round on a pool of two threads, nothing on one:
        benchmarks/bench_rounds.py times the round). The numbers are those of stepping all
        devices together (``losses_and_gradients`` then one [n, d] update, Problem.local_sgd):
        every kernel works row by row, and the caller checks the update's
        (``rowwise_update_exact``)."""
        chain = self.chain

        def device(i: int) -> None:
            model = models[i]
            for e in range(steps[i]):
                run = chain.record(model, inputs(e, i))
                g = logit_gradient(e, i, run[1][-1][None])
                chain.backward(model, run, g[0], None, sgd=(lr, l2))

        with torch.no_grad():  # the pool's tasks take the caller's grad mode
            self._each_device(device, len(models))

    def _linear(self, models: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        n, b = x.shape[:2]
        h = x
        for step in self.plan:
            if step[0] == "flatten":
                h = h.reshape(n, b, -1)
            elif step[0] == "relu":
                h = h.relu()
            else:
                h = self._linear_step(models, h, step)
        return h

    @staticmethod
    def _linear_step(models: torch.Tensor, h: torch.Tensor, step: tuple) -> torch.Tensor:
        """One linear layer of every device: h [n, b, in] -> [n, b, out]."""
        _, w_at, b_at, out, inp = step
        weight = models[:, w_at:w_at + out * inp].unflatten(1, (out, inp))
        if b_at is None:
            return torch.bmm(h, weight.transpose(1, 2))
        return torch.baddbmm(models[:, None, b_at:b_at + out], h, weight.transpose(1, 2))
