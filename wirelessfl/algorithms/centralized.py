"""Centralized references of the Fed-MCO experiment, off the air.

Centralized SGD: the reference of the Fed-MCO experiment (fedmsa.md 4.1: FedMSA "vs its
centralized counterpart at equal number of updates"), as the authors' notebook runs it (fedmsa.md
4.5 [C]): plain minibatch SGD on the composed objective, every client's samples pooled at the base
station,

    x_{k+1} = x_k - lr grad_x F_hat(x_k; B_k),   |B_k| = batch_size (100), lr = 0.01,

with F_hat the plug-in estimate of the composition on the batch (``MSAProblem.pooled_gradient``:
no trackers, so a biased gradient: what FedMSA's tracking recipe avoids). Not a federated method:
nothing crosses the air and no device computes, so its rounds cost no time and no device energy
[D]; each round is one update (``local_steps`` counts them), which is what the paper compares.
The trackers z of the state are left as they start.

Centralized STSA: the tracking recipe FedMSA federates, run where the data is pooled (fedmsa.md
Table 1's non-federated MSA method, "STSA"; Sec. 2.1's updates with one client holding every
sample and no local steps), so that "fewer updates than its centralized counterpart" can be
asked of the counterpart that tracks the inner values too:

    d_k = maps(theta_k; xi_k) + (1 - rho_k) (d_{k-1} - maps(theta_{k-1}; xi_k)),
    theta_{k+1} = theta_k - steps * d_k   (alpha on x, beta on the trackers z),

rho_0 = 1, one sample xi_k of ``batch_size`` pooled samples a step, used at both points
(``MSAProblem.pooled_maps``). That is FedMSA's Phase A and one Phase B step (K = 1) with M = 1
client [D]. Off the air like centralized SGD: one update a round, no time, no device energy.
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


class OffAirReference(Algorithm):
    """A centralized reference on a compositional problem's pooled data: nothing crosses the
    air, no device computes (the conformance suite checks that it spends and sends nothing,
    wirelessfl.testing.check_off_air), one update a round."""

    problem_needs = COMPOSITIONAL
    uploads_per_round = 0

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1
                          ) -> tuple[Payload, Payload]:
        """Nothing crosses the air."""
        return Payload.scalar(bits, count=0), Payload.scalar(bits, count=0)


class CentralizedSGD(OffAirReference):
    name = "centralized-sgd"
    Params = CentralizedSGDParams
    summary = ("fedmsa.md 4.1's reference: minibatch SGD on the pooled composed objective at "
               "the base station; no radio, one update a round")

    def round(self, k: int):
        problem = self.ctx.evaluator
        key = int(keyed_rng(self.ctx.seed, "centralized-batch", k).integers(0, KEY_LIMIT))
        grad = problem.pooled_gradient(self.theta, key, self.params.batch_size)
        # a NaN or an infinity here is found at the next evaluation (nothing is sent to check)
        x = problem.x_part(self.theta).to(torch.float64) - self.params.lr * grad
        self.theta = torch.cat([x.to(self.theta.dtype), self.theta[x.numel():]])
        return
        yield  # a round of no events: no simulated time passes


class CentralizedSTSAParams(AlgorithmParams):
    alpha: float = Field(0.0003, gt=0, description="step on x (FedMSA's alpha; the notebook's "
                                                   "3e-4, fedmsa.md 4.5 [C])")
    beta: float = Field(0.0003, gt=0, description="step on the trackers z (FedMSA's beta; the "
                                                  "notebook's 3e-4, fedmsa.md 4.5 [C])")
    rho: float = Field(0.5, ge=0, le=1, description="momentum of the direction (FedMSA's rho; "
                                                    "1 = plain map evaluation); step 0 uses 1")
    batch_size: int = Field(100, gt=0, description="pooled samples a step, drawn with "
                                                   "replacement (the notebook's 100, fedmsa.md "
                                                   "4.5 [C])")


class CentralizedSTSA(OffAirReference):
    name = "centralized-stsa"
    Params = CentralizedSTSAParams
    summary = ("fedmsa.md's tracking recipe (STSA) on the pooled data at the base station: "
               "FedMSA with one client and K = 1; no radio, one update a round")

    def setup(self) -> None:
        ev, p = self.ctx.evaluator, self.params
        self.steps = ev.step_sizes((p.alpha,) + (p.beta,) * (len(ev.blocks) - 1))
        self.previous = None  # theta_{k-1} [P], float64
        self.direction = None  # d_{k-1} [P], float64

    def round(self, k: int):
        problem, p = self.ctx.evaluator, self.params
        key = int(keyed_rng(self.ctx.seed, "stsa-batch", k).integers(0, KEY_LIMIT))
        state = self.theta.to(torch.float64)
        if self.direction is None or p.rho == 1:
            direction = problem.pooled_maps(state[None], key, p.batch_size)[0]
        else:
            both = problem.pooled_maps(torch.stack([state, self.previous]), key, p.batch_size)
            direction = both[0] + (1 - p.rho) * (self.direction - both[1])
        self.previous, self.direction = state, direction
        self.theta = (state - self.steps * direction).to(self.theta.dtype)
        return
        yield  # a round of no events: no simulated time passes
