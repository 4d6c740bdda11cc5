"""Methods whose uploads superpose on the air (``air = "superposition"``; the analog uplink of
channel/analog.py): 1P-ZOFL and AirComp FedSGD / FedAvg. Each device's values are never seen
alone: the base station receives the channel-weighted sum plus noise and who transmitted.

**1P-ZOFL** (Mhanna and Assaad, "Rendering wireless environments useful for gradient estimators:
a zero-order stochastic federated learning method", arXiv 2401.17460; seed 002's reference [17],
whose DZOFL is its digital counterpart). Iteration k, with a perturbation Phi_k shared by all
devices (Rademacher +-1/sqrt(d), regenerated from (seed, k) as DZOFL's):

    device i:  v_i = f_i(theta_k + gamma_k Phi_k; xi_i)          (one forward pass)
               transmits v_i as one analog symbol, at once with every other device
    air:       y_k = sum_{i in K_k} w_i v_i + noise              (w_i = |h_i| without channel
               state at the transmitters: the channel is part of the estimator)
    server:    Delta_k = (N / |K_k|) y_k, broadcast as one M-bit scalar (theta unchanged when
               no device transmitted)
    all:       theta_{k+1} = theta_k - alpha_k Phi_k Q(Delta_k)

with alpha_k = alpha_0 (1+k)^-v1, gamma_k = gamma_0 (1+k)^-v2. What is the paper's and what is
ours: the paper's Algorithm 1 could not be read in any copy we could reach (docs/algorithms.md
"1P-ZOFL: what is the paper's"). From its abstract (v1, v2): a one-point estimator, one scalar
per device, the channel used by the estimator instead of estimated, a rate O(K^(-1/3)); from the
public reviews of its ICLR 2024 version: the estimator is Phi_k times the received (faded, noisy)
sum, without the classical d / gamma factor, and a two-point variant exists. Ours [D]: the
estimator's form above, the (N / |K_k|) rescaling (DZOFL's for lost uploads), the default
exponents (v1 = 0.51, v2 = 0.17: the choice the rate K^(-1/3 + eps) follows from for a
one-point estimator with a bias O(gamma^2): sum alpha_k^2 and sum alpha_k gamma_k^3 finite), the
perturbation law (seed 002's), the digital scalar broadcast (seed 002's), and the two-point
variant (``estimator: two-point``): each device sends its difference
v_i = f_i(theta + gamma Phi) - f_i(theta - gamma Phi) as one analog value, DZOFL's scalar sent
over the air (the reviewed version sends the two queries in two channel uses; one value of the
difference has a far smaller amplitude, so the receiver noise, relative to the largest value
sent, is far smaller), exponents DZOFL's 0.26.

**AirComp FedSGD / FedAvg** (Zhu, Wang and Huang, "Broadband analog aggregation for low-latency
federated edge learning", IEEE TWC 2020; Amiri and Gunduz, "Machine learning at the wireless
edge: distributed SGD over-the-air", IEEE TSP 2020): the devices' gradients (FedSGD) or model
deltas (FedAvg) cross the analog uplink, d channel uses whatever the number of devices, under
the profile's power control (truncated channel inversion by default, with cell-interior
scheduling by ``uplink.analog.interior_radius_m``); the base station divides the received sum by
the transmitting devices' total weight (their sample counts, or 1 each) and broadcasts the
quantised mean digitally, as FedSGD / FedAvg do; the local work is theirs, unchanged.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from wirelessfl.algorithms.base import Algorithm, ScalarFormatParams
from wirelessfl.algorithms.dzofl import decaying_steps, rademacher_direction
from wirelessfl.algorithms.fedavg import (
    FedAvg,
    FedAvgParams,
    FedSGD,
    FedSGDParams,
    VectorUploadAlgorithm,
)
from wirelessfl.contract.memory import RoundShape
from wirelessfl.contract.payload import Cost, Payload
from wirelessfl.contract.port import PowerControl
from wirelessfl.learning.seeds import keyed_generator


def power_control_field(default: str, why: str):
    """The ``power_control`` parameter of a method on the analog uplink (channel/analog.py)."""
    return Field(default, description="truncated-inversion: the transmitters know their channel, "
                                      "invert it and stay silent below "
                                      "channel.uplink.analog.threshold_db (Zhu et al. 2020); "
                                      "large-scale-inversion: they do not, their values arrive "
                                      f"scaled by |h| (default: {default}, {why})")


# The exponents of alpha_k and gamma_k by estimator [D] (module docstring).
DEFAULT_EXPONENTS = {"one-point": (0.51, 0.17), "two-point": (0.26, 0.26)}


class OverTheAirVectors(VectorUploadAlgorithm):
    """A vector method whose uploads superpose on the air (AirComp): the same local work as its
    digital parent, one analog phase of d values instead of one packet per device."""

    air = "superposition"

    @classmethod
    def round_memory(cls, params, shape: RoundShape) -> tuple[int, bool]:
        """The digital parent's round, plus every asked device's vector held at once: the
        analog phase needs them all together [devices, d] (the network's float64 sum goes
        block by block)."""
        own, chunked = super().round_memory(params, shape)
        return own + shape.devices * shape.d * shape.itemsize, chunked

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1) -> tuple[Payload, Payload]:
        """d analog values up (one channel use each, shared by every device); the digital parent's
        quantised d-vector down."""
        return Payload.analog(d), Payload.vectors(d, bits)

    def round(self, k: int):
        d = self.theta.numel()
        up, down = self.declared_payloads(d, self.bits)
        devices = self.holder_devices()
        weights = self.weights[torch.as_tensor(devices, device=self.theta.device)]
        values = torch.empty((len(devices), d), dtype=self.theta.dtype, device=self.theta.device)
        if len(devices):
            for rows, vectors in self.device_vectors(k, devices):
                # each device scales its own values by its weight before it transmits
                values[rows] = vectors * weights[rows, None]
                del vectors
        result = yield from self.superpose(self.cost(), up, values, devices)
        del values
        sent = torch.as_tensor(result.transmitted, device=self.theta.device)
        weight = float(weights[sent].double().sum()) if result.count else 0.0
        total = result.received.to(self.theta.device) if result.count else \
            torch.zeros_like(self.theta)
        received = result.count
        if self.params.server_data:  # the base station's own (wired) share, added digitally
            total = total + self.server_weight * self.server_vector(k)
            received += 1
            weight += self.server_weight
        if not received:
            yield from self.broadcast(Payload.scalar(self.bits, label="no-update flag"))
            return
        yield from self.send_mean(k, total, weight, down)


class AirCompFedSGDParams(FedSGDParams):
    power_control: PowerControl = power_control_field("truncated-inversion", "Zhu et al.'s")


class AirCompFedAvgParams(FedAvgParams):
    power_control: PowerControl = power_control_field("truncated-inversion", "Zhu et al.'s")


class AirCompFedSGD(OverTheAirVectors, FedSGD):
    name = "aircomp-fedsgd"
    Params = AirCompFedSGDParams
    summary = "FedSGD over the analog uplink: the devices' gradients superpose on the air"


class AirCompFedAvg(OverTheAirVectors, FedAvg):
    name = "aircomp-fedavg"
    Params = AirCompFedAvgParams
    summary = "FedAvg over the analog uplink: the devices' model deltas superpose on the air"

    def round(self, k: int):
        self.round_local_steps = self.params.round_steps(k)
        yield from OverTheAirVectors.round(self, k)


class ZOFLParams(ScalarFormatParams):
    estimator: Literal["one-point", "two-point"] = Field(
        "one-point", description="one-point: f_i(theta + gamma Phi), one analog value a device "
                                 "(1P-ZOFL); two-point [D]: f_i(theta + gamma Phi) - "
                                 "f_i(theta - gamma Phi), one analog value a device")
    power_control: PowerControl = power_control_field(
        "large-scale-inversion", "the paper's devices do not know their channel")
    alpha0: float = Field(0.001, gt=0, description="alpha_0, step size scale [D]")
    gamma0: float = Field(0.05, gt=0, description="gamma_0, perturbation radius scale [D]")
    v1: float | None = Field(
        None, ge=0, description="alpha_k decay exponent (default: 0.51 one-point, 0.26 "
                                "two-point [D])")
    v2: float | None = Field(
        None, ge=0, description="gamma_k decay exponent (default: 0.17 one-point, 0.26 "
                                "two-point [D])")

    @model_validator(mode="after")
    def _exponents(self):
        v1, v2 = DEFAULT_EXPONENTS[self.estimator]
        self.v1 = v1 if self.v1 is None else self.v1
        self.v2 = v2 if self.v2 is None else self.v2
        return self


class ZOFL(Algorithm):
    """1P-ZOFL (module docstring): zeroth-order FL whose scalars superpose on the air."""

    name = "1p-zofl"
    Params = ZOFLParams
    summary = ("zeroth-order FL over the analog uplink: one loss value a device superposes on "
               "the air, the channel part of the estimator; one M-bit scalar down")
    air = "superposition"
    computes_participants_only = True
    reads_device_indices = True

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1
                          ) -> tuple[Payload, Payload]:
        """One analog value up per device (either estimator), one M-bit scalar down (seed 002's
        broadcast)."""
        return Payload.analog(1), Payload.scalar(bits)

    @classmethod
    def round_memory(cls, params, shape: RoundShape) -> tuple[int, bool]:
        """Forward passes only, one value a device: a chunk's forward minibatch pass (DZOFL's)."""
        return shape.forward_bytes(), True

    def perturbation(self, k: int) -> torch.Tensor:
        """Phi_k, Rademacher +-1/sqrt(d) from (seed, k) (DZOFL's law, a stream of its own)."""
        return rademacher_direction(self.ctx.seed, "zofl-phi", k,
                                    self.theta.numel()).to(self.theta.device, self.theta.dtype)

    def step_sizes(self, k: int) -> tuple[float, float]:
        """(alpha_k, gamma_k) = (alpha_0 (1+k)^-v1, gamma_0 (1+k)^-v2)."""
        return decaying_steps(self.params, k)

    def round(self, k: int):
        p, ctx = self.params, self.ctx
        two = p.estimator == "two-point"
        up, down = self.declared_payloads(self.theta.numel(), self.bits)
        phi = self.perturbation(k)
        alpha, gamma = self.step_sizes(k)
        devices = self.holder_devices()
        passes = 2 if two else 1
        cost = Cost(forward_passes=passes, paper_forward_passes=1,
                    batch_size=ctx.evaluator.minibatch_sizes(p.batch_size))
        values = torch.zeros((len(devices), 1), dtype=self.theta.dtype, device=self.theta.device)
        if len(devices):
            idx = self.minibatches(k, devices)[0]
            values[:, 0] = ctx.evaluator.device_losses(self.theta + gamma * phi, idx)
            if two:
                values[:, 0] -= ctx.evaluator.device_losses(self.theta - gamma * phi, idx)
        result = yield from self.superpose(cost, up, values, devices)
        if not result.count:  # nobody transmitted: the model stays as it is
            yield from self.broadcast(down)
            return
        aggregate = (ctx.num_devices / result.count) * result.received.double()[0]
        fixed = p.fixed_range()
        uniform = torch.rand((1,), generator=keyed_generator(ctx.seed, "zofl-down", k))
        q = self.quantize_scalars(aggregate.reshape(1).to(self.theta.dtype),
                                  None if fixed is None else ctx.num_devices * fixed,
                                  uniform, direction="down")
        yield from self.broadcast(down)
        self.theta = self.theta - alpha * phi * q[0]

