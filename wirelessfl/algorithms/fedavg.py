"""Full-vector baselines: FedSGD and FedAvg (McMahan et al., 2017), the seed-002 "standard FL",
and the heterogeneity baselines FedProx (Li et al., MLSys 2020) and SCAFFOLD (Karimireddy et al.,
ICML 2020) that seed 000 compares against.

FedSGD, round k: every device computes one minibatch gradient g_i at the broadcast theta_k and
uploads Q(g_i) (d values of M bits plus a 32-bit scale); the server averages what was delivered,
g = sum_{i in S_k} n_i Q(g_i) / sum_{i in S_k} n_i, broadcasts Q(g) and all copies take
theta_{k+1} = theta_k - lr g.

FedAvg, round k: every device runs E local SGD steps from theta_k and uploads
Q(theta_i - theta_k); the server broadcasts the quantised mean delta Q(Delta), Delta =
sum_{i in S_k} n_i Q(Delta_i) / sum_{i in S_k} n_i, and all copies take
theta_{k+1} = theta_k + server_lr * Q(Delta).

The weights n_i are the devices' sample counts (``average: weighted``, the default): McMahan et
al. (2017) weigh client k by n_k / n in FedSGD (Sec. 2: sum_k (n_k / n) g_k) and in FedAvg
(Alg. 1: w_{t+1} = sum_{k in S_t} (n_k / m_t) w^k_{t+1}, m_t = sum_{k in S_t} n_k, the sampled
clients' total); here S_k is the set whose upload arrived, so a lost upload leaves the
normaliser too. ``Problem.sample_weights`` says what n_k is for the problem's f_k (equal for
problems without samples). ``average: uniform`` weighs every delivered upload 1 / |S_k| (the
objective (1/N) sum_i f_i of most specs, e.g. fgdro.md Sec. 6 item 10). With ``server_data`` the
base station is one more client, weighted by its own sample count.

FedProx, round k: as FedAvg, but each local step descends f_i(w) + (mu/2) ||w - theta_k||^2
(Li et al. 2020, eq. 2), i.e. w <- w - lr (g_i(w) + mu (w - theta_k)); averaged like FedAvg
(Li et al.'s Alg. 2 samples devices with probability p_k = n_k / n and averages them uniformly,
which in expectation is the n_k-weighted average over all devices; participation here draws
devices uniformly, so the weight goes into the average instead [D]).

SCAFFOLD (option II of Karimireddy et al. 2020, Alg. 1), round k with server and device control
variates c, c_i: K local steps y <- y - lr (g_i(y) - c_i + c); then
c_i+ = c_i - c + (theta_k - y) / (K lr); the device uploads Delta y_i = y - theta_k and
Delta c_i = c_i+ - c_i (two d-vectors); the server takes theta += server_lr mean_S(Delta y_i) and
c += (1/N) sum_S Delta c_i and broadcasts both updates (two d-vectors): uniform averages over the
sampled clients, as Alg. 1 has them (no sample weights; ``average: uniform`` only). A device
commits its new c_i only when its upload was delivered (the base station's acknowledgement), so c
stays the mean of the c_i that the server knows; both directions are quantised like FedAvg's
vectors.

E is ``local_steps`` every round, or with ``local_steps_schedule: zo-hfl`` [D] the round's
E_r = 2 min(max_local_steps, ceil(tau sqrt(r+1))): ZO-HFL's two solves of H_r steps
(step_schedule.py), so that the baselines run ZO-HFL's total local steps (zo_hfl.md 4.3, A12).

Lost uploads are never aggregated; a round in which nothing arrives leaves theta unchanged and the
server broadcasts only a one-value "no update" flag.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import numpy as np
import torch
from pydantic import Field, field_validator, model_serializer, model_validator

from wirelessfl.algorithms.base import Algorithm, AlgorithmParams
from wirelessfl.algorithms.device_state import BLOCK_ROWS, DeviceRows, expected_rows
from wirelessfl.algorithms.step_schedule import DEFAULT_MAX_LOCAL_STEPS, DEFAULT_TAU, zo_hfl_steps
from wirelessfl.contract.payload import Cost, Payload
from wirelessfl.learning.seeds import keyed_generator


class VectorUploadAlgorithm(Algorithm):
    """Shared mechanics of methods that upload one d-vector per device and broadcast one back."""

    computes_participants_only = True
    reads_device_indices = True

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1) -> tuple[Payload, Payload]:
        """d values of M bits (+ a 32-bit scale) each way (seed 002, Sec. III: M d bits)."""
        return Payload.vectors(d, bits), Payload.vectors(d, bits)

    def cost(self) -> Cost:
        raise NotImplementedError

    def device_vectors(self, k: int, devices: np.ndarray
                       ) -> Iterator[tuple[slice, torch.Tensor]]:
        """What the devices ``devices`` upload, chunk by chunk: (rows of ``devices``, [rows, d])
        before quantisation; each chunk a tensor of its own, which ``round`` overwrites (no
        second [rows, d] buffer for the weighted sum)."""
        raise NotImplementedError

    def apply(self, mean_vector: torch.Tensor) -> None:
        """Update theta with the (quantised) broadcast mean."""
        raise NotImplementedError

    def server_vector(self, k: int) -> torch.Tensor:
        """What the base station contributes from its own data (``server_data: true``): the
        same local work a device does, on minibatches of the server's samples."""
        raise NotImplementedError

    def setup(self) -> None:
        """The weights of the average: n_k (``average: weighted``) or 1 (``uniform``), divided by
        the largest n_k, so that equal sample counts give weights of exactly 1 (the uniform
        average's arithmetic)."""
        ev, p = self.ctx.evaluator, self.params
        n = self.ctx.num_devices
        sizes = ev.sample_weights() if p.average == "weighted" else np.ones(n)
        server = 1.0
        if p.server_data and p.average == "weighted":
            server = ev.server_sample_weight()
        scale = float(sizes.max())
        self.weights = torch.as_tensor(sizes / scale, dtype=self.theta.dtype,
                                       device=self.theta.device)
        self.server_weight = server / scale

    def round(self, k: int):
        d = self.theta.numel()
        vector, broadcast = self.declared_payloads(d, self.bits)
        result = yield from self.collect(self.cost(), vector)
        # Only the delivered uploads enter the average, and whether an upload arrives is known
        # before anyone computes, so only the devices whose upload arrives are computed for
        # (their minibatches and noise are theirs whichever devices are computed together).
        devices = result.delivered_devices
        received = len(devices)
        weights = self.weights[torch.as_tensor(devices, device=self.theta.device)]
        total = torch.zeros_like(self.theta)
        weight = float(weights.double().sum()) if received else 0.0
        if self.params.server_data:  # the base station takes part as one more (wired) client
            total += self.server_weight * self.server_vector(k)
            received += 1
            weight += self.server_weight
        if not received:
            yield from self.broadcast(Payload.scalar(self.bits, label="no-update flag"))
            return
        if len(devices):
            for rows, vectors in self.device_vectors(k, devices):
                q = self.quantize(vectors, f"{self.name}-up", k, devices[rows])
                total += q.mul_(weights[rows, None]).sum(0)
                del vectors, q  # freed before the next chunk is computed: one chunk at a time
        yield from self.send_mean(k, total, weight, broadcast)

    def send_mean(self, k: int, total: torch.Tensor, weight: float, broadcast: Payload):
        """Broadcast the quantised mean Q(total / weight) of what arrived, then apply it."""
        mean = (total / weight).unsqueeze(0)
        q_mean = self.quantize(mean, f"{self.name}-down", k, slice(0, 1), direction="down")[0]
        yield from self.broadcast(broadcast)
        self.apply(q_mean)


class VectorUploadParams(AlgorithmParams):
    average: Literal["weighted", "uniform"] = Field(
        "weighted", description="weighted: the delivered uploads weighted by the devices' sample "
                                "counts n_k / sum n_k (McMahan et al. 2017, Alg. 1); uniform: "
                                "1 / |delivered| each (the unweighted mean)")
    server_data: bool = Field(
        False, description="the base station also trains on the data it keeps "
                           "(data.server_fraction), as one more client in the average (the "
                           "fair baseline for ZO-HFL, zo_hfl.md A14); its compute is not charged "
                           "to any device")


class FedSGDParams(VectorUploadParams):
    lr: float = Field(0.1, gt=0, description="server learning rate on the averaged gradient")


class FedSGD(VectorUploadAlgorithm):
    name = "fedsgd"
    Params = FedSGDParams
    summary = "one minibatch gradient per device per round, d values of M bits uploaded"

    def cost(self) -> Cost:
        return Cost(forward_passes=1, backward_passes=1,
                    batch_size=self.ctx.evaluator.minibatch_sizes(self.params.batch_size))

    def device_vectors(self, k, devices):
        return self.ctx.evaluator.device_gradients(self.theta, self.minibatches(k, devices)[0])

    def server_vector(self, k):
        p = self.params
        return self.ctx.evaluator.server_gradient(
            self.theta, keyed_generator(self.ctx.seed, "server-batch", k), p.batch_size)

    def apply(self, mean_vector):
        self.theta = self.theta - self.params.lr * mean_vector


# The keys of the local-steps schedule, left out of a dumped ``fixed`` schedule [D].
SCHEDULE_KEYS = ("local_steps_schedule", "tau", "max_local_steps")


class FedAvgParams(VectorUploadParams):
    lr: float = Field(0.1, gt=0, description="local SGD learning rate")
    local_steps: int = Field(5, gt=0, description="E, local SGD steps per round (with "
                                                  "local_steps_schedule: fixed)")
    server_lr: float = Field(1.0, gt=0, description="server step on the averaged model delta")
    local_steps_schedule: Literal["fixed", "zo-hfl"] = Field(
        "fixed", description="fixed: E = local_steps every round; zo-hfl [D]: round r runs "
                             "E_r = 2 min(max_local_steps, ceil(tau sqrt(r+1))) steps, ZO-HFL's "
                             "two solves of H_r steps, so that both run the same total local "
                             "steps (zo_hfl.md 4.3 and A12)")
    tau: float | None = Field(
        None, gt=0, description=f"local_steps_schedule zo-hfl only: tau of H_r (default "
                                f"{DEFAULT_TAU:g}, ZO-HFL's; give the ZO-HFL run's own)")
    max_local_steps: int | None = Field(
        None, gt=0, description=f"local_steps_schedule zo-hfl only: the cap on H_r (default "
                                f"{DEFAULT_MAX_LOCAL_STEPS}, ZO-HFL's)")

    @model_validator(mode="after")
    def _schedule_keys(self):
        """tau and max_local_steps belong to the zo-hfl schedule, which takes ZO-HFL's defaults
        for them (written into the parameters, so a manifest records the steps run); a
        local_steps other than its default there would be ignored, so it is refused [D]."""
        if self.local_steps_schedule == "fixed":
            given = [key for key in SCHEDULE_KEYS[1:] if getattr(self, key) is not None]
            if given:
                raise ValueError(f"{given[0]} belongs to local_steps_schedule: zo-hfl; with the "
                                 "default fixed schedule every round runs local_steps: remove "
                                 f"{given[0]}, or set local_steps_schedule: zo-hfl")
            return self
        default = type(self).model_fields["local_steps"].default
        if self.local_steps != default:
            raise ValueError(f"local_steps = {self.local_steps} is the fixed schedule's E; with "
                             "local_steps_schedule: zo-hfl round r runs 2 min(max_local_steps, "
                             "ceil(tau sqrt(r+1))) steps: remove local_steps, or set tau")
        if self.tau is None:
            self.tau = DEFAULT_TAU
        if self.max_local_steps is None:
            self.max_local_steps = DEFAULT_MAX_LOCAL_STEPS
        return self

    @model_serializer(mode="wrap")
    def _fixed_schedule_unlisted(self, handler):
        """The default fixed schedule is dumped without its keys: a resolved scenario (its
        fingerprint, a checkpoint's, the sweeps that compare it) reads as before the schedule
        existed, so run folders written before it resume [D]."""
        data = handler(self)
        if isinstance(data, dict) and self.local_steps_schedule == "fixed":
            for key in SCHEDULE_KEYS:
                data.pop(key, None)
        return data

    def round_steps(self, r: int) -> int:
        """E_r, the local steps of round r: local_steps, or ZO-HFL's 2 H_r (step_schedule.py).
        A function of r alone, so a resumed run needs no state for it."""
        if self.local_steps_schedule == "fixed":
            return self.local_steps
        return 2 * zo_hfl_steps(self.tau, r, self.max_local_steps)


def steps_cost(algorithm: Algorithm) -> Cost:
    """E_r forward and E_r backward passes a device: the round's local steps, which ``round``
    sets (``round_local_steps``, the rounds table's count) before it collects."""
    e = algorithm.round_local_steps
    return Cost(forward_passes=e, backward_passes=e,
                batch_size=algorithm.ctx.evaluator.minibatch_sizes(algorithm.params.batch_size))


class FedAvg(VectorUploadAlgorithm):
    name = "fedavg"
    Params = FedAvgParams
    summary = "E local SGD steps per device per round, model delta (d values of M bits) uploaded"

    def round(self, k: int):
        self.round_local_steps = self.params.round_steps(k)
        yield from super().round(k)

    def cost(self) -> Cost:
        return steps_cost(self)

    def device_vectors(self, k, devices):
        p, ev = self.params, self.ctx.evaluator
        idx = self.minibatches(k, devices, p.round_steps(k))
        # each chunk is done with (quantised, summed) before the next is asked for: ``reuse``
        for rows, models in ev.local_sgd(self.theta, idx, p.lr, reuse=True):
            yield rows, models.sub_(self.theta)  # the delta, in the models' own memory
            del models  # one chunk alive at a time

    def server_vector(self, k):
        """E local steps on the server's minibatches (with replacement), as its model delta."""
        p, ev = self.params, self.ctx.evaluator
        gen = keyed_generator(self.ctx.seed, "server-batch", k)
        model = self.theta.clone()
        for _ in range(p.round_steps(k)):
            g = ev.server_gradient(model, gen, p.batch_size)
            model = model - p.lr * (g + self.proximal_pull(model))
        return model - self.theta

    def proximal_pull(self, model: torch.Tensor) -> torch.Tensor | float:
        return 0.0

    def apply(self, mean_vector):
        self.theta = self.theta + self.params.server_lr * mean_vector


class FedProxParams(FedAvgParams):
    mu: float = Field(0.01, ge=0, description="mu, weight of the proximal term (Li et al. 2020)")


class FedProx(FedAvg):
    name = "fedprox"
    Params = FedProxParams
    summary = "FedAvg whose local steps add a proximal pull mu (w - theta) toward the broadcast model"

    def proximal_pull(self, model):
        return self.params.mu * (model - self.theta)

    def device_vectors(self, k, devices):
        p, ev = self.params, self.ctx.evaluator
        steps = p.round_steps(k)
        idx = self.minibatches(k, devices, steps)
        for rows in ev.row_chunks(len(devices), p.batch_size, own_model=True):
            models = self.theta.expand(rows.stop - rows.start, -1).clone()
            for e in range(steps):
                g = ev.stacked_gradients(models, idx[e, rows])
                models.sub_(g + self.proximal_pull(models), alpha=p.lr)
            yield rows, models.sub_(self.theta)
            del models, g  # one chunk alive at a time


class FedAdamParams(VectorUploadParams):
    average: Literal["weighted", "uniform"] = Field(
        "uniform", description="uniform (default): the delivered deltas' plain mean, as Reddi "
                               "et al. (2021, Alg. 2) average the sampled clients; weighted: "
                               "by the devices' sample counts")
    lr: float = Field(0.1, gt=0, description="local SGD learning rate")
    local_steps: int = Field(5, gt=0, description="E, local SGD steps per round")
    server_lr: float = Field(0.01, gt=0, description="eta, the server's Adam step (Reddi et al. "
                                                     "2021 tune it; 0.01 is our default [D])")
    beta1: float = Field(0.9, ge=0, lt=1, description="b1, decay of the server's momentum "
                                                      "(Reddi et al. 2021: 0.9)")
    beta2: float = Field(0.99, ge=0, lt=1, description="b2, decay of the server's second moment "
                                                       "(Reddi et al. 2021: 0.99)")
    tau: float = Field(1e-3, gt=0, description="tau, the adaptivity added to sqrt(v) (Reddi et "
                                               "al. 2021 tune it; 1e-3 is our default [D])")

    def round_steps(self, r: int) -> int:
        """E every round (FedAvg's fixed schedule)."""
        return self.local_steps


class FedAdam(FedAvg):
    """FedAdam (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Alg. 2 with the Adam
    server update): devices run E local SGD steps as in FedAvg and upload their deltas; the base
    station takes the mean delta D and keeps Adam's moments of it,
      m <- b1 m + (1 - b1) D;  v <- b2 v + (1 - b2) D*D;  theta <- theta + eta m / (sqrt(v) + tau)
    (no bias correction, as Reddi et al. write it). What crosses the air is FedAvg's: one
    d-vector each way; the broadcast carries the quantised mean delta, from which every device
    (holding m and v as the base station does, since all of them follow from the broadcasts)
    takes the same step [D]: a device that missed a broadcast is resynced with the model."""

    name = "fedadam"
    Params = FedAdamParams
    summary = ("FedAvg's local SGD with an Adam step at the base station (Reddi et al. 2021); "
               "one d-vector each way")

    def setup(self) -> None:
        super().setup()
        self.m = torch.zeros_like(self.theta)
        self.v = torch.zeros_like(self.theta)

    def apply(self, mean_vector):
        p = self.params
        self.m = p.beta1 * self.m + (1 - p.beta1) * mean_vector
        self.v = p.beta2 * self.v + (1 - p.beta2) * mean_vector * mean_vector
        self.theta = self.theta + p.server_lr * self.m / (self.v.sqrt() + p.tau)


class ScaffoldParams(FedAvgParams):
    average: Literal["weighted", "uniform"] = Field(
        "uniform", description="uniform only: SCAFFOLD averages the sampled clients' updates "
                               "uniformly (Karimireddy et al. 2020, Alg. 1)")

    @field_validator("average")
    @classmethod
    def _uniform_only(cls, value: str) -> str:
        if value != "uniform":
            raise ValueError("scaffold averages the sampled clients uniformly (Karimireddy et "
                             "al. 2020, Alg. 1); remove average or set it to uniform")
        return value

    @field_validator("server_data")
    @classmethod
    def _no_server_client(cls, value: bool) -> bool:
        if value:
            raise ValueError("server_data is not available for scaffold (the server would need "
                             "a control variate of its own); remove it")
        return value


class Scaffold(VectorUploadAlgorithm):
    name = "scaffold"
    peak_device_arrays = 1  # c_i between rounds (models and uploads go chunk by chunk)
    Params = ScaffoldParams
    summary = "drift-corrected local SGD with control variates; two d-vectors up and two down"

    @classmethod
    def state_rows(cls, num_devices, params):
        """c_i of the devices that took part so far (``DeviceRows``: expected after all rounds,
        plus the last storage block's slack)."""
        held = expected_rows(num_devices, params.participation, params.rounds)
        return min(float(num_devices), held + BLOCK_ROWS)

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1) -> tuple[Payload, Payload]:
        """Model delta and control-variate delta, each d values of M bits (+ a scale), each way."""
        return Payload.vectors(d, bits, count=2), Payload.vectors(d, bits, count=2)

    def setup(self) -> None:
        self.c = torch.zeros_like(self.theta)
        # c_i = 0 until device i's first delivered upload: rows only for the devices that
        # have one (a cross-device population's c_i would otherwise be N x d from round 0).
        self.c_device = DeviceRows(self.ctx.num_devices, torch.zeros_like(self.theta))

    def cost(self) -> Cost:
        return steps_cost(self)

    def round(self, k: int):
        p, ev, d = self.params, self.ctx.evaluator, self.theta.numel()
        steps = self.round_local_steps = p.round_steps(k)
        up, down = self.declared_payloads(d, self.bits)
        result = yield from self.collect(self.cost(), up)
        # Only delivered uploads are aggregated and only they commit c_i: compute those alone.
        devices = result.delivered_devices
        received = len(devices)
        if not received:
            yield from self.broadcast(Payload.scalar(self.bits, label="no-update flag"))
            return
        idx = self.minibatches(k, devices, steps)
        total_y, total_c = torch.zeros_like(self.theta), torch.zeros_like(self.theta)
        for rows in ev.row_chunks(received, p.batch_size, own_model=True):
            chunk = devices[rows]
            c_old = self.c_device.get(chunk)
            correction = self.c - c_old
            models = self.theta.expand(len(chunk), -1).clone()
            for e in range(steps):
                models.sub_(ev.stacked_gradients(models, idx[e, rows]) + correction, alpha=p.lr)
            delta_y = models - self.theta
            delta_c = -self.c - delta_y / (steps * p.lr)  # c_i+ - c_i
            q_y = self.quantize(delta_y, "scaffold-up-y", k, chunk)
            q_c = self.quantize(delta_c, "scaffold-up-c", k, chunk)
            total_y += q_y.sum(0)
            total_c += q_c.sum(0)
            self.c_device.set(chunk, c_old + q_c)
        q_y_mean = self.quantize((total_y / received)[None], "scaffold-down-y", k, slice(0, 1),
                                 direction="down")[0]
        q_c_step = self.quantize((total_c / self.ctx.num_devices)[None], "scaffold-down-c", k,
                                 slice(0, 1), direction="down")[0]
        yield from self.broadcast(down)
        self.theta = self.theta + p.server_lr * q_y_mean
        self.c = self.c + q_c_step
