"""Centralized SGD: the reference of the Fed-MCO experiment (fedmsa.md 4.1: FedMSA "vs its
centralized counterpart at equal number of updates"), as the authors' notebook runs it (fedmsa.md
4.5 [C]): plain minibatch SGD on the composed objective, every client's samples pooled at the base
station,

    x_{k+1} = x_k - lr grad_x F_hat(x_k; B_k),   |B_k| = batch_size (100), lr = 0.01,

with F_hat the plug-in estimate of the composition on the batch (``MSAProblem.pooled_gradient``:
no trackers, so a biased gradient: what FedMSA's tracking recipe avoids). Not a federated method:
nothing crosses the air and no device computes, so its rounds cost no time and no device energy
[D]; each round is one update (``local_steps`` counts them), which is what the paper compares.
The trackers z of the state are left as they start.
"""

from __future__ import annotations

import torch
from pydantic import Field

from wirelessfl.algorithms.base import Algorithm, AlgorithmParams
from wirelessfl.contract.facts import COMPOSITIONAL
from wirelessfl.contract.payload import Payload
from wirelessfl.contract.problem import KEY_LIMIT
from wirelessfl.learning.seeds import keyed_rng


class CentralizedSGDParams(AlgorithmParams):
    lr: float = Field(0.01, gt=0, description="step size (the notebook's 0.01, fedmsa.md 4.5 "
                                              "[C])")
    batch_size: int = Field(100, gt=0, description="samples a step, drawn with replacement from "
                                                   "every client's pooled samples (the "
                                                   "notebook's 100, fedmsa.md 4.5 [C])")


class CentralizedSGD(Algorithm):
    name = "centralized-sgd"
    Params = CentralizedSGDParams
    summary = ("fedmsa.md 4.1's reference: minibatch SGD on the pooled composed objective at "
               "the base station; no radio, one update a round")
    problem_needs = COMPOSITIONAL
    # Off the air: the conformance suite checks that it spends and sends nothing
    # (wirelessfl.testing.check_off_air).
    uploads_per_round = 0

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1
                          ) -> tuple[Payload, Payload]:
        """Nothing crosses the air."""
        return Payload.scalar(bits, count=0), Payload.scalar(bits, count=0)

    def round(self, k: int):
        problem = self.ctx.evaluator
        key = int(keyed_rng(self.ctx.seed, "centralized-batch", k).integers(0, KEY_LIMIT))
        grad = problem.pooled_gradient(self.theta, key, self.params.batch_size)
        # a NaN or an infinity here is found at the next evaluation (nothing is sent to check)
        x = problem.x_part(self.theta).to(torch.float64) - self.params.lr * grad
        self.theta = torch.cat([x.to(self.theta.dtype), self.theta[x.numel():]])
        return
        yield  # a round of no events: no simulated time passes
