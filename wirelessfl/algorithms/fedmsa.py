"""FedMSA (fedmsa.md, seed 001: Tarzanagh, Li, Sharma and Oymak, "Federated Multi-Sequence
Stochastic Approximation with Local Hypergradient Estimation"), Algorithm 1, on an MSA problem
(``wirelessfl.problems.bilevel``): state theta = [x; z^1..z^N], client maps of the same layout.

Round r (rho_0 = 1 and K_0 = 1 in round 0, else rho and K; fedmsa.md Sec. 2.1):

* Phase A, every client m, one sample xi used at both points (eq. 5, A9):
  d_r^m = maps^m(theta_r; xi) + (1 - rho_r) (d_{r-1} - maps^m(theta_{r-1}; xi)); UL d_r^m;
  the base station averages what arrived, d_r = [h_r; q_r], and broadcasts it.
* Phase B, S clients drawn uniformly without replacement (S = 1: Algorithm 1; S > 1: the
  "generalized FedMSA" of the authors' experiments, V3), each from theta_{r+1,0} = theta_{r+1,1}
  = theta_r with d_{r,0} = d_r, for k = 1..K_r (eq. 6, fresh sample per step used at both points):
  d_{r,k} = maps(theta_{r+1,k}) + d_{r,k-1} - maps(theta_{r+1,k-1});
  theta_{r+1,k+1} = theta_{r+1,k} - steps * d_{r,k} (alpha on x, beta on z).
  k = 1 is free (theta_{r+1,1} = theta_{r+1,0}: d_{r,1} = d_r), so K_r steps cost 2 (K_r - 1)
  map evaluations. UL the final iterate; the base station averages what arrived (S = 1: a copy)
  and broadcasts theta_{r+1}.

``refresh: false`` is the V4 ablation (local steps reuse d_r unchanged, the "frozen indirect
hypergradient" of earlier federated bilevel methods); ``rho: 1`` is V2.

What crosses the air (fedmsa.md Sec. 3.2-3.4), P = d_0 + sum_n d_n values (bilevel: d_x + 2 d_w):
Phase A, P up from every client and the averaged direction d_r (P) down; Phase B, P up from each
selected client and the new model (P) down. Two exchanges per round (``exchanges``). The
direction goes out as one broadcast to every client rather than a unicast to the selected ones
(our choice, written in docs/algorithms.md): on a broadcast downlink it costs the same airtime,
and every client needs d_r as d_{r-1} in the next round's momentum, so the next round needs no
separate (h_{r-1}, q_{r-1}) packet (A7) and each client hears 2P per round, the spec's Sec. 3.3
count. Clients keep theta_{r-1} from the previous round. A device that missed a packet gets
theta_r, theta_{r-1} and d_{r-1} (3P, float32) before it takes part again (A16).

Lost packets (A16) follow the drift family's ``on_loss``: ``wait`` asks again, ``drop`` averages
what arrived; a Phase A with nothing delivered ends the round with theta unchanged; a Phase B
with nothing delivered keeps theta_r.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from wirelessfl.algorithms.drift import DriftCorrected, DriftParams
from wirelessfl.contract.facts import MULTI_SEQUENCE, ScenarioFacts
from wirelessfl.contract.payload import Payload
from wirelessfl.contract.problem import MSAProblem
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_generator, keyed_rng


class FedMSAParams(DriftParams):
    alpha: float = Field(0.02, gt=0, description="step on x (fedmsa.md A10: 0.02 on the "
                                                 "synthetic quadratic; 0.05 for NN loss tuning)")
    beta: float = Field(0.1, gt=0, description="step on z = [w; v] (fedmsa.md A10: 0.1; keep "
                                               "alpha <= beta / 5, Sec. 2.6)")
    rho: float = Field(0.5, ge=0, le=1, description="momentum of Phase A (fedmsa.md A11: 0.5; 1 "
                                                    "= plain map evaluation, V2); round 0 uses 1")
    local_steps: int = Field(5, gt=0, description="K variance-reduced local steps of Phase B "
                                                  "(fedmsa.md Sec. 5.1: 5, 10, 20); round 0: 1")
    local_clients: int = Field(1, gt=0, description="S clients running Phase B: 1 = Algorithm 1;"
                                                    " more = the authors' generalized FedMSA "
                                                    "(V3), final iterates averaged")
    refresh: bool = Field(True, description="false: the V4 ablation, local steps reuse the "
                                            "round's direction unchanged (frozen)")


class FedMSA(DriftCorrected):
    """FedMSA, fedmsa.md Algorithm 1 (module docstring)."""

    name = "fedmsa"
    Params = FedMSAParams
    summary = ("momentum map average at all clients, then K variance-reduced local steps on "
               "S sampled clients; P = d_x + 2 d_w values per packet, two exchanges per round")
    uploads_per_round = 2
    problem_needs = MULTI_SEQUENCE  # an MSAProblem (``setup`` checks the built one)

    @classmethod
    def check_scenario(cls, params: FedMSAParams, facts: ScenarioFacts) -> str | None:
        """Phase B's S clients are drawn from the N (``setup``'s check, from the scenario)."""
        n = facts.num_devices
        if params.local_clients > n:
            return (f"algorithms '{params.display_name}': local_clients ({params.local_clients})"
                    f" exceeds the {n} clients; set local_clients <= {n}")
        return None

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1
                          ) -> tuple[Payload, Payload]:
        """Per round, a client that runs Phase B: its direction and its final iterate up; the
        averaged direction and the new model down (a client not selected uploads only one)."""
        return Payload.vectors(d, bits, count=2), Payload.vectors(d, bits, count=2)

    def resync_payload(self, missed: int) -> Payload:
        """theta_r, theta_{r-1} and d_{r-1}: what Phase A needs (A16)."""
        return Payload.vectors(self.theta.numel(), 32, count=3,
                               label="resync model, previous model, previous direction")

    def setup(self) -> None:
        ev, p = self.ctx.evaluator, self.params
        if not isinstance(ev, MSAProblem):
            raise UserError(f"algorithms '{p.display_name}': fedmsa needs a multi-sequence "
                            "problem (problem.name: bilevel-quadratic, loss-tuning or "
                            "risk-averse-mco); this scenario's problem is single-level "
                            f"('{ev.describe().get('name', type(ev).__name__)}')")
        if p.local_clients > ev.num_devices:
            raise UserError(f"algorithms '{p.display_name}': local_clients ({p.local_clients}) "
                            f"exceeds the {ev.num_devices} clients; set local_clients <= "
                            f"{ev.num_devices}")
        rates = (p.alpha,) + (p.beta,) * (len(ev.blocks) - 1)
        self.steps = ev.step_sizes(rates)
        self.previous = None  # theta_{r-1} [P], float64
        self.direction = None  # d_{r-1} [P], float64

    def keys(self, r: int, k: int) -> np.ndarray | None:
        """Sample keys [N] of round r, step k (k = 0: Phase A); None = exact maps."""
        if self.params.full_batch:
            return None
        return self.ctx.evaluator.sample_keys(keyed_generator(self.ctx.seed, "fedmsa-sample",
                                                              r, k))

    def round(self, r: int):
        p, ev = self.params, self.ctx.evaluator
        rho = 1.0 if r == 0 or self.direction is None else p.rho
        steps = 1 if r == 0 else p.local_steps
        self.round_local_steps = steps
        state = self.theta.to(torch.float64)
        # ---- Phase A: momentum map average at all clients (eq. 5) ----------------------------
        keys = self.keys(r, 0)

        def directions(devices: np.ndarray) -> torch.Tensor:
            """d_r^m of the clients whose upload arrives (only their direction is read)."""
            rows = torch.as_tensor(devices, device=state.device)
            own = None if keys is None else keys[devices]
            local = ev.maps(state.expand(len(devices), -1), rows, own)
            if rho < 1:
                before = ev.maps(self.previous.expand(len(devices), -1), rows, own)
                local = local + (1 - rho) * (self.direction - before)
            return local

        cost = ev.evaluation_cost(2 if rho < 1 else 1, p.full_batch, p.batch_size)
        mean, _ = yield from self.exchange_delivered(directions, state.numel(), cost, r,
                                                     self.holder_devices(), "direction")
        if mean is None:
            return
        self.previous, self.direction = state, mean.to(torch.float64)
        # ---- Phase B: K variance-reduced local steps on S sampled clients (eq. 6) ------------
        eligible = self.holder_devices()
        if not len(eligible):
            return
        count = min(p.local_clients, len(eligible))
        chosen = np.sort(keyed_rng(self.ctx.seed, "fedmsa-select", r).choice(
            eligible, count, replace=False))
        rows = torch.as_tensor(chosen, device=state.device)
        current = state.expand(count, -1).clone()
        last = current.clone()
        direction = self.direction.expand(count, -1).clone()
        for k in range(1, steps + 1):
            if k > 1 and p.refresh:
                step_keys = self.keys(r, k)
                step_keys = None if step_keys is None else step_keys[chosen]
                direction = (ev.maps(current, rows, step_keys) + direction
                             - ev.maps(last, rows, step_keys))
            last, current = current, current - self.steps * direction
        per_device = self.per_device(chosen, 2 * (steps - 1) if p.refresh else 0)
        new = yield from self.exchange_models(
            current, chosen, ev.evaluation_cost(per_device, p.full_batch, p.batch_size), r)
        if new is not None:
            self.theta = new
