"""Forward passes of n devices' own models at once: device i's parameters are row i of [n, d].

Per-device gradients then come from ONE autograd call on the sum of the per-device losses (device
i's loss depends only on row i, so d(sum)/d(row i) is device i's gradient), or from one per device.
Which kernels run is chosen from the model's structure, never from timings or thread counts, so
a scenario always takes the same arithmetic path (same seed, same numbers):

* ``linear``: a chain of Flatten / Linear / ReLU (the zoo's mlp and logistic, through their
  ``layers()``) becomes one batched matrix product per layer for all devices (torch.baddbmm);
* ``per-device``: models with 2-D convolutions run device by device in channels-last layout.
  Each device's pass is large (the seed-002 CNN: 10^7 MACs per sample), so the Python loop is
  negligible, and mkldnn's channels-last convolutions beat the grouped convolution that vmap
  produces (measured in benchmarks/README.md, "per-device model strategies"; a grouped
  convolution over the devices' channel-stacked inputs gives the same bits but was ~15 % slower
  on one thread). Each device's forward (and backward) is one task of the run's thread pool
  (engine/threads.py) when the model holds no buffers (its private copy per thread then
  computes exactly what the original would); results are written in device order, so they
  never depend on the thread count. A model whose ``layers()`` are Conv2d / ReLU / MaxPool2d
  steps followed by Flatten and a Linear / ReLU tail (the seed-002 CNN) takes its backward pass
  layer by layer (``ConvChain``): the same kernels autograd would call, without the layout
  copies autograd's saved tensors cost on every step;
* ``vmap``: any other model, torch.func.vmap of functional_call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from wirelessfl.engine.threads import parallel_map

if TYPE_CHECKING:  # evaluator imports this module
    from wirelessfl.learning.evaluator import FlatModel

CHANNELS_LAST = torch.channels_last


def uses_convolutions(model: nn.Module) -> bool:
    """True when the model has 2-D convolutions (they run faster in channels-last layout)."""
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def thread_safe_copies(model: nn.Module) -> bool:
    """True when private copies of the model compute what it computes: no buffers (a copy's
    batch-norm running statistics, say, would drift apart from the original's)."""
    return next(model.buffers(), None) is None


def to_channels_last(t: torch.Tensor) -> torch.Tensor:
    """A 4-D tensor in channels-last layout (same values); other tensors unchanged."""
    return t.contiguous(memory_format=CHANNELS_LAST) if t.dim() == 4 else t


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


def _pair(value) -> list[int]:
    return list(value) if isinstance(value, (tuple, list)) else [value, value]


def strictly_channels_last(t: torch.Tensor) -> bool:
    """True when a 4-D tensor is channels-last and not also plain contiguous: a convolution
    given it runs in channels-last mode (an ambiguous tensor, one channel say, leaves the choice
    to the other operand, and two ambiguous ones run in the plain layout)."""
    return t.dim() == 4 and t.is_contiguous(memory_format=CHANNELS_LAST) and not t.is_contiguous()


def runs_nhwc(conv: nn.Conv2d) -> bool:
    """True when the convolution, its weight in channels-last layout, runs channels-last
    whatever its input's layout."""
    return strictly_channels_last(to_channels_last(torch.empty(conv.weight.shape,
                                                               device="meta")))


def nhwc(t: torch.Tensor) -> torch.Tensor:
    """A 4-D tensor's values with channels-last strides, also for one channel (whose contiguous
    tensor torch reads as the plain layout)."""
    if t.shape[1] != 1:
        return to_channels_last(t)
    t = t.contiguous()
    _, _, _, width = t.shape
    return t.as_strided(t.shape, (t.shape[2] * width, 1, width, 1))


class ConvChain:
    """A model whose ``layers()`` are Conv2d / ReLU / MaxPool2d steps (the head), then Flatten and
    Linear / ReLU layers (the tail): the seed-002 CNN. One device's pass, layer by layer.

    The backward pass calls the kernels autograd calls (convolution_backward, threshold_backward,
    max_pool2d_with_indices_backward), in the layouts autograd gives them, so every number is the
    one autograd computes (tests/test_evaluator.py compares them exactly); the tail, whose
    tensors are small, is left to autograd. What goes is autograd's bookkeeping around the
    convolutions: a channels-last convolution fed a plain-layout activation converts it in its
    forward and again in its backward, and the weight gradients pass through views, a split's
    backward and a concatenation; here each activation is converted once and each gradient is
    written straight into its row of the [n, d] result.

    A ReLU right before a max-pool is applied after it instead (on a quarter of the values for a
    2x2 pool), and its backward to the pooled gradient: the same numbers, as the max commutes
    with the ReLU. Where the window's maximum is positive (or NaN) both orders pick the same
    element and pass its gradient; where it is not, the old order's ReLU gradient zeroes the
    whole window and the new order's zeroes the pooled gradient, and a zero gradient scattered
    onto zeros is zero.

    The first convolution's input needs no gradient. When its input and weight are ambiguous
    (one input channel: the plain contiguous tensor is also channels-last), torch runs it in the
    plain layout, where mkldnn pads the one channel to a block of 8 and takes ~4x longer for its
    weight gradient than in channels-last layout. Its weight gradient then runs channels-last
    if, and only if, that gives exactly the plain layout's bits, checked once per input shape on
    random data (the kernels' summation order does not depend on the values).
    """

    def __init__(self, head: list[nn.Module], tail: list[nn.Module],
                 slices: dict[int, tuple[slice, torch.Size]]):
        self.head, self.tail, self.slices = head, tail, slices
        self.first_conv = next(k for k, m in enumerate(head) if isinstance(m, nn.Conv2d))
        # ReLUs applied after the max-pool that follows them (see above).
        self.after_pool = {k for k in range(len(head) - 1) if isinstance(head[k], nn.ReLU)
                           and isinstance(head[k + 1], nn.MaxPool2d)}
        # ReLUs that write their output in the channels-last layout the next convolution takes
        # (one pass instead of a ReLU and a conversion).
        self.into_nhwc = {k for k in range(len(head) - 1) if isinstance(head[k], nn.ReLU)
                          and k not in self.after_pool and isinstance(head[k + 1], nn.Conv2d)
                          and runs_nhwc(head[k + 1])}
        self._nhwc_first: dict[tuple, bool] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, flat: FlatModel) -> ConvChain | None:
        """The model's chain, or None when it is not such a chain (or holds buffers)."""
        layers = getattr(flat.model, "layers", None)
        if not callable(layers) or not thread_safe_copies(flat.model):
            return None
        slices, start = {}, 0
        for p, numel in zip(flat.model.parameters(), flat.numels):
            slices[id(p)] = (slice(start, start + numel), p.shape)
            start += numel
        modules = list(layers())
        cut = next((k for k, m in enumerate(modules) if isinstance(m, nn.Flatten)), None)
        if cut is None or not any(isinstance(m, nn.Conv2d) for m in modules[:cut]):
            return None
        head, tail = modules[:cut], modules[cut:]
        for m in head:
            if isinstance(m, nn.Conv2d):
                if m.padding_mode != "zeros" or isinstance(m.padding, str):
                    return None
            elif not (isinstance(m, nn.ReLU) or
                      (isinstance(m, nn.MaxPool2d) and not m.return_indices)):
                return None
        flatten = tail[0]
        if (flatten.start_dim, flatten.end_dim) != (1, -1) or not all(
                isinstance(m, (nn.Linear, nn.ReLU)) for m in tail[1:]):
            return None
        used = sum(p.numel() for m in modules for p in m.parameters(recurse=False))
        if used != flat.d:  # a parameter the layers do not use
            return None
        return cls(head, tail, slices)

    def _param(self, theta: torch.Tensor, p: torch.Tensor | None) -> torch.Tensor | None:
        if p is None:
            return None
        at, shape = self.slices[id(p)]
        return theta[at].view(shape)

    def _head(self, theta: torch.Tensor, x: torch.Tensor, keep: bool
              ) -> tuple[list[torch.Tensor], list]:
        """The head's activations (input first, output last; only the output unless ``keep``)
        and, per layer, the weight a convolution used or the indices of a max-pool."""
        h = to_channels_last(x)
        acts, extras = [h], []
        for k, layer in enumerate(self.head):
            extra = None
            if k in self.after_pool:
                pass  # applied after the pool
            elif isinstance(layer, nn.Conv2d):
                extra = to_channels_last(self._param(theta, layer.weight))
                if strictly_channels_last(extra):  # the conversion conv2d would make inside
                    h = acts[-1] = to_channels_last(h)
                h = F.conv2d(h, extra, self._param(theta, layer.bias), layer.stride,
                             layer.padding, layer.dilation, layer.groups)
            elif k in self.into_nhwc:  # relu is clamp_min(h, 0) in torch
                h = torch.clamp_min(h, 0, out=torch.empty(
                    h.shape, dtype=h.dtype, device=h.device, memory_format=CHANNELS_LAST))
            elif isinstance(layer, nn.ReLU):
                h = torch.relu(h)
            else:
                h, extra = F.max_pool2d(h, layer.kernel_size, layer.stride, layer.padding,
                                        layer.dilation, ceil_mode=layer.ceil_mode,
                                        return_indices=True)
                if k - 1 in self.after_pool and k == len(self.head) - 1:
                    # in the plain layout the flattening reads as a view (one pass, not two)
                    h = torch.clamp_min(h, 0, out=torch.empty(h.shape, dtype=h.dtype,
                                                              device=h.device))
                elif k - 1 in self.after_pool:
                    h = torch.relu(h)
            if keep:
                acts.append(h)
                extras.append(extra)
            else:
                acts[-1] = h
        return acts, extras

    def _tail(self, theta: torch.Tensor, h: torch.Tensor) -> list[torch.Tensor]:
        """The tail's activations from the head's output: its flattening first, logits last."""
        outs = [h.flatten(1)]
        for layer in self.tail[1:]:
            if isinstance(layer, nn.ReLU):
                outs.append(torch.relu(outs[-1]))
            else:  # addmm(bias, h, weight.t()), or mm without a bias
                outs.append(F.linear(outs[-1], self._param(theta, layer.weight),
                                     self._param(theta, layer.bias)))
        return outs

    def forward(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """One device's logits (no gradient)."""
        acts, _ = self._head(theta, x, keep=False)
        return self._tail(theta, acts[-1])[-1]

    def loss_and_gradient(self, theta: torch.Tensor, x: torch.Tensor,
                          loss_of: Callable[[torch.Tensor], torch.Tensor],
                          grad: torch.Tensor) -> torch.Tensor:
        """``loss_of(logits)`` at theta [d] on x; its gradient is written into ``grad`` [d].

        Only ``loss_of`` (the caller's loss, any function of the logits) goes through
        autograd."""
        acts, extras = self._head(theta, x, keep=True)
        outs = self._tail(theta, acts[-1])
        with torch.enable_grad():
            logits = outs[-1].detach().requires_grad_(True)
            loss = loss_of(logits)
            (g,) = torch.autograd.grad(loss.sum(), logits)
        g = self._tail_backward(theta, g, outs, grad).view(acts[-1].shape)
        for k in range(len(self.head) - 1, self.first_conv - 1, -1):
            layer = self.head[k]
            if k in self.after_pool:
                continue  # taken with the pool's
            if isinstance(layer, nn.ReLU):
                g = torch.ops.aten.threshold_backward(g, acts[k + 1], 0)
            elif isinstance(layer, nn.MaxPool2d):
                if k - 1 in self.after_pool:
                    g = torch.ops.aten.threshold_backward(g, acts[k + 1], 0)
                # torch picks the kernel by the gradient's layout: given a plain one, it copies
                # the channels-last input gradient to the plain layout and back
                g = torch.ops.aten.max_pool2d_with_indices_backward(
                    to_channels_last(g) if strictly_channels_last(acts[k]) else g, acts[k], _pair(layer.kernel_size), _pair(layer.stride),
                    _pair(layer.padding), _pair(layer.dilation), layer.ceil_mode, extras[k])
            else:
                g = self._conv_backward(layer, g, acts[k], extras[k], grad, k == self.first_conv)
        return loss.detach()

    def _tail_backward(self, theta: torch.Tensor, g: torch.Tensor, outs: list[torch.Tensor],
                       grad: torch.Tensor) -> torch.Tensor:
        """The gradient at the flattened head output from the one at the logits; the tail's
        parameter gradients written into ``grad``. A linear layer's gradients are autograd's
        formulas for addmm / mm (torch/csrc/autograd/FunctionsManual.cpp, mm_mat1_backward and
        mm_mat2_backward for a row-major input and a transposed row-major weight; the bias's
        is the engine's sum_to over the batch), so the numbers are autograd's."""
        for j in range(len(self.tail) - 1, 0, -1):
            layer = self.tail[j]
            if isinstance(layer, nn.ReLU):
                g = torch.ops.aten.threshold_backward(g, outs[j], 0)
                continue
            if layer.bias is not None:
                self._param(grad, layer.bias).copy_(g.sum(0, keepdim=True).view(-1))
            self._param(grad, layer.weight).copy_(g.t().mm(outs[j - 1]))
            g = g.mm(self._param(theta, layer.weight))
        return g

    def _conv_backward(self, layer: nn.Conv2d, g: torch.Tensor, x: torch.Tensor,
                       weight: torch.Tensor, grad: torch.Tensor, first: bool) -> torch.Tensor | None:
        bias = layer.bias is not None
        if first and self._first_in_nhwc(layer, x, weight, g):
            x, weight, g = nhwc(x), nhwc(weight), to_channels_last(g)
        gx, gw, gb = self._conv_grads(layer, g, x, weight, not first)
        self._param(grad, layer.weight).copy_(gw)
        if bias:
            self._param(grad, layer.bias).copy_(gb)
        return gx

    @staticmethod
    def _conv_grads(layer: nn.Conv2d, g, x, weight, input_grad: bool) -> tuple:
        bias = [layer.out_channels] if layer.bias is not None else None
        return torch.ops.aten.convolution_backward(
            g, x, weight, bias, _pair(layer.stride), _pair(layer.padding),
            _pair(layer.dilation), False, [0, 0], layer.groups,
            [input_grad, True, bias is not None])

    def _first_in_nhwc(self, layer: nn.Conv2d, x: torch.Tensor, weight: torch.Tensor,
                       g: torch.Tensor) -> bool:
        """Whether the first convolution's weight gradient may run channels-last (see the class
        docstring): False when torch runs it channels-last anyway."""
        if strictly_channels_last(x) or strictly_channels_last(weight):
            return False
        key = (tuple(x.shape), tuple(weight.shape), tuple(g.shape))
        known = self._nhwc_first.get(key)
        if known is None:
            gen = torch.Generator().manual_seed(0)
            rx = torch.rand(x.shape, generator=gen)
            rw = to_channels_last(torch.randn(weight.shape, generator=gen))
            rg = torch.randn(g.shape, generator=gen)
            plain = self._conv_grads(layer, rg, rx, rw, False)
            fast = self._conv_grads(layer, to_channels_last(rg), nhwc(rx), nhwc(rw), False)
            known = all(a is None or torch.equal(a, b) for a, b in zip(plain[1:], fast[1:]))
            with self._lock:
                self._nhwc_first[key] = known
        return known


class StackedForward:
    """logits [n, b, C] of n models (rows of ``models`` [n, d]) on their inputs x [n, b, ...]."""

    def __init__(self, flat: FlatModel):
        self.flat = flat
        self.plan = linear_plan(flat)
        if self.plan is not None:
            self.strategy = "linear"
        elif flat.channels_last:
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
            return torch.stack(self._each_device(lambda i: forward(models[i], x[i]),
                                                 len(models)))
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
            grads = models.new_empty(models.shape)
            chain = self.chain

            def by_layer(i: int) -> torch.Tensor:
                return chain.loss_and_gradient(
                    models[i], x[i], lambda logits: device_losses(logits[None], slice(i, i + 1)),
                    grads[i])

            return torch.cat(self._each_device(by_layer, len(models))), grads
        if self.strategy == "per-device":
            def one(i: int) -> tuple[torch.Tensor, torch.Tensor]:
                with torch.enable_grad():
                    leaf = models[i].detach().requires_grad_(True)
                    loss = device_losses(self.flat.forward(leaf, x[i])[None], slice(i, i + 1))
                    (grad,) = torch.autograd.grad(loss.sum(), leaf)
                return loss.detach(), grad

            results = self._each_device(one, len(models))
            return torch.cat([r[0] for r in results]), torch.stack([r[1] for r in results])
        with torch.enable_grad():
            leaf = models.detach().requires_grad_(True)
            losses = device_losses(self(leaf, x), slice(0, len(models)))
            (grad,) = torch.autograd.grad(losses.sum(), leaf)
        return losses.detach(), grad

    def _linear(self, models: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        n, b = x.shape[:2]
        h = x
        for step in self.plan:
            if step[0] == "flatten":
                h = h.reshape(n, b, -1)
            elif step[0] == "relu":
                h = h.relu()
            else:
                _, w_at, b_at, out, inp = step
                weight = models[:, w_at:w_at + out * inp].unflatten(1, (out, inp))
                if b_at is None:
                    h = torch.bmm(h, weight.transpose(1, 2))
                else:
                    h = torch.baddbmm(models[:, None, b_at:b_at + out], h, weight.transpose(1, 2))
        return h
