"""One device's pass through a chain of layers (the seed-002 CNN, a large MLP), layer by layer,
with the numbers autograd gives, bit for bit.

A chain is a model whose ``layers()`` are Conv2d / ReLU / MaxPool2d steps (the head, empty for
an MLP), then a Flatten and Linear / ReLU layers (the tail). An MLP runs as a chain, one device
at a time, only when it is large (learning/stacked.py ``PER_DEVICE_MIN_PARAMETERS``): its
device's model then stays in the core's cache over the device's local steps. Its per-device
passes (learning/stacked.py, the ``per-device`` strategy; ``FlatModel.predict``) call here the
kernels autograd and the module would call, in the layouts they would get, so every number is
theirs (tests/test_conv_chain.py compares them exactly). What goes is the work around the kernels,
~30 % of a seed-002 CNN step under autograd:

* layout copies: a channels-last convolution fed a plain-layout activation converts it in its
  forward and again in its backward (here the ReLU before it writes channels-last in the same
  pass), and torch's max-pool backward, given the plain-layout gradient the flattening hands
  back, copies the channels-last input gradient to the plain layout and back;
* a ReLU right before a max-pool is applied after it instead (on a quarter of the values for a
  2x2 pool) and its backward to the pooled gradient: the same numbers, as the max commutes with
  the ReLU. Where a window's maximum is positive (or NaN) both orders pick the same element and
  pass its gradient; where it is not, the ReLU's gradient zeroes the window in the old order and
  the pooled gradient in the new, and a zero gradient scattered onto zeros is zero;
* the first convolution's input needs no gradient. With one input channel (the contiguous
  tensor is also channels-last, and torch then runs the plain layout, where mkldnn pads the
  channel to a block of 8) its weight gradient takes ~4x longer than in channels-last layout;
  it runs channels-last if, and only if, that gives exactly the plain layout's bits, checked
  once per input shape on random data (the kernels' summation order does not depend on the
  values);
* autograd's graph: only the caller's loss of the logits goes through it (and not even that
  in local SGD: minibatch.mean_cross_entropy_gradient); the linear tail's gradients are
  autograd's own formulas, and every gradient is written straight into the device's row of
  the [n, d] result (no views' and split's backward, no concatenation);
* idle vector lanes: a channels-last convolution whose input channels do not fill the vector
  registers (the seed-002 CNN's 20) may take its input gradient from a weight zero-padded to
  the next multiple of the register's floats, once per shape checked to give exactly the plain
  call's bits and timed to be faster (``ConvChain._padded_width``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from wirelessfl.learning.stacked import CHANNELS_LAST, to_channels_last

if TYPE_CHECKING:  # evaluator imports this module
    from wirelessfl.learning.flat_model import FlatModel

aten = torch.ops.aten

# float32 lanes of the CPU's vector registers, which oneDNN's channels-last kernels fill with
# channels [D]: AVX-512's 16, else AVX2's 8 (``ConvChain._padded_width``)
VECTOR_FLOATS = 16 if "AVX512" in torch.backends.cpu.get_cpu_capability() else 8


def strictly_channels_last(t: torch.Tensor) -> bool:
    """True when a 4-D tensor is channels-last and not also plain contiguous: a convolution
    given it runs in channels-last mode (an ambiguous tensor, one channel say, leaves the choice
    to the other operand, and two ambiguous ones run in the plain layout)."""
    return t.dim() == 4 and t.is_contiguous(memory_format=CHANNELS_LAST) and not t.is_contiguous()


def nhwc(t: torch.Tensor) -> torch.Tensor:
    """A 4-D tensor's values with channels-last strides, also for one channel (whose contiguous
    tensor torch reads as the plain layout)."""
    if t.shape[1] != 1:
        return to_channels_last(t)
    t = t.contiguous()
    return t.as_strided(t.shape, (t.shape[2] * t.shape[3], 1, t.shape[3], 1))


def _runs_nhwc(conv: nn.Conv2d) -> bool:
    """True when the convolution, its weight in channels-last layout, runs channels-last
    whatever its input's layout."""
    return strictly_channels_last(to_channels_last(torch.empty(conv.weight.shape,
                                                               device="meta")))


def _pair(value) -> list[int]:
    return list(value) if isinstance(value, (tuple, list)) else [value, value]


@dataclass(frozen=True)
class _Conv:
    weight: slice
    shape: torch.Size
    bias: slice | None
    stride: list[int]
    padding: list[int]
    dilation: list[int]
    groups: int
    nhwc: bool  # its channels-last weight makes it run channels-last whatever its input
    first: bool  # the first convolution: its input needs no gradient


@dataclass(frozen=True)
class _Relu:
    nhwc_out: bool  # written channels-last: a channels-last convolution follows


@dataclass(frozen=True)
class _Pool:
    kernel: list[int]
    stride: list[int]
    padding: list[int]
    dilation: list[int]
    ceil_mode: bool
    relu: bool  # the ReLU before it, applied after it
    plain_out: bool  # (with relu) written in the plain layout: the flattening is then a view


@dataclass(frozen=True)
class _Linear:
    weight: slice
    shape: torch.Size
    bias: slice | None


class ConvChain:
    """The per-device passes of a convolutional chain (see the module docstring)."""

    def __init__(self, head: list, tail: list):
        self.head, self.tail = head, tail
        # the first convolution (len(head) when there is none): steps before it need no backward
        self.first = next((k for k, step in enumerate(head) if isinstance(step, _Conv)),
                          len(head))
        self._first_linear = next(j for j, step in enumerate(tail) if isinstance(step, _Linear))
        self._nhwc_first: dict[tuple, bool] = {}
        self._padded: dict[tuple, int | None] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, flat: FlatModel) -> ConvChain | None:
        """The model's chain, or None when it is not such a chain (or holds buffers, or has no
        linear layer)."""
        layers = getattr(flat.model, "layers", None)
        if not callable(layers) or next(flat.model.buffers(), None) is not None:
            return None
        at, start = {}, 0
        for p, numel in zip(flat.model.parameters(), flat.numels):
            at[id(p)] = slice(start, start + numel)
            start += numel
        modules = list(layers())
        cut = next((k for k, m in enumerate(modules) if isinstance(m, nn.Flatten)), None)
        if cut is None or (modules[cut].start_dim, modules[cut].end_dim) != (1, -1):
            return None
        used = sum(p.numel() for m in modules for p in m.parameters(recurse=False))
        if used != flat.d:  # a parameter the layers do not use
            return None
        head = cls._head_steps(modules[:cut], at)
        tail = []
        for m in modules[cut + 1:]:
            if isinstance(m, nn.Linear):
                tail.append(_Linear(at[id(m.weight)], m.weight.shape,
                                    None if m.bias is None else at[id(m.bias)]))
            elif isinstance(m, nn.ReLU):
                tail.append(_Relu(False))
            else:
                return None
        if head is None or not any(isinstance(step, _Linear) for step in tail):
            return None
        return cls(head, tail)

    @staticmethod
    def _head_steps(modules: list[nn.Module], at: dict[int, slice]) -> list | None:
        steps: list = []
        for k, m in enumerate(modules):
            following = modules[k + 1] if k + 1 < len(modules) else None
            if isinstance(m, nn.Conv2d):
                if m.padding_mode != "zeros" or isinstance(m.padding, str):
                    return None
                first = not any(isinstance(step, _Conv) for step in steps)
                steps.append(_Conv(at[id(m.weight)], m.weight.shape,
                                   None if m.bias is None else at[id(m.bias)], _pair(m.stride),
                                   _pair(m.padding), _pair(m.dilation), m.groups, _runs_nhwc(m),
                                   first))
            elif isinstance(m, nn.MaxPool2d) and not m.return_indices:
                relu = k > 0 and isinstance(modules[k - 1], nn.ReLU)
                steps.append(_Pool(_pair(m.kernel_size), _pair(m.stride), _pair(m.padding),
                                   _pair(m.dilation), m.ceil_mode, relu,
                                   relu and following is None))
            elif isinstance(m, nn.ReLU):
                if isinstance(following, nn.MaxPool2d):
                    continue  # applied after the pool
                steps.append(_Relu(isinstance(following, nn.Conv2d) and _runs_nhwc(following)))
            else:
                return None
        return steps

    # ---- forward ---------------------------------------------------------------------------
    def _run_head(self, theta: torch.Tensor, x: torch.Tensor, keep: bool) -> list:
        """The head's output and, if ``keep``, per step what its backward needs: (input,
        weight) of a convolution, the output of a ReLU, (input, indices, output) of a pool."""
        h = to_channels_last(x) if self.head else x
        saved: list = []
        for step in self.head:
            if isinstance(step, _Conv):
                weight = to_channels_last(theta[step.weight].view(step.shape))
                if step.nhwc:  # the conversion conv2d would make inside
                    h = to_channels_last(h)
                if keep:
                    saved.append((h, weight))
                h = F.conv2d(h, weight, None if step.bias is None else theta[step.bias],
                             step.stride, step.padding, step.dilation, step.groups)
            elif isinstance(step, _Relu):
                if step.nhwc_out:  # torch's relu is clamp_min(h, 0)
                    h = torch.clamp_min(h, 0, out=torch.empty(
                        h.shape, dtype=h.dtype, device=h.device, memory_format=CHANNELS_LAST))
                else:
                    h = torch.relu(h)
                if keep:
                    saved.append(h)
            else:
                pooled, indices = aten.max_pool2d_with_indices(
                    h, step.kernel, step.stride, step.padding, step.dilation, step.ceil_mode)
                if step.plain_out:
                    pooled = torch.clamp_min(pooled, 0, out=torch.empty(
                        pooled.shape, dtype=pooled.dtype, device=pooled.device))
                elif step.relu:
                    pooled = torch.relu(pooled)
                if keep:
                    saved.append((h, indices, pooled))
                h = pooled
        saved.append(h)
        return saved

    def _run_tail(self, theta: torch.Tensor, h: torch.Tensor) -> list[torch.Tensor]:
        """The tail's activations from the head's output: its flattening first, logits last."""
        outs = [h.flatten(1)]
        for step in self.tail:
            if isinstance(step, _Relu):
                outs.append(torch.relu(outs[-1]))
            else:  # addmm(bias, h, weight.t()), or mm without a bias
                outs.append(F.linear(outs[-1], theta[step.weight].view(step.shape),
                                     None if step.bias is None else theta[step.bias]))
        return outs

    def forward(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """One device's logits at theta [d] on x (no gradient)."""
        return self._run_tail(theta, self._run_head(theta, x, keep=False)[-1])[-1]

    # ---- backward --------------------------------------------------------------------------
    def record(self, theta: torch.Tensor, x: torch.Tensor) -> tuple[list, list[torch.Tensor]]:
        """One device's forward pass at theta [d] on x, keeping what its backward needs: (head
        steps' saved tensors and output, tail activations with the logits last)."""
        saved = self._run_head(theta, x, keep=True)
        return saved, self._run_tail(theta, saved[-1])

    def backward(self, theta: torch.Tensor, run: tuple[list, list[torch.Tensor]],
                 g: torch.Tensor, grad: torch.Tensor | None,
                 sgd: tuple[float, float] | None = None) -> None:
        """Writes into ``grad`` [d] the gradient at theta of a loss whose gradient at the logits
        of ``run`` (from ``record``) is ``g``. With ``sgd`` = (lr, l2) it takes instead the step
        theta -= lr (gradient + l2 theta) in place, each parameter's part as soon as its
        gradient is known (after the gradient flowing past it, which reads its old value): no
        [d] gradient written and read back, the memory traffic of a plain torch loop's
        autograd and optimizer. Each value is the whole-vector update's where elementwise
        kernels round alike on every part of a vector (``stacked.rowwise_update_exact``)."""
        saved, outs = run
        g = self._tail_backward(theta, g, outs, grad, sgd)
        if g is None:  # no convolution: nothing before the tail needs a gradient
            return
        g = g.view(saved[-1].shape)
        for k in range(len(self.head) - 1, self.first - 1, -1):
            step = self.head[k]
            if isinstance(step, _Relu):
                g = aten.threshold_backward(g, saved[k], 0)
            elif isinstance(step, _Pool):
                h, indices, pooled = saved[k]
                if step.relu:
                    g = aten.threshold_backward(g, pooled, 0)
                if strictly_channels_last(h):
                    # torch picks the kernel by the gradient's layout: given a plain one, it
                    # copies the channels-last input gradient to the plain layout and back
                    g = to_channels_last(g)
                g = aten.max_pool2d_with_indices_backward(
                    g, h, step.kernel, step.stride, step.padding, step.dilation,
                    step.ceil_mode, indices)
            else:
                h, weight = saved[k]
                g = self._conv_backward(step, g, h, weight, theta, grad, sgd)

    @staticmethod
    def _put(theta: torch.Tensor, grad: torch.Tensor | None, where: slice, value: torch.Tensor,
             sgd: tuple[float, float] | None) -> None:
        """One parameter's gradient ``value``: written into ``grad[where]``, or (``sgd``) used
        at once for its step theta[where] -= lr (value + l2 theta[where]) (``backward``)."""
        if sgd is None:
            grad[where].view(value.shape).copy_(value)
            return
        lr, l2 = sgd
        p = theta[where].view(value.shape)
        p.sub_(value + l2 * p if l2 else value, alpha=lr)

    def _tail_backward(self, theta: torch.Tensor, g: torch.Tensor, outs: list[torch.Tensor],
                       grad: torch.Tensor | None, sgd: tuple[float, float] | None
                       ) -> torch.Tensor | None:
        """The gradient at the flattened head output from the one at the logits (None when the
        head has no convolution to take it); the tail's parameter gradients written into
        ``grad``. A linear layer's gradients are autograd's
        formulas for addmm / mm (torch/csrc/autograd/FunctionsManual.cpp, mm_mat1_backward and
        mm_mat2_backward for a row-major input and a transposed row-major weight; the bias's
        is the engine's sum_to over the batch), so the numbers are autograd's."""
        for j in range(len(self.tail) - 1, -1, -1):
            step = self.tail[j]
            if isinstance(step, _Relu):
                g = aten.threshold_backward(g, outs[j + 1], 0)
                continue
            gb = None if step.bias is None else g.sum(0, keepdim=True).view(-1)
            gw = g.t().mm(outs[j])
            below = None  # the model's input: no convolution before it wants a gradient
            if j != self._first_linear or self.first < len(self.head):
                below = g.mm(theta[step.weight].view(step.shape))
            if gb is not None:
                self._put(theta, grad, step.bias, gb, sgd)
            self._put(theta, grad, step.weight, gw, sgd)
            if below is None:
                return None
            g = below
        return g

    def _conv_backward(self, step: _Conv, g: torch.Tensor, h: torch.Tensor,
                       weight: torch.Tensor, theta: torch.Tensor, grad: torch.Tensor | None,
                       sgd: tuple[float, float] | None) -> torch.Tensor | None:
        if step.first and self._first_in_nhwc(step, h, weight, g):
            h, weight, g = nhwc(h), nhwc(weight), to_channels_last(g)
        width = None if step.first else self._padded_width(step, g, h, weight)
        if width is None:
            gh, gw, gb = self._conv_grads(step, g, h, weight)
        else:
            _, gw, gb = self._conv_grads(step, g, h, weight, input_grad=False)
            gh = self._padded_input_grad(step, g, h, weight, width)
        self._put(theta, grad, step.weight, gw, sgd)
        if gb is not None:
            self._put(theta, grad, step.bias, gb, sgd)
        return gh

    @staticmethod
    def _conv_grads(step: _Conv, g: torch.Tensor, h: torch.Tensor, weight: torch.Tensor,
                    input_grad: bool | None = None, weight_grad: bool = True) -> tuple:
        bias = None if step.bias is None or not weight_grad else [step.shape[0]]
        wanted = not step.first if input_grad is None else input_grad
        return aten.convolution_backward(
            g, h, weight, bias, step.stride, step.padding, step.dilation, False, [0, 0],
            step.groups, [wanted, weight_grad, bias is not None])

    @classmethod
    def _padded_input_grad(cls, step: _Conv, g: torch.Tensor, h: torch.Tensor,
                           weight: torch.Tensor, width: int) -> torch.Tensor:
        """The input gradient from the weight with ``width`` input channels, the added ones
        zero (``_padded_width``); the real channels' values, a channels-last view."""
        channels = step.shape[1]
        padded = torch.empty((step.shape[0], width, *step.shape[2:]), dtype=weight.dtype,
                             device=weight.device, memory_format=CHANNELS_LAST)
        padded[:, channels:].zero_()
        padded[:, :channels].copy_(weight)
        # only the input's shape and layout are read for its gradient
        shape = torch.empty((h.shape[0], width, *h.shape[2:]), dtype=h.dtype, device=h.device,
                            memory_format=CHANNELS_LAST)
        return cls._conv_grads(step, g, shape, padded, input_grad=True,
                               weight_grad=False)[0][:, :channels]

    def _padded_width(self, step: _Conv, g: torch.Tensor, h: torch.Tensor,
                      weight: torch.Tensor) -> int | None:
        """The input channels to pad a channels-last convolution's weight to for its input
        gradient, or None to run it as it is.

        oneDNN's channels-last kernels vectorise that gradient over the input channels, so a
        count that is not a multiple of the vector width leaves lanes idle: the seed-002 CNN's
        20 -> 40 convolution computed its input gradient 10-16 % faster from a weight padded
        to 24 zero-filled channels [D] when this was written (timed interleaved on one thread,
        AMD Zen 3). The real channels' values are the same bits on that shape, but padding is
        not faster on every shape: on others the padded call took up to 1.5x as long (a
        batch of 32, 36 or 60 channels, 3x3 kernels). So, once per shape, both are run on
        random data (the kernels' summation order does not depend on the values); the padded
        one is taken if, and only if, it gives exactly the plain call's bits and its best of
        four timings beats the plain call's best by 3 % [D]. Either way a result is the same
        bits; only the speed depends on the timing."""
        channels = step.shape[1]
        if (step.groups != 1 or channels % VECTOR_FLOATS == 0 or not strictly_channels_last(h)
                or not strictly_channels_last(weight) or not strictly_channels_last(g)):
            return None
        key = (id(step), h.shape, g.shape)  # the chain holds its steps: ids stay theirs
        if key not in self._padded:
            with self._lock:
                if key not in self._padded:
                    width = -(-channels // VECTOR_FLOATS) * VECTOR_FLOATS
                    self._padded[key] = self._calibrate_padding(step, h, weight, g, width)
        return self._padded[key]

    @classmethod
    def _calibrate_padding(cls, step: _Conv, h: torch.Tensor, weight: torch.Tensor,
                           g: torch.Tensor, width: int) -> int | None:
        gen = torch.Generator().manual_seed(0)
        rh = to_channels_last(torch.rand(h.shape, generator=gen, dtype=h.dtype))
        rw = to_channels_last(torch.randn(weight.shape, generator=gen, dtype=weight.dtype))
        rg = to_channels_last(torch.randn(g.shape, generator=gen, dtype=g.dtype))

        def plain() -> torch.Tensor:
            return cls._conv_grads(step, rg, rh, rw, input_grad=True, weight_grad=False)[0]

        def padded() -> torch.Tensor:
            return cls._padded_input_grad(step, rg, rh, rw, width)

        if not torch.equal(plain(), padded()) or not cls._faster(padded, plain):
            return None
        return width

    @staticmethod
    def _faster(candidate: Callable[[], object], incumbent: Callable[[], object]) -> bool:
        """Whether ``candidate``'s best of four timings (interleaved with ``incumbent``'s)
        beats ``incumbent``'s best by 3 % [D]."""
        best = [float("inf"), float("inf")]
        for _ in range(4):
            for k, call in enumerate((candidate, incumbent)):
                start = time.perf_counter()
                call()
                best[k] = min(best[k], time.perf_counter() - start)
        return best[0] < 0.97 * best[1]

    def _first_in_nhwc(self, step: _Conv, h: torch.Tensor, weight: torch.Tensor,
                       g: torch.Tensor) -> bool:
        """Whether the first convolution's weight gradient may run channels-last (see the
        module docstring): False when torch runs it channels-last anyway."""
        if strictly_channels_last(h) or strictly_channels_last(weight):
            return False
        key = (h.shape, g.shape)
        known = self._nhwc_first.get(key)
        if known is None:
            gen = torch.Generator().manual_seed(0)
            rh = torch.rand(h.shape, generator=gen)
            rw = to_channels_last(torch.randn(weight.shape, generator=gen))
            rg = torch.randn(g.shape, generator=gen)
            plain = self._conv_grads(step, rg, rh, rw)
            fast = self._conv_grads(step, to_channels_last(rg), nhwc(rh), nhwc(rw))
            known = all(a is None or torch.equal(a, b) for a, b in zip(plain[1:], fast[1:]))
            with self._lock:
                self._nhwc_first[key] = known
        return known
