"""DRFA: Distributionally Robust Federated Averaging (Deng, Kamani and Mahdavi, NeurIPS 2020,
Alg. 1), a baseline of seed 003 (fgdro.md Sec. 3, baseline table, and Sec. 4.2).

Objective: min_w max_{lambda in the simplex} sum_i lambda_i f_i(w). Round s, as we read Alg. 1
(every choice the paper leaves open is marked [D]; they are ours, not the paper's):

1. the server draws D, m clients sampled from lambda (m = round(participation N), at least 1
   [D]), and t' uniformly in {1, ..., tau} (tau = ``local_steps``); w-bar and t' reach the
   clients;
2. each client of D runs tau local SGD steps from w-bar (minibatches of ``batch_size``, step
   ``lr``) and uploads its final model and its model after step t' (two d-vectors);
3. the server averages each over the uploads that arrived: w-bar_new and w_t';
4. the server draws U, m clients uniformly, sends each w_t', and each computes one minibatch loss
   f_i(w_t'; xi) (one forward pass) and uploads it as one float64;
5. lambda <- Proj_simplex(lambda + tau gamma v), v_i = (N/m) f_i(w_t'; xi) for the i in U whose
   loss arrived, 0 otherwise (gamma = ``lr_lambda``);
6. w-bar_new is broadcast: the round ends with the downlink of the next round, as FedAvg's does.

Our choices [D]:

* D is drawn with replacement, i.i.d. from lambda (inverse CDF of m uniforms): then the
  multiplicity-weighted mean of the drawn clients' gradients is an unbiased estimate of
  sum_i lambda_i grad f_i. A client drawn c_i times computes and uploads once, and its upload
  weighs c_i in both averages (sum_{i in S} c_i x_i / sum_{i in S} c_i over the set S whose
  upload arrived; a lost upload leaves numerator and denominator). U is a uniform draw without
  replacement (Alg. 1 calls it a subset).
* The downlink: every device holds w_0 and round 0's t' at the start (as every algorithm here
  holds theta_0); the broadcast ending round s carries w-bar_{s+1} and t'_{s+1} (d values of M
  bits, their 32-bit scale below 32 bits, and t' as a 32-bit integer). Broadcasting to every
  device (not only to D) is the cell's one transmission (fgdro.md Sec. 3's default), and it
  keeps every device current for the loss phase.
* On the air, as FedAvg's and FGDRO's vectors: uploads are differences from w-bar (M bits, a
  scale each), the server quantises its averages (w-bar_new - w-bar and w_t' - w-bar) once for
  the downlink; w_t' goes to each client of U as a unicast of one d-vector (which does not make
  a device that misses it stale: it just computes no loss). The loss travels as a float64
  (fgdro.md Sec. 3: scalars float64).
* Losses: a device that is stale (missed a broadcast and was not yet resynced) or without
  energy is neither computed for nor asked, in either phase. A round in which no model upload
  arrives keeps w-bar and lambda (w_t' is undefined: no loss phase) and broadcasts a one-value
  flag with the next t'. v keeps the factor N/m of Alg. 1 whatever arrived (a lost loss is a 0
  entry, as for a client outside U).
* lambda starts uniform (1/N each); gamma defaults to 0.1, the default of ``--drfa_gamma`` in
  the authors' released code (MLOPTPSU/FedTorch, fedtorch/parameters.py); that code's per-round
  decay of gamma (x 0.9) and its floor of lambda at 1e-3 are not in Alg. 1 and not used here.
* tau = 32, B = 32 and eta = 0.1 by default: seed 003's common protocol for every method
  (fgdro.md 2.5 and 4.1), as FGDRO's defaults.

Energy: the clients of D pay tau forward and tau backward passes of B samples, those of U one
forward pass (as FedAvg's ``Cost``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import ClassVar

import numpy as np
import torch
from pydantic import Field

from wirelessfl.algorithms.base import Algorithm, AlgorithmParams
from wirelessfl.algorithms.participation import participant_count
from wirelessfl.contract.payload import VECTOR_SCALE_HEADER_BITS, Cost, Payload
from wirelessfl.learning.seeds import keyed_rng

# t' travels as one 32-bit unsigned integer [D] (the spec's "the index t'", fgdro.md Sec. 3).
T_PRIME_BITS = 32
# The loss f_i(w_t'; xi) travels as a float64 (fgdro.md Sec. 3: scalars float64, 8 B).
LOSS_BITS = 64


def project_simplex(v: np.ndarray) -> np.ndarray:
    """The Euclidean projection of v [N] onto the probability simplex {x >= 0, sum x = 1}, by
    the sort-based algorithm (Held, Wolfe and Crowder 1974; Duchi et al., ICML 2008, Fig. 1):
    with u = v sorted decreasingly, rho = the largest j with u_j - (sum_{r<=j} u_r - 1) / j > 0
    and theta = (sum_{r<=rho} u_r - 1) / rho, the projection is max(v - theta, 0). O(N log N)."""
    v = np.asarray(v, dtype=np.float64)
    u = np.sort(v)[::-1]
    excess = np.cumsum(u) - 1.0
    j = np.arange(1, len(u) + 1)
    rho = int(np.flatnonzero(u - excess / j > 0)[-1]) + 1
    theta = excess[rho - 1] / rho
    return np.maximum(v - theta, 0.0)


def draw_from(weights: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Indices drawn i.i.d. from the distribution ``weights`` [N] (>= 0), one per uniform in
    [0, 1): the first i whose cumulative weight exceeds u times the total (inverse CDF); an
    index of weight 0 is never drawn (up to rounding at the end of the cumulative sum)."""
    cdf = np.cumsum(np.asarray(weights, dtype=np.float64))
    picks = np.searchsorted(cdf, np.asarray(uniforms) * cdf[-1], side="right")
    return np.minimum(picks, len(cdf) - 1)


class DRFAParams(AlgorithmParams):
    batch_size: int = Field(32, gt=0, description="B, minibatch per local step and of the loss "
                                                  "(seed 003's protocol, fgdro.md 2.5: 32)")
    local_steps: int = Field(32, gt=0, description="tau, local SGD steps per round (DRFA's "
                                                   "synchronisation gap; fgdro.md 2.5: I = 32)")
    lr: float = Field(0.1, gt=0, allow_inf_nan=False,
                      description="eta, the local SGD step size (fgdro.md 2.5: 0.1)")
    lr_lambda: float = Field(
        0.1, gt=0, allow_inf_nan=False,
        description="gamma, the step of the projected ascent on lambda: lambda <- "
                    "Proj(lambda + tau gamma v) [D] default 0.1, the authors' code's "
                    "--drfa_gamma default (MLOPTPSU/FedTorch)")


class DRFA(Algorithm):
    name = "drfa"
    Params = DRFAParams
    summary = ("Deng et al. 2020 Alg. 1: clients sampled from lambda run tau SGD steps, upload "
               "final and step-t' models (2 vectors); a uniform set uploads its loss at the "
               "averaged step-t' model (1 float64); lambda by projected ascent")
    computes_participants_only = True
    # Upload phases of a round: the models of D, then the losses of U.
    uploads_per_round = 2
    # The round's devices are drawn by the algorithm (D from lambda with replacement, U
    # uniformly), not the base's participants: the conformance suite then checks each device's
    # traffic against ``declared_phases`` (wirelessfl/testing.py).
    samples_devices: ClassVar[bool] = True
    # [n, d] arrays of a chunk's work: the models, the step-t' models, gradients, the uploads.
    peak_device_arrays = 4

    @classmethod
    def state_rows(cls, num_devices: int, params: AlgorithmParams) -> float:
        """The round's work is held for the m drawn devices at most (lambda is N float64)."""
        return cls.peak_device_arrays * participant_count(params.participation, num_devices)

    @classmethod
    def declared_phases(cls, d: int, bits: int, participants: int = 1
                        ) -> tuple[Payload, tuple[tuple[Payload, Payload | None], ...]]:
        """(the broadcast every device gets each round, ((uplink, downlink sent before it to
        each device asked) of each upload phase)): w-bar and t' down; the two models up from
        the devices of D; w_t' down to each device of U and its loss up."""
        header = VECTOR_SCALE_HEADER_BITS if bits < 32 else 0
        broadcast = Payload(values=d, bits_per_value=bits, header_bits=header + T_PRIME_BITS,
                            label="drfa broadcast w-bar + t'")
        models = Payload.vectors(d, bits, count=2, label="drfa models (final, step t')")
        snapshot = Payload.vectors(d, bits, label="drfa w_t' unicast")
        loss = Payload.scalar(LOSS_BITS, label="drfa loss f_i(w_t')")
        return broadcast, ((models, None), (loss, snapshot))

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1
                          ) -> tuple[Payload, Payload]:
        """What a device asked in both phases of a round sends and receives: 2 d-vectors and
        a float64 up; the broadcast (d values + t') and the unicast w_t' (d values) down."""
        broadcast, ((models, _), (loss, snapshot)) = cls.declared_phases(d, bits, participants)
        up = Payload(values=models.values, bits_per_value=bits,
                     header_bits=models.header_bits + loss.bits, label="drfa uploads")
        down = Payload(values=broadcast.values + snapshot.values, bits_per_value=bits,
                       header_bits=broadcast.header_bits + snapshot.header_bits,
                       label="drfa downlinks")
        return up, down

    def resync_payload(self, missed: int) -> Payload:
        """The current w-bar at full precision and the next t'."""
        return Payload(values=self.theta.numel(), bits_per_value=32, header_bits=T_PRIME_BITS,
                       label="drfa resync w-bar + t'")

    def setup(self) -> None:
        n = self.ctx.num_devices
        self.m = participant_count(self.params.participation, n)
        self.lam = np.full(n, 1.0 / n)  # lambda^(0) uniform [D]

    # ---- the round's draws, each from a stream keyed by (seed, round) -------------------------
    def t_prime(self, k: int) -> int:
        """t' of round k, uniform in {1, ..., tau}."""
        return int(keyed_rng(self.ctx.seed, "drfa-t-prime", k).integers(1, self.params.local_steps
                                                                         + 1))

    def sampled_counts(self, k: int) -> np.ndarray:
        """[N] int: how often each device is among the m draws of D from lambda [D]."""
        uniforms = keyed_rng(self.ctx.seed, "drfa-clients", k).random(self.m)
        return np.bincount(draw_from(self.lam, uniforms), minlength=self.ctx.num_devices)

    def loss_devices(self, k: int) -> np.ndarray:
        """U: m devices drawn uniformly without replacement [D], increasing indices."""
        rng = keyed_rng(self.ctx.seed, "drfa-loss-clients", k)
        return np.sort(rng.choice(self.ctx.num_devices, self.m, replace=False)).astype(np.int64)

    # ---- the exchanges ------------------------------------------------------------------------
    def ask(self, cost: Cost, payload: Payload, devices: np.ndarray):
        """``net.collect`` over ``devices`` (increasing indices): DRFA draws its own devices, so
        the base's uniform participants do not apply. The result is aligned with them."""
        result = yield from self.ctx.net.collect(cost, payload, devices)
        self.ctx.health.collected(result.active, result.delivered)
        return result

    def local_models(self, k: int, devices: np.ndarray, t_prime: int
                     ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
        """(rows of ``devices``, final models [rows, d], models after step t' [rows, d]) of tau
        local SGD steps from w-bar, chunk by chunk, in the problem's compute precision."""
        p, ev = self.params, self.ctx.evaluator
        idx = self.minibatches(k, devices, p.local_steps)
        dtype = getattr(ev, "compute_dtype", self.theta.dtype)
        for rows in ev.row_chunks(len(devices), p.batch_size, own_model=True):
            # host seconds of learning compute (the problem's own timers are overridden here)
            before, start = ev.compute_s, time.perf_counter()
            w = self.theta.to(dtype).expand(rows.stop - rows.start, -1).clone()
            snapshot = w
            for t in range(p.local_steps):
                w = w - p.lr * ev.stacked_gradients(w, idx[t, rows])
                if t + 1 == t_prime:
                    snapshot = w
            ev.compute_s = before + (time.perf_counter() - start)
            yield rows, w, snapshot

    def round(self, k: int):
        p, ev, n = self.params, self.ctx.evaluator, self.ctx.num_devices
        broadcast, ((models_up, _), (loss_up, snapshot_down)) = \
            self.declared_phases(self.theta.numel(), self.bits)
        tau, t_prime = p.local_steps, self.t_prime(k)
        sizes = ev.minibatch_sizes(p.batch_size)
        holders = (self.missed == 0) & self.ctx.net.alive
        # 1-2. D from lambda; its devices that hold w-bar run tau steps and upload two models
        counts = self.sampled_counts(k)
        asked = np.flatnonzero((counts > 0) & holders)
        result = yield from self.ask(Cost(forward_passes=tau, backward_passes=tau,
                                          batch_size=sizes), models_up, asked)
        # only the uploads that arrive matter, and DRFA keeps no device state: only their
        # devices are computed for (their minibatches are theirs whoever is computed with them)
        arrived = result.delivered_devices
        if not len(arrived):
            yield from self.broadcast(Payload(values=1, bits_per_value=self.bits,
                                              header_bits=T_PRIME_BITS,
                                              label="no-update flag + t'"))
            return
        # 3. multiplicity-weighted averages of the delivered differences from w-bar [D]
        weights = counts[arrived].astype(np.float64)
        total = torch.zeros(2, self.theta.numel(), dtype=self.theta.dtype,
                            device=self.theta.device)
        for rows, final, snapshot in self.local_models(k, arrived, t_prime):
            w = torch.as_tensor(weights[rows], dtype=self.theta.dtype, device=self.theta.device)
            for j, models in enumerate((final, snapshot)):
                diff = (models - self.theta.to(models.dtype)).to(self.theta.dtype)
                q = self.quantize(diff, f"drfa-up-{j}", k, arrived[rows])
                total[j] += (q * w[:, None]).sum(0)
        mean = total / float(weights.sum())
        new_delta, snapshot_delta = (
            self.quantize(mean[j][None], f"drfa-down-{j}", k, slice(0, 1), direction="down")[0]
            for j in range(2))
        w_snapshot = self.theta + snapshot_delta
        # 4-5. U gets w_t', computes and uploads its loss; lambda takes a projected ascent step
        targets = np.zeros(n, dtype=bool)
        targets[self.loss_devices(k)] = True
        targets &= holders
        if targets.any():
            heard = yield from self.unicast(snapshot_down, targets)
            computing = np.flatnonzero(targets & np.asarray(heard.received, dtype=bool))
            answer = yield from self.ask(Cost(forward_passes=1, backward_passes=0,
                                              batch_size=sizes), loss_up, computing)
            got = answer.delivered_devices
            if len(got):
                idx = self.minibatches(k, got, 1, "drfa-loss")[0]
                dtype = getattr(ev, "compute_dtype", w_snapshot.dtype)
                losses = ev.device_losses(w_snapshot.to(dtype), idx).double()
                self.ctx.check_finite(losses, "up", k)
                v = np.zeros(n)
                v[got] = (n / self.m) * losses.cpu().numpy()
                self.lam = project_simplex(self.lam + tau * p.lr_lambda * v)
        # 6. the new w-bar (and the next t') to every device
        yield from self.broadcast(broadcast)
        self.theta = self.theta + new_delta
