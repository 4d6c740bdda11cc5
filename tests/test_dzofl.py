"""DZOFL against independent truths: autograd directional derivatives, seed 002's expectation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import small_scenario
from wirelessfl.algorithms.dzofl import DZOFL, aggregate_delivered
from wirelessfl.cli import main
from wirelessfl.engine.context import RunContext
from wirelessfl.engine.network import VectorNetwork
from wirelessfl.learning.quantize import quantize_scalars
from wirelessfl.learning.seeds import keyed_generator
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.results.health import assess
from wirelessfl.scenario.loader import load_scenario


def _rademacher(d, t):
    g = keyed_generator(99, "test-phi", t)
    return (torch.randint(0, 2, (d,), generator=g).float() * 2 - 1) / math.sqrt(d)


@pytest.fixture(scope="module")
def world():
    return build_world(small_scenario())


def test_loss_difference_is_twice_gamma_times_directional_derivative(world):
    ev, flat = world.evaluator, world.flat
    theta = flat.initial()
    idx = ev.sample(keyed_generator(0, "batch", 0), 10)[0]
    # gamma large enough that float32 rounding of the losses (~1e-7 relative) is negligible in the
    # difference, small enough that the central difference's O(gamma^3) term is too.
    phi, gamma = _rademacher(flat.d, 0), 1e-2
    delta = ev.device_losses(theta + gamma * phi, idx) - ev.device_losses(theta - gamma * phi, idx)
    for i in range(world.num_devices):
        th = theta.clone().requires_grad_(True)
        loss = flat.loss(th, ev.data.x[idx[i]], ev.data.y[idx[i]])
        (g,) = torch.autograd.grad(loss, th)
        assert float(delta[i]) == pytest.approx(2 * gamma * float(g @ phi), rel=2e-3, abs=1e-7)


def test_aggregate_reads_only_delivered_packets():
    q = torch.tensor([0.5, float("nan"), -0.25, float("inf"), 1.0])
    delivered = torch.tensor([True, False, True, False, True])
    # (N / |S|) * sum over S = 5/3 * 1.25, by hand
    assert float(aggregate_delivered(q[delivered], 5)) == pytest.approx(5 / 3 * 1.25)
    assert aggregate_delivered(q[torch.zeros(5, dtype=torch.bool)], 5) is None


def test_estimator_mean_matches_seed_expectation(world):
    """E[Phi Q(Delta f_k)] = (2 gamma / d) grad F + O(gamma^2), F = sum_i f_i (seed 002, Lemma 1),
    under random packet loss and stochastic quantisation. Checked along grad F, by Monte Carlo."""
    ev, flat, n = world.evaluator, world.flat, world.num_devices
    theta = flat.initial()
    idx = ev.sample(keyed_generator(0, "batch", 1), 10)[0]
    th = theta.clone().requires_grad_(True)
    total = sum(flat.loss(th, ev.data.x[idx[i]], ev.data.y[idx[i]]) for i in range(n))
    (grad_f,) = torch.autograd.grad(total, th)
    gamma, trials = 1e-2, 3000
    rng = np.random.default_rng(5)
    samples = []
    for t in range(trials):
        phi = _rademacher(flat.d, t)
        delta = (ev.device_losses(theta + gamma * phi, idx)
                 - ev.device_losses(theta - gamma * phi, idx))
        q, _ = quantize_scalars(delta, 8, 1.0, keyed_generator(1, "q", t))
        delivered = torch.as_tensor(rng.random(n) < 0.6)
        agg = aggregate_delivered(q[delivered], n)
        if agg is None:
            continue
        samples.append(float((phi * agg) @ grad_f))
    samples = np.array(samples)
    expected = 2 * gamma / flat.d * float(grad_f @ grad_f)
    se = samples.std(ddof=1) / math.sqrt(len(samples))
    assert abs(samples.mean() - expected) < 4 * se
    assert se < 0.2 * expected  # the test has the power to see a wrong scaling


def test_iteration_with_no_delivery_leaves_model_unchanged(monkeypatch):
    sc = small_scenario(["channel=seed002-pinned", "channel.uplink.delivery_probability=0.3",
                         "population.num_devices=2", "algorithms.0.rounds=40",
                         "algorithms.0.eval_every=1"])
    world = build_world(sc)
    thetas, received = [], []
    original_end, original_collect = RunContext.end_round, VectorNetwork.collect

    def end_round(self, completed, theta, *objective):
        thetas.append(theta.clone())
        return original_end(self, completed, theta, *objective)

    def collect(self, cost, payload, active=None):
        result = yield from original_collect(self, cost, payload, active)
        received.append(int(result.delivered.sum()))
        return result

    monkeypatch.setattr(RunContext, "end_round", end_round)
    monkeypatch.setattr(VectorNetwork, "collect", collect)
    run_algorithm(world, sc.algorithms[0])
    assert 0 in received and max(received) > 0
    for k, count in enumerate(received):
        same = torch.equal(thetas[k], thetas[k + 1])
        assert same == (count == 0), (k, count)


def test_perturbation_is_regenerated_not_stored(world):
    sc = small_scenario()
    ctx = type("Ctx", (), {"theta0": world.flat.initial(), "seed": sc.seed,
                           "num_devices": world.num_devices})()
    alg = DZOFL(sc.algorithms[0], ctx)
    a, b, c = alg.perturbation(5), alg.perturbation(5), alg.perturbation(6)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert set(torch.unique(a * math.sqrt(world.flat.d)).tolist()) == {-1.0, 1.0}
    assert float(a @ a) == pytest.approx(1.0)  # alpha_3 = 1: ||Phi|| = 1


def _quickstart_dzofl(*overrides):
    sc = load_scenario("quickstart", ["algorithms.DZOFL.rounds=1500",
                                      "algorithms.DZOFL.eval_every=1500", *overrides])
    assert sc.algorithms[0].name == "dzofl" and sc.target_accuracy == 0.9
    run = run_algorithm(build_world(sc), sc.algorithms[0])
    return pd.DataFrame(run.rows).iloc[-1], run, sc


@pytest.mark.slow  # 2 x 1,500 quickstart iterations (the 8-bit float format: test_quantize.py)
def test_quickstart_at_8_bits_learns_like_the_unquantised_method():
    """The README's ``--set quantization_bits=8``: with the stochastic float scalars (1 sign, 6
    exponent, 1 mantissa bit; sigma = 1/24) DZOFL's first 1,500 quickstart iterations reach the
    accuracy of the same iterations sent unquantised (M = 32, the same seeds) to within 0.03
    [D], and at least 0.8 [D] (the 0.9 target needs more iterations: docs/algorithms.md), with
    nothing clipped. (On the old fixed range [-1, 1], ``scalar_format: fixed``, the 8-bit step
    dwarfs the uploaded differences: issue 18.)"""
    last8, run8, sc = _quickstart_dzofl("quantization_bits=8")
    last32, _, _ = _quickstart_dzofl("quantization_bits=32")
    assert run8.status == "complete"
    assert last8.test_accuracy >= 0.8
    assert abs(last8.test_accuracy - last32.test_accuracy) <= 0.03
    assert last8.quantized_up > 0 and last8.clipped_up == last8.clipped_down == 0
    verdict = assess(pd.DataFrame(run8.rows), run8.status, sc.health,
                     type(sc.algorithms[0]).model_fields)
    assert verdict["healthy"], verdict["health"]


@pytest.mark.parametrize("overrides,needle", [
    (["algorithms.DZOFL.scalar_range=4"], "scalar_range is the range of scalar_format: fixed"),
    (["quantization_bits=1"], "the float scalar format needs M >= 2"),
    (["algorithms.DZOFL.scalar_format=posit"], "scalar_format"),
])
def test_scalar_format_mistakes_are_one_error_line(overrides, needle, capsys):
    args = [a for o in overrides for a in ("--set", o)]
    assert main(["validate", "quickstart", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
    assert "algorithms" in err[0]


def test_the_fixed_format_keeps_its_range_and_one_bit_scalars():
    def params(*overrides):
        return load_scenario("quickstart", list(overrides)).algorithms[0]

    assert params().scalar_format == "float" and params().fixed_range() is None
    assert params("algorithms.DZOFL.scalar_format=fixed").fixed_range() == 1.0
    fixed = params("algorithms.DZOFL.scalar_format=fixed", "algorithms.DZOFL.scalar_range=4",
                   "quantization_bits=1")
    assert (fixed.fixed_range(), fixed.bits) == (4.0, 1)
