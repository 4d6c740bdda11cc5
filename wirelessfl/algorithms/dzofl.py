"""DZOFL: digital zeroth-order federated learning (seed 002, Algorithm 1; spec dzofl.md, sec. 2).

Iteration k, with a perturbation Phi_k shared by all devices:
    device i:  Delta f_i = f_i(theta_k + gamma_k Phi_k; xi_i) - f_i(theta_k - gamma_k Phi_k; xi_i)
               uploads Q(Delta f_i), one M-bit scalar
    server:    Delta f_k = (N / |S_k|) sum_{i in S_k} Q(Delta f_i)   (0 if S_k is empty)
               broadcasts Q(Delta f_k), one M-bit scalar
    all:       theta_{k+1} = theta_k - alpha_k Phi_k Q(Delta f_k)
with alpha_k = alpha_0 (1+k)^-v1, gamma_k = gamma_0 (1+k)^-v2 and Phi_k Rademacher +-1/sqrt(d).
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

from wirelessfl.algorithms.base import Algorithm, AlgorithmParams, ScalarFormatParams
from wirelessfl.algorithms.lanes import Alone, Lanes, quantize_each
from wirelessfl.contract.memory import RoundShape
from wirelessfl.contract.payload import Cost, Payload
from wirelessfl.learning.seeds import keyed_generator


class DZOFLParams(ScalarFormatParams):
    alpha0: float = Field(2.0, gt=0, description="alpha_0, step size scale")
    gamma0: float = Field(0.05, gt=0, description="gamma_0, perturbation radius scale")
    v1: float = Field(0.26, ge=0, description="alpha_k decay exponent")
    v2: float = Field(0.26, ge=0, description="gamma_k decay exponent")
    check_schedule: bool = Field(
        True, description="enforce the paper's step-size conditions on v1, v2 (seed 002, Thm. 1)")

    @model_validator(mode="after")
    def _paper_conditions(self):
        v1, v2 = self.v1, self.v2
        if self.check_schedule and not (v1 + v2 <= 1 and v1 + 3 * v2 > 1 and v1 + v2 > 0.5):
            raise ValueError(
                f"v1={v1}, v2={v2} break seed 002's conditions 0 < v1+v2 <= 1, v1+3 v2 > 1, "
                "v1+v2 > 0.5 (e.g. v1 = v2 = 0.26); set check_schedule: false to run anyway")
        return self


def rademacher_direction(seed: int, stream: str, k: int, d: int) -> torch.Tensor:
    """Phi_k [d], Rademacher +-1/sqrt(d) (float32, CPU) from (seed, stream, k): regenerated on
    every call, never stored (seed 002's perturbation law; its analog counterpart draws its own
    stream)."""
    gen = keyed_generator(seed, stream, k)
    signs = torch.randint(0, 2, (d,), generator=gen, dtype=torch.int8).float() * 2 - 1
    return signs / d**0.5


def decaying_steps(params, k: int) -> tuple[float, float]:
    """(alpha_k, gamma_k) = (alpha_0 (1+k)^-v1, gamma_0 (1+k)^-v2) of ``params``."""
    return (params.alpha0 * (1 + k) ** (-params.v1), params.gamma0 * (1 + k) ** (-params.v2))


def aggregate_delivered(q_delivered: torch.Tensor, num_devices: int) -> torch.Tensor | None:
    """Delta f_k = (N / |S_k|) sum_{i in S_k} Q(Delta f_i) from the delivered values
    q_delivered [|S_k|] (a lost packet cannot reach the aggregate); None when S_k is empty."""
    if not len(q_delivered):
        return None
    return (num_devices / len(q_delivered)) * q_delivered.sum()


class DZOFL(Algorithm):
    name = "dzofl"
    Params = DZOFLParams
    summary = "seed 002: two-point zeroth-order FL, one quantised scalar up and down per iteration"
    computes_participants_only = True
    reads_device_indices = True

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1) -> tuple[Payload, Payload]:
        """One M-bit scalar up per device and one down (seed 002, Sec. III: N M bits per iteration)."""
        return Payload.scalar(bits), Payload.scalar(bits)

    @classmethod
    def round_memory(cls, params: AlgorithmParams, shape: RoundShape) -> tuple[int, bool]:
        """Forward passes only, one scalar a device: a chunk's forward minibatch pass."""
        return shape.forward_bytes(), True

    def resync_payload(self, missed: int) -> Payload:
        """The missed broadcast scalars (the device rebuilds theta from them and the seeds), or the
        model itself when that is smaller."""
        return min(Payload.scalar(self.bits, count=missed, label="missed scalars"),
                   super().resync_payload(missed), key=lambda payload: payload.bits)

    def perturbation(self, k: int) -> torch.Tensor:
        """Phi_k, Rademacher +-1/sqrt(d), regenerated from (seed, k) on every call: never stored."""
        return rademacher_direction(self.ctx.seed, "dzofl-phi", k,
                                    self.theta.numel()).to(self.theta.device)

    # Step sizes: they change theta alone, never what crosses the air or when, so a grid over
    # them runs in lockstep (algorithms/lanes.py).
    lockstep_parameters = ("alpha0", "gamma0", "v1", "v2")

    def round(self, k: int):
        yield from self.lanes_round(Alone(self), k)

    @staticmethod
    def lanes_round(lanes: Lanes, k: int):
        """Iteration k of every live lane of ``lanes`` (one run: ``Alone``): the lead's air and
        draws (participants, minibatches, Phi_k, quantiser noise), each lane's arithmetic on
        its own theta as a run alone does it."""
        lead = lanes.lead
        p, ctx = lead.params, lead.ctx
        n = ctx.num_devices
        phi = lead.perturbation(k)
        scalar, _ = lead.declared_payloads(lead.theta.numel(), lead.bits)
        cost = Cost(forward_passes=2, paper_forward_passes=1,
                    batch_size=ctx.evaluator.minibatch_sizes(p.batch_size))
        result = yield from lanes.collect(cost, scalar)
        # Only delivered differences reach the aggregate: compute and quantise those alone.
        devices = result.delivered_devices
        live = list(lanes.live)
        steps = {id(lane): lane.step_sizes(k) for lane in live}
        # fixed None: the stochastic float format (relative error); |aggregate| <= N r under
        # the fixed format, the broadcast's range
        fixed = p.fixed_range()
        if len(devices):
            idx = lead.minibatches(k, devices)[0]
            plus = ctx.evaluator.device_losses_many(
                [lane.theta + steps[id(lane)][1] * phi for lane in live], idx)
            minus = ctx.evaluator.device_losses_many(
                [lane.theta - steps[id(lane)][1] * phi for lane in live], idx)
            q_up = quantize_each(lanes, {id(lane): a - b for lane, a, b
                                         in zip(live, plus, minus, strict=True)},
                                 fixed, lead.scalar_noise("dzofl-up", k, devices))
        yield from lanes.broadcast(scalar)
        if not len(devices):  # S_k empty: the models stay as they are
            return
        aggregates = {id(lane): aggregate_delivered(q_up[id(lane)], n) for lane in lanes.live}
        uniform = torch.rand((1,), generator=keyed_generator(ctx.seed, "dzofl-down", k))
        q_down = quantize_each(lanes, {key: value.reshape(1) for key, value in aggregates.items()},
                               None if fixed is None else n * fixed, uniform, direction="down")

        def update(lane: DZOFL) -> None:
            lane.theta = lane.theta - steps[id(lane)][0] * phi * q_down[id(lane)][0]

        lanes.each(update)

    def step_sizes(self, k: int) -> tuple[float, float]:
        """(alpha_k, gamma_k) = (alpha_0 (1+k)^-v1, gamma_0 (1+k)^-v2)."""
        return decaying_steps(self.params, k)
