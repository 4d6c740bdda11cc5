"""Unbiased M-bit stochastic rounding: seed 002's quantiser Q (spec dzofl.md, section 2).

The grid has L = 2^M levels evenly spaced on [-s, s], step Delta = 2 s / (L - 1). A value x in
[-s, s] with neighbours g_j <= x < g_{j+1} becomes g_{j+1} with probability (x - g_j) / Delta and
g_j otherwise, so E[Q(x) | x] = x and E[(Q(x) - x)^2 | x] = (x - g_j)(g_{j+1} - x) <= Delta^2 / 4.
Values outside [-s, s] saturate to the nearest end (that bias is reported, never hidden).
M >= 32 means full precision: floats are sent as they are and Q is the identity.
"""

from __future__ import annotations

import numpy as np
import torch

FULL_PRECISION_BITS = 32  # at or above this, values travel as float32: no quantisation, no header
SCALE_HEADER_BITS = 32  # a per-vector scale travels as one float32 in front of the vector

Noise = torch.Generator | torch.Tensor | None


def stochastic_round(x: torch.Tensor, bits: int, scale: torch.Tensor | float,
                     generator: Noise = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Q(x) on the 2^bits-level grid over [-scale, scale]; returns (values, saturated mask).

    ``scale`` [same unit as x] is a float or a tensor broadcastable to x (e.g. per-row [n, 1]);
    where it is 0 the output is 0. ``generator`` is a CPU torch.Generator (uniforms are drawn on
    the CPU and moved to x.device, so results do not depend on the device), or a tensor of
    pre-drawn uniforms in [0, 1) shaped like x (keyed per-device noise), or None (global RNG).
    """
    if bits < 1:
        raise ValueError(f"bits must be >= 1, got {bits}")
    if bits >= FULL_PRECISION_BITS:
        return x, torch.zeros_like(x, dtype=torch.bool)
    work = x.double()  # float64 grid arithmetic: the rounding probability stays exact at M = 16+
    if isinstance(scale, int | float):
        return _round_fixed_range(work, bits, float(scale), generator, x.dtype)
    scale = torch.as_tensor(scale, dtype=work.dtype, device=work.device)
    if bool((scale < 0).any()):
        raise ValueError("scale must be non-negative")
    saturated = work.abs() > scale
    intervals = 2**bits - 1
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    step = 2 * safe / intervals
    clipped = torch.maximum(torch.minimum(work, scale), -scale)
    position = (clipped + safe) / step  # in [0, intervals], in units of grid steps
    low = position.floor().clamp(0, intervals - 1)
    up = _uniforms(generator, work) < (position - low)  # P(round up) = fractional part
    q = (low + up) * step - safe
    q = torch.where(scale > 0, q, torch.zeros_like(q))
    return q.to(x.dtype), saturated


def _round_fixed_range(work: torch.Tensor, bits: int, scale: float, generator: Noise,
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """stochastic_round for one float range (DZOFL's scalars): the same grid, fewer tensor ops."""
    if scale < 0:
        raise ValueError("scale must be non-negative")
    saturated = work.abs() > scale
    if scale == 0:
        return torch.zeros_like(work, dtype=dtype), saturated
    intervals = 2**bits - 1
    step = 2 * scale / intervals
    position = (work.clamp(-scale, scale) + scale) / step
    low = position.floor().clamp_(0, intervals - 1)
    up = _uniforms(generator, work) < (position - low)
    return ((low + up) * step - scale).to(dtype), saturated


def _uniforms(generator: Noise, like: torch.Tensor) -> torch.Tensor:
    if isinstance(generator, torch.Tensor):
        return generator.to(like.device, like.dtype).expand_as(like)
    return torch.rand(like.shape, generator=generator, dtype=torch.float32).to(like.device, like.dtype)


def quantize_scalars(values: np.ndarray | torch.Tensor, bits: int, scale: float,
                     generator: Noise = None) -> tuple[np.ndarray | torch.Tensor,
                                                       np.ndarray | torch.Tensor]:
    """DZOFL's uploaded scalars on the fixed range [-scale, scale] known to devices and server.

    No header is sent (the range is agreed beforehand). Returns (values, saturated mask) of the
    input's kind: numpy in, numpy out; torch in, torch out.
    """
    if isinstance(values, torch.Tensor):
        return stochastic_round(values, bits, scale, generator)
    q, saturated = stochastic_round(torch.as_tensor(np.asarray(values, np.float64)), bits, scale,
                                    generator)
    return q.numpy(), saturated.numpy()


def quantize_rows(matrix: torch.Tensor, bits: int,
                  generator: Noise = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row (one device's vector) on its own grid over [-s_i, s_i], s_i = max |row i|.

    s_i travels as a float32 header (SCALE_HEADER_BITS) with the row, so nothing saturates and
    all-zero rows stay zero. Returns (quantised [n, d], scales [n] float32).
    """
    if matrix.dim() != 2:
        raise ValueError(f"quantize_rows expects a 2-D [rows, values] tensor, got {matrix.dim()}-D")
    exact = matrix.abs().amax(dim=1) if matrix.shape[1] else matrix.new_zeros(matrix.shape[0])
    scales = exact.float()
    # A float64 max can round down to float32; step up one ulp so the row stays inside the grid.
    scales = torch.where(scales.to(exact.dtype) < exact, torch.nextafter(scales, scales + 1), scales)
    if bits >= FULL_PRECISION_BITS:
        return matrix, scales
    q, _ = stochastic_round(matrix, bits, scales.to(matrix.dtype)[:, None], generator)
    return q, scales


def payload_bits_vector(length: int, bits: int, header_bits: int = SCALE_HEADER_BITS) -> int:
    """Size [bit] of one quantised vector: length * bits plus its scale header (none at >= 32 bits).

    Matches ``Payload.vectors`` in wirelessfl.algorithms.types.
    """
    return length * bits + (header_bits if bits < FULL_PRECISION_BITS else 0)


def payload_bits_scalar(bits: int) -> int:
    """Size [bit] of one quantised scalar on a pre-agreed range: no header."""
    return bits
