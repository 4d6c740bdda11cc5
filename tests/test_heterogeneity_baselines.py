"""FedProx, SCAFFOLD and partial participation against plain per-device references (ordinary
autograd, one device at a time, written from the papers' update rules), full precision and full
delivery so the only difference could be the batched implementation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import run_recording_thetas, small_scenario
from wirelessfl.learning.seeds import keyed_generator

EXACT = ["channel=seed002-pinned", "channel.uplink.delivery_probability=1.0",
         "quantization_bits=32"]


def _thetas(monkeypatch, scenario):
    """Run the scenario's only algorithm; return theta after every round and the run."""
    return run_recording_thetas(monkeypatch, scenario)


def _grad(world, theta, idx):
    ev, model = world.evaluator, world.flat.model
    leaf = {n: p.detach().clone().requires_grad_(True)
            for n, p in world.flat.unflatten(theta.clone()).items()}
    loss = F.cross_entropy(torch.func.functional_call(model, leaf, (ev.data.x[idx],)),
                           ev.data.y[idx])
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(leaf.values()))])


def scaffold_reference_round(world, theta, c, c_i, idx, devices, lr, steps):
    """One SCAFFOLD round (option II, Karimireddy et al. 2020, Alg. 1) of ``devices``, one
    device at a time with plain autograd; updates c_i [N, d] in place, returns (theta, c)."""
    dy, dc = [], []
    for i in devices:
        y = theta.clone()
        for e in range(steps):
            y = y - lr * (_grad(world, y, idx[e, i]) - c_i[i] + c)
        c_plus = c_i[i] - c + (theta - y) / (steps * lr)  # option II
        dy.append(y - theta)
        dc.append(c_plus - c_i[i])
        c_i[i] = c_plus
    return theta + torch.stack(dy).mean(0), c + torch.stack(dc).sum(0) / world.num_devices


def _algorithm(name, rounds=2, **params):
    return small_scenario(EXACT, algorithms=[{"name": name, "rounds": rounds, "eval_every": 1,
                                              "local_steps": 3, "lr": 0.3, **params}])


def test_fedprox_with_mu_zero_is_fedavg(monkeypatch):
    _, prox, _ = _thetas(monkeypatch, _algorithm("fedprox", mu=0.0))
    _, avg, _ = _thetas(monkeypatch, _algorithm("fedavg"))
    for a, b in zip(prox, avg):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_fedprox_matches_a_per_device_reference(monkeypatch):
    mu, lr, steps = 0.5, 0.3, 3
    world, thetas, _ = _thetas(monkeypatch, _algorithm("fedprox", mu=mu))
    theta = thetas[0]
    n_k = world.evaluator.data.sizes.double()  # McMahan et al.'s weights (168 or 169 here)
    for k in range(2):
        idx = world.evaluator.sample(keyed_generator(3, "batch", k), 10, steps)
        new = []
        for i in range(world.num_devices):
            w = theta.clone()
            for e in range(steps):
                w = w - lr * (_grad(world, w, idx[e, i]) + mu * (w - theta))
            new.append(w)
        theta = (n_k[:, None] * torch.stack(new).double()).sum(0).float() / n_k.sum().float()
        torch.testing.assert_close(thetas[k + 1], theta, rtol=1e-4, atol=1e-6)


def test_scaffold_matches_a_per_device_reference(monkeypatch):
    lr, steps = 0.3, 3
    world, thetas, _ = _thetas(monkeypatch, _algorithm("scaffold", rounds=3))
    n, theta = world.num_devices, thetas[0]
    c, c_i = torch.zeros_like(theta), torch.zeros(n, theta.numel())
    for k in range(3):
        idx = world.evaluator.sample(keyed_generator(3, "batch", k), 10, steps)
        theta, c = scaffold_reference_round(world, theta, c, c_i, idx, range(n), lr, steps)
        torch.testing.assert_close(thetas[k + 1], theta, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(c, c_i.mean(0), rtol=1e-5, atol=1e-6)  # c is the mean of the c_i


def test_scaffold_first_round_is_fedavg(monkeypatch):
    """With c = c_i = 0 the first SCAFFOLD round is a FedAvg round (server_lr 1) averaged
    uniformly, as SCAFFOLD's Alg. 1 averages."""
    _, sc, _ = _thetas(monkeypatch, _algorithm("scaffold", rounds=1))
    _, avg, _ = _thetas(monkeypatch, _algorithm("fedavg", rounds=1, average="uniform"))
    torch.testing.assert_close(sc[1], avg[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["fedavg", "dzofl"])
def test_partial_participation_asks_beta_n_devices_each_round(monkeypatch, name):
    rounds, n, beta = 6, 8, 0.25
    sc = small_scenario(EXACT, algorithms=[{"name": name, "rounds": rounds, "eval_every": 1,
                                            "participation": beta}])
    _, _, run = _thetas(monkeypatch, sc)
    led = run.ledger
    assert led.packets_sent.sum() == rounds * round(beta * n)
    rows = pd.DataFrame(run.rows)
    # per round, exactly round(beta N) devices paid compute
    assert np.all(np.diff(rows.transmissions) == round(beta * n))
    assert (led.packets_sent > 0).sum() > round(beta * n)  # different devices in different rounds
    # devices that never took part spent no compute energy
    idle = led.packets_sent == 0
    assert np.all(led.energy_j[idle, :2] == 0)


def test_participants_are_common_across_algorithms(monkeypatch):
    sent = []
    for name in ("fedavg", "fedprox"):
        sc = small_scenario(EXACT, algorithms=[{"name": name, "rounds": 5, "eval_every": 5,
                                                "participation": 0.5}])
        sent.append(_thetas(monkeypatch, sc)[2].ledger.packets_sent.copy())
    np.testing.assert_array_equal(sent[0], sent[1])


def test_server_data_makes_the_base_station_one_more_client(monkeypatch):
    """FedAvg with server_data: with every upload lost, theta moves by exactly the server's own
    E local steps on its data; with full delivery the server's delta is one term of N + 1."""
    lost = ["channel=seed002-pinned", "channel.uplink.delivery_probability=1e-12",
            "quantization_bits=32", "data.server_fraction=0.3"]
    algo = {"name": "fedavg", "rounds": 1, "eval_every": 1, "local_steps": 3, "lr": 0.3,
            "server_data": True}
    world, thetas, _ = _thetas(monkeypatch, small_scenario(lost, algorithms=[algo]))
    ev, theta = world.evaluator, thetas[0]
    gen = keyed_generator(3, "server-batch", 0)
    w = theta.clone()
    for _ in range(3):
        pick = torch.randint(len(ev.data.y_server), (10,), generator=gen)
        leaf = {n: p.detach().clone().requires_grad_(True)
                for n, p in world.flat.unflatten(w.clone()).items()}
        loss = F.cross_entropy(torch.func.functional_call(world.flat.model, leaf,
                                                          (ev.data.x_server[pick],)),
                               ev.data.y_server[pick])
        g = torch.cat([x.reshape(-1) for x in torch.autograd.grad(loss, list(leaf.values()))])
        w = w - 0.3 * g
    torch.testing.assert_close(thetas[1], w, rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match="server_data is not available for scaffold"):
        small_scenario(lost, algorithms=[{"name": "scaffold", "server_data": True}])
