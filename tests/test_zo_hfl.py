"""ZO-HFL (seed 000) against a per-device reference written from Algorithms 1-2 of the spec, and
its two payload modes against each other."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import run_recording_thetas, small_scenario
from wirelessfl.algorithms.base import Algorithm
from wirelessfl.channel.link import Downlink
from wirelessfl.engine.context import RunContext
from wirelessfl.engine.ledger import KIND_INDEX
from wirelessfl.learning.seeds import keyed_generator, keyed_rng
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm

EXACT = ["channel=seed002-pinned", "channel.uplink.delivery_probability=1.0",
         "quantization_bits=32", "data.server_fraction=0.3"]


def _run(monkeypatch, overrides=(), **params):
    algo = {"name": "zo-hfl", "rounds": 2, "eval_every": 1, "tau": 2, "gamma0": 0.5,
            "batch_size": 8, "server_batch_size": 8, **params}
    sc = small_scenario([*EXACT, *overrides], algorithms=[algo])
    return run_recording_thetas(monkeypatch, sc)


def _ce_grad(world, theta, x, y):
    leaf = {n: p.detach().clone().requires_grad_(True)
            for n, p in world.flat.unflatten(theta.clone()).items()}
    loss = F.cross_entropy(torch.func.functional_call(world.flat.model, leaf, (x,)), y)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(leaf.values()))])


def _reference(world, theta, delivered, weights="paper", taus=None):
    """x_r after each round of Alg. 1 with Alg. 2's solves, device by device (tau = 2, eta = 0.1,
    lam = mu = 1, inner_lr0 = 0.1, B = B_s = 8, gamma0 = 0.5, seed 3): g = server gradient +
    sum_i a_i (d / (2 eta)) (F+ - F-) v_i over the clients in ``delivered[r]``, a_i = w_i
    (``paper``) or w_i / sum of the delivered w_j (``renormalised``), w_i = N_i / N. ``taus``
    (per client, default 2 each): client i runs H_{i,r} = ceil(tau_i sqrt(r+1)) steps in both
    solves (zo_hfl.md 2.2), on the first H_{i,r} minibatches of its own row of the round's
    draw, drawn here for its own H_{i,r} alone; H_{i,r} = 0 returns y_0 = x."""
    ev, n, d = world.evaluator, world.num_devices, world.flat.d
    eta, lam, mu, lr0, b = 0.1, 1.0, 1.0, 0.1, 8
    taus = [2.0] * n if taus is None else taus
    sizes = ev.data.sizes.double()
    thetas = [theta]
    for r, mask in enumerate(delivered):
        w = sizes / sizes.sum() * torch.as_tensor(mask, dtype=torch.float64)
        a = (w if weights == "paper" else w / w.sum()).float()
        z = torch.randn((n, d), generator=keyed_generator(3, "zo-hfl-v", r))
        v = z / z.norm(dim=1, keepdim=True)
        pick = torch.randint(len(ev.data.y_server), (8,),
                             generator=keyed_generator(3, "zo-hfl-server", r))
        g = _ce_grad(world, theta, ev.data.x_server[pick], ev.data.y_server[pick])
        for i in np.flatnonzero(mask):
            steps = math.ceil(taus[i] * math.sqrt(r + 1))
            plus = ev.sample(keyed_generator(3, "batch", r), b, steps)
            minus = ev.sample(keyed_generator(3, "batch-minus", r), b, steps)
            f = []
            for sign, idx in ((1.0, plus), (-1.0, minus)):
                x = theta + sign * eta * v[i]
                y = x.clone()
                for t in range(steps):
                    batch = idx[t, i]
                    y = y - lr0 / (t + 1) * (_ce_grad(world, y, ev.data.x[batch], ev.data.y[batch])
                                             + mu * (y - x))
                f.append(0.5 * lam * float((x - y).double().square().sum()))
            g = g + a[i] * (d / (2 * eta)) * (f[0] - f[1]) * v[i]
        theta = theta - 0.5 / math.sqrt(r + 1) * g
        thetas.append(theta)
    return thetas


def _record_collects(monkeypatch):
    """Every collect's result (who took part, whose upload arrived), as the network returned it."""
    seen = []
    original = Algorithm.collect

    def collect(self, *args, **kwargs):
        result = yield from original(self, *args, **kwargs)
        seen.append(result)
        return result

    monkeypatch.setattr(Algorithm, "collect", collect)
    return seen


def test_matches_a_per_device_reference(monkeypatch):
    world, thetas, _ = _run(monkeypatch)
    want = _reference(world, thetas[0], [np.ones(world.num_devices, dtype=bool)] * 2)
    for got, ref in zip(thetas[1:], want[1:]):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_weights_under_partial_participation_and_loss(monkeypatch):
    """beta = 0.5 (4 of 8 asked) and half the uploads lost: rounds with 2, 1 and 3 clients
    delivered. ``paper`` (the default) weighs each delivered client by its data share w_i, as
    Alg. 1's sum over all m clients does with the absent ones at 0; ``renormalised`` rescales the
    delivered w_i to sum to 1, so the lone client of round 1 counts with weight 1."""
    lossy = ["channel.uplink.delivery_probability=0.5"]
    runs = {}
    for weights in ("paper", "renormalised"):
        collects = _record_collects(monkeypatch)
        world, thetas, _ = _run(monkeypatch, lossy, rounds=3, participation=0.5,
                                **({} if weights == "paper" else {"weights": weights}))
        monkeypatch.undo()
        delivered = [np.asarray(c.delivered, dtype=bool) for c in collects]
        assert [int(m.sum()) for m in delivered] == [2, 1, 3]
        want = _reference(world, thetas[0], delivered, weights)
        for got, ref in zip(thetas[1:], want[1:]):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
        runs[weights] = thetas
    # the rules differ from round 0 on (two delivered clients' w_i sum to less than 1)
    assert not torch.allclose(runs["paper"][1], runs["renormalised"][1], rtol=1e-3, atol=1e-4)


def test_seed_mode_gives_the_paper_update_at_full_precision(monkeypatch):
    _, models, run_m = _run(monkeypatch, payload="models")
    _, seeds, run_s = _run(monkeypatch, payload="seed")
    for a, b in zip(models, seeds):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # ... with a fraction of the uplink: one 32-bit scalar instead of two d-vectors
    assert run_s.ledger.bits_up.sum() * 2 * 650 == run_m.ledger.bits_up.sum()


def test_without_coupling_it_is_server_sgd(monkeypatch):
    world, thetas, run = _run(monkeypatch, lam=0.0)
    ev = world.evaluator
    theta = thetas[0]
    for r in range(2):
        pick = torch.randint(len(ev.data.y_server), (8,),
                             generator=keyed_generator(3, "zo-hfl-server", r))
        g = _ce_grad(world, theta, ev.data.x_server[pick], ev.data.y_server[pick])
        theta = theta - 0.5 / math.sqrt(r + 1) * g
        torch.testing.assert_close(thetas[r + 1], theta, rtol=1e-5, atol=1e-6)
    # the clients still did (and paid for) their two solves of ceil(2 sqrt(r+1)) steps
    assert np.all(run.ledger.energy_j[:, 1] > 0)


def test_server_data_is_kept_off_the_devices(monkeypatch):
    world, _, _ = _run(monkeypatch)
    ev = world.evaluator
    total = len(world.dataset.y_train)
    assert len(ev.data.y_server) == round(0.3 * total)
    assert len(ev.data.y_server) + int(ev.data.sizes.sum()) == total


def _quadratic_bilevel(rounds, payload="models", bits=32):
    from tests.conftest import small_doc
    from wirelessfl.scenario.loader import scenario_from_document

    doc = small_doc(problem={"name": "quadratic", "clients": 3, "dimension": 4, "L": 4.0,
                             "mu": 1.0, "delta": 0.5, "server_loss": True},
                    channel={"profile": "seed002-pinned",
                             "uplink": {"delivery_probability": 1.0}},
                    quantization_bits=bits,
                    algorithms=[{"name": "zo-hfl", "rounds": rounds, "eval_every": rounds,
                                 "tau": 8, "gamma0": 0.5, "inner_lr0": 0.5, "payload": payload}])
    for key in ("data", "model"):
        doc.pop(key)
    doc["population"] = {"num_devices": 3}
    return scenario_from_document(doc, "bilevel.yaml")


def test_converges_to_the_closed_form_bilevel_solution_on_quadratic_clients(monkeypatch):
    """f_i(y) = 1/2 y^T A_i y - c_i^T y, lower level y_i(x) = argmin f_i(y) + (mu/2)||y - x||^2
    = (A_i + mu I)^-1 (c_i + mu x); upper level f_1(x) (the clients' mean quadratic) +
    (lam / m) sum_i (1/2) ||x - y_i(x)||^2, a quadratic in x solved exactly here. The two-point
    estimate of a quadratic is exact along v, so only the direction sampling (d = 4) and the inner
    solvers' finite steps keep ZO-HFL (step gamma0 / sqrt(r+1)) away from it: 5 % after 200
    rounds, from 100 % at x_0 = 0."""
    seen = []
    original = RunContext.end_round
    monkeypatch.setattr(RunContext, "end_round",
                        lambda self, c, t, *o: (seen.append(t.clone()), original(self, c, t, *o))[1])
    sc = _quadratic_bilevel(200)
    world = build_world(sc)
    run_algorithm(world, sc.algorithms[0])
    prob = world.evaluator
    a, c = prob.a_np, prob.c_np
    m, d = c.shape
    eye, mu, lam = np.eye(d), 1.0, 1.0
    hess, rhs = a.mean(0).copy(), c.mean(0).copy()
    for a_i, c_i in zip(a, c):
        b_i = np.linalg.inv(a_i + mu * eye)
        k_i = eye - mu * b_i  # x - y_i(x) = k_i x - b_i c_i
        hess += lam / m * k_i.T @ k_i
        rhs += lam / m * k_i.T @ b_i @ c_i
    x_bilevel = np.linalg.solve(hess, rhs)
    x_r = seen[-1].double().numpy()
    assert np.linalg.norm(seen[0].double().numpy() - x_bilevel) == np.linalg.norm(x_bilevel)
    assert np.linalg.norm(x_r - x_bilevel) / np.linalg.norm(x_bilevel) < 0.08


def test_payload_modes_agree_on_quadratic_clients(monkeypatch):
    runs = []
    for payload in ("models", "seed"):
        seen = []
        original = RunContext.end_round
        monkeypatch.setattr(RunContext, "end_round",
                            lambda self, c, t, *o, seen=seen, original=original:
                            (seen.append(t.clone()), original(self, c, t, *o))[1])
        sc = _quadratic_bilevel(20, payload)
        run_algorithm(build_world(sc), sc.algorithms[0])
        runs.append(seen)
        monkeypatch.undo()
    torch.testing.assert_close(runs[0][-1], runs[1][-1], rtol=1e-6, atol=1e-7)


def test_seed_mode_scalars_in_the_float_format_track_full_precision(monkeypatch):
    """Seed mode at M = 16 sends F+ - F- as a stochastic float (1 sign, 6 exponent, 9 mantissa
    bits; relative error variance at most sigma(16) ~ 9.5e-7, docs/algorithms.md): nothing
    clips, every upload is counted, and after 20 rounds x stays within 1e-3 [D] (relative) of
    the unquantised seed mode's."""
    runs = []
    for bits in (32, 16):
        seen = []
        original = RunContext.end_round
        monkeypatch.setattr(RunContext, "end_round",
                            lambda self, c, t, *o, seen=seen, original=original:
                            (seen.append(t.clone()), original(self, c, t, *o))[1])
        sc = _quadratic_bilevel(20, "seed", bits)
        assert sc.algorithms[0].scalar_format == "float"
        run = run_algorithm(build_world(sc), sc.algorithms[0])
        runs.append((seen, pd.DataFrame(run.rows).iloc[-1]))
        monkeypatch.undo()
    (full, _), (quantised, last) = runs
    assert last.quantized_up == 3 * 20 and last.clipped_up == 0
    gap = (quantised[-1] - full[-1]).norm() / full[-1].norm()
    assert 0 < gap < 1e-3


def test_local_steps_count_both_solves(monkeypatch):
    """The rounds table's local_steps is each device's local SGD steps, as for FedAvg (E a round)
    and FedNest: 2 H_r a round here (the + and the - solve), ceil(2 sqrt(r+1)) = 2, 3, 4 at
    tau = 2, so 4 + 6 + 8 = 18 over three rounds, one backward pass each."""
    _, _, run = _run(monkeypatch, rounds=3)
    rows = pd.DataFrame(run.rows)
    assert rows.local_steps.tolist() == [0, 4, 10, 18]
    assert run.ledger.backward_passes.tolist() == [18] * 8


EIGHT_DISTANCES = [100, 150, 200, 250, 300, 350, 400, 450]


def _one_round(payload, directions="unicast", engine="vectorized"):
    sc = small_scenario([f"population.distances_m={EIGHT_DISTANCES}", "channel.fading=none",
                         "data.server_fraction=0.3", "quantization_bits=16",
                         f"engine.mode={engine}"],
                        algorithms=[{"name": "zo-hfl", "rounds": 1, "eval_every": 1, "tau": 1,
                                     "participation": 0.5, "payload": payload,
                                     "directions": directions}])
    return sc, run_algorithm(build_world(sc), sc.algorithms[0]).ledger


@pytest.mark.parametrize("engine", ["vectorized", "processes"])
def test_downlink_is_x_broadcast_plus_each_participants_own_direction(engine):
    """zo_hfl.md 3.1's download per client: x broadcast (1 vec, d = 650 values of 16 bits and
    a 32-bit scale) + v_i unicast to client i (1 vec), or a 32-bit seed in mode seed (3.5, 'ZO-HFL
    (B)'). With 4 of 8 devices asked: the others hear x only; the base station is on air for
    the broadcast at the farthest device's rate plus one packet per participant at its own
    rate, and each device listens to the broadcast and its own packet."""
    from tests.test_energy_engine import _broadcast_airtime

    vec = 650 * 16 + 32
    down = KIND_INDEX["downlink"]
    for payload, own in (("models", vec), ("seed", 32)):
        sc, led = _one_round(payload, engine=engine)
        asked = led.packets_sent == 1
        assert asked.sum() == 4
        assert led.bits_down.tolist() == [vec + own * a for a in asked]
        common = _broadcast_airtime(sc, vec, max(EIGHT_DISTANCES))
        unicast = np.array([_broadcast_airtime(sc, own, m) for m in EIGHT_DISTANCES])
        assert led.bs_airtime_s == pytest.approx(common + unicast[asked].sum(), rel=1e-12)
        np.testing.assert_allclose(led.busy_s[:, down], common + unicast * asked, rtol=1e-12)
    # A21's literal reading (one transmission of x and the 4 participants' directions / seeds)
    for payload, size in (("models", 5 * vec), ("seed", vec + 4 * 32)):
        sc, led = _one_round(payload, "broadcast", engine)
        assert led.bits_down.tolist() == [size] * 8
        assert led.bs_airtime_s == pytest.approx(
            _broadcast_airtime(sc, size, max(EIGHT_DISTANCES)), rel=1e-12)


def test_a_lost_direction_sits_the_client_out_without_making_it_stale(monkeypatch):
    """Downlink loss (zo_hfl.md 3.4): a participant that misses x is stale and is resent the
    model before the next round; one that holds x but misses its own v_i only sits this round
    out (it uploads nothing) and is not resent anything."""
    calls = []
    original = Downlink.transmit

    def transmit(link, bits, receivers, rng=None, now_s=0.0, mode=None):
        out = original(link, bits, receivers, rng=rng, now_s=now_s, mode=mode)
        calls.append((mode, np.array(receivers, dtype=bool), out.received.copy()))
        return out

    monkeypatch.setattr(Downlink, "transmit", transmit)
    sc = small_scenario(["seed=8", "data.server_fraction=0.3", "channel.downlink.loss=true",
                         "channel.downlink.tx_power_dbm=0"],
                        algorithms=[{"name": "zo-hfl", "rounds": 2, "eval_every": 1, "tau": 1,
                                     "participation": 0.5}])
    collects = _record_collects(monkeypatch)
    run_algorithm(build_world(sc), sc.algorithms[0])
    (_, everyone, got_x), (mode, asked, got_v), (_, resent, _) = calls[:3]
    assert everyone.all() and mode == "unicast"
    assert (asked & ~got_v).any(), "the setting must lose both kinds of packet"
    participants = np.zeros(8, dtype=bool)  # round 0's draw (Algorithm.participants)
    participants[keyed_rng(8, "participation", 0).choice(8, 4, replace=False)] = True
    assert (participants & ~got_x).any()
    np.testing.assert_array_equal(asked, participants & got_x)  # missed x: no direction
    np.testing.assert_array_equal(collects[0].active, got_v)  # round 0's uploaders
    np.testing.assert_array_equal(resent, ~got_x)  # only those that missed x are resent x


# ---- per-client tau_i (zo_hfl.md 2.2, nonidentical local steps) ----------------------------------

TAUS = [0.0, 1.0, 2.0, 3.0, 0.5, 2.0, 1.5, 4.0]  # H_{i,0} = 0, 1, 2, 3, 1, 2, 2, 4


def _compute(led):
    """Per device: (compute energy [J], compute busy time [s]), forward + backward."""
    kinds = [KIND_INDEX["compute_forward"], KIND_INDEX["compute_backward"]]
    return led.energy_j[:, kinds].sum(1), led.busy_s[:, kinds].sum(1)


def test_per_client_tau_matches_the_per_device_reference(monkeypatch):
    """Each client's own H_{i,r} = ceil(tau_i sqrt(r+1)) in both of its solves, the reference
    drawing each client's minibatches for its own H alone (so a client's minibatches do not
    depend on the others' H), under full and partial participation with lost uploads."""
    world, thetas, _ = _run(monkeypatch, tau_per_device=TAUS)
    want = _reference(world, thetas[0], [np.ones(8, dtype=bool)] * 2, taus=TAUS)
    for got, ref in zip(thetas[1:], want[1:]):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    monkeypatch.undo()
    collects = _record_collects(monkeypatch)
    world, thetas, _ = _run(monkeypatch, ["channel.uplink.delivery_probability=0.5"], rounds=3,
                            participation=0.5, tau_per_device=TAUS)
    delivered = [np.asarray(c.delivered, dtype=bool) for c in collects]
    assert [int(m.sum()) for m in delivered] == [2, 1, 3]
    want = _reference(world, thetas[0], delivered, taus=TAUS)
    for got, ref in zip(thetas[1:], want[1:]):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("payload", "streams"), [("models", "shared"), ("seed", "shared"),
                                                  ("models", "per-device")])
def test_every_tau_i_equal_to_tau_is_the_plain_run_bit_for_bit(monkeypatch, payload, streams):
    lossy = ["channel.uplink.delivery_probability=0.5", "quantization_bits=12",
             f"population.random_streams={streams}"]
    _, plain, run_p = _run(monkeypatch, lossy, rounds=3, participation=0.5, payload=payload)
    _, per, run_t = _run(monkeypatch, lossy, rounds=3, participation=0.5, payload=payload,
                         tau_per_device=[2.0] * 8)
    assert len(plain) == len(per) == 4
    for a, b in zip(plain, per):
        assert torch.equal(a, b)
    for key in ("energy_j", "busy_s", "bits_up", "bits_down", "backward_passes"):
        np.testing.assert_array_equal(getattr(run_p.ledger, key), getattr(run_t.ledger, key))
    keep = [c for c in pd.DataFrame(run_p.rows).columns if "wall" not in c and "host" not in c]
    pd.testing.assert_frame_equal(pd.DataFrame(run_p.rows)[keep], pd.DataFrame(run_t.rows)[keep])


def test_a_client_at_h_zero_returns_y0_and_computes_nothing(monkeypatch):
    """tau_0 = 0: H_{0,r} = 0, so device 0's solves return y_0 = x_r +- eta v_0 unmoved
    (zo_hfl.md 2.2: "a client with H_{i,r} = 0 returns y_0"; 3.1: 2H fwd and bwd, none here);
    it still takes part (hears x and v_0, uploads y+ and y-), and its F+ - F- is 0. Every other
    device is charged 2 H_{i,r} forward and backward passes, each at the energy model's price
    of one pass over its minibatch, and its compute time likewise; the rounds table's
    local_steps is the largest 2 H_{i,r} of the round's participants."""
    from wirelessfl.algorithms.zo_hfl import ZOHFL

    solves = []
    original = ZOHFL._solve

    def solve(self, x, idx, rows, steps=None):
        y = original(self, x, idx, rows, steps)
        solves.append((x, y, steps))
        return y

    monkeypatch.setattr(ZOHFL, "_solve", solve)
    world, _, run = _run(monkeypatch, rounds=3, tau_per_device=TAUS)
    h = np.array([[math.ceil(t * math.sqrt(r + 1)) for t in TAUS] for r in range(3)])
    assert len(solves) == 6  # the + and - solve of 8 devices (one chunk) in each round
    for k, (x, y, steps) in enumerate(solves):
        assert steps.tolist() == h[k // 2].tolist()
        assert torch.equal(y[0], x[0])  # H = 0: y_0, no movement
        assert not torch.equal(y[1:], x[1:])
    led = run.ledger
    passes = 2 * h.sum(0)
    assert passes[0] == 0 and passes.tolist() == led.backward_passes.tolist()
    energy, busy = _compute(led)
    compute = world.compute_model(32)
    sizes = world.evaluator.minibatch_sizes(8)
    for i in range(8):
        b = int(np.broadcast_to(sizes, (8,))[i])
        per_step = (compute.forward_energy_j(b) + compute.backward_energy_j(b),
                    compute.forward_time_s(b) + compute.backward_time_s(b))
        assert energy[i] == pytest.approx(passes[i] * per_step[0], rel=1e-12)
        assert busy[i] == pytest.approx(passes[i] * per_step[1], rel=1e-12)
    assert energy[0] == busy[0] == 0 and energy[1:].min() > 0
    assert led.bits_up[0] == led.bits_up[1] > 0  # device 0 still uploads y+ and y-
    # local_steps: cumulative, 2 max_i H_{i,r} = 8, 12, 14 (tau 4: 4, 6, 7)
    assert pd.DataFrame(run.rows).local_steps.tolist() == [0, 8, 20, 34]


def test_a_tau_per_device_of_the_wrong_length_is_one_error_line(capsys):
    from tests.conftest import cli

    code, _, err = cli(capsys, "validate", "seed000-table1-digits", "--set",
                       "algorithms.0.tau_per_device=[5, 5, 1]")
    assert code == 2 and "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.strip()]
    assert line.startswith("error: ") and "--set algorithms.0.tau_per_device=[5, 5, 1]" in line
    assert line.endswith("algorithms 'ZO-HFL': tau_per_device has 3 entries but "
                         "population.num_devices is 10; give one tau per device, or remove "
                         "tau_per_device to use tau = 5 for every device")


# ---- the global loss of Fig. 2 (log_objective) ---------------------------------------------------

def test_global_loss_on_quadratic_clients_is_the_closed_form(monkeypatch):
    """With quadratic clients y_i(x) = (A_i + mu I)^-1 (c_i + mu x) in closed form, so the logged
    f(x_r) = f_1(x_r) + sum_i w_i (lam/2) ||x_r - y_i(x_r)||^2 (w_i = 1/m, equal clients) is known
    exactly at every evaluated x_r; the solver's tolerance (1e-5 in y) bounds the difference."""
    sc = _quadratic_bilevel(6)
    sc.algorithms[0] = sc.algorithms[0].model_copy(update={"log_objective": True,
                                                           "eval_every": 2})
    world, thetas, run = run_recording_thetas(monkeypatch, sc)
    prob = world.evaluator
    a, c = prob.a_np, prob.c_np
    m, d = c.shape
    rows = pd.DataFrame(run.rows)
    assert rows["round"].tolist() == [0, 2, 4, 6]
    for r, got in zip(rows["round"], rows["objective"]):
        x = thetas[r].double().numpy()  # end_round sees theta_0 too
        f1 = 0.5 * x @ a.mean(0) @ x - c.mean(0) @ x
        gaps = [x - np.linalg.solve(a_i + np.eye(d), c_i + x) for a_i, c_i in zip(a, c)]
        want = f1 + sum(0.5 * g @ g for g in gaps) / m
        assert got == pytest.approx(want, rel=1e-6, abs=1e-6)


def test_global_loss_on_classifier_clients_matches_a_float64_reference_solve(monkeypatch):
    """f_1 = mean cross-entropy over the base station's data; each y_i(x) re-solved by scipy's
    L-BFGS-B in float64 on client i's samples (CE_i(y) + (mu/2) ||y - x||^2, mu = 2 here) and
    weighted by w_i = N_i / N; the logged value agrees to the solver tolerance and float32."""
    from scipy.optimize import minimize

    algo = {"name": "zo-hfl", "rounds": 2, "eval_every": 2, "tau": 2, "gamma0": 0.5, "mu": 2.0,
            "lam": 3.0, "batch_size": 8, "server_batch_size": 8, "log_objective": True}
    world, thetas, run = run_recording_thetas(monkeypatch, small_scenario(EXACT,
                                                                          algorithms=[algo]))
    ev = world.evaluator
    x = thetas[-1].double()
    module = copy.deepcopy(world.flat.model).double()

    def ce(theta, inputs, labels):
        params = {k: v.double() for k, v in world.flat.unflatten(theta).items()}
        logits = torch.func.functional_call(module, params, (inputs.double(),))
        return F.cross_entropy(logits, labels)

    def best_response(i):
        lo, n = int(ev.data.offsets[i]), int(ev.data.sizes[i])
        inputs, labels = ev.data.x[lo:lo + n], ev.data.y[lo:lo + n]

        def fun(z):
            y = torch.as_tensor(z).requires_grad_(True)
            value = ce(y, inputs, labels) + 1.0 * (y - x).square().sum()
            (grad,) = torch.autograd.grad(value, y)
            return float(value.detach()), grad.numpy()

        return minimize(fun, x.numpy(), jac=True, method="L-BFGS-B",
                        options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 5000}).x

    sizes = ev.data.sizes.double().numpy()
    w = sizes / sizes.sum()
    gaps = [float(np.square(x.numpy() - best_response(i)).sum()) for i in range(len(sizes))]
    f1 = float(ce(x, ev.data.x_server, ev.data.y_server))
    want = f1 + 0.5 * 3.0 * float(w @ np.array(gaps))
    got = pd.DataFrame(run.rows)["objective"].iloc[-1]
    assert got == pytest.approx(want, rel=2e-5)


def test_logging_the_global_loss_leaves_the_run_unchanged(monkeypatch):
    """The objective is computed outside the simulated run: every other column is identical with
    and without it, and without it the column is NaN throughout."""
    algo = {"name": "zo-hfl", "rounds": 3, "eval_every": 1, "tau": 2, "gamma0": 0.5,
            "batch_size": 8, "server_batch_size": 8}
    runs = []
    for log in (False, True):
        sc = small_scenario(EXACT, algorithms=[{**algo, "log_objective": log}])
        runs.append(pd.DataFrame(run_algorithm(build_world(sc), sc.algorithms[0]).rows))
    off, on = runs
    assert off["objective"].isna().all() and on["objective"].notna().all()
    pd.testing.assert_frame_equal(off.drop(columns="objective"), on.drop(columns="objective"))
    # the loss falls as the model learns (it starts at the untrained model's)
    assert on["objective"].iloc[-1] < on["objective"].iloc[0]
