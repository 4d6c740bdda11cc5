"""Measure a torch model's N_c (MACs), O_c (activations), d (parameters) and x_in (input size).

One sample of the given shape (zeros, batch dimension 1) goes through the model in eval mode
under ``torch.no_grad``, with a forward hook on every leaf module (a module without children).
Counting rules, per sample:

* MACs: Conv1d/2d/3d count output elements x (in_channels / groups x kernel volume); Linear counts
  output elements x in_features. Bias additions, activation functions, normalisation and pooling
  comparisons are not MACs.
* Activations: output elements of every leaf module (Conv, Linear, pooling, Flatten, BatchNorm, ...)
  except elementwise activation functions, Dropout and Identity, which work in place on their
  input. Flatten counts. For the seed-002 CNN this gives the paper's O_c: 9,680 + 10,240 + 2,560
  + 2,560 + 2 = 25,042 (conv1, conv2, pool, flatten, fc).
* Only leaf modules are seen: functional calls inside ``forward`` (``F.relu``, ``x.flatten()``)
  count nothing. A leaf with its own weights that has no MAC rule here (RNNs, transposed
  convolutions, embeddings) is refused rather than counted as zero MACs.
* Parameters d: trainable scalars. Input size x_in: elements of one sample.

Hooks are removed and every module's train/eval mode restored afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from wirelessfl.errors import UserError
from wirelessfl.learning.models import count_parameters

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
# Elementwise modules: they rewrite their input in place, so they add no activations.
_IN_PLACE = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU,
    nn.Mish, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Sigmoid, nn.Tanh, nn.Softplus,
    nn.Softmax, nn.LogSoftmax, nn.modules.dropout._DropoutNd, nn.Identity,
)
# Leaves with weights but no MACs under the rules above (elementwise affine maps).
_NO_MAC_WEIGHTS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.PReLU)


@dataclass(frozen=True)
class ModelProfile:
    """Per-sample counts of one forward pass, and the model's size."""

    params: int  # d, trainable scalars
    macs_per_sample: int  # N_c of one sample [MAC]
    activations_per_sample: int  # O_c of one sample
    input_size: int  # x_in, elements of one sample

    def macs(self, batch: int) -> int:
        """N_c of a pass over ``batch`` samples [MAC]."""
        return self.macs_per_sample * _positive(batch)

    def activations(self, batch: int) -> int:
        """O_c of a pass over ``batch`` samples."""
        return self.activations_per_sample * _positive(batch)


def _positive(batch: int) -> int:
    if int(batch) != batch or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    return int(batch)


def _elements(output) -> int:
    if isinstance(output, torch.Tensor):
        return output.numel()
    if isinstance(output, (tuple, list)):
        return sum(_elements(o) for o in output)
    return 0


def _macs(module: nn.Module, out_elements: int) -> int:
    if isinstance(module, _CONV):
        return out_elements * (module.in_channels // module.groups) * math.prod(module.kernel_size)
    if isinstance(module, nn.Linear):
        return out_elements * module.in_features
    has_weights = next(module.parameters(recurse=False), None) is not None
    if has_weights and not isinstance(module, _NO_MAC_WEIGHTS):
        raise UserError(f"the energy profiler has no MAC rule for layer {type(module).__name__}; "
                        "it knows Conv1d/2d/3d and Linear (see wirelessfl/energy/profiler.py)")
    return 0


def profile_model(model: nn.Module, input_shape: Sequence[int]) -> ModelProfile:
    """Count MACs and activations of one sample of ``input_shape`` (no batch dimension)."""
    shape = tuple(int(s) for s in input_shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be positive sizes, got {tuple(input_shape)}")
    counts = {"macs": 0, "activations": 0}

    def hook(module: nn.Module, _inputs, output) -> None:
        out = _elements(output)
        counts["macs"] += _macs(module, out)
        if not isinstance(module, _IN_PLACE):
            counts["activations"] += out

    leaves = [m for m in model.modules() if next(m.children(), None) is None]
    modes = {m: m.training for m in model.modules()}
    first = next(model.parameters(), None)
    dtype = first.dtype if first is not None else torch.get_default_dtype()
    device = first.device if first is not None else torch.device("cpu")
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros((1, *shape), dtype=dtype, device=device))
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.training = training
    return ModelProfile(params=count_parameters(model), macs_per_sample=counts["macs"],
                        activations_per_sample=counts["activations"],
                        input_size=math.prod(shape))
