"""Participant-only rounds of ZO-HFL, the drift-corrected family (GD, DANE+, DANE, Scaffold-cv,
FedRed, Scaffnew), FedMSA and FedNest.

Truth: the dense implementations these rounds replaced (wirelessfl/algorithms/drift.py,
zo_hfl.py, fedmsa.py and fednest.py before issue 22), kept below as plain functions over [N, d]
arrays: every device computed, per-device state dense, results masked by the [N] delivered mask.
Run on the same scenario (half the devices asked, a lossy uplink, with and without
retransmissions) they must give the very same models, round after round, as the rounds that
compute only the devices whose work matters. Then: per-device random streams give reproducible,
finite runs, and the rows computed are those of the delivered devices."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import (
    algorithm_scenario,
    record_collects,
    record_delivered,
    run_recording_thetas,
)
from wirelessfl.algorithms import drift, fedmsa, fednest, zo_hfl
from wirelessfl.contract.payload import Cost, Payload
from wirelessfl.learning.seeds import keyed_generator, keyed_rng

LOSSY = ["channel.uplink.tx_power_dbm=-10"]


# ---- the dense reference (the code before participant-only rounds) ------------------------------
def holders(self) -> np.ndarray:
    return self.participants(self.round_index) & (self.missed == 0) & self.ctx.net.alive


def local_gradients(self, models, k, step):
    ev = self.ctx.evaluator
    if self.params.full_batch:
        return ev.full_gradients(models)
    idx = ev.sample(keyed_generator(self.ctx.seed, "batch", k, step), self.params.batch_size)[0]
    return torch.cat([ev.stacked_gradients(models[rows], idx[rows])
                      for rows in ev.chunks(self.params.batch_size, own_model=True)])


def average(self, vectors, delivered, stream, k, combine=None):
    mask = torch.as_tensor(delivered, device=vectors.device)
    if not bool(mask.any()):
        return None
    sent = self.quantize(vectors.float(), f"{self.name}-{stream}-up", k,
                         slice(0, vectors.shape[0]), mask)
    mean = sent[mask].mean(0) if combine is None else combine(sent[mask])
    return self.quantize(mean[None], f"{self.name}-{stream}-down", k, slice(0, 1),
                         direction="down")[0]


def upload(self, cost, payload, active=None):
    result = yield from self.collect(cost, payload, active)
    delivered = np.array(result.delivered, dtype=bool)
    missing = np.asarray(result.active, dtype=bool) & ~delivered
    tries = 0
    while self.params.on_loss == "wait" and missing.any() and tries < self.params.max_retries:
        again = yield from self.ctx.net.collect(Cost(), payload, missing)
        arrived = np.asarray(again.delivered, dtype=bool)
        self.ctx.health.collected(again.active, arrived)
        delivered |= arrived
        missing &= ~arrived & self.ctx.net.alive
        tries += 1
    return delivered


def broadcast_mean(self, mean, d):
    if mean is None:
        yield from self.broadcast(Payload.scalar(self.bits, label="no-update flag"))
    else:
        yield from self.broadcast(Payload.vectors(d, self.bits))


def all_reduce(self, anchor, k, stream="grad"):
    d = anchor.numel()
    grads = self.ctx.evaluator.full_gradients(anchor.to(self.dtype))
    delivered = yield from upload(self, self.exact_cost(), Payload.vectors(d, self.bits))
    mean = average(self, grads, delivered, stream, k)
    yield from broadcast_mean(self, mean, d)
    return grads, mean, delivered


def exchange_models(self, models, cost, k, active, stream="model", combine=None):
    d = models.shape[1]
    delivered = yield from upload(self, cost, Payload.vectors(d, self.bits), active)
    mean = average(self, models, delivered, stream, k, combine)
    yield from broadcast_mean(self, mean, d)
    return mean


def gd_round(self, k):
    d = self.theta.numel()
    active = holders(self)
    grads = local_gradients(self, self.theta.to(self.dtype).expand(self.ctx.num_devices, -1),
                            k, 0)
    delivered = yield from upload(self, self.gradient_cost(1), Payload.vectors(d, self.bits),
                                  active)
    mean = average(self, grads, delivered, "grad", k)
    yield from broadcast_mean(self, mean, d)
    if mean is not None:
        self.theta = self.theta - self.lr * mean


def dane_solve(self, x, h, mean_grad, active, r):
    p, n = self.params, self.ctx.num_devices
    adaptive = p.local_steps is None
    limit = p.max_local_steps if adaptive else p.local_steps
    if isinstance(self, drift.Dane):
        self._start_sq = float(mean_grad.square().sum())
    y = x.expand(n, -1).clone()
    running = torch.as_tensor(active, device=x.device).clone()
    evaluations = torch.zeros(n, dtype=torch.int64)
    grad = mean_grad.expand(n, -1)
    floor = drift.GRADIENT_FLOOR[self.dtype] * max(1.0, float(mean_grad.norm()))
    for t in range(limit + 1):
        if t > 0 or not p.full_batch:
            if t == limit and not adaptive:
                break
            grad = local_gradients(self, y, r, t) - h + self.lam * (y - x)
            evaluations += running.cpu()
            if adaptive and t > 0:
                grad_sq = grad.square().sum(1)
                done = self.stop(grad_sq, (y - x).square().sum(1), r)
                running &= ~(done | (grad_sq.sqrt() <= floor))
                if not bool(running.any()):
                    break
        if t == limit:
            break
        y = torch.where(running[:, None], y - self.lr * grad, y)
    return y, evaluations.numpy()


def dane_round(self, r):
    x = self.theta.to(self.dtype)
    grads, mean, in_mean = yield from all_reduce(self, self.theta, r)
    if mean is None:
        return
    mean = mean.to(self.dtype)
    active = holders(self) & in_mean
    y, evaluations = dane_solve(self, x, grads - mean, mean, active, r)
    self.round_local_steps = float(evaluations[active].mean()) if active.any() else 0.0
    new = yield from exchange_models(self, y, self.gradient_cost(evaluations), r, active)
    if new is not None:
        self.theta = self.theta + self.params.server_lr * (new - self.theta)


def fedred_steps(self, x_ref, steps, active, k):
    p, n = self.params, self.ctx.num_devices
    on = torch.as_tensor(active)[:, None]
    evaluations = np.zeros(n, dtype=np.int64)
    for t in range(steps):
        if p.solver == "gd":
            g = local_gradients(self, self.dense_models, k, t)
            step = g - self.dense_h + self.lam * (self.dense_models - x_ref)
            self.dense_models = torch.where(on, self.dense_models - self.lr * step,
                                            self.dense_models)
            evaluations += active
            continue
        anchor = self.dense_models
        y = anchor.clone()
        running = on[:, 0].clone()
        for _ in range(p.exact_steps):
            g = local_gradients(self, y, k, t) - self.dense_h + self.eta * (y - anchor) \
                + self.lam * (y - x_ref)
            evaluations += running.cpu().numpy()
            running &= g.norm(dim=1) > p.exact_tolerance
            if not bool(running.any()):
                break
            y = torch.where(running[:, None], y - self.inner_lr * g, y)
        self.dense_models = torch.where(on, y, self.dense_models)
    return evaluations


def fedred_round(self, k):
    if getattr(self, "dense_models", None) is None:
        grads, mean, _ = yield from all_reduce(self, self.theta, k, "grad-init")
        self.dense_models = self.theta.to(self.dtype).expand(self.ctx.num_devices, -1).clone()
        self.dense_h = grads - mean.to(self.dtype) if mean is not None else torch.zeros_like(grads)
    steps = drift.coin_steps(self.ctx.seed, self.p, k)
    self.round_local_steps = steps
    active = holders(self)
    evaluations = fedred_steps(self, self.theta.to(self.dtype), steps, active, k)
    new = yield from exchange_models(self, self.dense_models, self.gradient_cost(evaluations),
                                     k, active)
    if new is None:
        return
    self.theta = new
    grads, mean, _ = yield from all_reduce(self, self.theta, k)
    if mean is not None:
        self.dense_h = grads - mean.to(self.dtype)


def scaffnew_round(self, k):
    if getattr(self, "dense_models", None) is None:
        self.dense_models = self.theta.to(self.dtype).expand(self.ctx.num_devices, -1).clone()
        self.dense_h = torch.zeros_like(self.dense_models)
    steps = drift.coin_steps(self.ctx.seed, self.p, k)
    self.round_local_steps = steps
    active = holders(self)
    on = torch.as_tensor(active)[:, None]
    hat = self.dense_models
    for t in range(steps):
        if t > 0:
            self.dense_models = torch.where(on, hat, self.dense_models)
        g = local_gradients(self, self.dense_models, k, t)
        hat = torch.where(on, self.dense_models - self.lr * (g - self.dense_h), self.dense_models)
    d = self.theta.numel()
    sent = hat - (self.lr / self.p) * self.dense_h
    delivered = yield from upload(self, self.gradient_cost(active.astype(np.int64) * steps),
                                  Payload.vectors(d, self.bits), active)
    mean = average(self, sent, delivered, "model", k)
    yield from broadcast_mean(self, mean, d)
    if mean is None:
        self.dense_models = torch.where(on, hat, self.dense_models)
        return
    self.theta = mean
    x_bar = mean.to(self.dtype)
    arrived = torch.as_tensor(delivered)[:, None]
    self.dense_h = torch.where(arrived, self.dense_h + (self.p / self.lr) * (x_bar - hat),
                               self.dense_h)
    self.dense_models = torch.where(on, x_bar.expand_as(self.dense_models), self.dense_models)


def zo_hfl_round(self, r):
    p, ev, ctx = self.params, self.ctx.evaluator, self.ctx
    d, n = self.theta.numel(), ctx.num_devices
    steps = self.local_steps(r)
    self.round_local_steps = 2 * steps
    chosen = self.participants(r) & (self.missed == 0)
    up, _ = self.declared_payloads(d, self.bits, payload=p.payload)
    common, own = self.downlink_payloads(d, self.bits, int(chosen.sum()), p.payload, p.directions)
    yield from self.broadcast(common, self.theta)
    if own is not None:
        chosen &= self.missed == 0
        sent = yield from self.unicast(own, chosen)
        chosen &= sent.received
    cost = Cost(forward_passes=2 * steps, backward_passes=2 * steps,
                batch_size=ev.minibatch_sizes(p.batch_size))
    result = yield from self.collect(cost, up, chosen)
    delivered = np.asarray(result.delivered, dtype=bool)
    g = ev.server_gradient(self.theta, keyed_generator(ctx.seed, "zo-hfl-server", r),
                           p.server_batch_size)
    if delivered.any():
        z = torch.randn((n, d), generator=keyed_generator(ctx.seed, "zo-hfl-v", r))
        v = z / z.norm(dim=1, keepdim=True)
        plus = ev.sample(keyed_generator(ctx.seed, "batch", r), p.batch_size, steps)
        minus = plus if p.common_batches else ev.sample(
            keyed_generator(ctx.seed, "batch-minus", r), p.batch_size, steps)
        diff = torch.zeros(n, dtype=torch.float64)
        for rows in ev.chunks(p.batch_size, own_model=True):
            if not delivered[rows].any():
                continue
            x_plus, x_minus = self.theta + p.eta * v[rows], self.theta - p.eta * v[rows]
            y_plus, y_minus = self._solve(x_plus, plus, rows), self._solve(x_minus, minus, rows)
            if p.payload == "models":
                y_plus = self.quantize(y_plus, "zo-hfl-up-plus", r, rows, delivered[rows])
                y_minus = self.quantize(y_minus, "zo-hfl-up-minus", r, rows, delivered[rows])
            diff[rows] = (0.5 * p.lam * (x_plus - y_plus).double().square().sum(1)
                          - 0.5 * p.lam * (x_minus - y_minus).double().square().sum(1))
        if p.payload == "seed":
            diff = self.quantize_scalars(diff, p.fixed_range(),
                                         keyed_generator(ctx.seed, "zo-hfl-up", r), delivered)
        w = torch.as_tensor(self.weights) * torch.as_tensor(delivered)
        a = (w if p.weights == "paper" else w / w.sum()).to(torch.float64)
        coeff = (a * diff * (d / (2 * p.eta))).to(self.theta.dtype)
        g = g + (coeff[:, None] * v).sum(0)
    self.theta = self.theta - p.gamma0 / np.sqrt(r + 1) * g


def fedmsa_round(self, r):
    p, ev, n = self.params, self.ctx.evaluator, self.ctx.num_devices
    rho = 1.0 if r == 0 or self.direction is None else p.rho
    steps = 1 if r == 0 else p.local_steps
    self.round_local_steps = steps
    state = self.theta.to(torch.float64)
    everyone = torch.arange(n)
    keys = self.keys(r, 0)
    local = ev.maps(state.expand(n, -1), everyone, keys)
    evaluations = 1
    if rho < 1:
        before = ev.maps(self.previous.expand(n, -1), everyone, keys)
        local = local + (1 - rho) * (self.direction - before)
        evaluations = 2
    cost = ev.evaluation_cost(evaluations, p.full_batch, p.batch_size)
    mean = yield from exchange_models(self, local, cost, r, holders(self), "direction")
    if mean is None:
        return
    self.previous, self.direction = state, mean.to(torch.float64)
    eligible = np.flatnonzero(holders(self))
    if not len(eligible):
        return
    count = min(p.local_clients, len(eligible))
    chosen = np.sort(keyed_rng(self.ctx.seed, "fedmsa-select", r).choice(eligible, count,
                                                                         replace=False))
    rows = torch.as_tensor(chosen)
    current = state.expand(count, -1).clone()
    last = current.clone()
    direction = self.direction.expand(count, -1).clone()
    for k in range(1, steps + 1):
        if k > 1 and p.refresh:
            step_keys = self.keys(r, k)
            step_keys = None if step_keys is None else step_keys[chosen]
            direction = (ev.maps(current, rows, step_keys) + direction
                         - ev.maps(last, rows, step_keys))
        last, current = current, current - self.steps * direction
    selected = np.zeros(n, dtype=bool)
    selected[chosen] = True
    per_device = np.where(selected, 2 * (steps - 1) if p.refresh else 0, 0)
    models = state.expand(n, -1).clone()
    models[rows] = current
    new = yield from exchange_models(
        self, models, ev.evaluation_cost(per_device, p.full_batch, p.batch_size), r, selected)
    if new is not None:
        self.theta = new


def spread(self, rows, values):
    out = values.new_zeros((self.ctx.num_devices, values.shape[1]))
    out[rows] = values
    return out


def stage_rows(self, stage):
    self.stage = stage
    active = holders(self)
    return active, torch.as_tensor(np.flatnonzero(active))


def fednest_round(self, r):
    """FedNest's outer iteration as it was (``neumann_form: sum``)."""
    p, ev = self.params, self.ctx.evaluator
    dx, dw = ev.dx, ev.dw
    state = self.theta.to(torch.float64)
    x, w = state[:dx], state[dx:dx + dw]
    inner_steps = []
    for t in range(p.inner_rounds):
        active, rows = stage_rows(self, t)
        snapshot = ev.inner_gradients(x.expand(len(rows), -1), w.expand(len(rows), -1), rows)
        q = yield from exchange_models(self, spread(self, rows, snapshot), self._cost(1), r,
                                       active, f"inner-gradient-{t}")
        if q is None:
            return
        local, steps = self.local_epochs(r, t, x, w, q.to(torch.float64), rows, snapshot)
        inner_steps.append(float(steps.mean()) if len(steps) else 0.0)
        new_w = yield from exchange_models(self, spread(self, rows, local),
                                           self._epoch_cost(rows, steps), r, holders(self),
                                           f"inner-model-{t}")
        if new_w is None:
            return
        w = new_w.to(torch.float64)
    self.round_local_steps = sum(inner_steps) + p.outer_steps
    active, rows = stage_rows(self, p.inner_rounds)
    xs, ws = x.expand(len(rows), -1), w.expand(len(rows), -1)
    f_x, f_w = ev.outer_gradients(xs, ws, rows)
    u0 = yield from exchange_models(self, spread(self, rows, f_w), self._cost(1), r, active,
                                    "outer-gradient")
    if u0 is None:
        return
    term = u0.to(torch.float64)
    v = term.clone()
    for k in range(p.neumann_terms):
        hvp = ev.second_order(xs, ws, term.expand(len(rows), -1), rows)[0]
        mean = yield from exchange_models(self, spread(self, rows, hvp), self._cost(1, 1), r,
                                          holders(self), f"neumann-{k}")
        if mean is None:
            return
        term = term - p.eta * mean.to(torch.float64)
        v = v + term
    jvp = ev.second_order(xs, ws, v.expand(len(rows), -1), rows)[1]
    h = yield from exchange_models(self, spread(self, rows, f_x - jvp), self._cost(1, 1), r,
                                   holders(self), "hypergradient")
    if h is None:
        return
    h = h.to(torch.float64)
    local = xs.clone()
    for _ in range(p.outer_steps):
        local = local - p.alpha * (ev.outer_gradients(local, ws, rows)[0] - f_x + h)
    new_x = yield from exchange_models(self, spread(self, rows, local), self._cost(p.outer_steps),
                                       r, holders(self), "outer-model")
    if new_x is None:
        return
    self.theta = torch.cat([new_x.to(torch.float64), w, v]).to(self.theta.dtype)


DENSE = {drift.GD: gd_round, drift.DanePlus: dane_round, drift.FedRed: fedred_round,
         drift.Scaffnew: scaffnew_round, zo_hfl.ZOHFL: zo_hfl_round,
         fedmsa.FedMSA: fedmsa_round, fednest.FedNest: fednest_round}

# (algorithm, overrides): every changed class, the -SGD variants, both loss rules and both of
# ZO-HFL's payloads and weightings
CASES = [
    ({"name": "gd"}, ()), ({"name": "gd", "full_batch": False, "on_loss": "drop"}, ()),
    ({"name": "dane-plus"}, ()), ({"name": "dane-plus", "on_loss": "drop"}, ()),
    ({"name": "dane", "on_loss": "drop"}, ()),
    ({"name": "scaffold-cv", "full_batch": False, "local_steps": 3, "on_loss": "drop"}, ()),
    ({"name": "fedred", "on_loss": "drop"}, ()),
    ({"name": "fedred", "full_batch": False, "on_loss": "drop"}, ()),
    ({"name": "scaffnew", "on_loss": "drop"}, ()),
    ({"name": "scaffnew", "full_batch": False}, ()),
    ({"name": "zo-hfl", "tau": 2.0}, ("data.server_fraction=0.3",)),
    ({"name": "zo-hfl", "tau": 2.0, "payload": "seed", "weights": "renormalised"},
     ("data.server_fraction=0.3",)),
    ({"name": "fedmsa", "on_loss": "drop", "local_clients": 2}, ()),
    ({"name": "fedmsa", "full_batch": False, "local_clients": 2}, ()),
    ({"name": "fednest", "inner_rounds": 2, "outer_steps": 2}, ()),
]


def _scenario(algorithm, overrides=(), streams=()):
    return algorithm_scenario({"rounds": 4, "eval_every": 1, "participation": 0.5,
                               **algorithm}, [*LOSSY, *overrides, *streams])


def _dense(monkeypatch, name):
    """Patch the class of ``name`` (the most derived with a dense reference) to run it."""
    from wirelessfl.plugins import ALGORITHMS

    cls = ALGORITHMS.get(name)
    base = next(c for c in cls.__mro__ if c in DENSE)
    monkeypatch.setattr(cls, "round", DENSE[base])


@pytest.mark.parametrize("algorithm, overrides", CASES,
                         ids=[f"{a['name']}-{i}" for i, (a, _) in enumerate(CASES)])
def test_participant_only_rounds_equal_the_dense_rounds(monkeypatch, algorithm, overrides):
    """Same models, round after round, bit for bit, as the dense reference; and the lossy
    uplink really left some asked devices out (so the masks mattered)."""
    sc = _scenario(algorithm, overrides)
    delivered = record_delivered(monkeypatch)
    _, sparse, _ = run_recording_thetas(monkeypatch, sc)
    sparse = list(sparse)
    first = [int(d.sum()) for d in delivered]
    _dense(monkeypatch, algorithm["name"])
    _, dense, _ = run_recording_thetas(monkeypatch, sc)
    assert len(sparse) == len(dense) == 5
    for a, b in zip(sparse, dense):
        assert torch.equal(a, b)
    assert not torch.equal(sparse[0], sparse[-1])
    n = sc.population.num_devices
    assert any(0 < count < n // 2 for count in first)  # the asked half partly delivered


@pytest.mark.parametrize("algorithm, overrides", [CASES[i] for i in (0, 3, 7, 8, 10, 11, 13)],
                         ids=["gd", "dane-plus", "fedred-sgd", "scaffnew", "zo-hfl",
                              "zo-hfl-seed", "fedmsa"])
def test_per_device_runs_are_reproducible_and_finite(monkeypatch, algorithm, overrides):
    """Per-device random streams: the network asked by index, two runs give the same models,
    finite, and the model moves."""

    sc = _scenario(algorithm, overrides, ["population.random_streams=per-device"])
    by_index = record_collects(monkeypatch, lambda _, result: result.devices is not None)
    _, first, _ = run_recording_thetas(monkeypatch, sc)
    _, again, _ = run_recording_thetas(monkeypatch, sc)
    assert by_index and all(by_index)
    for a, b in zip(first, again):
        assert torch.equal(a, b) and bool(torch.isfinite(a).all())
    assert not torch.equal(first[0], first[-1])


def test_only_needed_devices_are_computed(monkeypatch):
    """GD computes gradients for the delivered devices alone; Scaffnew's local steps run for
    the asked holders (half the devices), and its state holds rows only for devices that
    stepped."""
    from wirelessfl.plugins import ALGORITHMS
    from wirelessfl.problems.base import Problem

    ev_cls = None
    rows = []

    def counting(self, models, idx):
        rows.append(models.shape[0])
        return original(self, models, idx)

    sc = _scenario({"name": "gd", "full_batch": False, "on_loss": "drop"})
    from wirelessfl.pipeline.build import build_world

    ev_cls = type(build_world(sc).evaluator)
    assert issubclass(ev_cls, Problem)
    original = ev_cls.stacked_gradients
    monkeypatch.setattr(ev_cls, "stacked_gradients", counting)
    delivered = record_delivered(monkeypatch)
    run_recording_thetas(monkeypatch, sc)
    assert rows == [int(d.sum()) for d in delivered if d.any()]
    assert max(rows) < sc.population.num_devices // 2

    rows.clear()
    delivered.clear()
    held = []
    scaffnew = ALGORITHMS.get("scaffnew")
    round_ = scaffnew.round

    def recording(self, k):
        yield from round_(self, k)
        held.append((self.models.held, self.h.held))

    monkeypatch.setattr(scaffnew, "round", recording)
    sc = _scenario({"name": "scaffnew", "full_batch": False, "on_loss": "drop"})
    run_recording_thetas(monkeypatch, sc)
    n = sc.population.num_devices
    assert rows and all(r == n // 2 for r in rows)  # every local step: the asked half
    assert held[0][0] == n // 2  # x_i of the devices that stepped
    assert held[0][1] == int(delivered[0].sum())  # h_i only where an upload arrived


def test_state_rows_follow_the_participants():
    """The memory check's rows: at full participation the dense count (peak_device_arrays x N,
    the estimate before participant-only rounds); at 1 % of 100,000 devices over 10 rounds,
    by hand: the participants' work arrays, the held rows of the devices that took part
    (N (1 - 0.99^10) + one storage block); exact gradients evaluate the participants alone."""
    from wirelessfl.plugins import ALGORITHMS

    def rows(name, n, beta, **params):
        cls = ALGORITHMS.get(name)
        p = cls.Params(name=name, rounds=10, participation=beta, **params)
        return cls.state_rows(n, p)

    for name in ("gd", "dane-plus", "fedred", "scaffnew", "zo-hfl", "fedmsa"):
        assert rows(name, 500, 1.0) == ALGORITHMS.get(name).peak_device_arrays * 500
    n, ever = 100_000, 100_000 * (1 - 0.99**10) + 1024
    assert rows("gd", n, 0.01, full_batch=False) == 7 * 1000
    assert rows("gd", n, 0.01) == 7 * 1000  # full_batch: the participants' rows only
    assert rows("fedred", n, 0.01, full_batch=False) == pytest.approx(6 * 1000 + ever)
    assert rows("scaffnew", n, 0.01, full_batch=False) == pytest.approx(5 * 1000 + 2 * ever)
    assert rows("zo-hfl", n, 0.01) == 3 * 1000  # per-device streams: directions of 1,000
    assert rows("fednest", n, 0.01, full_batch=True) == 7 * 1000  # its own oracles


def test_zo_hfl_memory_counts_the_shared_draw_of_every_direction():
    """ZO-HFL's directions: with shared random streams one [N, d] draw of which the participants
    take their rows; with per-device streams the participants' rows alone. The estimates of the
    same scenario's round state differs by the non-participants' rows, (N - round(beta N)) d
    values (5,000 devices: the round, not loading the data, is the peak)."""
    from wirelessfl.pipeline.memory import estimate_memory, problem_facts

    def estimate(streams):
        sc = _scenario({"name": "zo-hfl", "tau": 2.0},
                       ("data.server_fraction=0.3", "population.num_devices=5000"),
                       [f"population.random_streams={streams}"])
        return sc, estimate_memory(sc)

    sc, shared = estimate("shared")
    _, own = estimate("per-device")
    n, facts = sc.population.num_devices, problem_facts(sc)
    assert shared.worst == own.worst == "zo-hfl"
    assert own.parts["state"] == 3 * round(0.5 * n) * facts.d * facts.itemsize
    assert shared.parts["state"] - own.parts["state"] == (
        (n - round(0.5 * n)) * facts.d * facts.itemsize)
