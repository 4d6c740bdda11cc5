"""Measure a torch model's N_c (MACs), O_c (activations), d (parameters) and x_in (input size).

One sample of the given shape (zeros, batch dimension 1) goes through the model in eval mode
under ``torch.no_grad``, with a forward hook on every leaf module (a module without children) and
on every ``nn.MultiheadAttention`` (counted as one unit; its own sub-modules are not hooked, as it
calls their weights functionally). Every call of a hooked module adds one ``LayerProfile``.
Counting rules, per sample:

| layer | MACs | activations |
|---|---|---|
| Conv1d/2d/3d | output elements x in_channels / groups x kernel volume (stride, padding and dilation act through the output size) | output elements |
| Linear | output elements x in_features | output elements |
| MultiheadAttention (L queries, S keys, E = embed_dim) | projections L E^2 + S E kdim + S E vdim + output L E^2, plus the two batched matmuls Q K^T and A V, L S E each | Q, K, V (L E + 2 S E), attention weights (heads L S), context (L E), output (L E) |
| pooling, BatchNorm, LayerNorm, GroupNorm, Flatten | 0 (comparisons, adds and elementwise scale-and-shift are not MACs) | output elements |
| Embedding, EmbeddingBag | 0 (a table look-up) | output elements |
| ReLU, GELU, Sigmoid, ... , Dropout, Identity, an empty Sequential | 0 | 0 (they work in place on their input) |

* Bias additions are not MACs (for the seed-002 CNN they are 19,922 per sample, 0.2 % of N_c).
  Flatten counts as activations, which reproduces the paper's O_c for its CNN: 9,680 + 10,240
  + 2,560 + 2,560 + 2 = 25,042 (conv1, conv2, pool, flatten, fc).
* Only hooked modules are seen: functional calls inside ``forward`` (``F.relu``, ``x + y`` of a
  residual connection, ``x.flatten()``) count nothing. A leaf with its own weights that has no
  rule here (RNNs, transposed convolutions, ...) is refused rather than counted as zero MACs.
* Parameters d: trainable scalars of the model; a layer's ``params`` are its own, listed at its
  first call (0 when a module is called again). Input size x_in: elements of one sample.

Hooks are removed and every module's train/eval mode restored afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

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
    nn.Sequential,  # hooked only when empty, i.e. an identity
)
# Leaves with weights but no MACs under the rules above (elementwise affine maps, look-ups).
_NO_MAC_WEIGHTS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.PReLU,
                   nn.Embedding, nn.EmbeddingBag)
# Modules counted as one unit: their children are not hooked.
_UNITS = (nn.MultiheadAttention,)


@dataclass(frozen=True)
class LayerProfile:
    """One call of one layer, per sample."""

    name: str  # qualified module name in the model ('' for the model itself)
    type: str  # module class name
    macs: int  # multiply-accumulates [MAC]
    params: int  # trainable scalars of this module (0 on a repeated call)
    activations: int  # output values kept (0 for in-place elementwise layers)


@dataclass(frozen=True)
class ModelProfile:
    """Per-sample counts of one forward pass, and the model's size; ``layers`` itemises them."""

    params: int  # d, trainable scalars
    macs_per_sample: int  # N_c of one sample [MAC]
    activations_per_sample: int  # O_c of one sample
    input_size: int  # x_in, elements of one sample
    layers: list[LayerProfile] = field(default_factory=list, compare=False)

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


def _own_params(module: nn.Module, recurse: bool) -> int:
    return sum(p.numel() for p in module.parameters(recurse=recurse) if p.requires_grad)


def _attention_counts(module: nn.MultiheadAttention, args: tuple, kwargs: dict) -> tuple[int, int]:
    """(MACs, activations) of one nn.MultiheadAttention call, from its query/key/value shapes."""
    names = ("query", "key", "value")
    query, key, value = (kwargs[n] if n in kwargs else args[i] for i, n in enumerate(names))
    e, heads = module.embed_dim, module.num_heads
    unbatched = query.dim() == 2
    seq_dim = 0 if unbatched or not module.batch_first else 1
    length, source = query.shape[seq_dim], key.shape[seq_dim]
    batch = 1 if unbatched else query.shape[1 - seq_dim]
    kdim, vdim = key.shape[-1], value.shape[-1]
    macs = (length * e * e + source * kdim * e + source * vdim * e  # Q, K, V projections
            + 2 * length * source * e  # Q K^T and A V over all heads
            + length * e * e)  # output projection
    activations = (length * e + 2 * source * e + heads * length * source + 2 * length * e)
    return batch * macs, batch * activations


def _macs(module: nn.Module, out_elements: int) -> int:
    if isinstance(module, _CONV):
        return out_elements * (module.in_channels // module.groups) * math.prod(module.kernel_size)
    if isinstance(module, nn.Linear):
        return out_elements * module.in_features
    has_weights = next(module.parameters(recurse=False), None) is not None
    if has_weights and not isinstance(module, _NO_MAC_WEIGHTS):
        raise UserError(f"the energy profiler has no MAC rule for layer {type(module).__name__}; "
                        "it knows Conv1d/2d/3d, Linear, MultiheadAttention, normalisation and "
                        "Embedding layers (see wirelessfl/energy/profiler.py)")
    return 0


def _hooked_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Leaves and attention units, in registration order, skipping what lies inside a unit."""
    chosen, inside = [], set()
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in inside):
            continue
        if isinstance(module, _UNITS):
            chosen.append((name, module))
            inside.add(f"{name}." if name else "")
        elif next(module.children(), None) is None:
            chosen.append((name, module))
    return chosen


def profile_model(model: nn.Module, input_shape: Sequence[int],
                  input_dtype: torch.dtype | None = None) -> ModelProfile:
    """Count MACs and activations of one sample of ``input_shape`` (no batch dimension).

    The sample is zeros of ``input_dtype``: by default the parameters' dtype, or ``torch.long``
    (token ids) when the first layer is an embedding.
    """
    shape = tuple(int(s) for s in input_shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be positive sizes, got {tuple(input_shape)}")
    layers: list[LayerProfile] = []
    seen: set[int] = set()

    def hook_for(name: str):
        def hook(module: nn.Module, args, kwargs, output) -> None:
            if isinstance(module, _UNITS):
                macs, activations = _attention_counts(module, args, kwargs)
                params = _own_params(module, recurse=True)
            else:
                out = _elements(output)
                macs = _macs(module, out)
                activations = 0 if isinstance(module, _IN_PLACE) else out
                params = _own_params(module, recurse=False)
            params = 0 if id(module) in seen else params
            seen.add(id(module))
            layers.append(LayerProfile(name, type(module).__name__, int(macs), int(params),
                                       int(activations)))
        return hook

    modes = {m: m.training for m in model.modules()}
    first = next(model.parameters(), None)
    hooked = _hooked_modules(model)
    dtype = first.dtype if first is not None else torch.get_default_dtype()
    if hooked and isinstance(hooked[0][1], (nn.Embedding, nn.EmbeddingBag)):
        dtype = torch.long
    dtype = input_dtype or dtype
    device = first.device if first is not None else torch.device("cpu")
    handles = [m.register_forward_hook(hook_for(name), with_kwargs=True) for name, m in hooked]
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros((1, *shape), dtype=dtype, device=device))
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.training = training
    return ModelProfile(params=count_parameters(model),
                        macs_per_sample=sum(layer.macs for layer in layers),
                        activations_per_sample=sum(layer.activations for layer in layers),
                        input_size=math.prod(shape), layers=layers)
