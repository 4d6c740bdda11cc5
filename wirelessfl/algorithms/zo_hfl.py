"""ZO-HFL (seed 000): hierarchical FL in which the server probes the clients' best responses with
two-point zeroth-order estimates (spec zo_hfl.md, Algorithms 1-2).

Round r, participants S_r (the base's ``participation`` beta, zo_hfl.md A11):
  server: v_i ~ Unif(unit sphere) per participant; downlink (``directions``): x_r broadcast to
    every device, then each participant's own v_i unicast to it (zo_hfl.md 3.1 and A21: "1 vec
    broadcast + 1 vec unicast"; a 32-bit seed instead of v_i in mode ``seed``), or, ``directions:
    broadcast``, A21's literal reading: one transmission of x_r and every participant's v_i;
  client i: two proximal solves from the perturbed points x_r +- eta v_i (Alg. 2), H_{i,r} =
    min(max_local_steps, ceil(tau_i sqrt(r+1))) steps each (tau_i = tau for every client, or
    its entry of ``tau_per_device``: the paper's nonidentical local steps, zo_hfl.md 2.2), so
    2 H_{i,r} local steps a round, priced per device (the rounds table's ``local_steps``: the
    largest 2 H_{i,r} of the round's participants S_r), y <- Pi(y - lr_t (grad CE_i(y; zeta) +
    mu (y - x))), lr_t = inner_lr0 / (t + 1), y_0 = x (A6), minibatches with replacement (A7);
    a client with H_{i,r} = 0 returns y_0 = x +- eta v_i and computes (and is charged) nothing;
  uplink, mode ``models`` (the paper): y+ and y- (two d-vectors); mode ``seed`` (ours): the client
    itself forms F+ - F- (below) and uploads one M-bit scalar, v_i coming from a seed both ends
    share, so the server's update is the same up to that scalar's quantisation (zo_hfl.md 3.5);
  server: F+- = (lam/2) ||x_r +- eta v_i - y+-||^2, g_i = (d / (2 eta)) (F+ - F-) v_i (eq. of 1.4),
    g = grad f~_1(x_r, xi) (its own data, ``data.server_fraction``) + sum_i a_i g_i,
    x_{r+1} = x_r - gamma_r g, gamma_r = gamma0 / sqrt(r + 1), with w_i = N_i / N (A5) and
    (``weights``) a_i = w_i for each client whose upload arrived and 0 for the others (``paper``:
    Alg. 1's sum runs over all m clients, nobody is rescaled; seed 000 notes that H_{i,r} = 0
    "has a similar effect" to leaving client i out), or a_i = w_i / sum_{j delivered} w_j
    (``renormalised``, ours [D], zo_hfl.md A4's self-normalised reading).
With a_i = w_i one client of ten at beta = 10 % enters with its share of the data; renormalised, it
enters with weight 1 and its d / (2 eta)-amplified noise with it. The server's own gradient is
computed at the base station, which is mains powered: it is not in the devices' ledger.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import Field, model_serializer

from wirelessfl.algorithms.base import Algorithm, ScalarFormatParams
from wirelessfl.algorithms.participation import participant_count
from wirelessfl.algorithms.step_schedule import DEFAULT_MAX_LOCAL_STEPS, DEFAULT_TAU, zo_hfl_steps
from wirelessfl.contract.facts import ScenarioFacts
from wirelessfl.contract.payload import Cost, Payload
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import counter_uniform, keyed_generator

SEED_BITS = 32  # a direction travels as the seed of its generator in mode "seed" [D]
# The best responses behind the logged global loss (``best_responses``) [D]: solved until each is
# within this distance of y_i(x) (float32 gradients resolve about 1e-6), or this many steps.
BEST_RESPONSE_TOL = 1e-5
BEST_RESPONSE_STEPS = 2000


class ZOHFLParams(ScalarFormatParams):
    batch_size: int = Field(32, gt=0, description="client minibatch B (zo_hfl.md A7: 32)")
    server_batch_size: int = Field(32, gt=0, description="server minibatch B_s (A7: 32)")
    gamma0: float = Field(0.01, gt=0, description="server step gamma_r = gamma0/sqrt(r+1) "
                                                  "(seed 000 Sec. IV: 0.01)")
    eta: float = Field(0.1, gt=0, description="smoothing radius eta (seed 000 Sec. IV: 0.1)")
    tau: float = Field(DEFAULT_TAU, gt=0, description="H_{i,r} = ceil(tau sqrt(r+1)) local steps per "
                                               "solve (seed 000 Table I: 20)")
    inner_lr0: float = Field(0.1, gt=0, description="client step lr_t = inner_lr0/(t+1) "
                                                    "(seed 000 Sec. IV: 0.1)")
    lam: float = Field(1.0, ge=0, description="lambda, weight of the coupling penalty (A9: 1)")
    mu: float = Field(1.0, gt=0, description="mu, the clients' proximal weight (A9: 1)")
    radius: float | None = Field(None, gt=0, description="rho: project y onto the ball "
                                                         "||y - x|| <= rho (A18; none: off)")
    payload: Literal["models", "seed"] = Field(
        "models", description="models: upload y+ and y- (the paper); seed: upload the scalar "
                              "F+ - F- (v from a shared seed)")
    common_batches: bool = Field(False, description="the + and - solves reuse one minibatch "
                                                    "sequence (A8, 'CRN'; the paper: independent)")
    tau_per_device: list[Annotated[float, Field(ge=0)]] | None = Field(
        None, description="tau_i per device (population.num_devices values): client i runs "
                          "H_{i,r} = ceil(tau_i sqrt(r+1)) steps per solve, the paper's "
                          "nonidentical local steps (seed 000 contribution (iv), zo_hfl.md 2.2); "
                          "tau_i = 0 gives H = 0 (the client returns y_0 = x +- eta v_i and "
                          "computes nothing) [D]; none: tau for every device")
    max_local_steps: int = Field(DEFAULT_MAX_LOCAL_STEPS, gt=0, description="cap on H_{i,r} [D]")
    weights: Literal["paper", "renormalised"] = Field(
        "paper", description="paper: a_i = w_i for the clients whose upload arrived, 0 for the "
                             "others (seed 000 Alg. 1, zo_hfl.md A4); renormalised [D]: "
                             "a_i = w_i / sum of the arrived clients' w_j")
    directions: Literal["unicast", "broadcast"] = Field(
        "unicast", description="unicast: x broadcast, then each participant's own direction (or "
                               "seed) unicast to it (zo_hfl.md 3.1, A21); broadcast: x and every "
                               "participant's direction in one transmission (A21's flag)")
    log_objective: bool = Field(
        False, description="record the global loss f(x_r) = f_1(x_r) + sum_i w_i (lam/2) "
                           "||x_r - y_i(x_r)||^2 at each evaluation (the rounds table's "
                           "'objective', Fig. 2's curve, zo_hfl.md 4.2): each client's best "
                           "response solved on all its data by the simulator, outside the "
                           "simulated run [D]")

    @model_serializer(mode="wrap")
    def _only_given(self, handler):
        """Leave tau_per_device out when absent and log_objective when off, so the scenarios
        and checkpoints recorded before them keep their fingerprints."""
        return {k: v for k, v in handler(self).items()
                if not ((k == "tau_per_device" and v is None)
                        or (k == "log_objective" and not v))}

    def tau_count_problem(self, num_devices: int) -> str | None:
        """The message refusing a tau_per_device whose length is not N, or None."""
        if self.tau_per_device is None or len(self.tau_per_device) == num_devices:
            return None
        return (f"algorithms '{self.display_name}': tau_per_device has "
                f"{len(self.tau_per_device)} entries but population.num_devices is "
                f"{num_devices}; give one tau per device, or remove tau_per_device to use "
                f"tau = {self.tau:g} for every device")


class ZOHFL(Algorithm):
    name = "zo-hfl"
    Params = ZOHFLParams
    server_learns = True
    peak_device_arrays = 3  # the directions v_i and the two proximal solves y+-
    # Only the devices whose upload arrives are computed for (their directions, minibatches
    # and quantisation noise are theirs whichever devices are computed together), and the
    # round reads its collect by device index.
    computes_participants_only = True
    reads_device_indices = True

    @classmethod
    def state_rows(cls, num_devices: int, params: ZOHFLParams) -> float:
        """No per-device state between rounds: the two proximal solves y+- of the round's
        round(beta N) participants and their directions v_i."""
        return cls.peak_device_arrays * participant_count(params.participation, num_devices)

    @classmethod
    def shared_stream_rows(cls, num_devices: int, params: ZOHFLParams) -> float:
        """With shared random streams the directions are rows of one [N, d] draw for all N:
        the non-participants' rows on top of ``state_rows``."""
        return num_devices - participant_count(params.participation, num_devices)

    summary = ("seed 000: server gradient on its own data + two-point ZO probes of the clients' "
               "proximal solves; y+- (or one scalar) up")

    @classmethod
    def downlink_payloads(cls, d: int, bits: int, participants: int = 1,
                          payload: str = "models", directions: str = "unicast"
                          ) -> tuple[Payload, Payload | None]:
        """(broadcast to every device, unicast to each participant or None) of one round:
        x_r and v_i as d-vectors, or v_i as a SEED_BITS seed (mode ``seed``); ``directions``
        ``broadcast`` puts the participants' v_i into the broadcast (zo_hfl.md 3.1, A21)."""
        x = Payload.vectors(d, bits, label="x")
        own = (Payload.scalar(SEED_BITS, label="direction seed") if payload == "seed"
               else Payload.vectors(d, bits, label="direction"))
        if directions == "unicast":
            return x, own
        if payload == "seed":
            return Payload(values=x.values, bits_per_value=bits,
                           header_bits=x.header_bits + participants * own.bits,
                           label="x and seeds"), None
        return Payload.vectors(d, bits, count=1 + participants, label="x and directions"), None

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1,
                          payload: str = "models", directions: str = "unicast"
                          ) -> tuple[Payload, Payload]:
        """Up: y+ and y- (two d-vectors) or one scalar. Down: what a participant hears in a
        round, the broadcast plus its own unicast direction (``downlink_payloads``)."""
        up = Payload.scalar(bits) if payload == "seed" else Payload.vectors(d, bits, count=2)
        x, own = cls.downlink_payloads(d, bits, participants, payload, directions)
        if own is None:
            return up, x
        if payload == "seed":
            return up, Payload(values=x.values, bits_per_value=bits,
                               header_bits=x.header_bits + own.bits, label="x and own seed")
        return up, Payload.vectors(d, bits, count=2, label="x and own direction")

    @classmethod
    def check_scenario(cls, params: ZOHFLParams, facts: ScenarioFacts) -> str | None:
        """tau_per_device holds one value per device (``setup``'s check, from the scenario)."""
        return params.tau_count_problem(facts.num_devices)

    def local_steps(self, r: int) -> int | np.ndarray:
        """H_{i,r} = min(max_local_steps, ceil(tau_i sqrt(r+1))) of each solve: one count for
        every device (tau), or [N] int64 (tau_per_device)."""
        p = self.params
        return zo_hfl_steps(p.tau if self.tau_i is None else self.tau_i, r, p.max_local_steps)

    def directions(self, r: int, devices: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """v_i uniform on the unit sphere for ``devices`` (increasing indices), regenerated
        from (seed, round): (a draw [m, d] holding their rows, their rows in it). Shared
        random streams: the population's draw [N, d] (rows: the devices); per-device streams:
        each device's own Gaussian vector (Box-Muller over its counter uniforms,
        ``counter_uniform``), normalised, for these devices alone (m = n)."""
        n, d = self.ctx.num_devices, self.theta.numel()
        if not self.ctx.per_device_streams:
            z = torch.randn((n, d), generator=keyed_generator(self.ctx.seed, "zo-hfl-v", r))
            return (z / z.norm(dim=1, keepdim=True)).to(self.theta.device), devices
        half = (d + 1) // 2
        u = counter_uniform(self.ctx.seed, "zo-hfl-v", (r,), devices, 2 * half)
        radius = np.sqrt(-2.0 * np.log1p(-u[:, :half]))  # 1 - u in (0, 1]: finite
        angle = 2.0 * math.pi * u[:, half:]
        z = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)], axis=1)[:, :d]
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        v = torch.from_numpy(z).to(device=self.theta.device, dtype=self.theta.dtype)
        return v, np.arange(len(devices))

    def setup(self) -> None:
        sizes = self.ctx.evaluator.sample_weights()  # N_i (equal without samples)
        self.weights = sizes / sizes.sum()  # w_i = N_i / N_clients (A5)
        refusal = self.params.tau_count_problem(self.ctx.num_devices)
        if refusal:
            raise UserError(refusal)
        tau = self.params.tau_per_device
        self.tau_i = None if tau is None else np.asarray(tau, dtype=np.float64)

    def own_objective(self):
        """The global loss (``global_loss``) when log_objective is on."""
        return self.global_loss if self.params.log_objective else None

    def global_loss(self, x: torch.Tensor) -> float:
        """f(x) = f_1(x) + sum_i w_i (lam / 2) ||x - y_i(x)||^2 (seed 000's objective, eq. (1),
        with the run's a_i = w_i, A5): f_1 on all the base station's data, y_i(x) each client's
        exact best response (``best_responses``). This is the "global loss" of Fig. 2, whose
        definition the paper leaves open (zo_hfl.md 4.2); A15's cheaper reading, the round's own
        y+ in place of y_i(x), moves with tau itself (longer solves land farther from x), so a
        tau comparison on it would be circular [D]."""
        f1 = self.ctx.evaluator.server_objective(x)
        if not self.params.lam:
            return f1
        gap = (x[None] - self.best_responses(x)).double().square().sum(1)
        w = torch.as_tensor(self.weights, dtype=torch.float64, device=gap.device)
        return f1 + 0.5 * self.params.lam * float((w * gap).sum())

    def best_responses(self, x: torch.Tensor) -> torch.Tensor:
        """y_i(x) = argmin over Y_i(x) of h_i(y) = L_i(y) + (mu / 2) ||y - x||^2 for every
        client i [N, d], L_i on all of client i's samples: projected gradient descent from y =
        x with Barzilai-Borwein steps per client, until every client's step residual bounds its
        distance to y_i(x) by BEST_RESPONSE_TOL (h_i is mu-strongly convex: ||y - y_i(x)|| <=
        ||grad h_i(y)|| / mu; the projected residual on a ball) or BEST_RESPONSE_STEPS have run
        [D]. Deterministic: no minibatch is drawn."""
        p, ev = self.params, self.ctx.evaluator
        n = self.ctx.num_devices
        anchor = x[None].expand(n, -1)
        y = anchor.clone()
        with ev.holding_full_batches():  # every step reads the same samples: gathered once
            grad = ev.full_gradients(y) + p.mu * (y - anchor)
            step = torch.full((n, 1), p.inner_lr0, dtype=y.dtype, device=y.device)
            for _ in range(BEST_RESPONSE_STEPS):
                moved = self._project(y - step * grad, anchor)
                residual = (moved - y).norm(dim=1) / step[:, 0]  # the projected gradient's norm
                if float(residual.max()) <= BEST_RESPONSE_TOL * p.mu:
                    break
                new_grad = ev.full_gradients(moved) + p.mu * (moved - anchor)
                s, g = moved - y, new_grad - grad
                curvature = (s * g).sum(1, keepdim=True)
                # BB1 step s.s / s.g where the curvature is positive (it is, h_i being strongly
                # convex, up to rounding), kept within [1e-8, 1e8] [D]
                bb = (s * s).sum(1, keepdim=True) / curvature.clamp_min(1e-30)
                step = torch.where(curvature > 0, bb, step).clamp(1e-8, 1e8)
                y, grad = moved, new_grad
        return y

    def _project(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Each row of y onto Y_i(x), the ball ||y - x|| <= radius around its row of x (A18);
        y itself without a radius."""
        radius = self.params.radius
        if radius is None:
            return y
        gap = y - x
        norm = gap.norm(dim=1, keepdim=True).clamp_min(1e-30)
        return x + gap * torch.clamp(radius / norm, max=1.0)

    def _solve(self, x: torch.Tensor, idx: torch.Tensor, rows: slice,
               steps: torch.Tensor | None = None) -> torch.Tensor:
        """Alg. 2 for the rows ``rows`` of idx from their points x [n, d] on minibatches
        idx [H, c, b]. ``steps`` [n] (optional, per-device H_{i,r}): row i takes only its
        first steps[i] (a row at 0 returns y_0 = x), as ``local_sgd``'s early stop."""
        p, ev = self.params, self.ctx.evaluator
        y = x.clone()
        for t in range(idx.shape[0]):
            g = ev.stacked_gradients(y, idx[t, rows]) + p.mu * (y - x)
            moved = self._project(y - (p.inner_lr0 / (t + 1)) * g, x)
            y = moved if steps is None else torch.where((t < steps)[:, None], moved, y)
        return y

    def round(self, r: int):
        p, ev, ctx = self.params, self.ctx.evaluator, self.ctx
        d = self.theta.numel()
        steps = self.local_steps(r)
        if np.ndim(steps):  # the largest 2 H_{i,r} of the round's participants S_r
            asked = steps[self.participant_devices(r)]
            self.round_local_steps = 2 * int(asked.max()) if len(asked) else 0
        else:
            self.round_local_steps = 2 * steps  # the + and the - solve
        chosen = self.participants(r) & (self.missed == 0)
        up, _ = self.declared_payloads(d, self.bits, payload=p.payload)
        common, own = self.downlink_payloads(d, self.bits, int(chosen.sum()), p.payload,
                                             p.directions)
        yield from self.broadcast(common, self.theta)
        if own is not None:  # a client whose direction is lost sits the round out (3.4)
            chosen &= self.missed == 0
            sent = yield from self.unicast(own, chosen)
            chosen &= sent.received
        # 2 H_{i,r} forward and backward passes per device ([N] with tau_per_device)
        cost = Cost(forward_passes=2 * steps, backward_passes=2 * steps,
                    batch_size=ev.minibatch_sizes(p.batch_size))
        result = yield from self.collect(cost, up, chosen)
        g = ev.server_gradient(self.theta, keyed_generator(ctx.seed, "zo-hfl-server", r),
                               p.server_batch_size)
        # Only delivered uploads enter g: solve and quantise for those devices alone.
        devices = result.delivered_devices
        if len(devices):
            g = g + self.probe_sum(r, devices, steps)
        self.theta = self.theta - p.gamma0 / math.sqrt(r + 1) * g

    def probe_sum(self, r: int, devices: np.ndarray, steps: int | np.ndarray) -> torch.Tensor:
        """sum_i a_i g_i [d] over the devices whose upload arrived (``devices``): their
        proximal solves from x_r +- eta v_i (``steps``: H_r, or [N] per-device H_{i,r}), F+ - F-
        as the server receives it, and the weights a_i. The sum runs over the rows of the
        directions' draw (the others weigh 0), so it is the one a round computing every device
        forms. Per-device H: the minibatches are drawn for the largest H of ``devices`` and
        each device takes its first H_{i,r} (a draw's first steps are a shorter draw's, so a
        device's minibatches do not depend on the others' H)."""
        p, ev, device = self.params, self.ctx.evaluator, self.theta.device
        d = self.theta.numel()
        v, at = self.directions(r, devices)
        own = None
        if np.ndim(steps):
            own = torch.as_tensor(steps[devices], device=device)
            steps = int(own.max())
        plus = self.minibatches(r, devices, steps, "batch")
        minus = plus if p.common_batches else self.minibatches(r, devices, steps, "batch-minus")
        diff = torch.zeros(len(devices), device=device, dtype=torch.float64)
        for rows in ev.row_chunks(len(devices), p.batch_size, own_model=True):
            mine = v[torch.as_tensor(at[rows], device=device)]
            x_plus = self.theta + p.eta * mine
            x_minus = self.theta - p.eta * mine
            cap = None if own is None else own[rows]
            y_plus = self._solve(x_plus, plus, rows, cap)
            y_minus = self._solve(x_minus, minus, rows, cap)
            if p.payload == "models":  # the server sees quantised y+-
                y_plus = self.quantize(y_plus, "zo-hfl-up-plus", r, devices[rows])
                y_minus = self.quantize(y_minus, "zo-hfl-up-minus", r, devices[rows])
            f_plus = 0.5 * p.lam * (x_plus - y_plus).double().square().sum(1)
            f_minus = 0.5 * p.lam * (x_minus - y_minus).double().square().sum(1)
            diff[rows] = f_plus - f_minus
        if p.payload == "seed":
            diff = self.quantize_scalars(diff, p.fixed_range(),
                                         self.scalar_noise("zo-hfl-up", r, devices))
        rows = torch.as_tensor(at, device=device)
        w = torch.zeros(v.shape[0], device=device, dtype=torch.float64)
        w[rows] = torch.as_tensor(self.weights[devices], device=device)
        spread = torch.zeros_like(w)
        spread[rows] = diff.to(torch.float64)
        a = w if p.weights == "paper" else w / w.sum()
        coeff = (a * spread * (d / (2 * p.eta))).to(self.theta.dtype)
        return (coeff[:, None] * v).sum(0)
