"""The stochastic quantiser against its definition: unbiased, on the grid, bounded variance."""

import numpy as np
import pytest
import torch

from wirelessfl.learning.quantize import (
    payload_bits_scalar,
    payload_bits_vector,
    quantize_rows,
    quantize_scalars,
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
