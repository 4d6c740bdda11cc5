"""On fedred.md's heterogeneous quadratic with exact gradients, SCAFFOLD reaches the optimum while
FedAvg with several local steps stalls exactly at its closed-form fixed point (client drift)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.conftest import small_doc
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.scenario.loader import scenario_from_document

LR, STEPS, ROUNDS = 0.02, 5, 600


def _run(name):
    doc = small_doc(
        problem={"name": "quadratic", "clients": 5, "dimension": 20, "L": 10.0, "mu": 1.0,
                 "delta": 2.0},
        channel={"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}},
        quantization_bits=32,
        algorithms=[{"name": name, "rounds": ROUNDS, "eval_every": ROUNDS, "lr": LR,
                     "local_steps": STEPS}])
    for key in ("data", "model"):
        doc.pop(key)
    doc["population"] = {"num_devices": 5}
    sc = scenario_from_document(doc, "quadratic.yaml")
    world = build_world(sc)
    return world, pd.DataFrame(run_algorithm(world, sc.algorithms[0]).rows)


def _fedavg_fixed_point(a, c):
    """x = mean_i [M_i^K x + sum_{k<K} M_i^k lr c_i], M_i = I - lr A_i, solved for x."""
    d = c.shape[1]
    eye = np.eye(d)
    mk, drift = np.zeros((d, d)), np.zeros(d)
    for a_i, c_i in zip(a, c):
        m = eye - LR * a_i
        power, acc = eye.copy(), np.zeros((d, d))
        for _ in range(STEPS):
            acc += power
            power = power @ m
        mk += power / len(a)
        drift += acc @ (LR * c_i) / len(a)
    return np.linalg.solve(eye - mk, drift)


def test_scaffold_reaches_the_optimum_where_fedavg_stalls_at_its_drift_bias():
    world, scaffold = _run("scaffold")
    _, fedavg = _run("fedavg")
    prob = world.evaluator
    a, c = prob.a_np, prob.c_np
    x_star = np.linalg.solve(a.mean(0), c.mean(0))
    x_fa = _fedavg_fixed_point(a, c)
    gap = x_fa - x_star
    bias = 0.5 * gap @ a.mean(0) @ gap  # f(x_FA) - f*
    assert bias > 1e-3  # heterogeneous clients: FedAvg's fixed point is not x*
    assert fedavg.suboptimality.iloc[-1] == pytest.approx(bias, rel=1e-3)
    assert scaffold.suboptimality.iloc[-1] < 1e-9
