"""FGDRO-CVaR, FGDRO-KL and FGDRO-KL-Adam (seed 003: Guo and Yang, "Communication-Efficient
Federated Group Distributionally Robust Optimization"; spec fgdro.md, Sec. 2), with the seed's
LocalAdam ablation (Alg. 4) and its KL-DRO baseline DR-DSGD (Issaid et al. 2022), which share
the round (local steps from the broadcast state, the state's uniform mean over what arrived).

Objectives over the N devices' local losses L_i (fgdro.md 1.3-1.4):
  CVaR:  min_w min_s (1/N) sum_i (L_i(w) - s)_+ + (K/N) s   (= K/N x the mean of the K largest L_i)
  KL:    min_w lam log((1/N) sum_i exp(L_i(w) / lam))

Round r (fgdro.md Alg. 1-3 as corrected there, Sec. 6 items 1-3), every participating device i
starting from the broadcast state and running I local steps on fresh minibatches z:
  CVaR:     l = loss(w; z); u_i <- (1-b1) u_i + b1 l; a = 1[u_i > s]  (s before this step);
            s <- s - eta2 (K/N - a); w <- w - eta1 a grad loss(w; z)
  KL:       l, g = loss and grad at (w; z); u_i <- (1-b1) u_i + b1 l; e = exp(u_i / lam);
            v <- (1-b2) v + b2 e; h = (e / v) g; m <- (1-b3) m + b3 h; w <- w - eta m
  KL-Adam:  as KL, then q <- (1-b4) q + b4 h*h; w <- w - eta m / (sqrt(q) + tau)  (no bias
            correction)
u_i is device state that never leaves the device (it carries over between rounds, also through
rounds the device sits out). Uplink per device: w and s (CVaR); w, m and v (KL); w, m, q and v
(KL-Adam); the server averages each over the devices whose upload arrived, S_r, with weight
1/|S_r| (fgdro.md Sec. 6 item 19), and broadcasts the averages back (the same sizes).

On the air (fgdro.md Sec. 3): vectors as d values of M bits (+ a 32-bit scale below 32 bits),
sent as differences from the broadcast values the receiver already holds (the same information
and size as the vectors themselves, quantised more finely), and the scalar s or v as one float64
(64 bits). At M = 32 an upload is 4cd + 8 bytes with c = 1, 2, 3 vectors: the spec's table.

Compute (fgdro.md Sec. 3): I forward and I backward passes per device per round, except CVaR with
``lazy_backward`` (the default, fgdro.md Sec. 6 item 21), which costs only the A_i steps with
a = 1 as backward passes (the forward pass comes first and decides); ``lazy_backward: false``
charges all I, as the paper's own timings (Table 6) suggest it ran.

Losses: a lost upload leaves its device out of every average of that round; a device that missed
the broadcast sits out until it is resynced (the base), keeping its u_i; the round's downlink is
the broadcast that ends it (as for FedAvg), every device holding w_0 and the initial s, v, m, q at
the start. If no upload arrives the server keeps its state and broadcasts a one-value flag.

Start of KL and KL-Adam (``start``, fgdro.md Sec. 6 item 4): ``cold`` u_i = 0, v = 1; ``warm``
(default) one exchange before round 0's local steps sets u_i to a minibatch loss at w_0 and v to
the mean of exp(u_i / lam) (``FGDROKL.warm_start``). Cold, exp(u_i / lam) climbs to
exp(loss / lam) within the first ~1/b1 steps while v, moving at b2, lags near 1: at small lam and
b2 (0.1 and 0.01, inside the spec's sweep and the paper's beta grid) the weight e / v peaks near
80 for a loss of 2.3, and round 1 throws the model out (docs/algorithms.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from wirelessfl.algorithms.base import Algorithm, AlgorithmParams
from wirelessfl.algorithms.participation import participant_count
from wirelessfl.contract.facts import ScenarioFacts
from wirelessfl.contract.memory import FGDRO_ROW_COPIES, RoundShape, on_heap
from wirelessfl.contract.payload import VECTOR_SCALE_HEADER_BITS, Cost, Payload
from wirelessfl.errors import UserError

SCALAR_BITS = 64  # s and v travel as float64 (fgdro.md Sec. 3: "scalars float64 (8 B)")
EXP_CLAMP = 700.0  # exp(u / lam) with u / lam clamped at 700 (fgdro.md Sec. 2.2 and 6 item 20)


def state_payload(d: int, bits: int, vectors: int, label: str, scalar: bool = True) -> Payload:
    """``vectors`` d-vectors of ``bits`` bits per value (+ a 32-bit scale each below 32 bits)
    and, with ``scalar``, one float64 scalar."""
    header = VECTOR_SCALE_HEADER_BITS * vectors if bits < 32 else 0
    return Payload(values=vectors * d, bits_per_value=bits,
                   header_bits=header + (SCALAR_BITS if scalar else 0), label=label)


class FGDROParams(AlgorithmParams):
    batch_size: int = Field(32, gt=0, description="B, minibatch per local step (fgdro.md 2.5: "
                                                  "32, the paper's experiments)")
    local_steps: int = Field(32, gt=0, description="I, local steps per round (fgdro.md 2.5: 32)")
    lr: float = Field(0.1, gt=0, allow_inf_nan=False,
                      description="eta (eta1 for CVaR), the model's step size (fgdro.md 2.5: "
                                  "SGD-type 0.1 for small models)")
    beta1: float = Field(0.1, gt=0, le=1, description="b1, weight of a fresh loss in the "
                                                      "tracker u_i (fgdro.md 2.5: 0.1)")


class _FGDRO(Algorithm):
    """Shared round of the three methods: local steps, one upload, averages over what arrived."""

    peak_device_arrays = 4  # w, m, q of every device and their quantised uploads
    computes_participants_only = True

    @classmethod
    def state_rows(cls, num_devices, params):
        """The round's work is held for the asked devices only (u_i is one float64 each)."""
        return cls.peak_device_arrays * participant_count(params.participation, num_devices)

    @classmethod
    def round_memory(cls, params: AlgorithmParams, shape: RoundShape) -> tuple[int, bool]:
        """A chunk's minibatches and FGDRO_ROW_COPIES [chunk, d] blocks (w, m, q, their
        gradients, updates and uploads), quantised in runs of consecutive devices."""
        block = shape.chunk * shape.d * shape.itemsize
        return shape.chunk * shape.minibatch_bytes + on_heap(FGDRO_ROW_COPIES * block, block), \
            True

    vectors: ClassVar[int]  # d-vectors each way: w (+ m, + q)
    has_scalar: ClassVar[bool] = True  # s or v travels beside the vectors (not LocalAdam's)

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1
                          ) -> tuple[Payload, Payload]:
        """The same state each way: ``vectors`` d-vectors of M bits and one float64 scalar
        (fgdro.md Sec. 3: CVaR 1 vec + 1 sc, KL 2 vec + 1 sc, KL-Adam 3 vec + 1 sc, LocalAdam
        3 vec, DR-DSGD 1 vec as FedAvg)."""
        up = state_payload(d, bits, cls.vectors, f"{cls.name} upload", cls.has_scalar)
        return up, state_payload(d, bits, cls.vectors, f"{cls.name} broadcast", cls.has_scalar)

    def resync_payload(self, missed: int) -> Payload:
        """The whole current state at full precision (the vectors and the scalar)."""
        return state_payload(self.theta.numel(), 32, self.vectors, f"{self.name} resync",
                             self.has_scalar)

    def setup(self) -> None:
        n, d = self.ctx.num_devices, self.theta.numel()
        dev = self.theta.device
        self.u = torch.zeros(n, dtype=torch.float64, device=dev)  # fgdro.md Sec. 6 item 4: u = 0
        # Server state beyond theta: the averaged vectors (m, q) and the scalar (s or v).
        self.moments = torch.zeros(self.vectors - 1, d, device=dev)
        self.scalar = self.initial_scalar()

    def initial_scalar(self) -> float:
        raise NotImplementedError

    def local_round(self, rows: torch.Tensor, idx: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """I local steps of devices ``rows`` (indices [n]) on their minibatches idx [I, n, b]
        from the broadcast state; updates their u_i. Returns (vectors [n, c, d] after the round,
        scalars [n] float64, backward passes [n])."""
        raise NotImplementedError

    def start(self, vector: torch.Tensor, n: int) -> torch.Tensor:
        """n devices' copies [n, d] of a broadcast vector, in the problem's compute precision
        (float64 for the quadratic; what travels stays float32)."""
        dtype = getattr(self.ctx.evaluator, "compute_dtype", vector.dtype)
        return vector.to(dtype).expand(n, -1).clone()

    def lazy(self) -> bool:
        """True when the backward passes depend on the data (then the work comes first)."""
        return False

    def _work(self, k: int, mask: np.ndarray
              ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(device indices, vectors, scalars, backward passes) for the devices of ``mask``,
        chunk by chunk."""
        p, ev = self.params, self.ctx.evaluator
        devices = np.flatnonzero(mask)  # every asked device's work matters: it moves its u_i
        if not len(devices):
            return
        idx = self.minibatches(k, devices, p.local_steps)
        for chunk in ev.row_chunks(len(devices), p.batch_size, own_model=True):
            rows_t = torch.as_tensor(devices[chunk], device=self.u.device)
            # host seconds of learning compute (the problem's own timers are overridden here)
            before, start = ev.compute_s, time.perf_counter()
            out = self.local_round(rows_t, idx[:, chunk])
            ev.compute_s = before + (time.perf_counter() - start)
            yield (torch.as_tensor(devices[chunk]), *out)

    def round(self, k: int):
        p, n, d = self.params, self.ctx.num_devices, self.theta.numel()
        up, down = self.declared_payloads(d, self.bits)
        mask = (self.missed == 0) & self.participants(k) & self.ctx.net.alive
        steps = p.local_steps
        if self.lazy():  # CVaR: the indicators decide the backward passes, so compute first
            work = list(self._work(k, mask))
            backward = np.zeros(n)
            for rows, _, _, passes in work:
                backward[rows.numpy()] = passes.cpu().numpy()
        else:
            work, backward = None, np.where(mask, float(steps), 0.0)
        cost = Cost(forward_passes=steps, backward_passes=backward,
                    batch_size=self.ctx.evaluator.minibatch_sizes(p.batch_size))
        result = yield from self.collect(cost, up, mask)
        delivered = np.asarray(result.delivered, dtype=bool)
        if work is None:
            work = self._work(k, mask)  # streamed: one chunk of devices in memory at a time
        current = self.state_vectors()
        total = torch.zeros_like(current)
        scalar_sum, received = 0.0, 0
        for rows, vectors, scalars, _ in work:
            keep = torch.as_tensor(delivered[rows.numpy()], device=vectors.device)
            if not keep.any():
                continue
            for j in range(self.vectors):  # differences from the broadcast state, quantised
                diff = (vectors[:, j] - current[j].to(vectors.dtype)).to(current.dtype)
                q = self._quantize_rows(diff, j, k, rows, keep)
                total[j] += q[keep].sum(0)
            # s or v travels as a float64 (unquantised): checked, not counted
            self.ctx.check_finite(scalars, "up", k, keep)
            scalar_sum += float(scalars[keep].sum())
            received += int(keep.sum())
        if not received:
            yield from self.broadcast(Payload.scalar(self.bits, label="no-update flag"))
            return
        mean = total / received
        q_mean = torch.stack([self.quantize(mean[j][None], f"{self.name}-down-{j}", k,
                                            slice(0, 1), direction="down")[0]
                              for j in range(self.vectors)])
        yield from self.broadcast(down)
        self.apply(current + q_mean, scalar_sum / received)

    def _quantize_rows(self, vectors: torch.Tensor, j: int, k: int, rows: torch.Tensor,
                       delivered: torch.Tensor) -> torch.Tensor:
        """Quantise the uploads of devices ``rows`` (sorted indices; ``delivered`` [n]: those
        that arrive) with each device's own keyed noise (the same values whichever devices are
        computed together)."""
        return self.quantize(vectors, f"{self.name}-up-{j}", k, rows.numpy(), delivered)

    def state_vectors(self) -> torch.Tensor:
        """The broadcast vectors [c, d]: theta, then m (and q)."""
        return torch.cat([self.theta[None], self.moments])

    def apply(self, vectors: torch.Tensor, scalar: float) -> None:
        """Take the new server state (the averages, as broadcast)."""
        self.theta = vectors[0].clone()
        self.moments = vectors[1:].clone()
        self.scalar = scalar


class FGDROCVaRParams(FGDROParams):
    k: int | None = Field(None, ge=1, description="K: the objective is the mean of the K largest "
                                                  "device losses (default max(1, ceil(0.2 N)), "
                                                  "fgdro.md 2.5)")
    lr_s: float | None = Field(None, gt=0, allow_inf_nan=False,
                               description="eta2, step size of the threshold s (default: lr, "
                                           "fgdro.md Sec. 6 item 6)")
    lazy_backward: bool = Field(True, description="skip the backward pass of a step whose "
                                                  "indicator is 0 and cost it as skipped "
                                                  "(fgdro.md Sec. 3; false: every step pays "
                                                  "one, as the paper's timings suggest)")


class FGDROCVaR(_FGDRO):
    name = "fgdro-cvar"
    Params = FGDROCVaRParams
    summary = ("seed 003 Alg. 1: mean of the K largest device losses; threshold s local and "
               "averaged; w and s up (1 vector + 1 float64)")
    vectors = 1

    @classmethod
    def check_scenario(cls, params: FGDROCVaRParams, facts: ScenarioFacts) -> str | None:
        """A K given beyond the N devices (``setup``'s check, from the scenario; the default K
        always fits)."""
        n = facts.num_devices
        if params.k is not None and params.k > n:
            return (f"{params.display_name}: k = {params.k} exceeds the {n} devices "
                    f"(population.num_devices); choose k between 1 and {n}")
        return None

    def setup(self) -> None:
        super().setup()
        n, k = self.ctx.num_devices, self.params.k
        if k is None:
            k = max(1, math.ceil(0.2 * n))  # fgdro.md 2.5 default
        if k > n:
            raise UserError(f"{self.params.display_name}: k = {k} exceeds the {n} devices "
                            f"(population.num_devices); choose k between 1 and {n}")
        self.k_devices = k
        self.lr_s = self.params.lr_s if self.params.lr_s is not None else self.params.lr

    def initial_scalar(self) -> float:
        return 0.0  # s_bar = 0 (fgdro.md Alg. 1)

    def lazy(self) -> bool:
        return self.params.lazy_backward

    def local_round(self, rows, idx):
        p, ev = self.params, self.ctx.evaluator
        n = len(rows)
        w = self.start(self.theta, n)
        s = torch.full((n,), self.scalar, dtype=torch.float64, device=w.device)
        u = self.u[rows]
        share = self.k_devices / self.ctx.num_devices  # K / N
        passes = torch.zeros(n, dtype=torch.float64, device=w.device)
        for t in range(p.local_steps):
            batch = idx[t]
            if p.lazy_backward:
                loss = ev.stacked_losses(w, batch)
            else:
                loss, grad = ev.stacked_losses_and_gradients(w, batch)
            u = (1 - p.beta1) * u + p.beta1 * loss.double()
            a = u > s  # the indicator at the threshold before this step's update
            s = s - self.lr_s * (share - a.double())
            if p.lazy_backward:
                on = torch.nonzero(a).squeeze(1)
                if len(on):
                    w[on] -= p.lr * ev.stacked_gradients(w[on], batch[on])
                passes += a.double()
            else:
                w -= p.lr * grad * a[:, None].to(w.dtype)
                passes += 1.0
        self.u[rows] = u
        return w[:, None], s, passes


class FGDROKLParams(FGDROParams):
    start: Literal["warm", "cold"] = Field(
        "warm", description="warm: before round 0 every device sets u_i to one minibatch loss "
                            "at w_0 and v starts at the mean of exp(u_i / lam) (fgdro.md Sec. 6 "
                            "item 4's alternative; one float64 each way); cold: u_i = 0, "
                            "v = 1 (item 4's default), which small lam turns into a first-round "
                            "blow-up (docs/algorithms.md)")
    lam: float = Field(1.0, gt=0, allow_inf_nan=False,
                       description="lambda, strength of the KL regulariser (fgdro.md 2.5: 1; "
                                   "0.5 in its Sec. 5 experiment); small -> worst device, "
                                   "large -> average loss")
    beta2: float = Field(0.1, gt=0, le=1, description="b2, weight of exp(u_i/lam) in the "
                                                      "estimate v of G (fgdro.md 2.5: 0.1)")
    beta3: float = Field(0.1, gt=0, le=1, description="b3, weight of the re-weighted gradient "
                                                      "in the momentum m (fgdro.md 2.5: 0.1)")


class FGDROKL(_FGDRO):
    name = "fgdro-kl"
    Params = FGDROKLParams
    summary = ("seed 003 Alg. 2: KL-regularised worst-case mix; momentum on exp(u_i/lam)/v "
               "re-weighted gradients; w, m and v up (2 vectors + 1 float64)")
    vectors = 2

    @classmethod
    def initial_payloads(cls, d: int, bits: int) -> tuple[Payload, Payload]:
        """The warm start's exchange (the default ``start``; none when cold): each device's
        exp(u_i / lam) up and the mean v_bar down, one float64 each (as v travels, Sec. 3)."""
        return (Payload.scalar(SCALAR_BITS, label=f"{cls.name} warm-start exp(u/lam)"),
                Payload.scalar(SCALAR_BITS, label=f"{cls.name} warm-start v"))

    @classmethod
    def one_off_forward_devices(cls, num_devices: int, params: FGDROKLParams) -> int:
        return num_devices if params.start == "warm" else 0  # warm_start asks every holder

    def setup(self) -> None:
        super().setup()
        self.warm_pending = self.params.start == "warm"

    def initial_scalar(self) -> float:
        return 1.0  # v_bar = exp(0 / lam) = 1 (fgdro.md Sec. 6 item 4)

    def exp_weight(self, u: torch.Tensor) -> torch.Tensor:
        """e = exp(u / lam), u / lam clamped at 700 (fgdro.md Sec. 6 item 20)."""
        return torch.exp(torch.clamp(u / self.params.lam, max=EXP_CLAMP))

    def warm_start(self):
        """fgdro.md Sec. 6 item 4's alternative start, before round 0's local steps: every
        device that holds w_0 computes one minibatch loss there (one forward pass of B samples,
        charged to it), takes u_i = that loss, and uploads e_i = exp(u_i / lam) as a float64;
        the base station broadcasts v_bar = the mean of the e_i that arrived (a float64).

        [D] the spec leaves the protocol open: every device is asked (not only round 0's
        participants: u_i is every device's state, and v_bar^1 is the mean over all i); a
        device whose upload is lost keeps its warm u_i and is left out of the mean (as in every
        FGDRO average, Sec. 6 item 19); if no upload arrives the base station broadcasts the
        one-value flag and the devices that hear it fall back to the cold start (u_i = 0,
        v_bar = 1); a device that misses the broadcast is stale and is resynced with the whole
        state before it computes again (the base class)."""
        p, ev = self.params, self.ctx.evaluator
        up, down = self.initial_payloads(self.theta.numel(), self.bits)
        holders = self.missed == 0
        cost = Cost(forward_passes=1, backward_passes=0,
                    batch_size=ev.minibatch_sizes(p.batch_size))
        # the base's collect asks only the round's participants: this one-off asks every holder
        result = yield from self.ctx.net.collect(cost, up, holders)
        self.ctx.health.collected(result.active, result.delivered)
        active = np.flatnonzero(np.asarray(result.active, dtype=bool))
        if len(active):
            idx = self.minibatches(0, active, 1, "fgdro-warm-start")[0]
            losses = ev.device_losses(self.theta, idx).double().to(self.u.device)
            self.u[torch.as_tensor(active, device=self.u.device)] = losses
        e = self.exp_weight(self.u)
        delivered = torch.as_tensor(np.asarray(result.delivered, dtype=bool)).to(e.device)
        self.ctx.check_finite(e, "up", self.round_index, delivered)
        if not bool(delivered.any()):
            heard = yield from self.broadcast(Payload.scalar(self.bits, label="no-update flag"))
            self.u[torch.as_tensor(heard.received).to(self.u.device)] = 0.0
            return
        v_bar = e[delivered].mean()
        yield from self.broadcast(down, v_bar[None])
        self.scalar = float(v_bar)

    def round(self, k: int):
        if self.warm_pending:
            self.warm_pending = False
            yield from self.warm_start()
        yield from super().round(k)

    def step(self, w: torch.Tensor, m: torch.Tensor, q: torch.Tensor | None, h: torch.Tensor
             ) -> None:
        """m <- (1-b3) m + b3 h; w <- w - eta m (in place)."""
        p = self.params
        m.mul_(1 - p.beta3).add_(h, alpha=p.beta3)
        w.sub_(m, alpha=p.lr)

    def local_round(self, rows, idx):
        p, ev = self.params, self.ctx.evaluator
        n = len(rows)
        w = self.start(self.theta, n)
        m = self.start(self.moments[0], n)
        q = self.start(self.moments[1], n) if self.vectors == 3 else None
        v = torch.full((n,), self.scalar, dtype=torch.float64, device=w.device)
        u = self.u[rows]
        for t in range(p.local_steps):
            loss, grad = ev.stacked_losses_and_gradients(w, idx[t])
            u = (1 - p.beta1) * u + p.beta1 * loss.double()
            e = self.exp_weight(u)  # estimate of G_i
            v = (1 - p.beta2) * v + p.beta2 * e  # estimate of G, with the fresh e
            h = (e / v).to(grad.dtype)[:, None] * grad  # weight ~ N p_i*
            self.step(w, m, q, h)
        self.u[rows] = u
        stacked = [w, m] if q is None else [w, m, q]
        return torch.stack(stacked, dim=1), v, torch.full((n,), float(p.local_steps))


class FGDROKLAdamParams(FGDROKLParams):
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False,
                      description="eta, the Adam-type step size (fgdro.md 2.5: 1e-3 for small "
                                  "models; 0.003 in its Sec. 5 experiment)")
    beta4: float = Field(0.01, gt=0, le=1, description="b4, weight of h*h in the second moment "
                                                       "q (fgdro.md 2.5: 0.01)")
    tau: float = Field(1e-8, gt=0, allow_inf_nan=False,
                       description="tau, added to sqrt(q) in the denominator (fgdro.md 2.5)")


class FGDROKLAdam(FGDROKL):
    name = "fgdro-kl-adam"
    Params = FGDROKLAdamParams
    summary = ("seed 003 Alg. 3: FGDRO-KL with Adam-type local steps (no bias correction); "
               "w, m, q and v up (3 vectors + 1 float64)")
    vectors = 3

    def step(self, w, m, q, h):
        """m and q moving averages, then w <- w - eta m / (sqrt(q) + tau) (in place)."""
        p = self.params
        m.mul_(1 - p.beta3).add_(h, alpha=p.beta3)
        q.mul_(1 - p.beta4).addcmul_(h, h, value=p.beta4)
        w.sub_(p.lr * m / (q.sqrt() + p.tau))

    def apply(self, vectors, scalar):
        """q_bar stays >= 0: the M-bit quantised average of differences can dip below 0 where q
        is tiny (exactly 0 difference at M = 32)."""
        super().apply(vectors, scalar)
        self.moments[1].clamp_(min=0.0)


class LocalAdamParams(AlgorithmParams):
    batch_size: int = Field(32, gt=0, description="B, minibatch per local step (fgdro.md 2.5: 32)")
    local_steps: int = Field(32, gt=0, description="I, local steps per round (fgdro.md 2.5: 32)")
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False,
                      description="eta, the Adam-type step size (fgdro.md 2.5: 1e-3 for small "
                                  "models)")
    beta3: float = Field(0.1, gt=0, le=1, description="b3, weight of the gradient in the "
                                                      "momentum m (fgdro.md 2.5: 0.1)")
    beta4: float = Field(0.01, gt=0, le=1, description="b4, weight of g*g in the second moment "
                                                       "q (fgdro.md 2.5: 0.01)")
    tau: float = Field(1e-8, gt=0, allow_inf_nan=False,
                       description="tau, added to sqrt(q) in the denominator (fgdro.md 2.5)")


class _ModelsOnly(_FGDRO):
    """The round of a method that averages only d-vectors (no s or v travels): its devices'
    local steps, then the vectors, zero scalars (unsent) and I backward passes each."""

    has_scalar = False

    def initial_scalar(self) -> float:
        return 0.0  # none travels (``has_scalar``)

    def step(self, w: torch.Tensor, moments: list[torch.Tensor], batch: torch.Tensor) -> None:
        """One local step of the devices' models ``w`` [n, d] (and ``moments``) in place."""
        raise NotImplementedError

    def local_round(self, rows, idx):
        n = len(rows)
        w = self.start(self.theta, n)
        moments = [self.start(v, n) for v in self.moments]
        for t in range(self.params.local_steps):
            self.step(w, moments, idx[t])
        zeros = torch.zeros(n, dtype=torch.float64, device=w.device)
        return (torch.stack([w, *moments], dim=1), zeros,
                torch.full((n,), float(self.params.local_steps)))


class LocalAdam(_ModelsOnly):
    """LocalAdam (seed 003 Alg. 4, fgdro.md 2.4), the ERM ablation of FGDRO-KL-Adam: every local
    step takes h = grad loss(w; z), then m <- (1-b3) m + b3 h, q <- (1-b4) q + b4 h*h,
    w <- w - eta m / (sqrt(q) + tau) (no bias correction); the server averages w, m and q
    uniformly over the delivered uploads (3 d-vectors each way, no scalar). Against FedAdam
    (Fig. 1b): the adaptive steps are taken on the devices, with the moments averaged."""

    name = "local-adam"
    Params = LocalAdamParams
    summary = ("seed 003 Alg. 4: Adam-type local steps on the plain loss, w, m and q averaged; "
               "3 vectors each way")
    vectors = 3

    def step(self, w, moments, batch):
        p = self.params
        m, q = moments
        h = self.ctx.evaluator.stacked_gradients(w, batch)
        m.mul_(1 - p.beta3).add_(h, alpha=p.beta3)
        q.mul_(1 - p.beta4).addcmul_(h, h, value=p.beta4)
        w.sub_(p.lr * m / (q.sqrt() + p.tau))

    def apply(self, vectors, scalar):
        """q_bar stays >= 0, as KL-Adam's (``FGDROKLAdam.apply``)."""
        super().apply(vectors, scalar)
        self.moments[1].clamp_(min=0.0)


class DRDSGDParams(AlgorithmParams):
    batch_size: int = Field(32, gt=0, description="B, minibatch per local step (fgdro.md 2.5: 32, "
                                                  "the seed's setting for every method)")
    local_steps: int = Field(32, gt=0, description="I, local steps per round (fgdro.md 2.5: 32)")
    lr: float = Field(0.1, gt=0, allow_inf_nan=False,
                      description="eta, the local step size (fgdro.md 2.5: SGD-type 0.1)")
    lam: float = Field(2.0, gt=0, allow_inf_nan=False,
                       description="lambda, the KL regulariser's strength: the objective is "
                                   "lam log((1/N) sum_i exp(f_i / lam)) (default 2 [D]; Issaid "
                                   "et al.'s theory asks for lambda > 1)")


class DRDSGD(_ModelsOnly):
    """DR-DSGD (Issaid, Elgabli and Bennis 2022; fgdro.md Sec. 3's baseline table), run as FL
    over the cell: the KL-regularised objective lam log((1/N) sum_i exp(f_i(w) / lam)) has the
    minimisers of sum_i h_i with h_i = exp(f_i / lam), so every local step descends h_i with
    the minibatch estimate of its gradient, (1/lam) exp(l(w; z) / lam) grad l(w; z), l the
    minibatch loss (the biased plug-in estimate whose theory needs large batches: fgdro.md
    Sec. 3); the decentralised gossip average becomes the base station's uniform mean of the
    delivered models every I steps [D]. exp's argument is clamped at 700 (as FGDRO-KL's, fgdro.md
    Sec. 6 item 20). One d-vector each way, as FedAvg."""

    name = "dr-dsgd"
    Params = DRDSGDParams
    summary = ("KL-DRO baseline of seed 003: local steps on exp(loss/lam)-scaled minibatch "
               "gradients, models averaged; one vector each way")
    vectors = 1

    def step(self, w, moments, batch):
        p = self.params
        loss, grad = self.ctx.evaluator.stacked_losses_and_gradients(w, batch)
        scale = torch.exp(torch.clamp(loss.double() / p.lam, max=EXP_CLAMP)) / p.lam
        w.sub_(p.lr * scale.to(grad.dtype)[:, None] * grad)
