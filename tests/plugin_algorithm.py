"""A plugin algorithm written against the contract only: FedSGD with heavy-ball momentum at the
server (Polyak 1964's momentum on the averaged gradient), in a round of its own.

It imports the algorithm base (``Algorithm``, ``AlgorithmParams``), the contract's ``Payload``
and ``Cost``, numpy, torch and pydantic: nothing of the engine, the pipeline or the scenario,
which it reaches only through what the base hands it at run time (``self.ctx``, ``collect``,
``broadcast``, ``quantize``, ``minibatches``). tests/test_plugin_conformance.py checks both:
its imports, and that it passes ``wirelessfl.testing.check_algorithm``.

Round k: every device computes one minibatch gradient g_i at the broadcast theta_k and uploads
Q(g_i) (d values of M bits and a 32-bit scale); the server averages the delivered ones,
g = mean_{i in S_k} Q(g_i), broadcasts Q(g), and every copy takes v <- beta v + Q(g),
theta <- theta - lr v (each device keeps v as the server does: it hears every Q(g)). A round in
which no upload arrives changes nothing; the server then broadcasts a one-value flag.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from wirelessfl.algorithms.base import Algorithm, AlgorithmParams
from wirelessfl.contract.payload import Cost, Payload


class MomentumSGDParams(AlgorithmParams):
    lr: float = Field(0.5, gt=0, description="server step on the velocity")
    momentum: float = Field(0.5, ge=0, lt=1, description="beta, the server's momentum")


class MomentumSGD(Algorithm):
    name = "plugin-momentum-sgd"
    Params = MomentumSGDParams
    summary = "FedSGD with server momentum: one gradient per device per round, d values up"

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1
                          ) -> tuple[Payload, Payload]:
        """A quantised d-vector each way (with its 32-bit scale below 32 bits)."""
        return (Payload.vectors(d, bits, label="gradient"),
                Payload.vectors(d, bits, label="mean gradient"))

    def setup(self) -> None:
        self.velocity = torch.zeros_like(self.theta)

    def heard(self, result) -> np.ndarray:
        """The devices whose gradients enter the average: those whose upload arrived."""
        return result.delivered_devices

    def round(self, k: int):
        d = self.theta.numel()
        work = Cost(forward_passes=1, backward_passes=1,
                    batch_size=self.ctx.evaluator.minibatch_sizes(self.params.batch_size))
        result = yield from self.collect(work, Payload.vectors(d, self.bits, label="gradient"))
        devices = self.heard(result)
        if len(devices) == 0:
            yield from self.broadcast(Payload.scalar(self.bits, label="no-update flag"))
            return
        total = torch.zeros_like(self.theta)
        batches = self.minibatches(k, devices)[0]
        for rows, gradients in self.ctx.evaluator.device_gradients(self.theta, batches):
            total += self.quantize(gradients, "momentum-sgd-up", k, devices[rows]).sum(0)
        mean = (total / len(devices)).unsqueeze(0)
        mean = self.quantize(mean, "momentum-sgd-down", k, slice(0, 1), direction="down")[0]
        yield from self.broadcast(Payload.vectors(d, self.bits, label="mean gradient"))
        self.velocity = self.params.momentum * self.velocity + mean
        self.theta = self.theta - self.params.lr * self.velocity
