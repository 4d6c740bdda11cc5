"""DRFA (Deng, Kamani and Mahdavi, NeurIPS 2020, Alg. 1; a seed-003 baseline, fgdro.md Sec. 3)
against independent truths: a literal per-client NumPy transcription of the round (our reading of
Alg. 1, docs/algorithms.md) with lost uploads, sharing with the algorithm only the keyed random
draws; the simplex projection against a brute force over the simplex's faces and scipy; the
min-max's saddle point found by scipy (the weight lambda goes to the clients whose loss is the
worst); the payloads in the ledger against the declaration, per device and phase."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import minimize

from tests.conftest import run_recording_thetas, small_quadratic, small_scenario
from wirelessfl.algorithms.drfa import DRFA, LOSS_BITS, draw_from, project_simplex
from wirelessfl.contract.payload import Payload
from wirelessfl.learning.seeds import keyed_rng
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.testing import check_declared_payloads

N = 5  # the quadratic's clients


def _losses(a, c, x):
    return 0.5 * np.einsum("j,njk,k->n", x, a, x) - c @ x


def _record(monkeypatch) -> tuple[list, list]:
    """Patch DRFA to record each exchange (round, payload label, devices asked, devices whose
    upload arrived) and lambda after every round."""
    exchanges, lambdas = [], []
    ask, round_ = DRFA.ask, DRFA.round

    def recording_ask(self, cost, payload, devices):
        result = yield from ask(self, cost, payload, devices)
        exchanges.append((self.round_index, payload.label, np.array(devices),
                          np.array(result.delivered_devices)))
        return result

    def recording_round(self, k):
        yield from round_(self, k)
        lambdas.append(self.lam.copy())

    monkeypatch.setattr(DRFA, "ask", recording_ask)
    monkeypatch.setattr(DRFA, "round", recording_round)
    return exchanges, lambdas


def _bisection_projection(v: np.ndarray) -> np.ndarray:
    """Proj_simplex(v) = max(v - theta, 0) with sum = 1, theta by bisection (not by sorting)."""
    lo, hi = v.min() - 1.0, v.max()
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.maximum(v - mid, 0.0).sum() > 1.0:
            lo = mid
        else:
            hi = mid
    return np.maximum(v - 0.5 * (lo + hi), 0.0)


def _reference(p: dict, a, c, seed: int, rounds: int, exchanges: list):
    """Alg. 1 as docs/algorithms.md reads it, client by client in float64: the server's w-bar
    after every round and lambda after every round. From the run it takes only which uploads
    arrived (``exchanges``); the draws (t', D, U) come from the same keyed streams."""
    n, d = c.shape
    tau, lr, gamma = p["local_steps"], p["lr"], p["lr_lambda"]
    m = max(1, round(p["participation"] * n))
    lam, w_bar = np.full(n, 1.0 / n), np.zeros(d)
    thetas, lambdas, repeats = [w_bar.copy()], [], 0
    for k in range(rounds):
        t_prime = int(keyed_rng(seed, "drfa-t-prime", k).integers(1, tau + 1))
        cum = np.cumsum(lam)
        draws = [next(i for i in range(n) if cum[i] > u * cum[-1])
                 for u in keyed_rng(seed, "drfa-clients", k).random(m)]
        repeats += len(draws) - len(set(draws))
        ours = [e for e in exchanges if e[0] == k]
        assert ours[0][2].tolist() == sorted(set(draws))  # the run asked D, once each
        arrived = set(ours[0][3].tolist())
        if not arrived:
            assert len(ours) == 1  # no loss phase: w-bar and lambda stay
            thetas.append(w_bar.copy())
            lambdas.append(lam.copy())
            continue
        final, at_t = {}, {}
        for i in sorted(set(draws)):
            w = w_bar.copy()
            for t in range(1, tau + 1):
                w = w - lr * (a[i] @ w - c[i])
                if t == t_prime:
                    at_t[i] = w.copy()
            final[i] = w
        weight = sum(draws.count(i) for i in arrived)
        w_new = w_bar + sum(draws.count(i) * (final[i] - w_bar) for i in arrived) / weight
        w_t = w_bar + sum(draws.count(i) * (at_t[i] - w_bar) for i in arrived) / weight
        u_set = sorted(keyed_rng(seed, "drfa-loss-clients", k).choice(n, m, replace=False))
        assert ours[1][2].tolist() == u_set  # the run asked U (a lossless downlink)
        v = np.zeros(n)
        for i in ours[1][3].tolist():
            v[i] = n / m * (0.5 * w_t @ a[i] @ w_t - c[i] @ w_t)
        lam = _bisection_projection(lam + tau * gamma * v)
        w_bar = w_new
        thetas.append(w_bar.copy())
        lambdas.append(lam.copy())
    return thetas, lambdas, repeats


@pytest.mark.parametrize("participation", [1.0, 0.6])
def test_matches_the_round_client_by_client_with_lost_uploads(monkeypatch, participation):
    p = {"local_steps": 3, "lr": 0.1, "lr_lambda": 0.1, "participation": participation}
    rounds = 10
    exchanges, lambdas = _record(monkeypatch)
    sc = small_quadratic({"name": "drfa", "rounds": rounds, **p}, delivery=0.6)
    world, thetas, _ = run_recording_thetas(monkeypatch, sc)
    models = [e for e in exchanges if e[1].startswith("drfa models")]
    losses = [e for e in exchanges if e[1].startswith("drfa loss")]
    for phase in (models, losses):  # in each phase some uploads were lost, some arrived
        assert sum(len(e[2]) - len(e[3]) for e in phase) > 0
        assert sum(len(e[3]) for e in phase) > 0
    assert len(models) == rounds and len(losses) < rounds  # a round where no model arrived
    prob = world.evaluator
    want_thetas, want_lambdas, repeats = _reference(p, prob.a_np, prob.c_np, sc.seed, rounds,
                                                    exchanges)
    assert repeats > 0  # some client was drawn twice in a round: the weights matter
    assert len(thetas) == rounds + 1
    for got, want in zip(thetas, want_thetas, strict=True):
        np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(want_lambdas[-1], 1 / N)  # lambda moved
    for got, want in zip(lambdas, want_lambdas, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
        assert got.min() >= 0 and got.sum() == pytest.approx(1.0, abs=1e-12)


# ---- the simplex projection ------------------------------------------------------------------
def _brute_force_projection(v: np.ndarray) -> np.ndarray:
    """The nearest point of the simplex to v over every face: on the face with support S the
    nearest point of its affine hull is v_S - (sum v_S - 1) / |S|; the best feasible one."""
    n, best, best_distance = len(v), None, np.inf
    for size in range(1, n + 1):
        for support in itertools.combinations(range(n), size):
            s = list(support)
            x = np.zeros(n)
            x[s] = v[s] - (v[s].sum() - 1.0) / size
            if x.min() >= -1e-12 and np.sum((x - v) ** 2) < best_distance:
                best, best_distance = x, np.sum((x - v) ** 2)
    return best


def test_simplex_projection_against_a_brute_force_and_scipy():
    rng = np.random.default_rng(0)
    cases = [rng.normal(size=n) * scale for n in (1, 2, 3, 5, 7) for scale in (0.1, 1.0, 10.0)]
    cases += [np.array([0.2, 0.3, 0.5]),  # already on the simplex: unchanged
              np.array([5.0, 0.0, 0.0, 0.0]),  # far beyond a vertex
              np.array([1.0, 1.0, 1.0, 1.0]),  # ties
              np.array([-3.0, -3.0, -2.0])]
    for v in cases:
        np.testing.assert_allclose(project_simplex(v), _brute_force_projection(v), atol=1e-12)
    np.testing.assert_allclose(project_simplex(np.array([0.2, 0.3, 0.5])), [0.2, 0.3, 0.5],
                               atol=1e-15)
    for _ in range(5):  # larger N: scipy's SLSQP on min ||x - v||^2, sum x = 1, x >= 0
        v = rng.normal(size=20) * 2.0
        found = minimize(lambda x, v=v: np.sum((x - v) ** 2), np.full(20, 0.05),
                         jac=lambda x, v=v: 2 * (x - v), method="SLSQP", bounds=[(0, None)] * 20,
                         constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0}],
                         options={"ftol": 1e-12, "maxiter": 500})
        assert found.success
        np.testing.assert_allclose(project_simplex(v), found.x, atol=1e-7)


def test_clients_are_drawn_from_lambda():
    """Inverse-CDF draws: frequencies match lambda; a weight of 0 is never drawn."""
    lam = np.array([0.5, 0.0, 0.3, 0.2, 0.0])
    picks = draw_from(lam, np.random.default_rng(1).random(200_000))
    freq = np.bincount(picks, minlength=5) / len(picks)
    np.testing.assert_allclose(freq, lam, atol=0.005)
    assert freq[1] == 0 and freq[4] == 0


# ---- the min-max ---------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_lambda_moves_to_the_worst_clients_and_the_model_to_the_saddle_point(monkeypatch, seed):
    """min_w max_i f_i(w), found by scipy (SLSQP on the epigraph min t, t >= f_i(w)): DRFA's
    lambda puts its weight on the clients whose loss is the largest there (a client whose
    loss stays clearly below keeps almost none), the client that averaging leaves worst off
    gains weight, and the mean of the second half's models has a worst-case loss near the
    min-max value, far below that of the average loss's minimiser."""
    rounds = 300
    _, lambdas = _record(monkeypatch)
    sc = small_quadratic({"name": "drfa", "rounds": rounds, "local_steps": 2, "lr": 0.05,
                     "lr_lambda": 0.01}, seed=seed)
    world, thetas, _ = run_recording_thetas(monkeypatch, sc)
    a, c = world.evaluator.a_np, world.evaluator.c_np
    d = c.shape[1]
    erm = np.linalg.solve(a.mean(0), c.mean(0))
    start = np.concatenate([erm, [_losses(a, c, erm).max()]])
    saddle = minimize(lambda z: z[d], start, method="SLSQP",
                      constraints=[{"type": "ineq", "fun": lambda z: z[d] - _losses(a, c, z[:d])}],
                      options={"ftol": 1e-12, "maxiter": 1000})
    assert saddle.success
    at_saddle, worst = _losses(a, c, saddle.x[:d]), saddle.fun
    below = np.flatnonzero(at_saddle < worst - 0.1)
    assert len(below)  # a client left out of the worst case
    weight = np.mean(lambdas[rounds // 2:], axis=0)
    assert weight[below].max() < 0.05
    assert weight[np.argmax(_losses(a, c, erm))] > 1.0 / N
    path = np.array([t.double().numpy() for t in thetas])
    average = path[rounds // 2:].mean(0)
    erm_worst = _losses(a, c, erm).max()
    assert _losses(a, c, average).max() - worst < 0.1 * (erm_worst - worst)


# ---- payloads and costs --------------------------------------------------------------------------
@pytest.mark.parametrize(("bits", "participation"), [(32, 1.0), (16, 1.0), (16, 0.5)])
def test_payload_bits_in_the_ledger_equal_the_declaration(monkeypatch, bits, participation):
    """Per device: the models (2 d-vectors) of each round it was in D, the loss (a float64) of
    each round it was in U up; the broadcast (d values + the 32-bit t') every round and w_t'
    (d values) each round it was in U down; tau forward and backward passes in D, one forward
    in U. At 32 bits: 8d + 8 bytes up, fgdro.md Sec. 3's baseline table (2 vec + 1 sc)."""
    exchanges, _ = _record(monkeypatch)
    rounds, tau = 3, 2
    sc = small_scenario(["channel=seed002-pinned", "channel.uplink.delivery_probability=1.0",
                         f"quantization_bits={bits}"],
                        algorithms=[{"name": "drfa", "rounds": rounds, "eval_every": 1,
                                     "local_steps": tau, "batch_size": 8,
                                     "participation": participation}])
    world = build_world(sc)
    run = run_algorithm(world, sc.algorithms[0])
    d, n = world.evaluator.d, world.num_devices
    in_d, in_u = np.zeros(n), np.zeros(n)
    for _, label, asked, arrived in exchanges:
        np.testing.assert_array_equal(asked, arrived)  # lossless
        (in_d if label.startswith("drfa models") else in_u)[asked] += 1
    m = max(1, round(participation * n))
    assert in_u.sum() == m * rounds
    if participation == 1:  # D: n draws with replacement, fewer distinct devices
        assert 0 < in_d.sum() < n * rounds
    scale = 32 if bits < 32 else 0
    vector = bits * d + scale
    led = run.ledger
    np.testing.assert_array_equal(led.bits_up, in_d * 2 * vector + in_u * LOSS_BITS)
    np.testing.assert_array_equal(led.bits_down, rounds * (vector + 32) + in_u * vector)
    np.testing.assert_array_equal(led.packets_delivered, in_d + in_u)
    np.testing.assert_array_equal(led.backward_passes, in_d * tau)
    assert led.exchanges == 2 * rounds
    up, down = DRFA.declared_payloads(d, bits)
    assert up.bits == 2 * vector + LOSS_BITS and down.bits == 2 * vector + 32
    if bits == 32:
        assert up.bits / 8 == 8 * d + 8
    # the forward passes: tau per round in D and one per round in U, at the same price each
    passes = in_d * tau + in_u
    per_pass = led.energy_j[passes > 0, 0] / passes[passes > 0]
    np.testing.assert_allclose(per_pass, per_pass[0], rtol=1e-12)
    assert (led.energy_j[passes == 0, 0] == 0).all()


class _ShortLossDRFA(DRFA):
    """DRFA sending its loss as a float32 while declaring a float64."""

    name = "drfa-short-loss"

    def ask(self, cost, payload, devices):
        if payload.label.startswith("drfa loss"):
            payload = Payload.scalar(32, label=payload.label)
        return (yield from super().ask(cost, payload, devices))


def test_the_sampled_payload_check_catches_a_payload_that_is_not_the_declared_one():
    check_declared_payloads(DRFA, {"local_steps": 2, "batch_size": 8})
    with pytest.raises(AssertionError, match="no whole number of the declared phases"):
        check_declared_payloads(_ShortLossDRFA, {"local_steps": 2, "batch_size": 8})
