"""Drift-corrected FL (fedred.md): GD, DANE, DANE+, FedRed(-GD / exact), Scaffold-cv, Scaffnew.

Truths used: the optimum of the quadratic by a linear solve in the test, numpy re-implementations
of the spec's pseudocode (Alg. 1, Alg. 3, ProxSkip) run on the same coin sequence, the geometric
law of the shared coin, the engine's own price of one gradient for the simulated time, and the
theory's parameter rules (Cor. 5, Cor. 21, Thm 9) evaluated from the instance's matrices."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.conftest import run_recording_thetas, small_doc
from wirelessfl.algorithms.drift import coin_steps
from wirelessfl.contract.payload import Payload
from wirelessfl.errors import UserError
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.scenario.loader import scenario_from_document

# A small instance of fedred.md's synthetic quadratic: L / delta = 10, as in the paper's regime.
PROBLEM = {"name": "quadratic", "clients": 5, "dimension": 20, "L": 50.0, "mu": 1.0,
           "delta": 5.0}
LOSSLESS = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}}


def _scenario(algorithm: dict, channel=None, **problem):
    doc = small_doc(problem={**PROBLEM, **problem}, channel=channel or LOSSLESS,
                    quantization_bits=32, algorithms=[{"eval_every": 1, **algorithm}])
    for key in ("data", "model"):
        doc.pop(key)
    doc["population"] = {"num_devices": PROBLEM["clients"]}
    return scenario_from_document(doc, "drift.yaml")


def _run(algorithm: dict, channel=None, **problem):
    sc = _scenario(algorithm, channel, **problem)
    world = build_world(sc)
    return world, pd.DataFrame(run_algorithm(world, sc.algorithms[0]).rows)


METHODS = [
    {"name": "gd", "rounds": 700},
    {"name": "dane", "rounds": 25},
    {"name": "dane-plus", "rounds": 30},
    {"name": "dane-plus", "rounds": 40, "full_batch": False, "local_steps": 10, "lr": 0.01,
     "lam": 5.0, "label": "sgd-noiseless"},
    {"name": "fedred", "rounds": 80, "p": 0.1},
    # Alg. 2 with Thm 7's regime eta >= lambda >= delta_A (eta = L, the -GD default, is slow here)
    {"name": "fedred", "rounds": 40, "p": 0.2, "solver": "exact", "eta": 10.0, "lam": 5.0},
    {"name": "scaffold-cv", "rounds": 120, "local_steps": 10},
    {"name": "scaffnew", "rounds": 150},
]


@pytest.mark.parametrize("algorithm", METHODS, ids=lambda a: a.get("label", a["name"]) + (
    "-" + a["solver"] if "solver" in a else ""))
def test_every_method_converges_to_the_linear_solve_optimum(monkeypatch, algorithm):
    """x* = A^{-1} c solved here in float64; every method ends within float32 resolution of it
    (||x - x*|| <= 1e-4 ||x*||, f - f* <= 1e-7 |f*|)."""
    world, thetas, run = run_recording_thetas(monkeypatch, _scenario(algorithm))
    prob = world.evaluator
    a, c = prob.a_np.mean(0), prob.c_np.mean(0)
    x_star = np.linalg.solve(a, c)
    x = thetas[-1].double().numpy()
    assert run.status == "complete"
    assert np.linalg.norm(x - x_star) <= 1e-4 * np.linalg.norm(x_star)
    f = lambda z: 0.5 * z @ a @ z - c @ z
    assert f(x) - f(x_star) <= 1e-7 * abs(f(x_star))
    rows = pd.DataFrame(run.rows)
    assert rows.suboptimality.iloc[-1] == pytest.approx(f(x) - f(x_star), rel=1e-3, abs=1e-9)


def _dane_plus_reference(a, c, lam, mu, rounds, cap=5000):
    """fedred.md Alg. 1 with control variate (1), Avg, and Thm 4's stopping rule, in numpy;
    the models that cross the air rounded to float32. Returns (x^r list, K_r per round [n])."""
    n, d = c.shape
    lr = 1 / (np.abs(np.linalg.eigvalsh(a)).max() + lam)
    x = np.zeros(d, dtype=np.float32)
    xs, ks = [x.copy()], []
    for r in range(rounds):
        xr = x.astype(np.float64)
        g = np.einsum("nij,j->ni", a, xr) - c
        mean = g.astype(np.float32).mean(0, dtype=np.float32).astype(np.float64)
        h = g - mean
        e_sq = lam * (mu + lam) / (8 * (r + 1) * (r + 2))
        ys, k = [], np.zeros(n, dtype=int)
        for i in range(n):
            y, grad = xr.copy(), mean.copy()
            floor = 1e-12 * max(1.0, np.linalg.norm(mean))
            for _ in range(cap):
                y = y - lr * grad
                grad = a[i] @ y - c[i] - h[i] + lam * (y - xr)
                k[i] += 1
                if grad @ grad <= e_sq * ((y - xr) @ (y - xr)) or np.linalg.norm(grad) <= floor:
                    break
            ys.append(y)
        x = np.stack(ys).astype(np.float32).mean(0, dtype=np.float32)
        xs.append(x.copy())
        ks.append(k)
    return xs, ks


def _delta_a_exact(a):
    """fedred.md A2's delta_A of quadratics with Hessians a [n, d, d], sqrt(lambda_max(mean_i
    (A_i - A)^2)), computed here as the spectral norm (SVD) of the stacked deviations
    [A_1 - A; ...; A_n - A] / sqrt(n), whose Gram matrix is mean_i (A_i - A)^2 (A_i symmetric)."""
    dev = (a - a.mean(0)) / np.sqrt(len(a))
    return float(np.linalg.norm(dev.reshape(-1, a.shape[2]), 2))


def test_dane_plus_matches_the_pseudocode(monkeypatch):
    rounds = 8
    world, thetas, run = run_recording_thetas(
        monkeypatch, _scenario({"name": "dane-plus", "rounds": rounds}))
    prob = world.evaluator
    lam = 2 * _delta_a_exact(prob.a_np)  # Cor. 5: the default for an inexact local solver
    xs, ks = _dane_plus_reference(prob.a_np, prob.c_np, lam, prob.constants["mu"], rounds)
    for ours, ref in zip(thetas, xs):
        np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-5, atol=1e-5)
    rows = pd.DataFrame(run.rows)
    # gradient evaluations per device: 1 (all-reduce) + K_r per round, averaged over devices
    expected = np.cumsum([1 + k.mean() for k in ks])
    np.testing.assert_allclose(rows.gradient_evaluations.iloc[1:], expected)
    assert (rows.exchanges.iloc[1:] == 2 * np.arange(1, rounds + 1)).all()
    # K_r grows with r (the rule tightens like 1/r^2; Table 1: O(L/delta log(r)))
    assert ks[-1].mean() > ks[0].mean()


def _fedred_reference(a, c, eta, lam, p, rounds, seed):
    """fedred.md Alg. 3 (FedRed-GD) in numpy on the same coin sequence as the simulator."""
    n, d = c.shape
    gamma = 1 / (eta + lam)
    grad = lambda z: np.einsum("nij,nj->ni", a, z) - c
    x_ref = np.zeros(d, dtype=np.float32)
    xs = np.zeros((n, d))
    g0 = grad(np.broadcast_to(x_ref.astype(np.float64), (n, d)))
    h = g0 - g0.astype(np.float32).mean(0, dtype=np.float32)
    out, steps = [x_ref.copy()], []
    for k in range(rounds):
        m = coin_steps(seed, p, k)
        steps.append(m)
        for _ in range(m):
            xs = xs - gamma * (grad(xs) - h + lam * (xs - x_ref.astype(np.float64)))
        x_ref = xs.astype(np.float32).mean(0, dtype=np.float32)
        g = grad(np.broadcast_to(x_ref.astype(np.float64), (n, d)))
        h = g - g.astype(np.float32).mean(0, dtype=np.float32)
        out.append(x_ref.copy())
    return out, steps


def test_fedred_gd_matches_the_pseudocode_and_keeps_local_iterates(monkeypatch):
    rounds, p, eta = 12, 0.2, 40.0
    sc = _scenario({"name": "fedred", "rounds": rounds, "p": p, "eta": eta})
    world, thetas, run = run_recording_thetas(monkeypatch, sc)
    prob = world.evaluator
    xs, steps = _fedred_reference(prob.a_np, prob.c_np, eta, p * eta, p, rounds, sc.seed)
    for ours, ref in zip(thetas, xs):
        np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-5, atol=1e-5)
    rows = pd.DataFrame(run.rows)
    np.testing.assert_array_equal(np.diff(rows.local_steps), steps)
    # N + 1 gradients per communication event, plus the all-reduce at x^0 (fedred.md 3.2)
    np.testing.assert_allclose(rows.gradient_evaluations.iloc[-1], sum(steps) + rounds + 1)


def _scaffnew_reference(a, c, gamma, p, rounds, seed):
    """ProxSkip / Scaffnew (Mishchenko et al. 2022, fedred.md 2.6) in numpy, h_0 = 0."""
    n, d = c.shape
    x = np.zeros((n, d))
    h = np.zeros((n, d))
    out = [np.zeros(d)]
    for k in range(rounds):
        for t in range(coin_steps(seed, p, k)):
            hat = x - gamma * (np.einsum("nij,nj->ni", a, x) - c - h)
            x = hat
        sent = (hat - gamma / p * h).astype(np.float32)
        x_bar = sent.mean(0, dtype=np.float32).astype(np.float64)
        h = h + p / gamma * (x_bar - hat)
        x = np.broadcast_to(x_bar, (n, d)).copy()
        out.append(x_bar)
    return out


def test_scaffnew_matches_proxskip(monkeypatch):
    rounds, p, lr = 15, 0.25, 0.02
    sc = _scenario({"name": "scaffnew", "rounds": rounds, "p": p, "lr": lr})
    world, thetas, _ = run_recording_thetas(monkeypatch, sc)
    prob = world.evaluator
    ref = _scaffnew_reference(prob.a_np, prob.c_np, lr, p, rounds, sc.seed)
    for ours, x in zip(thetas, ref):
        np.testing.assert_allclose(ours.numpy(), x, rtol=1e-4, atol=1e-4)


def test_shared_coin_communicates_with_probability_p_and_time_counts_every_step():
    """Over R rounds, communications per local step -> p (the mean of Geom(p) is 1/p; bound of
    4 standard errors), and each round's simulated time is N_k gradient times plus a constant
    communication time on a pinned channel."""
    p, rounds = 0.2, 300
    world, rows = _run({"name": "fedred", "rounds": rounds, "p": p, "eta": 40.0})
    steps = np.diff(rows.local_steps.to_numpy())
    assert steps.min() >= 1
    rate = rounds / steps.sum()
    stderr = np.sqrt(1 - p) / np.sqrt(rounds) * p  # delta method on 1 / mean(N)
    assert abs(rate - p) <= 4 * stderr
    compute = world.compute_model(32)
    t_grad = compute.forward_time_s(1) + compute.backward_time_s(1)
    per_round = np.diff(rows.sim_time_s.to_numpy())[1:]  # round 0 also holds the x^0 all-reduce
    communication = per_round - steps[1:] * t_grad
    np.testing.assert_allclose(communication, communication[0], rtol=1e-9)
    assert t_grad > 0 and communication[0] > t_grad  # two exchanges + the gradient at x~


def test_waiting_for_lost_uploads_keeps_the_exact_trajectory(monkeypatch):
    """on_loss: wait retransmits until everything arrived: the models are those of a lossless
    channel, and the retransmissions cost time and energy."""
    algo = {"name": "dane-plus", "rounds": 6}
    lossy = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 0.6}}
    _, clean, run_clean = run_recording_thetas(monkeypatch, _scenario(algo))
    monkeypatch.undo()
    _, noisy, run_noisy = run_recording_thetas(monkeypatch, _scenario(algo, lossy))
    for a, b in zip(clean, noisy):
        assert bool((a == b).all())
    clean_rows, noisy_rows = pd.DataFrame(run_clean.rows), pd.DataFrame(run_noisy.rows)
    assert noisy_rows.energy_uplink_j.iloc[-1] > clean_rows.energy_uplink_j.iloc[-1]
    assert noisy_rows.exchanges.iloc[-1] > clean_rows.exchanges.iloc[-1]


def test_dropping_lost_uploads_reaches_a_neighbourhood_that_waiting_does_not_leave():
    """on_loss: drop (A12 b) averages over what arrived, and only devices whose gradient is in the
    mean solve. The round then descends on the participants' objective, whose optimum is not x*:
    the gap falls by orders of magnitude but stays noisy, while on_loss: wait converges."""
    lossy = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 0.9}}
    _, drop = _run({"name": "dane-plus", "rounds": 30, "on_loss": "drop"}, lossy)
    _, wait = _run({"name": "dane-plus", "rounds": 30, "on_loss": "wait"}, lossy)
    start = drop.suboptimality.iloc[0]
    assert np.median(drop.suboptimality.iloc[-10:]) < 1e-2 * start
    assert wait.suboptimality.iloc[-1] < 1e-8 * start
    assert drop.suboptimality.iloc[-10:].max() > 1e3 * wait.suboptimality.iloc[-1]


def test_the_manifest_records_the_parameters_each_method_resolved_from_theory(tmp_path):
    """Each algorithm's manifest entry holds the values its defaults resolved to ("params" keeps
    the user's null), against the theory's rules evaluated here from the instance's matrices:
    L = max_i ||A_i|| and mu = min_i lambda_min(A_i) by numpy, delta_A by ``_delta_a_exact``.
    DANE+ lambda = 2 delta_A (Cor. 5), DANE delta_A (Cor. 21), FedRed-GD Thm 9, GD and Scaffnew
    1/L, Scaffnew p = sqrt(mu / L), averaging avg (a convex problem) for the methods that have
    the option; FedRed's first communication comes after the Geom(p) draw of the resolved p."""
    from wirelessfl.pipeline.runner import run_scenario

    entries = [{"name": "dane-plus", "rounds": 2}, {"name": "dane", "rounds": 1},
               {"name": "fedred", "rounds": 3}, {"name": "fedred", "rounds": 1, "p": 0.2,
                                                  "label": "fedred-p"},
               {"name": "gd", "rounds": 1}, {"name": "scaffnew", "rounds": 1}]
    doc = small_doc(problem=PROBLEM, channel=LOSSLESS, quantization_bits=32,
                    algorithms=[{"eval_every": 1, **e} for e in entries])
    for key in ("data", "model"):
        doc.pop(key)
    doc["population"] = {"num_devices": PROBLEM["clients"]}
    sc = scenario_from_document(doc, "drift.yaml")
    built = []
    run_scenario(sc, tmp_path / "run", on_world=built.append, warn=lambda _: None)
    [world] = built
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())["algorithms"]
    a = world.evaluator.a_np
    big_l = max(np.linalg.norm(a_i, 2) for a_i in a)
    mu = min(np.linalg.eigvalsh(a_i)[0] for a_i in a)
    delta = _delta_a_exact(a)
    assert delta < 0.9 * PROBLEM["delta"]  # the exact constant, not the paper's formula (A2)
    resolved = {label: entry["resolved"] for label, entry in manifest.items()}
    assert manifest["dane-plus"]["params"]["lam"] is None
    assert resolved["dane-plus"] == pytest.approx(
        {"lam": 2 * delta, "lr": 1 / (big_l + 2 * delta), "mu": mu, "averaging": "avg"},
        rel=1e-9)
    assert resolved["dane"] == pytest.approx(
        {"lam": delta, "lr": 1 / (big_l + delta), "mu": mu, "averaging": "avg"}, rel=1e-9)
    p = (delta + mu / 2) / (big_l - mu / 2)
    assert resolved["fedred"] == pytest.approx(
        {"p": p, "eta": big_l, "lam": delta, "lr": 1 / (big_l + delta), "averaging": "avg"},
        rel=1e-9)
    assert resolved["fedred-p"] == pytest.approx(
        {"p": 0.2, "eta": big_l, "lam": 0.2 * big_l, "lr": 1 / (1.2 * big_l),
         "averaging": "avg"}, rel=1e-9)
    assert resolved["gd"] == pytest.approx({"lr": 1 / big_l}, rel=1e-9)
    assert resolved["scaffnew"] == pytest.approx({"lr": 1 / big_l, "p": np.sqrt(mu / big_l)},
                                                 rel=1e-9)
    rounds = pd.read_parquet(tmp_path / "run" / "rounds.parquet")
    steps = np.diff(rounds[rounds.algorithm == "fedred"].local_steps.to_numpy())
    np.testing.assert_array_equal(steps, [coin_steps(sc.seed, p, k) for k in range(3)])


def test_parameters_that_need_the_problem_constants_say_so():
    doc = small_doc(algorithms=[{"name": "fedred", "rounds": 2}])
    sc = scenario_from_document(doc, "nn.yaml")
    with pytest.raises(UserError, match=r"fedred.*eta defaults to L.*set eta explicitly"):
        run_algorithm(build_world(sc), sc.algorithms[0])
    sc = scenario_from_document(small_doc(algorithms=[{"name": "fedred", "eta": 10.0}]), "nn.yaml")
    with pytest.raises(UserError, match=r"lam defaults to delta_A \(Thm 9\).*set lam explicitly"):
        run_algorithm(build_world(sc), sc.algorithms[0])
    with pytest.raises(UserError, match="set either eta or lr"):
        _scenario({"name": "fedred", "eta": 1.0, "lr": 0.1})
    with pytest.raises(UserError, match="adaptive stopping rule needs exact gradients"):
        _scenario({"name": "dane-plus", "full_batch": False})


def _logistic_scenario(algorithm: dict):
    doc = small_doc(channel=LOSSLESS, quantization_bits=32, population={"num_devices": 5},
                    data={"name": "breast_cancer"},
                    partition={"scheme": "dirichlet", "alpha": 0.5},  # fedred.md A7
                    problem={"name": "logistic", "l2": 0.01},
                    algorithms=[{"eval_every": 10, **algorithm}])
    doc.pop("model")
    return scenario_from_document(doc, "logistic.yaml")


LOGISTIC_METHODS = [
    {"name": "gd", "rounds": 400},
    {"name": "dane", "rounds": 150},
    {"name": "dane-plus", "rounds": 150},
    {"name": "fedred", "rounds": 80, "p": 0.1},
    {"name": "scaffold-cv", "rounds": 40},
    {"name": "scaffnew", "rounds": 60, "p": 0.2},
]


@pytest.mark.parametrize("algorithm", LOGISTIC_METHODS, ids=lambda a: a["name"])
def test_every_method_converges_to_the_lbfgs_optimum_on_logistic_regression(monkeypatch,
                                                                             algorithm):
    """Breast cancer split over 5 devices by Dir(0.5): x* of f = (1/M) sum log(1 + exp(-y a^T x))
    + (l2/2) ||x||^2 by scipy's L-BFGS-B here, independently of the problem's Newton solve; every
    method ends within ||x - x*|| <= 1e-4 ||x*||."""
    from scipy.optimize import minimize

    world, thetas, run = run_recording_thetas(monkeypatch, _logistic_scenario(algorithm))
    prob = world.evaluator
    a, y, l2 = prob.a_np, prob.y_np, prob.l2

    def f_and_grad(x):
        margin = -y * (a @ x)
        value = np.logaddexp(0.0, margin).mean() + 0.5 * l2 * x @ x
        sig = 0.5 * (1 + np.tanh(0.5 * margin))  # sigmoid(margin), overflow-free
        return value, -(a.T @ (y * sig)) / len(y) + l2 * x

    ref = minimize(f_and_grad, np.zeros(a.shape[1]), jac=True, method="L-BFGS-B",
                   options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 10000})
    x_star = ref.x
    assert np.linalg.norm(f_and_grad(x_star)[1]) < 1e-8
    x = thetas[-1].double().numpy()
    assert run.status == "complete"
    assert np.linalg.norm(x - x_star) <= 1e-4 * np.linalg.norm(x_star)


def test_summary_counts_rounds_and_gradients_to_a_suboptimality_target(tmp_path):
    """The summary's target on f - f* picks the first row at or below it (hand-made table), both
    targets must hold when both are set, and the progress figure is drawn only where f* is known."""
    from wirelessfl.report.plots import optimization_progress
    from wirelessfl.results.records import RunRecord
    from wirelessfl.results.summary import format_summary, summarize

    rows = pd.DataFrame({
        "algorithm": ["a"] * 4, "round": [0, 1, 2, 3], "sim_time_s": [0.0, 1.0, 2.0, 3.0],
        "energy_j": [0.0, 2.0, 4.0, 6.0], "energy_compute_j": [0.0, 1.0, 2.0, 3.0],
        "energy_uplink_j": [0.0, 0.5, 1.0, 1.5], "energy_downlink_j": [0.0, 0.5, 1.0, 1.5],
        "energy_idle_j": 0.0, "bits_up": [0, 10, 20, 30], "delivered_fraction": 1.0,
        "test_accuracy": [0.5, 0.6, 0.7, 0.9], "suboptimality": [1.0, 1e-3, 1e-7, 1e-9],
        "grad_norm_sq": [1.0, 1e-2, 1e-6, 1e-8], "gradient_evaluations": [0.0, 3.0, 7.0, 9.0]})
    table = summarize(rows, None, 2, target_suboptimality=1e-6)
    assert table.rounds_to_target[0] == 2 and table.energy_to_target_j[0] == 4.0
    assert table.gradient_evaluations_to_target[0] == 7.0
    assert table.final_suboptimality[0] == 1e-9
    both = summarize(rows, 0.8, 2, target_suboptimality=1e-6)
    assert both.rounds_to_target[0] == 3
    assert "target accuracy 0.800 and target f - f* <= 1e-06" in format_summary(both, 0.8, 1e-6)
    record = RunRecord(tmp_path, rows, pd.DataFrame(), {"scenario": {"name": "t"}})
    fig = optimization_progress(record)
    assert [len(ax.lines) for ax in fig.axes] == [1] * 8  # f - f* and ||grad||^2 on four axes
    nan = RunRecord(tmp_path, rows.assign(suboptimality=np.nan), pd.DataFrame(), {})
    assert optimization_progress(nan) is None
    assert "final f - f*" not in format_summary(summarize(nan.rounds, 0.8, 2), 0.8)


def test_the_progress_figure_draws_a_methods_own_objective(tmp_path):
    """A run that records only its own objective (ZO-HFL's global loss, no f*) gets the progress
    figure with that row alone, one line per algorithm on each x axis; a run recording neither
    gets none."""
    from wirelessfl.report.plots import PROGRESS_AXES, optimization_progress
    from wirelessfl.results.records import RunRecord

    rows = pd.DataFrame({
        "algorithm": ["A"] * 3 + ["B"] * 3, "round": [0, 1, 2] * 2,
        "sim_time_s": [0.0, 1.0, 2.0] * 2, "energy_j": [0.0, 1.0, 2.0] * 2,
        "gradient_evaluations": [0.0, 1.0, 2.0] * 2, "suboptimality": np.nan,
        "objective": [2.0, 1.5, 1.2, 2.0, 1.8, 1.7]})
    fig = optimization_progress(RunRecord(tmp_path, rows, pd.DataFrame(), {}))
    assert [len(ax.lines) for ax in fig.axes] == [2] * len(PROGRESS_AXES)
    assert fig.axes[0].get_ylabel() == "objective f(x)"
    np.testing.assert_array_equal(fig.axes[0].lines[0].get_ydata(), [2.0, 1.5, 1.2])
    empty = RunRecord(tmp_path, rows.assign(objective=np.nan), pd.DataFrame(), {})
    assert optimization_progress(empty) is None


def test_scaffnew_refuses_its_default_p_without_strong_convexity():
    """p = sqrt(mu / L) is 0 at mu = 0: a built mu = 0 instance measures mu about 1e-14 L, whose
    p would draw tens of millions of local steps a round (an exact 0 became p = 1, plain GD,
    silently). The run stops with one error naming the parameter and both fixes; an explicit p
    runs."""
    from wirelessfl.errors import UserError

    sc = _scenario({"name": "scaffnew", "rounds": 2}, mu=0.0)
    with pytest.raises(UserError, match=r"p defaults to sqrt\(mu / L\), which is 0 here "
                                        r"\(mu = .*zero up to rounding.*set p explicitly"
                                        r".*problem.mu"):
        run_algorithm(build_world(sc), sc.algorithms[0])
    _, rows = _run({"name": "scaffnew", "rounds": 2, "p": 0.5}, mu=0.0)
    assert len(rows) == 3


# ---- DANE+ with Rand averaging and the fast gradient method (fedred.md Sec. 2.0, 2.2, 3.2) ------
def _rand_index(seed, r, n):
    """Rand's j_r as the simulator's docs define it: uniform over the n devices from the keyed
    stream (seed, "rand-averaging", r) (participation 1: every device is asked)."""
    from wirelessfl.learning.seeds import keyed_rng

    return int(keyed_rng(seed, "rand-averaging", r).integers(n))


def _record_uploads(monkeypatch):
    """Patch the drift family's ``upload`` to append (round, the devices that uploaded,
    ndarray) of every upload phase (retransmissions included) to the returned list."""
    from wirelessfl.algorithms.drift import DriftCorrected

    seen, original = [], DriftCorrected.upload

    def recording(self, cost, payload, active=None):
        delivered = yield from original(self, cost, payload, active)
        seen.append((self.round_index, np.array(delivered)))
        return delivered

    monkeypatch.setattr(DriftCorrected, "upload", recording)
    return seen


def _gd_solve(a_i, c_i, h_i, xr, mean, lam, lr, e_sq, cap=5000, beta=lambda t: 0.0):
    """Local solver of fedred.md Sec. 2.2 on F(y) = f_i(y) - <h_i, y> + lam/2 ||y - xr||^2 from
    y_0 = xr (grad F(xr) = mean, free), with Nesterov's scheme (2.2.19) in its textbook form:
    x_{t+1} = y_t - lr grad F(y_t), y_{t+1} = x_{t+1} + beta_t (x_{t+1} - x_t) (beta = 0: GD);
    stop at the first t >= 1 with ||grad F(y_t)||^2 <= e_sq ||y_t - xr||^2, at the numerical
    floor 1e-12 max(1, ||mean||) or after cap evaluations. Returns (y_t, t = evaluations)."""
    x_prev, y, grad = xr.copy(), xr.copy(), mean.copy()
    floor = 1e-12 * max(1.0, np.linalg.norm(mean))
    for t in range(cap):
        x_new = y - lr * grad
        y = x_new + beta(t) * (x_new - x_prev)
        x_prev = x_new
        grad = a_i @ y - c_i - h_i + lam * (y - xr)
        if grad @ grad <= e_sq * ((y - xr) @ (y - xr)) or np.linalg.norm(grad) <= floor:
            return y, t + 1
    return y, cap


def _instance_constants(a):
    """(L, mu, delta_A exact) of Hessians a [n, d, d] by numpy: L = max_i ||A_i||, mu = min_i
    lambda_min(A_i)."""
    eig = np.linalg.eigvalsh(a)
    return float(np.abs(eig).max()), float(eig[:, 0].min()), _delta_a_exact(a)


def test_dane_plus_rand_averaging_matches_the_pseudocode_with_lost_uploads(monkeypatch):
    """Alg. 1 with Rand (fedred.md Sec. 2.0 / 2.2) transcribed in numpy round by round on a
    lossy uplink with on_loss: drop: the gradient mean over the devices whose gradient arrived
    (read from the run), j_r re-drawn here from the keyed stream, only j_r solves (GD under
    Thm 4's rule) and uploads; x^{r+1} = x_{j_r,r+1} when that upload arrives, else x^r (also
    when j_r's gradient was lost). Costs (Sec. 3.2 row "DANE+-GD, Rand averaging"): every device
    1 gradient a round, j_r also its K_r; local_steps counts K_r."""
    rounds, n = 14, PROBLEM["clients"]
    lossy = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 0.7}}
    sc = _scenario({"name": "dane-plus", "rounds": rounds, "averaging": "rand",
                    "on_loss": "drop"}, lossy)
    uploads = _record_uploads(monkeypatch)
    world, thetas, run = run_recording_thetas(monkeypatch, sc)
    prob = world.evaluator
    a, c = prob.a_np, prob.c_np
    big_l, mu, delta = _instance_constants(a)
    lam = 2 * delta
    lr = 1 / (big_l + lam)
    x = np.zeros(c.shape[1], dtype=np.float32)
    grads_per_device, steps = np.zeros(n), []
    events = {"gradient lost": 0, "j_r not in the mean": 0, "model lost": 0, "model in": 0}
    for r in range(rounds):
        phases = [got for k, got in uploads if k == r]
        np.testing.assert_allclose(thetas[r].numpy(), x, rtol=1e-5, atol=1e-5)
        xr = x.astype(np.float64)
        grads_per_device += 1  # every device computes and uploads grad f_i(x^r)
        in_mean = phases[0]
        events["gradient lost"] += len(in_mean) < n
        j = _rand_index(sc.seed, r, n)
        if j not in in_mean:  # no solve, no model phase, x^{r+1} = x^r
            events["j_r not in the mean"] += 1
            assert len(phases) == 1
            steps.append(0)
            continue
        g = np.einsum("nij,j->ni", a, xr) - c
        mean = g[in_mean].astype(np.float32).mean(0, dtype=np.float32).astype(np.float64)
        e_sq = lam * (mu + lam) / (8 * (r + 1) * (r + 2))
        y, k = _gd_solve(a[j], c[j], g[j] - mean, xr, mean, lam, lr, e_sq)
        grads_per_device[j] += k
        steps.append(k)
        assert len(phases) == 2 and set(phases[1]) <= {j}  # only j_r uploads its model
        if len(phases[1]):
            events["model in"] += 1
            x = y.astype(np.float32)
        else:
            events["model lost"] += 1
    np.testing.assert_allclose(thetas[rounds].numpy(), x, rtol=1e-5, atol=1e-5)
    assert min(events.values()) >= 1, events  # every case of the transcription was exercised
    np.testing.assert_array_equal(run.ledger.backward_passes, grads_per_device)
    rows = pd.DataFrame(run.rows)
    np.testing.assert_array_equal(np.diff(rows.local_steps), steps)


def test_dane_plus_rand_waiting_for_lost_uploads_keeps_the_exact_trajectory(monkeypatch):
    """on_loss: wait asks j_r (and any device whose gradient was lost) again: the models are
    those of a lossless channel, at the price of more exchanges; in every round the gradient
    phase delivered every device's gradient and the model phase j_r's model alone (j_r
    re-drawn here)."""
    rounds, n = 8, PROBLEM["clients"]
    algo = {"name": "dane-plus", "rounds": rounds, "averaging": "rand"}
    lossy = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 0.5}}
    _, clean, run_clean = run_recording_thetas(monkeypatch, _scenario(algo))
    monkeypatch.undo()
    uploads = _record_uploads(monkeypatch)
    sc = _scenario(algo, lossy)
    _, noisy, run_noisy = run_recording_thetas(monkeypatch, sc)
    for a, b in zip(clean, noisy):
        assert bool((a == b).all())
    assert [r for r, _ in uploads] == [r for r in range(rounds) for _ in range(2)]
    for r in range(rounds):
        gradients, models = uploads[2 * r][1], uploads[2 * r + 1][1]
        np.testing.assert_array_equal(gradients, np.arange(n))
        np.testing.assert_array_equal(models, [_rand_index(sc.seed, r, n)])
    # lossless: n gradients + 1 model a round; lossy: retransmissions (j_r's model among them)
    assert int(run_clean.ledger.packets_delivered.sum()) == rounds * (n + 1)
    assert run_clean.ledger.exchanges == 2 * rounds < run_noisy.ledger.exchanges


def _dane_plus_fgd_reference(a, c, lam, mu, lr, beta, rounds):
    """fedred.md Alg. 1 (Avg) with DANE+-FGD: _gd_solve with Nesterov's constant momentum
    beta for every client, the models that cross the air rounded to float32. Returns (x^r
    list, [per round (y_i [n, d], K_r [n])])."""
    n, d = c.shape
    x = np.zeros(d, dtype=np.float32)
    xs, solves = [x.copy()], []
    for r in range(rounds):
        xr = x.astype(np.float64)
        g = np.einsum("nij,j->ni", a, xr) - c
        mean = g.astype(np.float32).mean(0, dtype=np.float32).astype(np.float64)
        e_sq = lam * (mu + lam) / (8 * (r + 1) * (r + 2))
        out = [_gd_solve(a[i], c[i], g[i] - mean, xr, mean, lam, lr, e_sq, beta=lambda t: beta)
               for i in range(n)]
        ys, ks = np.stack([y for y, _ in out]), np.array([k for _, k in out])
        solves.append((ys, ks))
        x = ys.astype(np.float32).mean(0, dtype=np.float32)
        xs.append(x.copy())
    return xs, solves


def _record_local_solves(monkeypatch):
    """Patch DanePlus.local_solve to append (y [n, d] float64, evaluations [n]) of each call."""
    from wirelessfl.algorithms.drift import DanePlus

    seen, original = [], DanePlus.local_solve

    def recording(self, *args):
        y, evaluations = original(self, *args)
        seen.append((y.double().numpy().copy(), evaluations.copy()))
        return y, evaluations

    monkeypatch.setattr(DanePlus, "local_solve", recording)
    return seen


def test_dane_plus_fgd_matches_nesterovs_constant_step_scheme(monkeypatch):
    """DANE+-FGD (fedred.md Sec. 2.2) against Nesterov's scheme (2.2.19) in numpy with beta =
    (sqrt(kappa) - 1) / (sqrt(kappa) + 1), kappa = (L + lambda) / (mu + lambda) from the
    instance's eigenvalues: every client's returned iterate y_t, its stopping step and the
    gradient counts (1 for the all-reduce + K_r a round) per round."""
    rounds = 6
    solves = _record_local_solves(monkeypatch)
    world, thetas, run = run_recording_thetas(
        monkeypatch, _scenario({"name": "dane-plus", "rounds": rounds, "solver": "fgd"}))
    prob = world.evaluator
    big_l, mu, delta = _instance_constants(prob.a_np)
    lam = 2 * delta
    kappa = (big_l + lam) / (mu + lam)
    beta = (np.sqrt(kappa) - 1) / (np.sqrt(kappa) + 1)
    xs, ref = _dane_plus_fgd_reference(prob.a_np, prob.c_np, lam, mu, 1 / (big_l + lam), beta,
                                       rounds)
    for ours, x in zip(thetas, xs):
        np.testing.assert_allclose(ours.numpy(), x, rtol=1e-5, atol=1e-5)
    assert len(solves) == rounds
    for (y, k), (y_ref, k_ref) in zip(solves, ref):
        np.testing.assert_array_equal(k, k_ref)
        np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(run.ledger.backward_passes,
                                  rounds + np.sum([k for _, k in ref], axis=0))
    rows = pd.DataFrame(run.rows)
    np.testing.assert_allclose(rows.local_steps.iloc[-1], sum(k.mean() for _, k in ref))


def test_dane_plus_fgd_needs_far_fewer_local_steps_than_gd_when_ill_conditioned():
    """L / (mu + lambda) ~ 400 (L = 1000, mu = 1, delta = 1): under the same rule, GD needs
    Theta(kappa log) local steps, FGD Theta(sqrt(kappa) log) (fedred.md Sec. 2.2): FGD takes at
    most half of GD's, and at most 4 / sqrt(kappa) of them (the ratio the two rates predict,
    with a margin for their unknown constants); both reach the same accuracy."""
    problem = {"L": 1000.0, "delta": 1.0}
    world, gd = _run({"name": "dane-plus", "rounds": 4}, **problem)
    _, fgd = _run({"name": "dane-plus", "rounds": 4, "solver": "fgd"}, **problem)
    big_l, mu, delta = _instance_constants(world.evaluator.a_np)
    kappa = (big_l + 2 * delta) / (mu + 2 * delta)
    ratio = fgd.local_steps.iloc[-1] / gd.local_steps.iloc[-1]
    assert ratio <= 0.5 and ratio <= 4 / np.sqrt(kappa), (ratio, kappa)
    assert fgd.suboptimality.iloc[-1] <= 2 * gd.suboptimality.iloc[-1]


def test_fgd_with_fixed_steps_uses_the_convex_sequence_when_nothing_is_strongly_convex(
        monkeypatch):
    """mu + lambda = 0 (lam: 0, mu: 0 given): momentum (s_t - 1) / s_{t+1} of Nesterov 1983 /
    FISTA, and with fixed local_steps K the scheme's z_K is returned, after K - 1 evaluations
    (the first gradient is the all-reduce's), as for GD."""
    k_steps = 7
    solves = _record_local_solves(monkeypatch)
    world, thetas, _ = run_recording_thetas(monkeypatch, _scenario(
        {"name": "dane-plus", "rounds": 1, "solver": "fgd", "lam": 0.0, "mu": 0.0,
         "local_steps": k_steps}))
    prob = world.evaluator
    a, c = prob.a_np, prob.c_np
    lr = 1 / _instance_constants(a)[0]
    g = -c  # x^0 = 0
    mean = g.astype(np.float32).mean(0, dtype=np.float32).astype(np.float64)
    s, betas = 1.0, []
    for _ in range(k_steps):
        s_next = (1 + np.sqrt(1 + 4 * s * s)) / 2
        betas.append((s - 1) / s_next)
        s = s_next
    zs = []
    for i in range(len(c)):
        z_prev, y, grad = np.zeros(c.shape[1]), np.zeros(c.shape[1]), mean
        for t in range(k_steps):
            z = y - lr * grad
            y = z + betas[t] * (z - z_prev)
            z_prev = z
            grad = a[i] @ y - c[i] - (g[i] - mean)
        zs.append(z)
    [(y_ours, evaluations)] = solves
    np.testing.assert_array_equal(evaluations, k_steps - 1)
    np.testing.assert_allclose(y_ours, np.stack(zs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(thetas[1].numpy(), np.stack(zs).astype(np.float32).mean(0),
                               rtol=1e-5, atol=1e-6)


NEW_VARIANTS = [
    {"name": "dane-plus", "rounds": 70, "averaging": "rand"},
    {"name": "dane-plus", "rounds": 30, "solver": "fgd"},
    {"name": "dane", "rounds": 70, "averaging": "rand", "solver": "fgd"},
    {"name": "dane", "rounds": 25, "solver": "fgd"},
]


@pytest.mark.parametrize("algorithm", NEW_VARIANTS,
                         ids=lambda a: f"{a['name']}-{a.get('averaging', 'avg')}-"
                                       f"{a.get('solver', 'gd')}")
def test_rand_and_fgd_variants_converge_to_the_linear_solve_optimum(monkeypatch, algorithm):
    """As test_every_method_converges_to_the_linear_solve_optimum: x* = A^{-1} c in float64,
    ||x - x*|| <= 1e-4 ||x*|| at the end."""
    world, thetas, run = run_recording_thetas(monkeypatch, _scenario(algorithm))
    prob = world.evaluator
    x_star = np.linalg.solve(prob.a_np.mean(0), prob.c_np.mean(0))
    assert run.status == "complete"
    assert np.linalg.norm(thetas[-1].double().numpy() - x_star) <= 1e-4 * np.linalg.norm(x_star)


def test_fgd_refuses_minibatch_gradients():
    with pytest.raises(UserError, match="solver: fgd needs exact gradients"):
        _scenario({"name": "dane-plus", "full_batch": False, "local_steps": 5, "solver": "fgd"})


@pytest.mark.parametrize("name", ["dane-plus", "dane"])
def test_rand_averaging_and_fgd_pass_the_conformance_suite(name):
    """The whole conformance suite (wirelessfl.testing) with averaging: rand and solver: fgd:
    each device's ledger is whole packets of declared_phases (every device's gradient every
    round, j_r's model), energies add up, lost uploads never reach the model."""
    from tests.conftest import ALGORITHM_NEEDS
    from wirelessfl.plugins import ALGORITHMS
    from wirelessfl.testing import check_algorithm

    cls = ALGORITHMS.load_builtins()[name]
    check_algorithm(cls, {**ALGORITHM_NEEDS[name], "averaging": "rand", "solver": "fgd"})


@pytest.mark.parametrize("name", ["dane-plus", "dane"])
def test_avg_rounds_send_exactly_the_declared_payloads_from_every_device(name):
    """DANE+ / DANE declare ``samples_devices`` for averaging: rand, which loosens the
    conformance suite's payload check to whole packets of ``declared_phases``; with avg every
    device sends and receives exactly ``declared_payloads`` each round (2 d-vectors up in 2
    packets, 2 down), as the suite's exact check would ask, at 32 and 8 bits."""
    from wirelessfl.algorithms.drift import DanePlus

    rounds, n = 3, PROBLEM["clients"]
    for bits in (32, 8):
        sc = _scenario({"name": name, "rounds": rounds, "bits": bits})
        world = build_world(sc)
        led = run_algorithm(world, sc.algorithms[0]).ledger
        up, down = DanePlus.declared_payloads(world.evaluator.d, bits, participants=n)
        np.testing.assert_array_equal(led.bits_up, [up.bits * rounds] * n)
        np.testing.assert_array_equal(led.bits_down, [down.bits * rounds] * n)
        np.testing.assert_array_equal(led.packets_delivered, [2 * rounds] * n)
        assert led.exchanges == 2 * rounds


# ---- non-convex problems: the non-convex theory's defaults (fedred.md Sec. 2.2 - 2.5) -------------
# fedred.md Fig. 1's non-convex instance (Sec. 4.1): indefinite A_i plus beta sum_k phi([x]_k),
# beta = 400, so the recorded mu is negative (-delta/2 - beta/2 = -202.5) and L = 100 + 2 beta.
NONCONVEX = {"name": "quadratic", "instance": "non-convex", "minimizer_std": 30.0,
             "dimension": 100}


def _nc_scenario(algorithm: dict, channel=None, seed=None, **problem):
    """The non-convex instance on a lossless channel, at the small scenario's seed (3) or
    ``seed`` (which draws the instance too)."""
    doc = small_doc(problem={**NONCONVEX, **problem}, channel=channel or LOSSLESS,
                    quantization_bits=32, algorithms=[{"eval_every": 1, **algorithm}])
    for key in ("data", "model"):
        doc.pop(key)
    doc["population"] = {"num_devices": PROBLEM["clients"]}
    if seed is not None:
        doc["seed"] = seed
    return scenario_from_document(doc, "drift-nonconvex.yaml")


def _nc_run(algorithm: dict, seed=None, **problem):
    sc = _nc_scenario(algorithm, seed=seed, **problem)
    world = build_world(sc)
    run = run_algorithm(world, sc.algorithms[0])
    return world, run, pd.DataFrame(run.rows)


def _nc_gradients(prob, x):
    """grad f_i(x) of every client at x [d] (-> [n, d]) or at their own points x [n, d], in
    numpy from the instance's matrices: A_i x - c_i + beta 2x / (1 + x^2)^2 (fedred.md 4.1)."""
    x = np.broadcast_to(x, prob.c_np.shape)
    return (np.einsum("nij,nj->ni", prob.a_np, x) - prob.c_np
            + prob.beta * 2 * x / (1 + x * x) ** 2)


def test_nonconvex_defaults_resolve_by_the_nonconvex_theory(tmp_path):
    """On the non-convex instance (the recorded mu < 0) the parameters left out resolve by the
    non-convex theory, checked against the formulas evaluated here from the manifest's recorded
    constants (L, mu, delta_B) and, for F^_0 = ||grad f(x^0)||^2 / (2L), the gradient at x^0 = 0,
    -mean_i c_i (the beta term's gradient is 0 there): DANE+ lambda = 2 delta_B (Cor. 2), Cor.
    30's tolerance 18 delta_B F^_0 / R and (B.83)'s ceil((L + lambda) R / (18 delta_B)) steps,
    Rand; DANE 2 delta_B (Thm 1, a = 2), Rand, no Cor. 30 rule; FedRed-GD Thm 8 (lambda =
    delta_B, eta = 6L at sigma = 0, p = delta_B / L), Rand; FedRed exact Thm 6 (eta = max(L,
    4 delta_B), p = lambda / eta); a given p keeps lambda = p eta; a given averaging is kept."""
    from wirelessfl.pipeline.runner import run_scenario

    entries = [{"name": "dane-plus", "rounds": 3}, {"name": "dane", "rounds": 1},
               {"name": "dane-plus", "rounds": 2, "averaging": "avg", "label": "dane-plus-avg"},
               {"name": "fedred", "rounds": 2},
               {"name": "fedred", "rounds": 1, "solver": "exact", "label": "fedred-exact"},
               {"name": "fedred", "rounds": 1, "p": 0.05, "label": "fedred-p"},
               {"name": "gd", "rounds": 1}]
    doc = small_doc(problem=NONCONVEX, channel=LOSSLESS, quantization_bits=32,
                    algorithms=[{"eval_every": 1, **e} for e in entries])
    for key in ("data", "model"):
        doc.pop(key)
    doc["population"] = {"num_devices": PROBLEM["clients"]}
    built = []
    run_scenario(scenario_from_document(doc, "nc.yaml"), tmp_path / "run",
                 on_world=built.append, warn=lambda _: None)
    [world] = built
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    c = manifest["problem"]
    big_l, mu, delta_b = c["L"], c["mu"], c["delta_B"]
    assert mu < 0 and c["optimum_value"] is None  # the non-convex instance
    g0 = world.evaluator.c_np.mean(0)  # -grad f(0)
    gap = float(g0 @ g0) / (2 * big_l)
    entries = manifest["algorithms"]
    resolved = {label: entry["resolved"] for label, entry in entries.items()}
    assert entries["dane-plus"]["params"]["averaging"] is None
    lam = 2 * delta_b
    assert resolved["dane-plus"] == pytest.approx(
        {"lam": lam, "lr": 1 / (big_l + lam), "mu": mu, "initial_gap": gap,
         "grad_tolerance_sq": 18 * delta_b * gap / 3,
         "local_step_cap": np.ceil((big_l + lam) * 3 / (18 * delta_b)), "averaging": "rand"},
        rel=1e-9)
    assert resolved["dane"] == pytest.approx(
        {"lam": lam, "lr": 1 / (big_l + lam), "mu": mu, "averaging": "rand"}, rel=1e-9)
    assert resolved["dane-plus-avg"] == pytest.approx(
        {**resolved["dane-plus"], "averaging": "avg", "grad_tolerance_sq": 18 * delta_b * gap / 2,
         "local_step_cap": np.ceil((big_l + lam) * 2 / (18 * delta_b))}, rel=1e-9)
    assert resolved["fedred"] == pytest.approx(
        {"p": delta_b / big_l, "eta": 6 * big_l, "lam": delta_b,
         "lr": 1 / (6 * big_l + delta_b), "averaging": "rand"}, rel=1e-9)
    eta = max(big_l, 4 * delta_b)
    assert resolved["fedred-exact"] == pytest.approx(
        {"p": delta_b / eta, "eta": eta, "lam": delta_b, "lr": 1 / (eta + delta_b),
         "inner_lr": 1 / (big_l + eta + delta_b), "averaging": "rand"}, rel=1e-9)
    assert resolved["fedred-p"] == pytest.approx(
        {"p": 0.05, "eta": 6 * big_l, "lam": 0.05 * 6 * big_l,
         "lr": 1 / (1.05 * 6 * big_l), "averaging": "rand"}, rel=1e-9)
    assert resolved["gd"] == pytest.approx({"lr": 1 / big_l}, rel=1e-9)
    for label in resolved:
        assert manifest["algorithms"][label]["status"] == "complete", label


def test_fedred_sgd_eta_on_a_nonconvex_problem_follows_thm_8_with_the_minibatch_noise():
    """FedRed-SGD (full_batch: false, so averaging: avg given: Rand needs exact gradients) on
    the non-convex instance with gradient noise: eta = 3L + sqrt(9L^2 + L sigma^2 K / F^_0),
    sigma^2 = noise_std^2 / batch_size (the quadratic's minibatch noise), K = R L / delta_B,
    F^_0 = ||mean_i c_i||^2 / (2L); lambda = delta_B, p = delta_B / L. Left to its default,
    averaging would be rand, which is refused with both fixes."""
    noise, batch, rounds = 40.0, 5, 4
    world, run, _ = _nc_run({"name": "fedred", "rounds": rounds, "full_batch": False,
                             "batch_size": batch, "averaging": "avg"}, noise_std=noise)
    c = world.evaluator.constants
    big_l, delta_b = c["L"], c["delta_B"]
    g0 = world.evaluator.c_np.mean(0)
    gap = float(g0 @ g0) / (2 * big_l)
    eta = 3 * big_l + np.sqrt(9 * big_l ** 2 + big_l * noise ** 2 / batch
                              * (rounds * big_l / delta_b) / gap)
    assert eta > 6 * big_l
    assert run.extra["resolved"] == pytest.approx(
        {"p": delta_b / big_l, "eta": eta, "lam": delta_b, "lr": 1 / (eta + delta_b),
         "initial_gap": gap, "averaging": "avg"}, rel=1e-9)
    sc = _nc_scenario({"name": "fedred", "rounds": 2, "full_batch": False}, noise_std=noise)
    with pytest.raises(UserError, match=r"averaging defaults to rand on this non-convex problem "
                                        r"\(Thm 8\).*set full_batch: true, or averaging: avg"):
        run_algorithm(build_world(sc), sc.algorithms[0])
    with pytest.raises(UserError, match="averaging: rand needs exact gradients"):
        _scenario({"name": "fedred", "full_batch": False, "averaging": "rand"})


def test_scaffnew_refuses_its_default_p_on_a_nonconvex_problem():
    """mu < 0: not 'zero up to rounding' but a non-convex problem, where ProxSkip has no theory;
    the message says so and gives the fix; an explicit p runs."""
    sc = _nc_scenario({"name": "scaffnew", "rounds": 2})
    with pytest.raises(UserError, match=r"p defaults to sqrt\(mu / L\), which needs mu > 0, but "
                                        r"this problem is non-convex \(mu = -202\.5 < 0\).*set p "
                                        r"explicitly"):
        run_algorithm(build_world(sc), sc.algorithms[0])
    _, _, rows = _nc_run({"name": "scaffnew", "rounds": 2, "p": 0.5})
    assert len(rows) == 3


def test_dane_plus_refuses_fgd_under_the_nonconvex_rule():
    sc = _nc_scenario({"name": "dane-plus", "rounds": 2, "solver": "fgd"})
    with pytest.raises(UserError, match=r"solver: fgd has no non-convex theory.*use solver: gd, "
                                        r"or set local_steps"):
        run_algorithm(build_world(sc), sc.algorithms[0])


def _nonconvex_solve(grad_i, h_i, xr, mean, lam, lr, tol, cap):
    """fedred.md Sec. 2.2 "DANE+-GD, non-convex" (Cor. 2 / Cor. 30) on F(y) = f_i(y) - <h_i, y>
    + lam/2 ||y - xr||^2: GD with step lr from y_0 = xr (grad F(xr) = mean, free) until
    ||grad F(y_t)||^2 <= tol or t = cap (or the floor 1e-12 max(1, ||mean||)); returns (the y_t,
    t >= 1, with the smallest ||grad F||, t = evaluations, how it ended)."""
    y, grad = xr.copy(), mean.copy()
    floor = 1e-12 * max(1.0, np.linalg.norm(mean))
    best, best_sq, best_t = None, np.inf, 0
    for t in range(1, cap + 1):
        y = y - lr * grad
        grad = grad_i(y) - h_i + lam * (y - xr)
        sq = grad @ grad
        if sq < best_sq:
            best, best_sq, best_t = y.copy(), sq, t
        if sq <= tol or np.sqrt(sq) <= floor:
            return best, t, "tolerance"
    return best, cap, "cap, best is the last" if best_t == cap else "cap, best is earlier"


def test_nonconvex_dane_plus_stopping_rule_and_best_point_match_a_transcription(monkeypatch):
    """DANE+ at its non-convex defaults (Rand, lambda = 2 delta_B, Cor. 30's tolerance 18
    delta_B F^_0 / R, R = 110 the planned rounds) with max_local_steps 20 binding before (B.83)'s
    step count: each round transcribed in numpy from the run's x^r (the gradient mean of the
    float32 uploads, j_r re-drawn here, j_r's GD on F_{j_r,r}): the returned point (the visited
    one with the smallest ||grad F||), its evaluation count, x^{r+1}, and every way a solve ends
    exercised: at the tolerance, at the cap with the last point best, at the cap with an
    earlier point best (||grad F|| grows on the way: F_{i,r} is not convex)."""
    rounds, n, cap = 110, PROBLEM["clients"], 20
    solves = _record_local_solves(monkeypatch)
    sc = _nc_scenario({"name": "dane-plus", "rounds": rounds, "max_local_steps": cap})
    world, thetas, run = run_recording_thetas(monkeypatch, sc)
    prob = world.evaluator
    c = prob.constants
    big_l, delta_b = c["L"], c["delta_B"]
    lam = 2 * delta_b
    lr = 1 / (big_l + lam)
    g0 = prob.c_np.mean(0)
    tol = 18 * delta_b * (g0 @ g0 / (2 * big_l)) / rounds
    assert np.ceil((big_l + lam) * rounds / (18 * delta_b)) > cap  # the cap binds first
    assert len(solves) == rounds
    events = {"tolerance": 0, "cap, best is the last": 0, "cap, best is earlier": 0}
    for r, (y, k) in enumerate(solves):
        xr = thetas[r].double().numpy()
        g = _nc_gradients(prob, xr)
        mean = g.astype(np.float32).mean(0, dtype=np.float32).astype(np.float64)
        j = _rand_index(sc.seed, r, n)

        def grad_j(z, j=j):
            return _nc_gradients(prob, z)[j]

        y_ref, k_ref, how = _nonconvex_solve(grad_j, g[j] - mean, xr, mean, lam, lr, tol, cap)
        events[how] += 1
        np.testing.assert_array_equal(k, [k_ref])
        np.testing.assert_allclose(y[0], y_ref, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(thetas[r + 1].numpy(), y_ref.astype(np.float32),
                                   rtol=1e-6, atol=1e-6)
    assert min(events.values()) >= 1, events
    rows = pd.DataFrame(run.rows)
    np.testing.assert_array_equal(np.diff(rows.local_steps), [k[0] for _, k in solves])


def _fedred_rand_reference(prob_a, prob_c, eta, lam, p, seed, rounds, uploads, n):
    """fedred.md Alg. 3 with Rand (Thm 8's averaging) in numpy, driven by the run's recorded
    upload phases (which devices' packets arrived; on_loss: drop): every device steps N_k times;
    j_k alone uploads x_{j_k,k+1}; if it arrives, x~ = it (float32) and the gradient all-reduce
    at x~ averages the delivered gradients (float32), h_i = grad f_i(x~) - mean for every device;
    else nothing changes. Also the gradient evaluations charged to each device: its own steps
    with its model upload (j_k), the others' with the next all-reduce, 1 per all-reduce.
    Returns (x~ per round, charged [n], events)."""
    d = prob_c.shape[1]
    gamma = 1 / (eta + lam)
    grad = lambda z: np.einsum("nij,nj->ni", prob_a, np.broadcast_to(z, (n, d))) - prob_c
    phases = {}
    for k, got in uploads:
        phases.setdefault(k, []).append(set(got.tolist()))
    x_ref = np.zeros(d, dtype=np.float32)
    xs, h = np.zeros((n, d)), np.zeros((n, d))
    charged, owed = np.ones(n), np.zeros(n)  # the all-reduce at x^0 (A19)
    init = sorted(phases[0].pop(0))
    if init:
        g = grad(x_ref.astype(np.float64))
        h = g - g[init].astype(np.float32).mean(0, dtype=np.float32)
    out = [x_ref.copy()]
    events = {"model in": 0, "model lost": 0, "gradient lost": 0}
    for k in range(rounds):
        m = coin_steps(seed, p, k)
        for _ in range(m):
            xs = xs - gamma * (grad(xs) - h + lam * (xs - x_ref.astype(np.float64)))
        j = _rand_index(seed, k, n)
        model, *rest = phases[k]
        assert model <= {j}  # only j_k uploads its model
        charged[j] += m
        owed[np.arange(n) != j] += m
        if model:
            events["model in"] += 1
            x_ref = xs[j].astype(np.float32)
            [in_mean] = rest
            events["gradient lost"] += len(in_mean) < n
            charged += 1 + owed
            owed[:] = 0
            if in_mean:
                g = grad(x_ref.astype(np.float64))
                h = g - g[sorted(in_mean)].astype(np.float32).mean(0, dtype=np.float32)
        else:
            events["model lost"] += 1
            assert rest == []  # no all-reduce
        out.append(x_ref.copy())
    return out, charged, events


def test_fedred_rand_averaging_matches_the_pseudocode_with_lost_uploads(monkeypatch):
    """FedRed-GD with averaging: rand on a lossy uplink (on_loss: drop) against the numpy
    transcription above, driven by which uploads the run delivered: x~ every round, and every
    device's gradient evaluations in the ledger (the devices other than j_k are charged their
    steps with the all-reduce that follows, or the next one after a round whose model was
    lost); every case of the transcription exercised."""
    rounds, n, p, eta = 30, PROBLEM["clients"], 0.2, 40.0
    lossy = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 0.7}}
    sc = _scenario({"name": "fedred", "rounds": rounds, "p": p, "eta": eta,
                    "averaging": "rand", "on_loss": "drop"}, lossy)
    uploads = _record_uploads(monkeypatch)
    world, thetas, run = run_recording_thetas(monkeypatch, sc)
    prob = world.evaluator
    xs, charged, events = _fedred_rand_reference(prob.a_np, prob.c_np, eta, p * eta, p,
                                                 sc.seed, rounds, uploads, n)
    assert min(events.values()) >= 1, events
    for ours, ref in zip(thetas, xs, strict=True):
        np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(run.ledger.backward_passes, charged)
    assert run.extra["resolved"]["averaging"] == "rand"


@pytest.mark.parametrize("averaging", ["avg", "rand"])
def test_fedred_sends_its_declared_payloads(averaging):
    """FedRed declares ``samples_devices`` for averaging: rand; with avg every device sends and
    receives exactly ``declared_payloads`` each round plus ``initial_payloads`` once (2 packets
    a round + 1); with rand the same except j_k's model packet: n - 1 fewer model packets a
    round. At 32 and 8 bits."""
    from wirelessfl.algorithms.drift import FedRed

    rounds, n = 4, PROBLEM["clients"]
    for bits in (32, 8):
        sc = _scenario({"name": "fedred", "rounds": rounds, "p": 0.3, "eta": 40.0, "bits": bits,
                        "averaging": averaging})
        world = build_world(sc)
        led = run_algorithm(world, sc.algorithms[0]).ledger
        d = world.evaluator.d
        up, down = FedRed.declared_payloads(d, bits, participants=n)
        up0, down0 = FedRed.initial_payloads(d, bits)
        np.testing.assert_array_equal(led.bits_down, [down.bits * rounds + down0.bits] * n)
        assert led.exchanges == 2 * rounds + 1
        if averaging == "avg":
            np.testing.assert_array_equal(led.bits_up, [up.bits * rounds + up0.bits] * n)
            np.testing.assert_array_equal(led.packets_delivered, [2 * rounds + 1] * n)
            continue
        models = np.bincount([_rand_index(sc.seed, k, n) for k in range(rounds)], minlength=n)
        vector = Payload.vectors(d, bits).bits
        np.testing.assert_array_equal(led.bits_up, (rounds + 1 + models) * vector)
        np.testing.assert_array_equal(led.packets_delivered, rounds + 1 + models)


def test_fedred_rand_passes_the_conformance_suite():
    from tests.conftest import ALGORITHM_NEEDS
    from wirelessfl.plugins import ALGORITHMS
    from wirelessfl.testing import check_algorithm

    cls = ALGORITHMS.load_builtins()["fedred"]
    check_algorithm(cls, {**ALGORITHM_NEEDS["fedred"], "averaging": "rand"})


def _rounds_to(rows: pd.DataFrame, target: float) -> int | None:
    """The first round whose grad_norm_sq is at or below ``target`` (None: none)."""
    hit = rows[rows.grad_norm_sq <= target]
    return None if hit.empty else int(hit["round"].iloc[0])


# Rounds to ||grad f||^2 <= 1e-4 measured on the non-convex instance (minimizer_std 30, d = 100,
# 5 devices, lossless) at the scenario seeds 0 - 5, every method at its defaults, FedRed with a
# budget of 160 rounds: GD 835 / 1223 / 1295 / 1096 / 1083 / 998; FedRed-GD (Thm 8, Rand) none
# (min 1.4e-4) / none (4e-3) / 49 / 54 / 50 / none (0.059), 7719 / 7609 / 7367 gradients per
# device where it got there; with averaging: avg none (4.8e3) / none (5.5) / 50 / 54 / 50 / none
# (3.3e2). Seeds 3 (the small scenario's) and 0 stand for the two outcomes.
NONCONVEX_SEEDS = {3: True, 0: False}


@pytest.mark.parametrize("seed", sorted(NONCONVEX_SEEDS))
def test_nonconvex_defaults_against_gd_on_the_gradient_target(seed):
    """fedred.md Fig. 1's non-convex instance, every method at its non-convex theory defaults,
    ||grad f(x^r)||^2 (A14, the rounds column grad_norm_sq) against 1e-4, with a tenth of GD's
    rounds (GD at step 1/L run here to its first round below the target). What holds is
    instance dependent (NONCONVEX_SEEDS's note: the paper's claim of about 20x fewer rounds is
    not the theory's guarantee, which is on a uniformly drawn iterate): FedRed-GD (Thm 8: p =
    delta_B / L, eta = 6L, Rand) gets there on half of the instances tried (seed 3: 54 rounds
    of GD's 1096, 7609 gradients per device, about 7 times GD's: eta = 6L makes its step
    1/(6L + delta_B)) and not on the others (seed 0: its smallest ||grad f||^2 over GD's 835 / 10
    rounds stays above 1e-4; the model moves away again, the local iterates of the devices
    leaving x~ between communications, Rand taking one of them). DANE+-GD (Cor. 2 / Cor. 30, R =
    the same tenth) gets there on none: Cor. 30's tolerance 18 delta_B F^_0 / R (about 4e4)
    ends its local solves after about one step once ||grad f||^2 is below it, so it runs like GD
    (seed 3: 2e3 after 109 rounds; with R = 1500, 1e-4 at round 894). It meets what Cor. 30
    promises, min_r ||grad f(x^r)||^2 <= 72 delta_B F_0 / R, checked with F^_0 <= F_0."""
    target = 1e-4
    _, _, gd = _nc_run({"name": "gd", "rounds": 1500}, seed=seed)
    gd_rounds = _rounds_to(gd, target)
    assert gd_rounds is not None
    budget = gd_rounds // 10
    world, _, fedred = _nc_run({"name": "fedred", "rounds": budget}, seed=seed)
    reached = _rounds_to(fedred, target)
    if NONCONVEX_SEEDS[seed]:
        assert reached is not None and reached <= budget
        # gradients on GD's scale: about 6 to 7 times GD's (Thm 8: GD's complexity at eta = 6L)
        grads = fedred.gradient_evaluations[fedred["round"] == reached].iloc[0]
        assert grads <= 10 * gd_rounds
    else:
        assert reached is None, reached
    _, run, dane = _nc_run({"name": "dane-plus", "rounds": budget}, seed=seed)
    resolved = run.extra["resolved"]
    c = world.evaluator.constants
    assert resolved["averaging"] == "rand"
    assert dane.grad_norm_sq.min() <= 72 * c["delta_B"] * resolved["initial_gap"] / budget
    assert _rounds_to(dane, target) is None  # the theory's rule does not get there (docstring)
