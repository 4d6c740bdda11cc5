"""Unbiased M-bit quantisers: seed 002's Q (spec dzofl.md, section 2; seed 002, Assumption IV.5:
E[Q(x) | x] = x and E[||Q(x) - x||^2 | x] <= sigma ||x||^2).

Three formats, all stochastically rounded (x between neighbouring levels g_j <= x < g_{j+1}
becomes g_{j+1} with probability (x - g_j) / (g_{j+1} - g_j), else g_j, so E[Q(x) | x] = x and
E[(Q(x) - x)^2 | x] = (x - g_j)(g_{j+1} - x)):

* Scalars, stochastic float (``stochastic_float``, the default for DZOFL and ZO-HFL's seed mode):
  1 sign bit, E = min(6, M - 1) exponent bits, m = M - 1 - E mantissa bits (M = 8: 1 + 6 + 1;
  M = 16: 1 + 6 + 9) [D]. Levels: 0, the subnormals k 2^(e_min - m) (k < 2^m) and the normals
  (1 + k 2^-m) 2^e for e_min <= e <= e_max, e_min = 1 - 2^(E-1), e_max = 2^(E-1) - 1 (E = 6:
  e = -31..31, the normal range [2^-31, (2 - 2^-m) 2^31] ~ [4.7e-10, 3.2e9] at M = 8). Nothing is
  carried beside the M bits. For |x| in the normal range, sigma(M) = h^2 / (4 (1 + h)), h = 2^-m
  (the worst x is 2 (1 + h) / (2 + h) 2^e, in a binade's first step): M = 8: 1/24; M = 16:
  2^-18 / (4 (1 + 2^-9)) ~ 9.5e-7. Below 2^e_min the subnormal grid keeps Q unbiased with
  E[(Q(x) - x)^2] <= (2^(e_min - m))^2 / 4; zero is exact. Above the largest level Q saturates
  (biased): the only clipping left, flagged and counted by the run's health.
* Scalars on a fixed range [-s, s] (``stochastic_round`` with a float scale; ``scalar_format:
  fixed``): 2^M levels evenly spaced, step Delta = 2 s / (2^M - 1), no zero level, absolute error
  E[(Q(x) - x)^2] <= Delta^2 / 4; values beyond [-s, s] saturate (biased, flagged).
* Vectors (``quantize_rows``): each row on its own grid over [-s_i, s_i], s_i = max_j |x_ij| sent
  as a float32 header, so nothing clips; since s_i <= ||x_i||, sigma = d / (2^M - 1)^2 for a
  d-vector (nearly attained when one entry dominates and the others sit mid-step).

The uniforms are float32 (resolution 2^-24), so a rounding probability is exact to 2^-24: a bias
below 2^-24 of one step. M >= 32 means full precision: floats are sent as they are and Q is the
identity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

FULL_PRECISION_BITS = 32  # at or above this, values travel as float32: no quantisation, no header
SCALE_HEADER_BITS = 32  # a per-vector scale travels as one float32 in front of the vector
# [D] Exponent bits of the stochastic float scalar format: 63 binades, 2^-31 to 2^31, so that a
# loss difference of any realistic magnitude keeps its relative precision (fewer at M < 7).
SCALAR_EXPONENT_BITS = 6

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


@dataclass(frozen=True)
class FloatFormat:
    """The stochastic float scalar format of M = ``bits`` bits (module docstring): 1 sign bit,
    ``exponent_bits`` E and ``mantissa_bits`` m."""

    bits: int

    def __post_init__(self):
        if not 2 <= self.bits < FULL_PRECISION_BITS:
            raise ValueError(f"a float scalar format needs 2 to {FULL_PRECISION_BITS - 1} bits "
                             f"(1 sign + at least 1 exponent bit), got {self.bits}")

    @property
    def exponent_bits(self) -> int:
        return min(SCALAR_EXPONENT_BITS, self.bits - 1)

    @property
    def mantissa_bits(self) -> int:
        return self.bits - 1 - self.exponent_bits

    @property
    def min_exponent(self) -> int:
        """e_min = 1 - 2^(E-1): exponent field 1 (field 0 holds zero and the subnormals)."""
        return 1 - 2 ** (self.exponent_bits - 1)

    @property
    def max_exponent(self) -> int:
        """e_max = 2^(E-1) - 1: exponent field 2^E - 1 (no code is kept for inf or NaN)."""
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def smallest_normal(self) -> float:
        """2^e_min [unit of x]: from here up the relative bound sigma holds."""
        return math.ldexp(1.0, self.min_exponent)

    @property
    def largest(self) -> float:
        """(2 - 2^-m) 2^e_max [unit of x]: beyond it values saturate (clip)."""
        return math.ldexp(2.0 - math.ldexp(1.0, -self.mantissa_bits), self.max_exponent)

    @property
    def sigma(self) -> float:
        """sigma(M) = h^2 / (4 (1 + h)), h = 2^-m: sup of E[(Q(x) - x)^2] / x^2 over the normal
        range (seed 002, Assumption IV.5)."""
        h = math.ldexp(1.0, -self.mantissa_bits)
        return h * h / (4 * (1 + h))


def stochastic_float(x: torch.Tensor, bits: int,
                     generator: Noise = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Q(x) in the M = ``bits`` stochastic float format (FloatFormat); returns (values, clipped
    mask: |x| beyond the largest level, saturated to it). ``generator`` as in stochastic_round.

    Computed in numpy on the CPU whatever x's device (the uniforms are drawn there anyway):
    DZOFL quantises a few scalars per round, where numpy's per-call cost is a quarter of
    torch's, and every step is exact in float64 (abs, frexp, ldexp, a division by a power of
    two, floor, copysign), so the values do not depend on the library.
    """
    if bits >= FULL_PRECISION_BITS:
        return x, torch.zeros_like(x, dtype=torch.bool)
    fmt = FloatFormat(bits)
    value = x.detach().cpu().numpy()
    if isinstance(generator, torch.Tensor):  # pre-drawn uniforms, broadcast against x
        uniforms = generator.detach().cpu().numpy()
    else:
        uniforms = torch.rand(x.shape, generator=generator, dtype=torch.float32).numpy()
    # float64: every level of M <= 31 is exact, so is the rounding probability
    magnitude = np.abs(value, dtype=np.float64)
    clipped = magnitude > fmt.largest
    magnitude = np.minimum(magnitude, fmt.largest)
    _, exponent = np.frexp(magnitude)  # magnitude = f 2^exponent, f in [0.5, 1)
    # floor(log2 |x|) = exponent - 1; the subnormals share the lowest binade's step.
    binade = np.maximum(exponent - 1, fmt.min_exponent)
    step = np.ldexp(1.0, binade - fmt.mantissa_bits)
    position = magnitude / step  # exact: a division by a power of two
    low = np.floor(position)
    q = np.copysign((low + (uniforms < position - low)) * step, value)  # float32 u: exact
    return (torch.from_numpy(np.asarray(q, dtype=value.dtype)).to(x.device),
            torch.from_numpy(np.asarray(clipped)).to(x.device))


def _uniforms(generator: Noise, like: torch.Tensor) -> torch.Tensor:
    if isinstance(generator, torch.Tensor):
        return generator.to(like.device, like.dtype).expand_as(like)
    return torch.rand(like.shape, generator=generator, dtype=torch.float32).to(like.device, like.dtype)


def quantize_scalars(values: np.ndarray | torch.Tensor, bits: int, scale: float | None,
                     generator: Noise = None) -> tuple[np.ndarray | torch.Tensor,
                                                       np.ndarray | torch.Tensor]:
    """Uploaded or broadcast scalars: the stochastic float format (``scale`` None, the default
    for DZOFL and ZO-HFL's seed mode) or the fixed range [-scale, scale] known to both ends.

    No header is sent in either format. Returns (values, clipped mask) of the input's kind:
    numpy in, numpy out; torch in, torch out.
    """
    tensor = values if isinstance(values, torch.Tensor) else torch.as_tensor(
        np.asarray(values, np.float64))
    if scale is None:
        q, clipped = stochastic_float(tensor, bits, generator)
    else:
        q, clipped = stochastic_round(tensor, bits, float(scale), generator)
    if isinstance(values, torch.Tensor):
        return q, clipped
    return q.numpy(), clipped.numpy()


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
    # A float64 max can round down to float32; step up one ulp so the row stays inside the grid
    # (towards +inf: ``scales + 1`` would be ``scales`` itself above 2^24).
    up = torch.nextafter(scales, torch.full_like(scales, math.inf))
    scales = torch.where(scales.to(exact.dtype) < exact, up, scales)
    if bits >= FULL_PRECISION_BITS:
        return matrix, scales
    scale = scales.to(matrix.dtype)[:, None]
    if bool((scale > 0).all()):  # no zero row (nor a NaN one): the lean path, same values
        return _round_within(matrix, bits, scale, generator), scales
    q, _ = stochastic_round(matrix, bits, scale, generator)
    return q, scales


def _round_within(x: torch.Tensor, bits: int, scale: torch.Tensor, generator: Noise
                  ) -> torch.Tensor:
    """``stochastic_round``'s values for rows inside their positive scales (|x_ij| <= s_i,
    s_i > 0, quantize_rows' own): its saturation test, clipping and zero-scale select are
    identities there (a NaN passes them unchanged too), so the grid arithmetic alone gives the
    same bits with six fewer passes over [n, d] (every upload and broadcast of a round)."""
    work = x.double()
    intervals = 2**bits - 1
    scale = scale.double()
    step = 2 * scale / intervals
    position = (work + scale) / step  # in [0, intervals], in units of grid steps
    low = position.floor().clamp(0, intervals - 1)
    up = _uniforms(generator, work) < (position - low)  # P(round up) = fractional part
    return ((low + up) * step - scale).to(x.dtype)


def payload_bits_vector(length: int, bits: int, header_bits: int = SCALE_HEADER_BITS) -> int:
    """Size [bit] of one quantised vector: length * bits plus its scale header (none at >= 32 bits).

    Matches ``Payload.vectors`` in wirelessfl.contract.payload.
    """
    return length * bits + (header_bits if bits < FULL_PRECISION_BITS else 0)


def payload_bits_scalar(bits: int) -> int:
    """Size [bit] of one quantised scalar, in either scalar format: no header."""
    return bits
