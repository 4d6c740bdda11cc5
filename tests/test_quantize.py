"""The stochastic quantiser against its definition: unbiased, on the grid, bounded variance."""

import math

import numpy as np
import pytest
import torch

from wirelessfl.algorithms.dzofl import DZOFL
from wirelessfl.algorithms.zo_hfl import ZOHFL
from wirelessfl.learning.quantize import (
    FloatFormat,
    payload_bits_scalar,
    payload_bits_vector,
    quantize_rows,
    quantize_scalars,
    stochastic_float,
    stochastic_round,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def grid(bits: int, scale: float) -> np.ndarray:
    """The 2^bits levels written out independently of the code under test."""
    return np.linspace(-scale, scale, 2**bits)


def test_bits2_grid_by_hand():
    x = torch.linspace(-1, 1, 1001, dtype=torch.float64)
    q, sat = stochastic_round(x, 2, 1.0, gen(0))
    levels = np.array([-1, -1 / 3, 1 / 3, 1])
    assert np.allclose(grid(2, 1.0), levels)
    dist = np.abs(q.numpy()[:, None] - levels[None]).min(1)
    assert dist.max() < 1e-12
    assert not sat.any()
    # Q(x) is one of the two neighbouring levels of x.
    assert (np.abs(q.numpy() - x.numpy()) <= 2 / 3 + 1e-12).all()


@pytest.mark.parametrize("bits", [2, 4, 16])
@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_unbiased_and_variance_bounded(bits, scale):
    n = 100_000
    step = 2 * scale / (2**bits - 1)
    g = gen(bits * 10 + int(scale))
    for frac_of_range in (-0.77, -0.2, 0.05, 0.41, 0.93):
        value = frac_of_range * scale
        q, sat = stochastic_round(torch.full((n,), value, dtype=torch.float64), bits, scale, g)
        q = q.numpy()
        assert not sat.any()
        # Theoretical conditional law: Bernoulli between the two neighbouring levels.
        low = np.floor((value + scale) / step)
        f = (value + scale) / step - low
        se = step * np.sqrt(f * (1 - f) / n)
        assert abs(q.mean() - value) <= 4 * se + 1e-12, (bits, scale, value)
        assert q.var() <= step**2 / 4 * 1.02
        assert np.isclose(q.var(), step**2 * f * (1 - f), rtol=0.05, atol=1e-15)
        # Every output is on the grid.
        levels = grid(bits, scale)
        idx = np.clip(np.round((q + scale) / step).astype(int), 0, 2**bits - 1)
        assert np.allclose(q, levels[idx], atol=1e-9 * scale)


def test_saturation_flagged_and_clipped():
    x = torch.tensor([-3.0, -1.0, 0.5, 1.0, 2.0])
    q, sat = stochastic_round(x, 4, 1.0, gen(1))
    assert sat.tolist() == [True, False, False, False, True]
    assert q[0].item() == pytest.approx(-1.0) and q[4].item() == pytest.approx(1.0)
    assert q[1].item() == pytest.approx(-1.0) and q[3].item() == pytest.approx(1.0)


def test_tensor_scale_broadcasts_per_row():
    x = torch.tensor([[0.5, -2.0], [0.5, -2.0]])
    scale = torch.tensor([[1.0], [4.0]])
    q, sat = stochastic_round(x, 8, scale, gen(2))
    assert sat.tolist() == [[False, True], [False, False]]
    assert q[0, 1].item() == pytest.approx(-1.0)
    assert (q.abs() <= scale + 1e-6).all()


def test_same_seed_same_output_and_predrawn_noise_matches():
    x = torch.randn(500, generator=gen(3))
    a, _ = stochastic_round(x, 4, 3.0, gen(7))
    b, _ = stochastic_round(x, 4, 3.0, gen(7))
    c, _ = stochastic_round(x, 4, 3.0, gen(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    noise = torch.rand(x.shape, generator=gen(7))
    d, _ = stochastic_round(x, 4, 3.0, noise)
    assert torch.equal(a, d)
    assert a.dtype == x.dtype


def test_full_precision_is_identity():
    x = torch.randn(100, generator=gen(4)) * 10
    q, sat = stochastic_round(x, 32, 1.0, gen(0))
    assert torch.equal(q, x) and not sat.any()
    rows, scales = quantize_rows(x.reshape(10, 10), 32, gen(0))
    assert torch.equal(rows, x.reshape(10, 10))
    assert torch.equal(scales, x.reshape(10, 10).abs().amax(1))


def test_quantize_rows_scales_and_zero_rows():
    m = torch.randn(6, 50, generator=gen(5))
    m[2] = 0.0
    m[4] *= 100
    q, scales = quantize_rows(m, 3, gen(6))
    assert scales.dtype == torch.float32
    assert torch.equal(scales, m.abs().amax(1))
    assert torch.equal(q[2], torch.zeros(50))
    for i in (0, 1, 3, 4, 5):
        s = scales[i].item()
        levels = torch.tensor(grid(3, s), dtype=torch.float32)
        assert torch.isclose(q[i][:, None], levels[None], atol=1e-5 * s).any(1).all()
        # The largest-magnitude entry sits exactly on the end of its row's grid.
        j = m[i].abs().argmax()
        assert q[i, j].item() == pytest.approx(m[i, j].item(), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bits", [1, 3, 8, 16])
def test_quantize_rows_are_stochastic_round_on_their_own_scales_bit_for_bit(bits, dtype):
    """quantize_rows' lean path (rows inside positive scales) against the general grid
    (stochastic_round, checked above against the levels written out) with the same scales and
    noise: equal bits, with pre-drawn uniforms and with a generator; a zero, a NaN or an
    infinite row takes the general path."""
    m = (torch.randn(7, 300, generator=gen(bits)) * torch.logspace(-6, 6, 7)[:, None]).to(dtype)
    m[3, 5] = m[3].abs().max() * 1.0000001  # a float64 maximum rounds up to its float32 scale
    zero_row = torch.cat([m, torch.zeros(1, 300, dtype=dtype)])
    nan_row, inf_row = m.clone(), m.clone()
    nan_row[1, 7], inf_row[1, 7] = math.nan, math.inf
    for rows in (m, zero_row, nan_row, inf_row):
        noise = torch.rand(rows.shape, generator=gen(bits + 1))
        for draw in (lambda noise=noise: noise, lambda: gen(4)):
            q, scales = quantize_rows(rows, bits, draw())
            assert (scales.to(dtype) >= rows.abs().amax(1)).all() or rows.isnan().any()
            ref, _ = stochastic_round(rows, bits, scales.to(dtype)[:, None], draw())
            assert torch.equal(q.isnan(), ref.isnan())
            assert torch.equal(torch.nan_to_num(q), torch.nan_to_num(ref))


def torch_stochastic_float(x, bits, noise):
    """The float format's steps in torch (as stochastic_float was written before it moved to
    numpy): the reference its numpy version must equal bit for bit."""
    fmt = FloatFormat(bits)
    work = x.double()
    magnitude = work.abs()
    clipped = magnitude > fmt.largest
    magnitude = magnitude.clamp(max=fmt.largest)
    _, exponent = torch.frexp(magnitude)
    binade = (exponent - 1).clamp(min=fmt.min_exponent)
    step = torch.ldexp(torch.ones_like(magnitude), binade - fmt.mantissa_bits)
    position = magnitude / step
    low = position.floor()
    up = noise.to(torch.float64) < (position - low)
    return torch.copysign((low + up) * step, work).to(x.dtype), clipped


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bits", [2, 3, 8, 16, 31])
def test_stochastic_float_in_numpy_equals_its_torch_steps_bit_for_bit(bits, dtype):
    """Magnitudes from the subnormals past the largest level, zeros of both signs, NaN and
    infinities; pre-drawn uniforms and a generator; a 0-d scalar keeps its shape."""
    magnitudes = torch.logspace(-60, 60, 400, base=2.0, dtype=torch.float64)
    x = torch.cat([magnitudes, -magnitudes, torch.tensor([0.0, -0.0, math.nan, math.inf,
                                                           -math.inf], dtype=torch.float64)])
    x = x.to(dtype)
    noise = torch.rand(x.shape, generator=gen(bits))
    for draw in (noise, gen(7)):
        q, clipped = stochastic_float(x, bits, draw)
        ref, ref_clipped = torch_stochastic_float(
            x, bits, noise if draw is noise else torch.rand(x.shape, generator=gen(7)))
        assert q.dtype == dtype and torch.equal(clipped, ref_clipped)
        assert torch.equal(q.isnan(), ref.isnan())
        assert torch.equal(torch.nan_to_num(q), torch.nan_to_num(ref))
        assert torch.equal(q.signbit(), ref.signbit())
    one, _ = stochastic_float(x[3], bits, noise[3])
    assert one.shape == () and torch.equal(one, stochastic_float(x[3:4], bits, noise[3:4])[0][0])


def test_quantize_rows_unbiased():
    m = torch.tensor([[0.3, -0.1, 1.0], [2.0, -4.0, 0.7]], dtype=torch.float64)
    reps = 40_000
    big = m.repeat(reps, 1)
    q, _ = quantize_rows(big, 2, gen(9))
    mean = q.reshape(reps, 2, 3).mean(0)
    step = 2 * m.abs().amax(1, keepdim=True) / 3
    assert (mean - m).abs().max() <= 4 * step.max() / 2 / reps**0.5


def test_quantize_scalars_keeps_array_kind():
    values = np.array([0.1, -0.4, 3.0])
    q, sat = quantize_scalars(values, 4, 1.0, gen(10))
    assert isinstance(q, np.ndarray) and isinstance(sat, np.ndarray)
    assert sat.tolist() == [False, False, True] and q[2] == pytest.approx(1.0)
    qt, satt = quantize_scalars(torch.from_numpy(values), 4, 1.0, gen(10))
    assert isinstance(qt, torch.Tensor) and np.allclose(qt.numpy(), q)
    assert satt.tolist() == sat.tolist()


def test_payload_sizes():
    assert payload_bits_vector(45_362, 16) == 45_362 * 16 + 32
    assert payload_bits_vector(10, 8, header_bits=0) == 80
    assert payload_bits_vector(10, 32) == 320  # full precision: no scale header
    assert payload_bits_scalar(16) == 16


def test_invalid_bits():
    with pytest.raises(ValueError):
        stochastic_round(torch.zeros(3), 0, 1.0, gen(0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_and_cuda_agree():
    x = torch.randn(1000, generator=gen(11))
    a, _ = stochastic_round(x, 6, 2.0, gen(12))
    b, _ = stochastic_round(x.cuda(), 6, 2.0, gen(12))
    assert torch.allclose(a, b.cpu(), atol=1e-6)


# --- The stochastic float scalar format (seed 002, Assumption IV.5) -------------------------------
# Statistical checks use 5 standard errors: a two-sided normal tail of 5.7e-7 per check, so the
# few hundred checks below fail by chance with probability below 2e-4 (Bonferroni) [D].
Z = 5.0


def float_levels(bits: int) -> np.ndarray:
    """Every non-negative value of the M-bit float format, decoded from its bit fields (1 sign,
    E = min(6, M - 1) exponent, m = M - 1 - E mantissa bits; exponent field 0: zero and the
    subnormals k 2^(1 - bias - m); field f > 0: (1 + k 2^-m) 2^(f - bias), bias = 2^(E-1)),
    written independently of the code under test. Sorted; 2^(M-1) codes."""
    e_bits = min(6, bits - 1)
    m_bits = bits - 1 - e_bits
    bias = 2 ** (e_bits - 1)
    values = []
    for field in range(2**e_bits):
        for k in range(2**m_bits):
            if field == 0:
                values.append(k * 2.0 ** (1 - bias - m_bits))
            else:
                values.append((1 + k * 2.0**-m_bits) * 2.0 ** (field - bias))
    return np.array(values)


def float_sigma(bits: int) -> float:
    """sigma(M) = h^2 / (4 (1 + h)), h = 2^-m: the docstring's closed form."""
    h = 2.0 ** -(bits - 1 - min(6, bits - 1))
    return h * h / (4 * (1 + h))


def neighbours(levels: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) levels around |x| (equal when |x| is a level); |x| inside the table."""
    a = np.abs(x)
    j = np.searchsorted(levels, a, side="right") - 1
    lo = levels[j]
    hi = np.where(lo == a, lo, levels[np.minimum(j + 1, len(levels) - 1)])
    return lo, hi


def wide_inputs(seed: int) -> np.ndarray:
    """1e-9, 1e9 and 36 magnitudes log-uniform between them, both signs, and zero."""
    rng = np.random.default_rng(seed)
    mags = 10.0 ** np.concatenate([[-9.0, 9.0], rng.uniform(-9, 9, 36)])
    return np.concatenate([mags, -mags, [0.0]])


def test_float_format_has_2_to_the_m_codes_and_its_closed_form_range():
    for bits in (2, 5, 8, 12, 16):
        levels = float_levels(bits)
        assert len(np.unique(levels)) == len(levels) == 2 ** (bits - 1)  # sign + the rest: M bits
        fmt = FloatFormat(bits)
        assert fmt.exponent_bits + fmt.mantissa_bits + 1 == bits
        assert fmt.largest == levels.max() and levels[0] == 0
        assert fmt.smallest_normal == levels[2**fmt.mantissa_bits]  # field 1, mantissa 0
        assert fmt.sigma == float_sigma(bits)
    assert (FloatFormat(8).exponent_bits, FloatFormat(8).mantissa_bits) == (6, 1)
    assert (FloatFormat(16).exponent_bits, FloatFormat(16).mantissa_bits) == (6, 9)
    assert FloatFormat(16).smallest_normal == 2.0**-31 and FloatFormat(16).largest == (
        2 - 2**-9) * 2.0**31
    with pytest.raises(ValueError, match="needs 2 to 31 bits"):
        FloatFormat(1)


@pytest.mark.parametrize("bits", [5, 8, 12, 16])
def test_sigma_is_the_sup_of_the_exact_relative_variance(bits):
    """Over a dense sweep of two binades (and at the closed-form worst point), the exact
    conditional variance (lo, hi from the decoded table) never exceeds sigma x^2 and reaches it."""
    levels, sigma = float_levels(bits), float_sigma(bits)
    h = 2.0 ** -(bits - 1 - min(6, bits - 1))
    half = 2 ** (min(6, bits - 1) - 1)
    for e in (1 - half, 0, half - 2):  # the lowest two binades, two in the middle, the top two
        x = 2.0**e * np.concatenate([np.linspace(1, 4, 200_001)[:-1],
                                     [2 * (1 + h) / (2 + h)]])
        lo, hi = neighbours(levels, x)
        ratio = (x - lo) * (hi - x) / x**2
        assert ratio.max() <= sigma * (1 + 1e-12)
        assert ratio[-1] == pytest.approx(sigma, rel=1e-9)


@pytest.mark.parametrize("bits", [5, 8, 12, 16])
def test_float_scalars_unbiased_with_relative_variance_below_sigma_from_1e_minus_9_to_1e9(bits):
    n = 20_000
    x = wide_inputs(bits)
    levels, sigma = float_levels(bits), float_sigma(bits)
    fmt = FloatFormat(bits)
    inside = (np.abs(x) >= fmt.smallest_normal) & (np.abs(x) <= fmt.largest)
    x = x[inside | (x == 0)]
    assert (np.abs(x) > 0).sum() == 76 or bits == 5  # M >= 7: every input in range
    q, clipped = stochastic_float(torch.tensor(x).repeat(n, 1), bits, gen(bits))
    q = q.numpy()
    assert not clipped.any()
    lo, hi = neighbours(levels, x)
    # Every output is one of the two neighbouring levels of x, with x's sign; zero stays zero.
    assert ((np.abs(q) == lo) | (np.abs(q) == hi)).all()
    assert ((np.sign(q) == np.sign(x)) | (q == 0)).all()
    assert (q[:, x == 0] == 0).all()
    var = (np.abs(x) - lo) * (hi - np.abs(x))  # Bernoulli between lo and hi
    assert (var <= sigma * x**2 * (1 + 1e-12)).all()
    se = np.sqrt(var / n)
    assert (np.abs(q.mean(0) - x) <= Z * se + 1e-15 * np.abs(x)).all()
    # The sample variance of a two-point law: Var(s^2) ~ (mu4 - var^2) / n, mu4 = var (hi-lo)^2
    # - 3 var^2 for a Bernoulli scaled by (hi - lo).
    mu4 = var * (hi - lo) ** 2 - 3 * var**2
    se_var = np.sqrt(np.maximum(mu4 - var**2, 0) / n)
    assert (np.abs(q.var(0) - var) <= Z * se_var + 1e-12 * var + 1e-300).all()
    assert (q.var(0) <= sigma * x**2 + Z * se_var).all()


def test_float_scalars_at_the_format_s_range_ends_and_below_it():
    fmt = FloatFormat(8)
    top, bottom = fmt.largest, fmt.smallest_normal
    x = torch.tensor([0.0, bottom, top, -top, np.nextafter(top, np.inf), -1e12, 1e300, 1e-12],
                     dtype=torch.float64)
    q, clipped = stochastic_float(x, 8, gen(1))
    assert clipped.tolist() == [False, False, False, False, True, True, True, False]
    assert q[:4].tolist() == [0.0, bottom, top, -top]  # levels are exact
    assert q[4:7].tolist() == [top, -top, top]  # saturated to the largest level
    # Below the smallest normal the subnormal grid (step 2^(-31 - m)) keeps Q unbiased.
    step = 2.0 ** (-31 - fmt.mantissa_bits)
    n = 200_000
    tiny = torch.full((n,), 1e-12, dtype=torch.float64)
    qt, ct = stochastic_float(tiny, 8, gen(2))
    assert not ct.any() and set(qt.unique().tolist()) <= {0.0, step}
    f = 1e-12 / step
    assert abs(qt.mean().item() - 1e-12) <= Z * step * np.sqrt(f * (1 - f) / n)


def test_float_format_is_identity_at_32_bits_and_keeps_the_dtype():
    x = torch.randn(50, generator=gen(3)) * 1e20
    q, clipped = stochastic_float(x, 32, gen(0))
    assert torch.equal(q, x) and not clipped.any()
    x32 = torch.tensor([0.7, -3e-5, 0.0], dtype=torch.float32)
    q32, _ = stochastic_float(x32, 16, gen(4))
    assert q32.dtype == torch.float32
    levels = float_levels(16)
    assert np.isin(np.abs(q32.numpy().astype(np.float64)), levels).all()
    a, _ = quantize_scalars(x32.numpy(), 16, None, gen(4))
    assert np.array_equal(a, q32.numpy())  # numpy in, numpy out, same draws


def test_scalar_payload_bits_by_hand():
    """Both scalar formats fit in M bits: no header on the air."""
    for bits in (8, 16):
        assert payload_bits_scalar(bits) == bits
        up, down = DZOFL.declared_payloads(650, bits)
        assert (up.bits, down.bits) == (bits, bits)
        zo_up, _ = ZOHFL.declared_payloads(650, bits, participants=3, payload="seed")
        assert zo_up.bits == bits


# --- Vector payloads: sigma = d / (2^M - 1)^2 ----------------------------------------------------

def row_neighbours(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) levels of each entry on its row's grid linspace(-s, s, 2^M), s = max |x|,
    in numpy; s is the float32 header rounded up, as it travels."""
    exact = np.abs(x).max(axis=1, keepdims=True)
    s = exact.astype(np.float32)
    s = np.where(s < exact, np.nextafter(s, np.float32(np.inf)), s).astype(np.float64)
    step = 2 * s / (2**bits - 1)
    j = np.clip(np.floor((x + s) / step), 0, 2**bits - 2)
    return j * step - s, (j + 1) * step - s


@pytest.mark.parametrize("d,bits", [(1, 2), (3, 2), (50, 4), (400, 8), (1000, 3)])
def test_vectors_unbiased_with_relative_variance_below_d_over_levels_squared(d, bits):
    reps = max(2000, 400_000 // d)
    rng = np.random.default_rng(d + bits)
    rows = np.stack([rng.standard_normal(d) * 1e-9, rng.standard_normal(d) * 1e9,
                     np.eye(1, d)[0] * -3.0,  # one-hot: the bound's nearly attained case
                     np.where(rng.uniform(size=d) < 0.5, 0.0, rng.standard_normal(d))])
    rows = rows[np.abs(rows).max(1) > 0]
    n = len(rows)
    q, _ = quantize_rows(torch.tensor(rows).repeat(reps, 1), bits, gen(d * bits))
    q = q.numpy().reshape(reps, n, d)
    lo, hi = row_neighbours(rows, bits)
    assert ((np.isclose(q, lo, rtol=1e-12, atol=0)) | np.isclose(q, hi, rtol=1e-12, atol=0)).all()
    assert (lo <= rows).all() and (rows <= hi).all()  # the float32 header keeps rows inside
    var = (rows - lo) * (hi - rows)  # per entry
    se = np.sqrt(var / reps)
    assert (np.abs(q.mean(0) - rows) <= Z * se + 1e-12 * np.abs(rows).max(1, keepdims=True)).all()
    bound = d / (2**bits - 1) ** 2 * (rows**2).sum(1)
    exact = var.sum(1)
    assert (exact <= bound * (1 + 1e-6)).all()
    err = ((q - rows) ** 2).sum(2)  # [reps, n]: ||Q(x) - x||^2
    # Entries round independently: Var ||Q(x) - x||^2 = sum_i p_i (1 - p_i) (e_hi^2 - e_lo^2)^2.
    p_up = (rows - lo) / (hi - lo)
    var_err = (p_up * (1 - p_up) * ((hi - rows) ** 2 - (rows - lo) ** 2) ** 2).sum(1)
    assert (np.abs(err.mean(0) - exact) <= Z * np.sqrt(var_err / reps) + 1e-12 * exact).all()
    # The one-hot row: E||Q(x) - x||^2 = (d - 1) s^2 / (2^M - 1)^2, by hand (zeros sit mid-step).
    assert exact[2] == pytest.approx((d - 1) * 9.0 / (2**bits - 1) ** 2, rel=1e-12)


def test_a_row_header_above_2_to_the_24_is_rounded_up_not_down():
    """float32(3e9 + 1) rounds down to 3e9 (float32's step there is 256); the header must round
    up instead, or the row's largest entry would lie outside its grid and clip (a regression:
    the old step towards ``scales + 1`` stayed put above 2^24)."""
    row = torch.tensor([[3e9 + 1.0, -5.0]], dtype=torch.float64)
    assert float(torch.tensor(3e9 + 1.0).float()) < 3e9 + 1.0
    q, scales = quantize_rows(row, 8, gen(5))
    assert scales.item() >= 3e9 + 1.0 and scales.item() == np.nextafter(
        np.float32(3e9 + 1.0), np.float32(np.inf))
    assert q.abs().max().item() <= scales.item()
