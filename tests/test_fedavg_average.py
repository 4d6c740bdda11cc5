"""FedSGD, FedAvg and FedProx average the delivered uploads weighted by the devices' sample
counts (McMahan et al. 2017, Alg. 1: sum_{k in S} n_k Delta_k / sum_{k in S} n_k), or uniformly
with ``average: uniform`` (the behaviour before the weights). The truth is a NumPy
re-implementation of one round, softmax regression written out by hand in float64, on devices of
very unequal sizes over an uplink that loses some uploads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import record_delivered, run_recording_thetas, small_doc, small_scenario
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_generator
from wirelessfl.scenario.loader import scenario_from_document

LR, STEPS, MU, BATCH = 0.3, 3, 0.5, 10
# 8 devices with Dir(0.5) sizes (quantity-skew; at least 20 samples each, so every minibatch of
# 10 is 10 distinct samples), softmax regression, float32 on the air, 60 % of the uploads
# delivered.
WORLD = ["partition={scheme: quantity-skew, beta: 0.5, min_samples: 20}", "channel=seed002-pinned",
         "channel.uplink.delivery_probability=0.6", "quantization_bits=32"]


def _run(monkeypatch, algorithm: dict, overrides=()):
    """(world, theta after every round, delivered mask of every round) of one algorithm."""
    delivered = record_delivered(monkeypatch)
    sc = small_scenario([*WORLD, *overrides],
                        algorithms=[{"eval_every": 1, "batch_size": BATCH, **algorithm}])
    world, thetas, _ = run_recording_thetas(monkeypatch, sc)
    monkeypatch.undo()
    return world, thetas, delivered


def _softmax_gradient(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray):
    """Gradient of the mean cross-entropy of softmax(x w^T + b) (by hand)."""
    z = x @ w.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    p /= len(y)
    return p.T @ x, p.sum(0)


def _local_update(name: str, theta: np.ndarray, shapes, batches) -> np.ndarray:
    """The device's upload for one round: FedSGD's gradient at theta, or the model delta of
    E local steps (FedProx: on f_i + mu/2 ||w - theta||^2, Li et al. 2020 eq. 2)."""
    (rows, cols), _ = shapes
    split = rows * cols

    def grad(v, x, y):
        gw, gb = _softmax_gradient(v[:split].reshape(rows, cols), v[split:], x, y)
        return np.concatenate([gw.ravel(), gb])

    if name == "fedsgd":
        return grad(theta, *batches[0])
    v = theta.copy()
    for x, y in batches:
        pull = MU * (v - theta) if name == "fedprox" else 0.0
        v = v - LR * (grad(v, x, y) + pull)
    return v - theta


def _reference_round(world, name: str, theta: np.ndarray, delivered: np.ndarray,
                     weights: np.ndarray, k: int = 0) -> np.ndarray:
    """One round of McMahan et al.'s Alg. 1 (FedSGD: Sec. 2) over the delivered devices with
    weights n_k: theta + sum n_k Delta_k / sum n_k (FedSGD: theta - lr sum n_k g_k / sum n_k)."""
    ev = world.evaluator
    shapes = [tuple(p.shape) for p in world.flat.unflatten(torch.zeros(ev.d)).values()]
    steps = 1 if name == "fedsgd" else STEPS
    idx = ev.sample(keyed_generator(world.scenario.seed, "batch", k), BATCH, steps).cpu().numpy()
    x = ev.data.x.reshape(len(ev.data.x), -1).double().numpy()
    y = ev.data.y.numpy()
    total, weight = np.zeros_like(theta), 0.0
    for i in np.flatnonzero(delivered):
        batches = [(x[idx[e, i]], y[idx[e, i]]) for e in range(steps)]
        total += weights[i] * _local_update(name, theta, shapes, batches)
        weight += weights[i]
    mean = total / weight
    return theta - LR * mean if name == "fedsgd" else theta + mean


@pytest.mark.parametrize("name", ["fedsgd", "fedavg", "fedprox"])
def test_one_round_weights_the_delivered_uploads_by_sample_count(monkeypatch, name):
    extra = {"lr": LR} if name == "fedsgd" else {"lr": LR, "local_steps": STEPS}
    if name == "fedprox":
        extra["mu"] = MU
    runs = {avg: _run(monkeypatch, {"name": name, "rounds": 1, "average": avg, **extra})
            for avg in ("weighted", "uniform")}
    world, _, delivered = runs["weighted"]
    mask = delivered[0]
    assert 1 < mask.sum() < len(mask)  # some uploads lost
    np.testing.assert_array_equal(runs["uniform"][2][0], mask)  # the same channel draws
    sizes = world.evaluator.data.sizes.numpy().astype(float)
    assert sizes.min() >= BATCH and sizes[mask].max() > 3 * sizes[mask].min()  # very unequal
    theta0 = world.initial().double().numpy()
    want = {"weighted": _reference_round(world, name, theta0, mask, sizes),
            "uniform": _reference_round(world, name, theta0, mask, np.ones_like(sizes))}
    gap = np.abs(want["weighted"] - want["uniform"]).max()
    assert gap > 1e-3  # the two averages differ far beyond the tolerance below
    for avg, (_, thetas, _) in runs.items():
        np.testing.assert_allclose(thetas[1].double().numpy(), want[avg], rtol=1e-4,
                                   atol=1e-6 * gap)


def test_server_data_counts_the_base_station_with_its_own_sample_count(monkeypatch):
    """server_data: the base station's delta (E local steps on its own samples, batches drawn
    with replacement from (seed, "server-batch", k)) joins the devices' with weight n_server."""
    algo = {"name": "fedavg", "rounds": 1, "lr": LR, "local_steps": STEPS,
            "server_data": True}
    world, thetas, delivered = _run(monkeypatch, algo, ["data.server_fraction=0.3"])
    ev, mask = world.evaluator, delivered[0]
    theta0 = world.initial().double().numpy()
    shapes = [tuple(p.shape) for p in world.flat.unflatten(torch.zeros(ev.d)).values()]
    gen = keyed_generator(world.scenario.seed, "server-batch", 0)
    xs = ev.data.x_server.reshape(len(ev.data.x_server), -1).double().numpy()
    ys = ev.data.y_server.numpy()
    picks = [torch.randint(len(ys), (BATCH,), generator=gen).numpy() for _ in range(STEPS)]
    server = _local_update("fedavg", theta0, shapes, [(xs[p], ys[p]) for p in picks])
    sizes = ev.data.sizes.numpy().astype(float)
    n_server = float(len(ys))
    assert n_server > sizes.max()  # the server's weight is not a device's
    devices = _reference_round(world, "fedavg", theta0, mask, sizes) - theta0
    weight = sizes[mask].sum()
    want = theta0 + (weight * devices + n_server * server) / (weight + n_server)
    np.testing.assert_allclose(thetas[1].double().numpy(), want, rtol=1e-4, atol=1e-7)


def test_equal_sample_counts_give_exactly_the_uniform_average():
    """Quadratic devices have no samples (equal weights): the weighted run is the uniform run
    bit for bit (the weights are exactly 1), so only unequal partitions change numbers."""
    doc = small_doc(problem={"name": "quadratic", "clients": 5, "dimension": 4},
                    population={"num_devices": 5})
    for key in ("data", "model"):
        doc.pop(key)
    runs = []
    for avg in ("weighted", "uniform"):
        doc["algorithms"] = [{"name": "fedavg", "rounds": 3, "eval_every": 1, "average": avg}]
        sc = scenario_from_document(doc, "quadratic.yaml", WORLD[1:])
        with pytest.MonkeyPatch.context() as patch:
            runs.append(run_recording_thetas(patch, sc)[1])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_logistic_problem_devices_already_carry_their_share():
    """The logistic problem's f_i = (n m_i / M) F_i already weighs device i by its m_i samples
    (fedred.md Sec. 4.2), so its sample weights are equal (M / n each): weighing by m_i again
    would count the sizes twice. Check: the uniform mean of the f_i's exact gradients is the
    gradient of the mean loss over all samples."""
    from wirelessfl.pipeline.build import build_world

    doc = small_doc(data={"name": "breast_cancer"}, problem={"name": "logistic"},
                    population={"num_devices": 5},
                    partition={"scheme": "quantity-skew", "beta": 0.5},
                    algorithms=[{"name": "fedsgd", "rounds": 1}])
    doc.pop("model")
    ev = build_world(scenario_from_document(doc, "logistic.yaml")).evaluator
    assert ev.sizes_np.max() > 3 * ev.sizes_np.min()
    np.testing.assert_array_equal(ev.sample_weights(), ev.M / ev.num_devices)
    x = np.linspace(-0.5, 0.5, ev.d)
    a, y = ev.a_np, ev.y_np
    per_sample = (-y / (1 + np.exp(y * (a @ x))))[:, None] * a
    pooled = per_sample.mean(0) + ev.l2 * x
    mean_of_f_i = ev.full_gradients(torch.as_tensor(x)).double().numpy().mean(0)
    np.testing.assert_allclose(mean_of_f_i, pooled, rtol=1e-10, atol=1e-13)


def test_scaffold_refuses_a_weighted_average():
    with pytest.raises(UserError, match=r"algorithms\[0\]\.average: .*scaffold averages the "
                                        r"sampled clients uniformly"):
        small_scenario(algorithms=[{"name": "scaffold", "average": "weighted"}])
    small_scenario(algorithms=[{"name": "scaffold", "average": "uniform"}])
