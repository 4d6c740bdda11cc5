"""Full-vector baselines: FedSGD and FedAvg (McMahan et al., 2017), the seed-002 "standard FL".

FedSGD, round k: every device computes one minibatch gradient g_i at the broadcast theta_k and
uploads Q(g_i) (d values of M bits plus a 32-bit scale); the server averages what was delivered,
g = (1/|S_k|) sum_{i in S_k} Q(g_i), broadcasts Q(g) and all copies take theta_{k+1} = theta_k - lr g.

FedAvg, round k: every device runs E local SGD steps from theta_k and uploads
Q(theta_i - theta_k); the server broadcasts the quantised mean delta Q(Delta) and all copies take
theta_{k+1} = theta_k + server_lr * Q(Delta).

Lost uploads are never aggregated; a round in which nothing arrives leaves theta unchanged and the
server broadcasts only a one-value "no update" flag.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from pydantic import Field

from wirelessfl.algorithms.base import Algorithm, AlgorithmParams, register
from wirelessfl.algorithms.types import Cost, Payload
from wirelessfl.learning.quantize import quantize_rows
from wirelessfl.learning.seeds import device_uniform, keyed_generator


class VectorUploadAlgorithm(Algorithm):
    """Shared mechanics of methods that upload one d-vector per device and broadcast one back."""

    @classmethod
    def declared_payloads(cls, d: int, bits: int) -> tuple[Payload, Payload]:
        """d values of M bits (+ a 32-bit scale) each way (seed 002, Sec. III: M d bits)."""
        return Payload.vectors(d, bits), Payload.vectors(d, bits)

    def cost(self) -> Cost:
        raise NotImplementedError

    def device_vectors(self, k: int) -> Iterator[tuple[slice, torch.Tensor]]:
        """What each device uploads, chunk by chunk: (rows, [n, d]) before quantisation."""
        raise NotImplementedError

    def apply(self, mean_vector: torch.Tensor) -> None:
        """Update theta with the (quantised) broadcast mean."""
        raise NotImplementedError

    def quantize(self, vectors: torch.Tensor, stream: str, k: int, rows: slice) -> torch.Tensor:
        """Per-vector-scaled unbiased M-bit quantisation with noise keyed by (device, round)."""
        if self.bits >= 32:
            return vectors
        noise = device_uniform(self.ctx.seed, stream, k, rows, vectors.shape[1], vectors.device)
        return quantize_rows(vectors, self.bits, noise)[0]

    def round(self, k: int):
        d = self.theta.numel()
        vector, broadcast = self.declared_payloads(d, self.bits)
        result = yield from self.collect(self.cost(), vector)
        delivered = torch.as_tensor(result.delivered, device=self.theta.device)
        received = int(delivered.sum())
        if not received:
            yield from self.broadcast(Payload.scalar(self.bits, label="no-update flag"))
            return
        total = torch.zeros_like(self.theta)
        for rows, vectors in self.device_vectors(k):
            mask = delivered[rows]
            if mask.any():
                q = self.quantize(vectors, f"{self.name}-up", k, rows)
                total += q[mask].sum(0)
        mean = (total / received).unsqueeze(0)
        q_mean = self.quantize(mean, f"{self.name}-down", k, slice(0, 1))[0]
        yield from self.broadcast(broadcast)
        self.apply(q_mean)


class FedSGDParams(AlgorithmParams):
    lr: float = Field(0.1, gt=0, description="server learning rate on the averaged gradient")


@register
class FedSGD(VectorUploadAlgorithm):
    name = "fedsgd"
    Params = FedSGDParams
    summary = "one minibatch gradient per device per round, d values of M bits uploaded"

    def cost(self) -> Cost:
        return Cost(forward_passes=1, backward_passes=1, batch_size=self.params.batch_size)

    def device_vectors(self, k):
        ev = self.ctx.evaluator
        idx = ev.sample(keyed_generator(self.ctx.seed, "batch", k), self.params.batch_size)[0]
        return ev.device_gradients(self.theta, idx)

    def apply(self, mean_vector):
        self.theta = self.theta - self.params.lr * mean_vector


class FedAvgParams(AlgorithmParams):
    lr: float = Field(0.1, gt=0, description="local SGD learning rate")
    local_steps: int = Field(5, gt=0, description="E, local SGD steps per round")
    server_lr: float = Field(1.0, gt=0, description="server step on the averaged model delta")


@register
class FedAvg(VectorUploadAlgorithm):
    name = "fedavg"
    Params = FedAvgParams
    summary = "E local SGD steps per device per round, model delta (d values of M bits) uploaded"

    def cost(self) -> Cost:
        e = self.params.local_steps
        return Cost(forward_passes=e, backward_passes=e, batch_size=self.params.batch_size)

    def device_vectors(self, k):
        p, ev = self.params, self.ctx.evaluator
        idx = ev.sample(keyed_generator(self.ctx.seed, "batch", k), p.batch_size, p.local_steps)
        for rows, models in ev.local_sgd(self.theta, idx, p.lr):
            yield rows, models - self.theta

    def apply(self, mean_vector):
        self.theta = self.theta + self.params.server_lr * mean_vector
