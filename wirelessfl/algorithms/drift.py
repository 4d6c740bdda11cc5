"""Drift-corrected FL (fedred.md, seed 004: Jiang, Rodomanov and Stich, ICML): DANE, DANE+, FedRed,
FedRed-(S)GD, and the baselines the paper's experiments use: GD, Scaffold as the paper ran it
(exact control variate, "scaffold-cv") and Scaffnew / ProxSkip. FedAvg, FedProx and SCAFFOLD
(option II) are in fedavg.py.

Every method optimises f = (1/N) sum_i f_i through the problem's exact local gradients
(``Problem.full_gradients``, the -GD variants) or minibatch gradients (``full_batch: false``, the
-SGD variants). The exact control variate (fedred.md eqs. 1 and 4) is

    h_i = grad f_i(anchor) - grad f(anchor),

which needs a gradient all-reduce at the anchor: devices upload grad f_i(anchor), the base
station broadcasts the mean. That exchange and the model exchange are two sequential phases of
one round, both timed and costed on the simulated network (Sec. 3.1-3.2: 2 vectors up and 2 down
per round, column ``exchanges``).

Round structures (Sec. 3.2 "phase sequence"):

* DANE / DANE+ / Scaffold-cv, round r: C(1) -> UL grad f_i(x^r) -> DL grad f(x^r) -> C(K_r) ->
  UL x_{i,r+1} -> DL x^{r+1}. The local solver starts at x^r, where grad F_{i,r}(x^r) =
  grad f(x^r) is already known, so the first local step is free (Sec. 3.1 reuse rule). DANE+ /
  DANE with ``averaging: rand``: only the drawn device j_r runs C(K_r) and uploads x_{j_r,r+1}
  (Sec. 3.2, "DANE+-GD, Rand averaging"); ``solver: fgd``: Nesterov's fast gradient method
  in place of GD (DanePlus).
* FedRed, one round = one communication event: the base station draws N ~ Geom(p) (the shared
  coin of Alg. 2, A5) and announces it with the previous broadcast; C(N) -> UL x_{i,k+1} ->
  DL x~ -> C(1) -> UL grad f_i(x~) -> DL grad f(x~). Local iterates are NOT reset (A4). Round 0
  starts with the all-reduce at x^0 (A19), declared by ``initial_payloads``.
  ``averaging: rand``: only the drawn device j_k uploads x_{j_k,k+1} (FedRed class doc).
* Scaffnew, one round: N ~ Geom(p) local steps, then UL x^_i - (gamma/p) h_i -> DL x-bar.

Parameters left out resolve by the convex theory, or by the non-convex theory on a problem whose
constants say mu < -MU_ROUNDING L (``is_nonconvex``; DanePlus, FedRed, Scaffnew).

Lost packets (A12). Default ``on_loss: wait``, the exact algorithm: the base station asks the
devices whose upload was lost to send it again (a retransmission phase: airtime and energy
charged, no recomputation), up to ``max_retries`` times. The methods need it: near x* the local
gradients grad f_i(x*) of heterogeneous clients are large and only their mean is 0, so a gradient
mean over a subset throws the model far off (measured: f - f* jumps from 1e-6 back to 1e3 on the
seed004 quadratic). What is still missing after the retries is handled as A12 (b): only delivered
uploads are averaged, the gradient mean is taken over the devices whose gradient arrived, and only
those devices run the round's local solve (so sum_i h_i = 0 among them). ``on_loss: drop`` skips
the retransmissions. A round in which nothing arrives leaves the global point unchanged (the base
station broadcasts a one-value "no update" flag instead).

Local computation runs in ``Problem.compute_dtype`` (float64 for the quadratic and logistic
problems: the DANE+ stopping rule compares gradients near machine precision); what crosses the
air is M-bit quantised when ``bits`` (default: the scenario's quantization_bits) is below 32,
else float32 (the paper's setting, A22: the seed004 scenarios set quantization_bits: 32).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch
from pydantic import Field, model_validator

from wirelessfl.algorithms.base import Algorithm, AlgorithmParams
from wirelessfl.algorithms.device_state import BLOCK_ROWS, DeviceRows, expected_rows
from wirelessfl.algorithms.participation import participant_count
from wirelessfl.contract.memory import RoundShape
from wirelessfl.contract.payload import Cost, Payload
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_rng

# Safety cap of the DANE+ local solver (fedred.md Sec. 2.2 [D]: K_max = 5000 evaluations).
DEFAULT_MAX_LOCAL_STEPS = 5000
# Numerical floor of the local solvers: stop once ||grad F|| <= floor max(1, ||grad F(y_0)||)
# (Sec. 2.2 [D]: 1e-12 in float64; float32 models cannot go below ~1e-6 relative).
GRADIENT_FLOOR = {torch.float64: 1e-12, torch.float32: 1e-6}


class DriftParams(AlgorithmParams):
    """What the drift-corrected family shares."""

    full_batch: bool = Field(True, description="true: exact local gradients over all of each "
                                               "device's data (-GD variants); false: minibatches "
                                               "of batch_size (-SGD variants)")
    on_loss: str = Field("wait", pattern="^(wait|drop)$",
                         description="a lost upload: wait (ask for it again, up to max_retries "
                                     "phases; the exact algorithm, A12 a) or drop (average what "
                                     "arrived, A12 b)")
    max_retries: int = Field(32, ge=0, description="retransmission phases per upload phase")


# Below this share of L a problem's mu is taken for 0 (Scaffnew's default p refuses it) [D].
MU_ROUNDING = 1e-10


def is_nonconvex(constants: dict[str, float]) -> bool:
    """Whether a problem's constants make it non-convex for the parameters' default rules:
    mu < -MU_ROUNDING L [D], the test Scaffnew's refusal of a mu "zero up to rounding" uses from
    the other side (a built mu = 0 instance measures about -1e-14 L and stays convex). A problem
    that knows no mu or no L (a neural network) counts as convex: its defaults need constants it
    does not have and are refused by ``theory_value`` anyway. Non-convex problems resolve the
    parameters left out by fedred.md's non-convex theory (Sec. 2.2 "DANE+-GD, non-convex": Thm 1,
    Cor. 2 / Cor. 30; Sec. 2.3-2.4: Thm 6, Thm 8; Sec. 2.5), convex ones by the convex theory."""
    mu, big_l = constants.get("mu"), constants.get("L")
    return mu is not None and big_l is not None and mu < -MU_ROUNDING * big_l


def initial_gap(algorithm: Algorithm, big_l: float) -> float:
    """F^_0 = ||grad f(x^0)||^2 / (2L), the non-convex rules' stand-in for F_0 = f(x^0) - f*
    (fedred.md Sec. 1.2) [D]: f* (or a lower bound f_low) is unknown in advance, while for any
    L-smooth f bounded below f* <= f(x^0 - grad f(x^0) / L) <= f(x^0) - ||grad f(x^0)||^2 / (2L),
    so F^_0 <= F_0 is a certified lower bound: a tolerance 18 delta_B F^_0 / R is no looser than
    Cor. 30's and its guarantee holds as stated, and eta of Thm 8 only grows (a smaller step).
    It needs no function value, only the gradient at x^0 (what round 0's all-reduce gives the
    base station); the simulator reads it exactly, in float64, when it resolves the defaults."""
    return algorithm.ctx.evaluator.grad_norm_sq(algorithm.theta) / (2 * big_l)


def theory_value(algorithm: Algorithm, param: str, rule: str, *keys: str) -> dict[str, float]:
    """The problem's constants needed by a parameter's default rule, or a UserError telling the
    user to set the parameter (neural networks know no L or delta)."""
    constants = algorithm.ctx.evaluator.constants or {}
    check_theory(algorithm.params, [(param, rule, keys)], set(constants))
    return constants


def check_theory(params: AlgorithmParams, needs: list[tuple[str, str, tuple[str, ...]]],
                 known: set[str]) -> None:
    """Refuse the first (parameter, rule, constants) of ``needs`` whose constants the problem
    does not know (``known``); what ``theory_value`` checks at setup and what ``wirelessfl
    validate`` checks from the scenario (``DriftCorrected.theory_needs``)."""
    for param, rule, keys in needs:
        missing = [k for k in keys if k not in known]
        if missing:
            raise UserError(
                f"algorithms '{params.display_name}': {param} defaults to {rule}, but this "
                f"problem does not know {', '.join(missing)} (only the quadratic and logistic "
                f"problems do); set {param} explicitly")


def similarity(algorithm: Algorithm, param: str, rule: str) -> float:
    """delta_A for a parameter's default rule: the exact AHD constant (the smallest that satisfies
    Definition 2) where the problem knows it, else the paper's formula (fedred.md A2: "use the exact
    one to set lambda")."""
    c = theory_value(algorithm, param, rule, "delta_A")
    return c.get("delta_A_exact", c["delta_A"])


def coin_steps(seed: int, p: float, k: int) -> int:
    """N_k ~ Geom(p) on {1, 2, ...}: the local steps before communication event k (the shared
    coin of FedRed / Scaffnew, drawn by the base station from (seed, round), so methods with the
    same p see the same sequence)."""
    return 1 if p >= 1 else int(keyed_rng(seed, "communication-coin", k).geometric(p))


class DriftCorrected(Algorithm):
    """Shared mechanics: exact local gradients, the gradient all-reduce, the model average.

    A round computes only for the devices whose work can matter (``computes_participants_only``):
    the asked devices that hold the current state run the local solves, and a gradient that is
    only averaged is computed only for the devices whose upload arrived (whether a packet
    arrives is known before anyone computes). Per-device state kept between rounds (FedRed's and
    Scaffnew's local iterates, Scaffnew's h_i) is held in ``DeviceRows``, rows only for the
    devices that ever took part; FedRed's h_i is recomputed for the devices that need it from
    the last all-reduce's anchor and mean, which is what every h_i equals. Results are read by
    device index (``reads_device_indices``), so with per-device random streams the network is
    asked by index too."""

    Params = DriftParams
    computes_participants_only = True
    reads_device_indices = True
    # Upload phases of a round in which packets arrive (the conformance suite reads it).
    uploads_per_round = 2

    @classmethod
    def theory_needs(cls, params: DriftParams) -> list[tuple[str, str, tuple[str, ...]]]:
        """(parameter, rule, problem constants) of each parameter left to its theory default
        by ``params``: what ``setup`` will read from the problem (``theory_value``), so that a
        scenario can be checked before anything is built (pipeline/preflight.py)."""
        return []

    @classmethod
    def check_constants(cls, params: AlgorithmParams, known: frozenset[str]) -> None:
        """The default rules' constants (``theory_needs``) against those the problem will
        hold: ``check_theory``'s refusal, before anything is built."""
        check_theory(params, cls.theory_needs(params), set(known))

    @classmethod
    def round_memory(cls, params: AlgorithmParams, shape: RoundShape) -> tuple[int, bool]:
        """The uploads of all the round's devices, quantised at once after the local work
        (``average``): they span every device, not a chunk. Inherited by every subclass
        (FedMSA, FedNest, a plugin's), where the rule once matched this module's classes by
        name and left a plugin subclass to the default."""
        return shape.quantized_bytes(shape.devices), False

    # Peak [n, d] arrays of a round's n participants: gradients at the anchor, h_i, local
    # iterates, the local gradient and the step's temporaries; ``held_arrays`` of them are
    # per-device state kept between rounds in DeviceRows (FedRed: x_i; Scaffnew: x_i, h_i),
    # held for every device that ever took part.
    peak_device_arrays = 7
    held_arrays: ClassVar[int] = 0
    @classmethod
    def state_rows(cls, num_devices: int, params: AlgorithmParams) -> float:
        """Rows [d] held at the peak: the round's work arrays for its round(beta N)
        participants and the ``held_arrays`` rows of every device that ever took part
        (expected after all rounds, plus the last storage block's slack); exact gradients
        (``full_batch``) evaluate the participants' rows only (``Problem.full_gradients`` with
        a subset). At full participation: ``peak_device_arrays`` x N, as before rounds
        computed participants only."""
        workers = participant_count(params.participation, num_devices)
        held = 0.0
        if cls.held_arrays:
            ever = expected_rows(num_devices, params.participation, params.rounds)
            held = cls.held_arrays * min(float(num_devices), ever + BLOCK_ROWS)
        return (cls.peak_device_arrays - cls.held_arrays) * workers + held

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1
                          ) -> tuple[Payload, Payload]:
        """Gradient and model, one d-vector each, up and down (fedred.md Sec. 3.2)."""
        return Payload.vectors(d, bits, count=2), Payload.vectors(d, bits, count=2)

    def resync_payload(self, missed: int) -> Payload:
        """A stale device needs the current model and the current mean gradient."""
        return Payload.vectors(self.theta.numel(), 32, count=2, label="resync model + gradient")

    # ---- compute ---------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return getattr(self.ctx.evaluator, "compute_dtype", torch.float32)

    def exact_gradients(self, point: torch.Tensor, devices: np.ndarray) -> torch.Tensor:
        """grad f_i over all of each device's data for ``devices`` (increasing indices), at a
        shared point [d] or at their own models [n, d]: -> [n, d]. Every device asked: the
        whole population's pass; fewer: ``Problem.full_gradients`` over those devices' data
        alone (a device's gradient reads its own samples only)."""
        ev = self.ctx.evaluator
        if len(devices) == self.ctx.num_devices:
            return ev.full_gradients(point)
        return ev.full_gradients(point, devices)

    def local_gradients(self, models: torch.Tensor, devices: np.ndarray, k: int, step: int
                        ) -> torch.Tensor:
        """grad f_i of ``devices`` at their own models [n, d]: exact, or a minibatch of
        batch_size from (seed, "batch", round, step) (``minibatches``: the rows of the
        population's draw, or each device's own with per-device random streams)."""
        ev = self.ctx.evaluator
        if not len(devices):
            return models.new_zeros((0, models.shape[1]))
        if self.params.full_batch:
            return self.exact_gradients(models, devices)
        idx = self.minibatches(k, devices, 1, "batch", step)[0]
        return torch.cat([ev.stacked_gradients(models[rows], idx[rows]) for rows in
                          ev.row_chunks(len(devices), self.params.batch_size, own_model=True)])

    def per_device(self, devices: np.ndarray, values) -> np.ndarray:
        """[N] with ``values`` at ``devices`` and 0 elsewhere (a Cost's per-device passes)."""
        out = np.zeros(self.ctx.num_devices, dtype=np.asarray(values).dtype)
        out[devices] = values
        return out

    def gradient_cost(self, passes) -> Cost:
        """``passes`` gradient evaluations (scalar or [N]) over the local gradient's batch."""
        ev = self.ctx.evaluator
        batch = (ev.full_batch_sizes() if self.params.full_batch
                 else ev.minibatch_sizes(self.params.batch_size))
        return Cost(forward_passes=passes, backward_passes=passes, batch_size=batch)

    def exact_cost(self) -> Cost:
        """One exact local gradient (the control variate's, always full: A17)."""
        return Cost(1, 1, self.ctx.evaluator.full_batch_sizes())

    # ---- communication ---------------------------------------------------------------------------
    def average(self, vectors: torch.Tensor, devices: np.ndarray, delivered: np.ndarray,
                stream: str, k: int, combine=None) -> torch.Tensor | None:
        """Mean [d] of the delivered rows of ``vectors`` [n, d] (the rows of ``devices``;
        ``delivered`` the increasing indices of those whose upload arrived) as the base station
        receives them (quantised up, float32), quantised for the broadcast; None when nothing
        arrived. ``combine``: what the base station makes of the received rows [c, d] instead
        of their mean (a [d] vector; FedNest's running mean over several phases)."""
        if not len(delivered):
            return None
        rows = torch.as_tensor(np.searchsorted(devices, delivered), device=vectors.device)
        sent = self.quantize(vectors[rows].float(), f"{self.name}-{stream}-up", k, delivered)
        mean = sent.mean(0) if combine is None else combine(sent)
        return self.quantize(mean[None], f"{self.name}-{stream}-down", k, slice(0, 1),
                             direction="down")[0]

    def upload(self, cost: Cost, payload: Payload, active: np.ndarray | None = None):
        """``collect`` from the asked devices holding the state (and in ``active``, increasing
        device indices), then (``on_loss: wait``) retransmission phases for the lost uploads,
        asked by index; returns the increasing indices of the devices whose upload arrived."""
        mask = None
        if active is not None:
            mask = np.zeros(self.ctx.num_devices, dtype=bool)
            mask[active] = True
        result = yield from self.collect(cost, payload, mask)
        arrived = [result.delivered_devices]
        missing = result.device_indices(np.asarray(result.active, dtype=bool)
                                        & ~np.asarray(result.delivered, dtype=bool))
        tries = 0
        while self.params.on_loss == "wait" and len(missing) and tries < self.params.max_retries:
            again = yield from self.ctx.net.collect(Cost(), payload, missing)
            got = np.asarray(again.delivered, dtype=bool)  # aligned with ``missing``
            self.ctx.health.collected(again.active, got)
            arrived.append(missing[got])
            missing = missing[~got & self.ctx.net.alive[missing]]
            tries += 1
        return np.sort(np.concatenate(arrived))

    def all_reduce(self, anchor: torch.Tensor, k: int, stream: str = "grad",
                   cost: Cost | None = None):
        """Phase pair: devices upload grad f_i(anchor), the base station broadcasts the mean.
        Returns (the local gradients [c, d] in compute dtype of the devices whose gradient is
        in the mean, the broadcast mean [d] or None, those devices' increasing indices): only
        they are computed for, as only their gradient is read. ``cost``: the devices' work in
        the phase (default ``exact_cost``, the one gradient)."""
        grads = []

        def gradients(devices: np.ndarray) -> torch.Tensor:
            grads.append(self.exact_gradients(anchor.to(self.dtype), devices))
            return grads[0]

        cost = self.exact_cost() if cost is None else cost
        mean, delivered = yield from self.exchange_delivered(gradients, anchor.numel(), cost, k,
                                                             None, stream)
        return (grads[0] if grads else None), mean, delivered

    def exchange_delivered(self, compute, d: int, cost: Cost, k: int,
                           active: np.ndarray | None = None, stream: str = "model"):
        """An exchange of a d-vector that the base station only averages: the devices in
        ``active`` (default: every holder asked) pay ``cost`` and upload, and ``compute``
        (increasing device indices -> their vectors [c, d]) is called for the devices whose
        upload arrived alone (whether it arrives is known before anyone computes). Returns
        (the broadcast mean [d] or None, those devices' indices)."""
        delivered = yield from self.upload(cost, Payload.vectors(d, self.bits), active)
        vectors = compute(delivered) if len(delivered) else None
        mean = self.average(vectors, delivered, delivered, stream, k)
        yield from self.broadcast_mean(mean, d)
        return mean, delivered

    def broadcast_mean(self, mean: torch.Tensor | None, d: int):
        """The broadcast of a phase's mean: d values, or the one-value "no update" flag."""
        if mean is None:
            yield from self.broadcast(Payload.scalar(self.bits, label="no-update flag"))
        else:
            yield from self.broadcast(Payload.vectors(d, self.bits))

    def exchange_models(self, models: torch.Tensor, devices: np.ndarray, cost: Cost, k: int,
                        active: np.ndarray | None = None, stream: str = "model", combine=None):
        """Devices in ``active`` (default ``devices``) pay ``cost`` and upload their row of
        ``models`` [n, d] (the rows of ``devices``, which hold ``active``: a model, or any
        d-vector: ``stream`` names it); the base station broadcasts the average of what arrived
        (or what ``combine`` makes of it: ``average``). Returns that [d] (float32) or None."""
        d = models.shape[1]
        active = devices if active is None else active
        delivered = yield from self.upload(cost, Payload.vectors(d, self.bits), active)
        mean = self.average(models, devices, delivered, stream, k, combine)
        yield from self.broadcast_mean(mean, d)
        return mean

    def selected_device(self, r: int) -> int:
        """Rand's j_r: uniform over round r's asked devices (all of [D] at participation 1),
        from the stream (seed, "rand-averaging", r), the same for every method of a scenario."""
        asked = self.participant_devices(r)
        return int(asked[keyed_rng(self.ctx.seed, "rand-averaging", r).integers(len(asked))])

    def resolve_averaging(self, nonconvex: bool) -> str:
        """``averaging`` as given, else by the theory (fedred.md Sec. 2.0, 2.5): avg for a
        convex problem (Thm 4 / Cor. 5, Thm 7, Thm 9; A10), rand for a non-convex one (Cor. 2,
        Thm 6, Thm 8)."""
        given = getattr(self.params, "averaging", None)
        return given if given is not None else ("rand" if nonconvex else "avg")

    def resolved(self) -> dict:
        """``Algorithm.resolved`` plus the averaging rule used ("avg" or "rand"), for the
        methods that have the option."""
        out = super().resolved()
        if "averaging" in self.Params.model_fields and getattr(self, "averaging", None):
            out["averaging"] = self.averaging
        return out


class SingleExchange(DriftCorrected):
    """Methods with one model-sized exchange per round and no gradient all-reduce (GD,
    Scaffnew): one d-vector up and one down."""

    uploads_per_round = 1

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1
                          ) -> tuple[Payload, Payload]:
        return Payload.vectors(d, bits), Payload.vectors(d, bits)

    def resync_payload(self, missed: int) -> Payload:
        return Payload.vectors(self.theta.numel(), 32, label="resync model")

    @classmethod
    def theory_needs(cls, params) -> list[tuple[str, str, tuple[str, ...]]]:
        return [("lr", "1/L", ("L",))] if params.lr is None else []

    def inverse_l_step(self) -> float:
        """``lr`` as given, else 1/L (fedred.md Sec. 2.6 [D], ProxSkip theory)."""
        if self.params.lr is not None:
            return self.params.lr
        return 1.0 / theory_value(self, "lr", "1/L", "L")["L"]


# ---- GD ------------------------------------------------------------------------------------------
class GDParams(DriftParams):
    lr: float | None = Field(None, gt=0, description="step on the averaged exact gradient "
                                                     "(default 1/L, fedred.md Sec. 2.6)")


class GD(SingleExchange):
    """x^{r+1} = x^r - lr grad f(x^r): devices upload their local gradients, the base station
    broadcasts the new model (fedred.md Sec. 2.6; DL x -> C(1) -> UL grad f_i). With
    ``full_batch: false`` this is FedSGD with the drift family's loss handling."""

    name = "gd"
    Params = GDParams
    summary = "distributed gradient descent: one local gradient per device per round"
    resolved_attributes = ("lr",)

    def setup(self) -> None:
        self.lr = self.inverse_l_step()

    def round(self, k: int):
        x = self.theta.to(self.dtype)
        mean, _ = yield from self.exchange_delivered(
            lambda devices: self.local_gradients(x.expand(len(devices), -1), devices, k, 0),
            x.numel(), self.gradient_cost(1), k, self.holder_devices(), "grad")
        if mean is not None:
            self.theta = self.theta - self.lr * mean


# ---- DANE, DANE+, Scaffold-cv ---------------------------------------------------------------------
class DanePlusParams(DriftParams):
    lam: float | None = Field(None, ge=0, description="lambda, the pull toward x^r (default "
                                                      "2 delta_A, Cor. 5 for an inexact local "
                                                      "solver, delta_A exact, A2; non-convex "
                                                      "problem: 2 delta_B, Cor. 2)")
    lr: float | None = Field(None, gt=0, description="local step gamma (default 1/(L + lambda), "
                                                     "Sec. 2.2)")
    local_steps: int | None = Field(
        None, gt=0, description="K local steps per round; default: the adaptive stopping rule "
                                "||grad F||^2 <= e_r^2 ||y - x^r||^2 (Thm 4, Sec. 2.2); "
                                "non-convex problem: ||grad F||^2 <= 18 delta_B F_0 / R or "
                                "ceil((L + lambda) R / (18 delta_B)) steps, returning the "
                                "visited point with the smallest ||grad F|| (Cor. 30, (B.83))")
    max_local_steps: int = Field(DEFAULT_MAX_LOCAL_STEPS, gt=0,
                                 description="cap of the adaptive rules (Sec. 2.2: 5000)")
    mu: float | None = Field(None, ge=0, description="mu of the rule's e_r^2 = lambda (mu + "
                                                     "lambda) / (8 (r+1)(r+2)) (default: the "
                                                     "problem's, else 0); given on a non-convex "
                                                     "problem, it selects this relative rule "
                                                     "instead of the non-convex one")
    server_lr: float = Field(1.0, gt=0, description="x^{r+1} = x^r + server_lr (mean y_i - x^r)")
    averaging: str | None = Field(
        None, pattern="^(avg|rand)$",
        description="Alg. 1's Average: avg, the mean of the devices' x_{i,r+1}; rand, "
                    "x_{j_r,r+1} of one device j_r drawn uniformly each round from (seed, "
                    "round), which alone solves and uploads its model (Sec. 2.0); default by "
                    "the theory: avg on a convex problem (Cor. 5, A10), rand on a non-convex "
                    "one (Cor. 2)")
    solver: str = Field("gd", pattern="^(gd|fgd)$",
                        description="local solver: gd, gradient descent (DANE+-GD); fgd, "
                                    "Nesterov's fast gradient method (DANE+-FGD, Sec. 2.2: "
                                    "momentum (sqrt(kappa) - 1) / (sqrt(kappa) + 1), kappa = "
                                    "(L + lambda) / (mu + lambda)); both with step lr and the "
                                    "same stopping rule")

    @model_validator(mode="after")
    def _adaptive_needs_exact_gradients(self):
        if self.local_steps is None and not self.full_batch:
            raise ValueError("the adaptive stopping rule needs exact gradients; with "
                             "full_batch: false set local_steps (App. C: 10 or 20)")
        if self.solver == "fgd" and not self.full_batch:
            raise ValueError("solver: fgd needs exact gradients (full_batch: true): momentum "
                             "on minibatch gradients is no method of the paper's")
        return self


class DanePlus(DriftCorrected):
    """DANE+ (fedred.md Alg. 1) with the exact control variate, standard (``averaging: avg``,
    A10) or randomised averaging (``averaging: rand``), and a local solver by gradient descent
    (``solver: gd``, DANE+-GD) or Nesterov's fast gradient method (``solver: fgd``, DANE+-FGD).

    Rand (fedred.md Sec. 2.0, Sec. 3.2 row "DANE+-GD, Rand averaging"): round r's index j_r is
    drawn uniformly from the round's asked devices (every device at participation 1; with
    partial participation a uniform draw from a uniform set, so still uniform over the
    devices) [D] from a stream keyed by (seed, round), the same for every method of a
    scenario: a predetermined sequence that every device knows, so announcing it costs
    nothing [D]. Phase A (the
    gradient all-reduce) is unchanged for every device; only j_r solves (phase B) and uploads
    x_{j_r,r+1} (phase C); x^{r+1} = x^r + server_lr (x_{j_r,r+1} - x^r). The others compute
    only the phase-A gradient. What j_r cannot deliver [D]: if j_r cannot solve (stale, out
    of energy, or its gradient is not in the mean: lost under ``on_loss: drop`` or after
    ``max_retries``, A12 b) or its model upload is lost (``on_loss: wait``: asked again up to
    ``max_retries`` times, the exact algorithm unless those run out; ``drop``: at once), the
    round keeps x^{r+1} = x^r and broadcasts the one-value "no update" flag, as any round in
    which nothing arrives; no other device is drawn in its place (that would take a second
    solve and a second upload phase) and the next round draws j_{r+1} afresh.

    FGD (fedred.md Sec. 2.2, DANE+-FGD; Nesterov 2004, "Introductory Lectures on Convex
    Optimization", Sec. 2.2.1, constant step scheme III, (2.2.19)) on F_{i,r}, which is
    (mu + lambda)-strongly convex and (L + lambda)-smooth: z_0 = y_0 = x^r,
    z_{t+1} = y_t - lr grad F(y_t), y_{t+1} = z_{t+1} + beta_t (z_{t+1} - z_t), with
    beta = (sqrt(kappa) - 1) / (sqrt(kappa) + 1), kappa = 1 / (lr (mu + lambda)) (= (L +
    lambda) / (mu + lambda) at the default lr = 1/(L + lambda)) when mu + lambda > 0, and, for
    mu + lambda = 0 (plain convex, lambda = 0), the convex sequence beta_t = (s_t - 1) / s_{t+1},
    s_0 = 1, s_{t+1} = (1 + sqrt(1 + 4 s_t^2)) / 2 (Nesterov 1983; Beck and Teboulle 2009,
    FISTA without a prox) [D]. One gradient per iteration, at y_t: the adaptive rules (Thm 4's,
    DANE's tolerance, the cap and the floor) are checked on y_t and return it, exactly as for
    GD; with fixed ``local_steps`` K the solver returns z_K, the point the scheme's guarantee is
    about. beta = 0 is GD.

    Non-convex problems (``is_nonconvex``: the problem's mu < -MU_ROUNDING L), fedred.md Sec. 2.2
    "DANE+-GD, non-convex" (Thm 1, Cor. 2 / Cor. 30): lambda = 2 delta_B (Cor. 2), averaging
    rand (Cor. 2's "an arbitrary local model"), and, in place of Thm 4's relative rule (whose
    e_r^2 = lambda (mu + lambda) / (8 (r+1)(r+2)) is negative once mu < -lambda), GD with step
    1/(L + lambda) until ||grad F_{i,r}(y_t)||^2 <= 18 delta_B F^_0 / R (Cor. 30) or for
    ceil((L + lambda) R / (18 delta_B)) steps (the step count of (B.83), Cor. 2's
    Theta(L R / delta_B)), whichever comes first (and at most ``max_local_steps``, the floor as
    ever), returning the visited point y_t, t >= 1, with the smallest ||grad F_{i,r}|| (Cor. 2;
    GD with this step never increases F_{i,r}, so the descent Thm 1 also needs holds). R is the
    run's planned ``rounds``, F^_0 = ||grad f(x^0)||^2 / (2L) (``initial_gap``) [D]; x^r itself
    is not a candidate [D] (as Thm 4's rule checks t >= 1 only), so a round always moves. An
    explicit ``mu`` keeps Thm 4's rule with that mu; ``solver: fgd`` is refused under the
    non-convex rule (momentum keeps no descent; the theory is GD's). The manifest's "resolved"
    records lambda, lr, the problem's mu, F^_0 (``initial_gap``), the tolerance
    (``grad_tolerance_sq``), the step cap (``local_step_cap``) and ``averaging``."""

    name = "dane-plus"
    Params = DanePlusParams
    summary = ("gradient all-reduce, then an inexact solve of f_i - <h_i, x> + lambda/2 "
               "||x - x^r||^2; two d-vectors up and two down")
    resolved_attributes = ("lam", "lr", "mu", "momentum", "initial_gap", "grad_tolerance_sq",
                           "local_step_cap")
    # averaging: rand asks only the drawn device j_r for its model, so a device's traffic
    # differs from round to round: the conformance suite then checks every device's ledger
    # against ``declared_phases`` (wirelessfl/testing.py), whole packets of the two phases.
    # The flag is per class, not per parameter set, so avg (every device in every phase, what
    # ``declared_payloads`` states) is held to that looser check too; tests/test_drift.py holds
    # avg to the exact per-device count of ``declared_payloads``.
    samples_devices: ClassVar[bool] = True
    # lambda's default as a multiple of delta_A: Cor. 5 (fedred.md Sec. 2.2 / 2.5), DANE+ with an
    # inexact local solver under Thm 4's relative rule, needs lambda = 2 delta_A; DANE overrides.
    lam_factor: ClassVar[float] = 2.0
    lam_rule: ClassVar[str] = "2 delta_A (Cor. 5)"
    # On a non-convex problem: lambda = a delta_B, a = 2 (Cor. 2; Thm 1 needs a > 1).
    nonconvex_lam_factor: ClassVar[float] = 2.0
    nonconvex_lam_rule: ClassVar[str] = "2 delta_B (Cor. 2)"
    # What ``setup`` sets; the class values serve Scaffold-cv, whose setup is its own.
    averaging = "avg"
    best_point = False  # return the visited y_t with the smallest ||grad F|| (non-convex rule)
    initial_gap = grad_tolerance_sq = local_step_cap = None

    @classmethod
    def theory_needs(cls, params) -> list[tuple[str, str, tuple[str, ...]]]:
        needs = [("lam", cls.lam_rule, ("delta_A",))] if params.lam is None else []
        return needs + ([("lr", "1/(L + lambda)", ("L",))] if params.lr is None else [])

    @classmethod
    def declared_phases(cls, d: int, bits: int, participants: int = 1
                        ) -> tuple[Payload, tuple[tuple[Payload, Payload | None], ...]]:
        """(what every device gets each round, ((uplink, unicast before it) of each upload
        phase)): the gradient mean and the model broadcast; grad f_i(x^r) up from every device,
        then x_{i,r+1} up (from every device with avg, from j_r alone with rand)."""
        gradient, model = Payload.vectors(d, bits), Payload.vectors(d, bits)
        return Payload.vectors(d, bits, count=2), ((gradient, None), (model, None))

    def setup(self) -> None:
        p = self.params
        nonconvex = is_nonconvex(self.ctx.evaluator.constants or {})
        self.averaging = self.resolve_averaging(nonconvex)
        self.lam = p.lam
        if self.lam is None:
            if nonconvex:
                self.lam = self.nonconvex_lam_factor * theory_value(
                    self, "lam", self.nonconvex_lam_rule, "delta_B")["delta_B"]
            else:
                self.lam = self.lam_factor * similarity(self, "lam", self.lam_rule)
        self.lr = p.lr
        if self.lr is None:
            self.lr = 1.0 / (theory_value(self, "lr", "1/(L + lambda)", "L")["L"] + self.lam)
        self.mu = p.mu if p.mu is not None else (self.ctx.evaluator.constants or {}).get("mu", 0)
        self.momentum = None  # FGD's constant beta (None: GD, or the convex sequence)
        # the non-convex rule (class doc) replaces Thm 4's unless mu or K is given
        self.best_point = nonconvex and p.local_steps is None and p.mu is None
        if self.best_point:
            if p.solver == "fgd":
                raise UserError(
                    f"algorithms '{p.display_name}': solver: fgd has no non-convex theory "
                    f"(mu = {self.mu:.4g} < 0): Cor. 2 / Cor. 30 run GD, whose steps never "
                    "increase F_{i,r} (the descent Thm 1 needs; momentum does not keep it); use "
                    "solver: gd, or set local_steps")
            self.nonconvex_rule()
        if p.solver == "fgd" and self.mu + self.lam > 0:
            kappa = max(1.0, 1.0 / (self.lr * (self.mu + self.lam)))
            self.momentum = (math.sqrt(kappa) - 1) / (math.sqrt(kappa) + 1)

    def nonconvex_rule(self) -> None:
        """Cor. 30's tolerance 18 delta_B F^_0 / R on ||grad F_{i,r}||^2 and (B.83)'s step count
        ceil((L + lambda) R / (18 delta_B)), R the planned ``rounds``, F^_0 ``initial_gap``;
        with delta_B = 0 (identical devices) no step count (the cap alone) and tolerance 0."""
        c = theory_value(self, "local_steps", "Cor. 30's rule (18 delta_B F_0 / R)", "L",
                         "delta_B")
        rounds, delta_b = self.params.rounds, c["delta_B"]
        self.initial_gap = initial_gap(self, c["L"])
        self.grad_tolerance_sq = 18 * delta_b * self.initial_gap / rounds
        if delta_b > 0:
            self.local_step_cap = math.ceil((c["L"] + self.lam) * rounds / (18 * delta_b))

    def momenta(self):
        """FGD's beta_0, beta_1, ...: the constant (sqrt(kappa) - 1) / (sqrt(kappa) + 1) when
        F_{i,r} is strongly convex, else the convex sequence (s_t - 1) / s_{t+1}."""
        if self.momentum is not None:
            while True:
                yield self.momentum
        s = 1.0
        while True:
            following = (1 + math.sqrt(1 + 4 * s * s)) / 2
            yield (s - 1) / following
            s = following

    def stop(self, grad_sq: torch.Tensor, step_sq: torch.Tensor, r: int) -> torch.Tensor:
        """[N] bool: Thm 4's relative rule ||grad F(y_t)||^2 <= e_r^2 ||y_t - x^r||^2 with
        e_r^2 = lambda (mu + lambda) / (8 (r+1)(r+2)) (fedred.md Sec. 2.2); on a non-convex
        problem Cor. 30's ||grad F(y_t)||^2 <= 18 delta_B F^_0 / R (class doc)."""
        if self.grad_tolerance_sq is not None:
            return grad_sq <= self.grad_tolerance_sq
        e_sq = self.lam * (self.mu + self.lam) / (8 * (r + 1) * (r + 2))
        return grad_sq <= e_sq * step_sq

    def local_solve(self, x: torch.Tensor, h: torch.Tensor, mean_grad: torch.Tensor,
                    devices: np.ndarray, r: int) -> tuple[torch.Tensor, np.ndarray]:
        """y_i ~ argmin F_{i,r}(y) = f_i(y) - <h_i, y> + lambda/2 ||y - x^r||^2 for ``devices``
        (h [n, d] their control variates), by (S)GD with step ``lr`` from x^r; returns (y [n, d],
        gradient evaluations per device [n]). Fixed K steps, or (adaptive) steps until ``stop``
        holds at the new point, the cap, or the numerical floor; K_r counts every evaluation,
        the final check included. Under the non-convex rule (``best_point``) the cap is also
        ``local_step_cap`` and the visited y_t (t >= 1) with the smallest ||grad F|| is
        returned."""
        p, n = self.params, len(devices)
        adaptive = p.local_steps is None
        limit = p.max_local_steps if adaptive else p.local_steps
        if adaptive and self.local_step_cap is not None:
            limit = min(limit, self.local_step_cap)
        best = adaptive and self.best_point
        reuse = p.full_batch  # grad F_{i,r}(x^r) = grad f(x^r), known from the all-reduce
        fast = getattr(p, "solver", "gd") == "fgd"  # Scaffold-cv's rounds are GD's
        momenta = self.momenta() if fast else None
        y = x.expand(n, -1).clone()
        z = y  # FGD: the last gradient step z_t (Nesterov's x_t); y_t is where grads are taken
        running = torch.ones(n, dtype=torch.bool, device=x.device)
        evaluations = torch.zeros(n, dtype=torch.int64)
        grad = mean_grad.expand(n, -1)
        floor = GRADIENT_FLOOR[self.dtype] * max(1.0, float(mean_grad.norm()))
        if best:
            best_y, best_sq = y, torch.full((n,), math.inf, dtype=y.dtype, device=y.device)
        for t in range(limit + 1):
            if t > 0 or not reuse:
                if t == limit and not adaptive:
                    break  # fixed K: no gradient at the returned point
                grad = self.local_gradients(y, devices, r, t) - h + self.lam * (y - x)
                evaluations += running.cpu()
                if adaptive and t > 0:
                    grad_sq = grad.square().sum(1)
                    if best:  # y_t of the devices still running is a new point
                        better = running & (grad_sq < best_sq)
                        best_sq = torch.where(better, grad_sq, best_sq)
                        best_y = torch.where(better[:, None], y, best_y)
                    done = self.stop(grad_sq, (y - x).square().sum(1), r)
                    running &= ~(done | (grad_sq.sqrt() <= floor))
                    if not bool(running.any()):
                        break
            if t == limit:
                break
            if not fast:
                y = torch.where(running[:, None], y - self.lr * grad, y)
                continue
            step = y - self.lr * grad
            beta = next(momenta)
            y = torch.where(running[:, None], step + beta * (step - z), y)
            z = torch.where(running[:, None], step, z)
        if fast and not adaptive:
            return z, evaluations.numpy()  # fixed K: the scheme's z_K
        if best:
            return best_y, evaluations.numpy()
        return y, evaluations.numpy()

    def round(self, r: int):
        p = self.params
        x = self.theta.to(self.dtype)
        grads, mean, in_mean = yield from self.all_reduce(self.theta, r)
        if mean is None:
            return
        mean = mean.to(self.dtype)
        # the devices whose gradient is in the mean and that still hold the state solve
        active = np.intersect1d(self.holder_devices(), in_mean)
        rand = self.averaging == "rand"
        if rand:  # only j_r solves and uploads; none when it cannot (no update, class doc)
            active = active[active == self.selected_device(r)]
            if not len(active):
                self.round_local_steps = 0
                yield from self.broadcast_mean(None, x.numel())
                return
        h = grads[torch.as_tensor(np.searchsorted(in_mean, active), device=grads.device)] - mean
        y, evaluations = self.local_solve(x, h, mean, active, r)
        self.round_local_steps = float(evaluations.mean()) if len(active) else 0.0
        new = yield from self.exchange_models(
            y, active, self.gradient_cost(self.per_device(active, evaluations)), r)
        if new is not None:
            self.theta = self.theta + p.server_lr * (new - self.theta)


class DaneParams(DanePlusParams):
    lam: float | None = Field(None, ge=0, description="lambda, the pull toward x^r (default "
                                                      "delta_A, Cor. 21 for exact local solves; "
                                                      "delta_A exact, A2)")
    tolerance: float = Field(1e-8, gt=0, lt=1, description="'exact' local solve: stop at "
                                                           "||grad F(y)|| <= tolerance "
                                                           "||grad F(x^r)|| (fedred.md 2.1 [D])")


class Dane(DanePlus):
    """DANE (fedred.md Sec. 2.1): DANE+ whose local problems are solved to a tight tolerance,
    the simulator's stand-in for an exact solve."""

    name = "dane"
    Params = DaneParams
    summary = "DANE+ with (nearly) exact local solves"
    # Cor. 21 (fedred.md Sec. 2.1): with exact local solves lambda >= delta_A suffices.
    lam_factor = 1.0
    lam_rule = "delta_A (Cor. 21)"
    # Non-convex: Thm 1 with exact solves (e_r = 0) needs lambda = a delta_B, a > 1; a = 2 as
    # in Cor. 2 [D] (the bound's 4 (a + 1)^2 / (a - 1) is least at a = 3: 32 against 36).
    nonconvex_lam_rule = "2 delta_B (Thm 1, a = 2)"

    def nonconvex_rule(self) -> None:
        """DANE keeps its own tight stopping rule on a non-convex problem too (its "exact"
        solve; no Cor. 30 tolerance or (B.83) step count, ``max_local_steps`` caps it), still
        returning the visited point with the smallest ||grad F|| there (``best_point``)."""

    def stop(self, grad_sq, step_sq, r):
        return grad_sq <= (self.params.tolerance ** 2) * self._start_sq

    def local_solve(self, x, h, mean_grad, devices, r):
        self._start_sq = float(mean_grad.square().sum())
        return super().local_solve(x, h, mean_grad, devices, r)


class ScaffoldCvParams(DriftParams):
    lr: float | None = Field(None, gt=0, description="local step gamma (default 1/L)")
    local_steps: int = Field(10, gt=0, description="K local steps per round (fedred.md 5.1: "
                                                   "10, 20, 50; App. C: 10 or 20)")
    server_lr: float = Field(1.0, gt=0, description="global step eta_g (App. C: 1)")


class ScaffoldCv(DanePlus):
    """Scaffold as the seed-004 paper ran it (fedred.md Sec. 2.6): the round of DANE+ with
    lambda = 0 and K fixed local steps y <- y - gamma (g_i(y) - h_i), h_i the exact control
    variate at x^r, then x^{r+1} = x^r + eta_g (mean y_i - x^r)."""

    name = "scaffold-cv"
    Params = ScaffoldCvParams
    summary = "Scaffold with the exact control variate (gradient all-reduce each round)"
    resolved_attributes = ("lr",)
    samples_devices = False  # every device in both phases, always (no averaging: rand)

    @classmethod
    def theory_needs(cls, params) -> list[tuple[str, str, tuple[str, ...]]]:
        return [("lr", "1/L", ("L",))] if params.lr is None else []

    def setup(self) -> None:
        self.lam, self.mu = 0.0, 0.0
        self.lr = self.params.lr
        if self.lr is None:
            self.lr = 1.0 / theory_value(self, "lr", "1/L", "L")["L"]


# ---- FedRed, FedRed-(S)GD ------------------------------------------------------------------------
class FedRedParams(DriftParams):
    p: float | None = Field(None, gt=0, le=1,
                            description="probability of communicating after a local step "
                                        "(default: the convex theory's (lambda + mu/2) / (eta "
                                        "- mu/2), Thm 9; solver exact: / (eta + mu/2), Thm 7; "
                                        "non-convex problem: delta_B / L, Thm 8; solver exact: "
                                        "lambda / eta, Thm 6)")
    eta: float | None = Field(None, ge=0, description="eta, pull toward the device's own previous "
                                                      "iterate (default L, A8; non-convex "
                                                      "problem: 3L + sqrt(9L^2 + L sigma^2 K / "
                                                      "F_0), Thm 8 (6L with exact gradients); "
                                                      "solver exact: max(L, 4 delta_B), Thm 6)")
    lam: float | None = Field(None, ge=0, description="lambda, pull toward x~ (default delta_A, "
                                                      "Thm 9 / Thm 7; non-convex problem: "
                                                      "delta_B, Thm 8 / Thm 6; with p given: p "
                                                      "eta, the practical rule of Sec. 2.4)")
    averaging: str | None = Field(
        None, pattern="^(avg|rand)$",
        description="the Average of x~ at a communication: avg, the mean of the devices' "
                    "x_{i,k+1}; rand, x_{j_k,k+1} of one device j_k drawn uniformly from (seed, "
                    "round), which alone uploads its model (every device still steps and takes "
                    "part in the gradient all-reduce); default by the theory: avg on a convex "
                    "problem (Thm 9 / Thm 7), rand on a non-convex one (Thm 8 / Thm 6)")
    lr: float | None = Field(None, gt=0, description="alternative to eta for the -(S)GD variant: "
                                                     "gamma = 1/(eta + lambda), so eta = 1/lr - "
                                                     "lambda (A16)")
    solver: str = Field("gd", pattern="^(gd|exact)$",
                        description="gd: FedRed-(S)GD, one linearised step per iteration (Alg. 3);"
                                    " exact: Alg. 2, each iteration solves F_{i,k} by GD to "
                                    "||grad F|| <= exact_tolerance or exact_steps steps (A21)")
    exact_steps: int = Field(50, gt=0, description="Alg. 2 inner GD cap (A21: 50)")
    exact_tolerance: float = Field(1e-8, gt=0, description="Alg. 2 inner stop (A21: 1e-8)")

    @model_validator(mode="after")
    def _one_step_rule(self):
        if self.lr is not None and self.eta is not None:
            raise ValueError("set either eta or lr (lr = 1/(eta + lambda)), not both")
        if self.lr is not None and self.lam is None:
            raise ValueError("with lr set, also set lam (eta = 1/lr - lam)")
        if self.lr is not None and self.lr * self.lam > 1:
            raise ValueError(f"lr * lam must be at most 1 (got {self.lr * self.lam:g}): eta = "
                             "1/lr - lam would be negative; lower lr or lam")
        if self.eta == 0 and self.lam == 0:
            raise ValueError("eta + lam must be positive (the local step is 1/(eta + lam)); "
                             "raise eta or lam")
        if self.solver == "exact" and not self.full_batch:
            raise ValueError("solver: exact needs exact gradients (full_batch: true)")
        if self.averaging == "rand" and not self.full_batch:
            raise ValueError(RAND_NEEDS_FULL_BATCH)
        return self


# FedRed with Rand: the devices other than j_k step without uploading, and their steps are
# charged with the gradient all-reduce that follows (FedRed.round), one batch size a phase.
RAND_NEEDS_FULL_BATCH = (
    "averaging: rand needs exact gradients (full_batch: true) in FedRed: the devices other than "
    "j_k step without uploading their model, and their steps are charged with the following "
    "gradient all-reduce, whose full-batch passes cannot be priced together with minibatch "
    "ones; set full_batch: true, or averaging: avg")


class FedRed(DriftCorrected):
    """FedRed (fedred.md Alg. 2) and FedRed-(S)GD (Alg. 3): doubly regularised local steps,
    communication with probability p, local iterates kept across communications (A4).

    ``averaging: rand`` (Thm 6 / Thm 8): at a communication event k, x~_{k+1} = x_{j_k,k+1} of
    one device j_k drawn as DANE+'s j_r (``selected_device``, stream (seed, "rand-averaging",
    k)); only j_k uploads its model, then every device takes part in the gradient all-reduce at
    x~_{k+1} as with avg. Every device still runs its N_k local steps (its iterate is kept, A4,
    and read when it is drawn): the steps of the devices other than j_k are charged with their
    next upload, the all-reduce that follows (the engine prices work only with an upload), so
    gradient counts and energy are exact and the simulated round is longer than the algorithm's
    by up to those N_k steps (they would run while j_k computes and uploads); this needs exact
    gradients (``RAND_NEEDS_FULL_BATCH``). When j_k cannot deliver (not holding the state, out
    of energy, or its upload lost after the retries) the round keeps x~ and h_i, broadcasts the
    one-value "no update" flag and skips the all-reduce, as a round in which nothing arrives;
    the steps already made are kept (Alg. 2 with theta_k = 0) and charged at the next
    all-reduce the device takes part in (at the run's end, steps still owed are not charged).

    Non-convex problems (``is_nonconvex``) resolve the parameters left out by Thm 8 (FedRed-(S)GD:
    lambda = delta_B, eta = 3L + sqrt(9L^2 + L sigma^2 K / F^_0), p = delta_B / L) or Thm 6
    (``solver: exact``: lambda = delta_B, eta = max(L, 4 delta_B) (A8's L, at least Thm 6's
    4 delta_B) [D], p = lambda / eta), and ``averaging`` by default rand. sigma^2 is Assumption
    1's variance of the gradients used: 0 with exact gradients (so eta = 6L), the problem's
    noise_std^2 / batch_size with minibatches; K = R L / delta_B, the iterations R communication
    events take in expectation at Thm 8's p (R the planned ``rounds``) [D]; F^_0
    (``initial_gap``) as DANE+'s, recorded only when sigma > 0 reads it."""

    name = "fedred"
    Params = FedRedParams
    summary = ("local steps on f_i - <h_i, x> + eta/2 ||x - x_i||^2 + lambda/2 ||x - x~||^2, "
               "communicating after Geom(p) steps; two d-vectors up and two down")
    resolved_attributes = ("p", "eta", "lam", "lr", "inner_lr", "initial_gap")
    held_arrays = 1  # x_i
    # averaging: rand asks only j_k for its model: the conformance suite checks each device's
    # ledger against ``declared_phases`` (as DANE+'s; avg is held to the exact count of
    # ``declared_payloads`` by tests/test_drift.py).
    samples_devices: ClassVar[bool] = True

    @classmethod
    def declared_phases(cls, d: int, bits: int, participants: int = 1
                        ) -> tuple[Payload, tuple[tuple[Payload, Payload | None], ...]]:
        """(every device's broadcasts each round: x~ and the gradient mean, ((uplink, unicast
        before it) of each upload phase)): x_{i,k+1} up (every device with avg, j_k alone with
        rand), then grad f_i(x~_{k+1}) up from every device."""
        model, gradient = Payload.vectors(d, bits), Payload.vectors(d, bits)
        return Payload.vectors(d, bits, count=2), ((model, None), (gradient, None))

    @classmethod
    def initial_payloads(cls, d: int, bits: int) -> tuple[Payload, Payload]:
        """The gradient all-reduce at x^0 that sets h_{i,0} (A19), before the first step."""
        return Payload.vectors(d, bits), Payload.vectors(d, bits)

    @classmethod
    def theory_needs(cls, params) -> list[tuple[str, str, tuple[str, ...]]]:
        theorem = "Thm 7" if params.solver == "exact" else "Thm 9"
        needs = []
        if params.lr is None and params.eta is None:
            needs.append(("eta", "L", ("L",)))
        if params.lr is None and params.lam is None and params.p is None:
            needs.append(("lam", f"delta_A ({theorem})", ("delta_A",)))
        if params.p is None:
            needs.append(("p", f"the convex theory's rule ({theorem})", ("mu",)))
        if params.solver == "exact":
            needs.append(("solver: exact", "1/(L + eta + lambda)", ("L",)))
        return needs

    def setup(self) -> None:
        """eta, lambda, p from the parameters, or from the convex theory (fedred.md Sec. 2.3 -
        2.5): eta = L (A8), lambda = delta_A, p = Thm 9's (Thm 7's with ``solver: exact``) for
        that eta and lambda; on a non-convex problem from Thm 8 (Thm 6), class doc. lambda and
        p are tied (lambda ~ p eta), so a given p sets lambda by the practical rule lambda =
        p eta (end of Sec. 5) and a given lambda sets p (convex theory; Thm 8's p is delta_B /
        L whatever lambda)."""
        p = self.params
        self.nonconvex = is_nonconvex(self.ctx.evaluator.constants or {})
        self.averaging = self.resolve_averaging(self.nonconvex)
        if self.averaging == "rand" and not p.full_batch:
            raise UserError(f"algorithms '{p.display_name}': averaging defaults to rand on this "
                            f"non-convex problem (Thm 8); {RAND_NEEDS_FULL_BATCH}")
        self.initial_gap = None
        if p.lr is not None:  # with lam, and lr * lam <= 1 (FedRedParams)
            self.lam, self.eta = p.lam, 1.0 / p.lr - p.lam
        else:
            self.eta = p.eta
            if self.eta is None:
                self.eta = (self.nonconvex_eta() if self.nonconvex
                            else theory_value(self, "eta", "L", "L")["L"])
            self.lam = p.lam
            if self.lam is None and p.p is not None:
                self.lam = p.p * self.eta
            elif self.lam is None and self.nonconvex:
                theorem = "Thm 6" if p.solver == "exact" else "Thm 8"
                self.lam = theory_value(self, "lam", f"delta_B ({theorem})",
                                        "delta_B")["delta_B"]
            elif self.lam is None:
                theorem = "Thm 7" if p.solver == "exact" else "Thm 9"
                self.lam = similarity(self, "lam", f"delta_A ({theorem})")
        if self.eta + self.lam <= 0:
            raise UserError(f"algorithms '{p.display_name}': eta + lam must be positive")
        self.lr = 1.0 / (self.eta + self.lam)
        self.p = p.p if p.p is not None else self.theory_p()
        self.inner_lr = None
        if p.solver == "exact":  # Alg. 2's inner GD on F_{i,k} (A21)
            self.inner_lr = 1.0 / (theory_value(self, "solver: exact", "1/(L + eta + lambda)",
                                                "L")["L"] + self.eta + self.lam)
        # x_{i,k}: x^0 until device i first steps (rows only for the devices that took part)
        self.models = DeviceRows(self.ctx.num_devices, self.theta.to(self.dtype))
        self.started = False  # the all-reduce at x^0 (A19) has run
        # h_i = grad f_i(x~) - grad f(x~) at the anchor x~ of the last all-reduce whose mean
        # arrived (None: no mean yet, h_i = 0); every h_i follows from the two, so h_i is
        # computed for the devices that step, when they step.
        self.anchor = None
        self.anchor_mean = None
        # averaging: rand: local steps made and not yet charged, per device (class doc)
        self.owed = np.zeros(self.ctx.num_devices, dtype=np.int64)

    def nonconvex_eta(self) -> float:
        """eta of the non-convex theory: Thm 8's 3L + sqrt(9L^2 + L sigma^2 K / F^_0) for
        FedRed-(S)GD, max(L, 4 delta_B) for the exact solver (Thm 6's eta >= 4 delta_B), class
        doc."""
        p = self.params
        if p.solver == "exact":
            c = theory_value(self, "eta", "max(L, 4 delta_B) (Thm 6)", "L", "delta_B")
            return max(c["L"], 4 * c["delta_B"])
        rule = "3L + sqrt(9L^2 + L sigma^2 K / F_0) (Thm 8)"
        c = theory_value(self, "eta", rule, "L", "delta_B")
        big_l = c["L"]
        if p.full_batch:  # exact gradients: sigma = 0
            return 6 * big_l
        noise = getattr(self.ctx.evaluator, "noise_std", None)
        if noise is None:
            raise UserError(f"algorithms '{p.display_name}': eta defaults to {rule}, which needs "
                            "the minibatch gradients' variance sigma^2 (Assumption 1), which "
                            "this problem does not state; set eta")
        sigma_sq = noise ** 2 / p.batch_size
        if sigma_sq == 0:
            return 6 * big_l
        self.initial_gap = initial_gap(self, big_l)
        comm = p.p if p.p is not None else min(1.0, c["delta_B"] / big_l)
        if self.initial_gap <= 0 or comm <= 0:
            raise UserError(f"algorithms '{p.display_name}': eta defaults to {rule}, which needs "
                            f"F_0 > 0 and delta_B > 0 (F^_0 = {self.initial_gap:g}, delta_B = "
                            f"{c['delta_B']:g}); set eta")
        iterations = p.rounds / comm
        return 3 * big_l + math.sqrt(9 * big_l ** 2
                                     + big_l * sigma_sq * iterations / self.initial_gap)

    def theory_p(self) -> float:
        """p of the convex theory for the resolved eta and lambda: (lambda + mu/2) / (eta - mu/2)
        for FedRed-(S)GD (Thm 9), (lambda + mu/2) / (eta + mu/2) for the exact solver (Thm 7);
        on a non-convex problem delta_B / L (Thm 8), lambda / eta for the exact solver (Thm 6)."""
        if self.nonconvex:
            if self.params.solver == "exact":
                return min(1.0, self.lam / self.eta)
            c = theory_value(self, "p", "delta_B / L (Thm 8)", "L", "delta_B")
            return min(1.0, c["delta_B"] / c["L"])
        rule = ("(lam + mu/2) / (eta + mu/2) (Thm 7)" if self.params.solver == "exact"
                else "(lam + mu/2) / (eta - mu/2) (Thm 9)")
        mu = max(theory_value(self, "p", rule, "mu")["mu"], 0.0)
        below = self.eta + mu / 2 if self.params.solver == "exact" else self.eta - mu / 2
        if below <= 0:
            raise UserError(f"algorithms '{self.params.display_name}': p defaults to {rule}, "
                            f"which needs eta > mu/2 (eta = {self.eta:g}, mu = {mu:g}); raise "
                            "eta or set p")
        return min(1.0, (self.lam + mu / 2) / below)

    def control_variates(self, devices: np.ndarray) -> torch.Tensor:
        """h_i [n, d] of ``devices``: grad f_i(x~) - grad f(x~) at the last all-reduce's
        anchor (the values it computed, at the same point), 0 before any mean arrived."""
        x = self.models.default
        if self.anchor is None:  # nothing arrived yet: no correction
            return x.new_zeros((len(devices), x.numel()))
        return self.exact_gradients(self.anchor, devices) - self.anchor_mean

    def remember_anchor(self, anchor: torch.Tensor, mean: torch.Tensor | None) -> None:
        """A mean arrived: the control variates are now those at ``anchor``."""
        if mean is not None:
            self.anchor, self.anchor_mean = anchor.to(self.dtype), mean.to(self.dtype)

    def local_steps(self, x_ref: torch.Tensor, steps: int, devices: np.ndarray, k: int
                    ) -> tuple[torch.Tensor, np.ndarray]:
        """``steps`` iterations on the own iterates of ``devices``; returns (their new
        iterates [n, d], gradient evaluations per device [n])."""
        p = self.params
        models = self.models.get(devices)
        h = self.control_variates(devices)
        evaluations = np.zeros(len(devices), dtype=np.int64)
        for t in range(steps):
            if p.solver == "gd":  # Alg. 3's closed-form step
                g = self.local_gradients(models, devices, k, t)
                step = g - h + self.lam * (models - x_ref)
                models = models - self.lr * step
                evaluations += 1
                continue
            # Alg. 2: GD on F_{i,k} from x_{i,k} with step 1/(L + eta + lambda) (A21)
            anchor = models
            y = anchor.clone()
            running = torch.ones(len(devices), dtype=torch.bool, device=y.device)
            for _ in range(p.exact_steps):
                g = self.local_gradients(y, devices, k, t) - h + self.eta * (y - anchor) \
                    + self.lam * (y - x_ref)
                evaluations += running.cpu().numpy()
                running &= g.norm(dim=1) > p.exact_tolerance
                if not bool(running.any()):
                    break
                y = torch.where(running[:, None], y - self.inner_lr * g, y)
            models = y
        return models, evaluations

    def round(self, k: int):
        if not self.started:  # h_{i,0} from an all-reduce at x^0 (A19)
            _, mean, _ = yield from self.all_reduce(self.theta, k, "grad-init")
            self.remember_anchor(self.theta, mean)
            self.started = True
        steps = coin_steps(self.ctx.seed, self.p, k)
        self.round_local_steps = steps
        active = self.holder_devices()
        x_ref = self.theta.to(self.dtype)
        models, evaluations = self.local_steps(x_ref, steps, active, k)
        self.models.set(active, models)
        if self.averaging == "rand":
            new = yield from self.rand_exchange(models, active, evaluations, k)
        else:
            new = yield from self.exchange_models(
                models, active, self.gradient_cost(self.per_device(active, evaluations)), k)
        if new is None:
            return
        self.theta = new
        if self.averaging == "rand":  # the others' steps, charged with the all-reduce
            charged = self.holder_devices()
            cost = Cost(1 + self.owed, 1 + self.owed, self.ctx.evaluator.full_batch_sizes())
            _, mean, _ = yield from self.all_reduce(self.theta, k, cost=cost)
            self.owed[charged] = 0
        else:
            _, mean, _ = yield from self.all_reduce(self.theta, k)
        self.remember_anchor(self.theta, mean)

    def rand_exchange(self, models: torch.Tensor, active: np.ndarray, evaluations: np.ndarray,
                      k: int):
        """Rand's model phase: j_k uploads x_{j_k,k+1} (its steps charged with it), the base
        station broadcasts it; the other devices' steps are owed to the all-reduce. Returns the
        new x~ (float32) or None (j_k not holding the state, or its upload lost: the "no
        update" flag)."""
        chosen = active == self.selected_device(k)
        self.owed[active[~chosen]] += evaluations[~chosen]
        sender = active[chosen]
        if not len(sender):
            yield from self.broadcast_mean(None, models.shape[1])
            return None
        cost = self.gradient_cost(self.per_device(sender, evaluations[chosen]))
        return (yield from self.exchange_models(models, active, cost, k, active=sender))


# ---- Scaffnew / ProxSkip --------------------------------------------------------------------------
class ScaffnewParams(DriftParams):
    lr: float | None = Field(None, gt=0, description="gamma (default 1/L, ProxSkip theory [E])")
    p: float | None = Field(None, gt=0, le=1, description="communication probability (default "
                                                          "sqrt(mu / L), ProxSkip theory [E]; "
                                                          "refused when mu is 0 or the problem "
                                                          "is non-convex)")


class Scaffnew(SingleExchange):
    """Scaffnew / ProxSkip (Mishchenko et al. 2022; fedred.md Sec. 2.6 [E]): x^_i = x_i -
    gamma (g_i(x_i) - h_i); after Geom(p) steps devices upload x^_i - (gamma/p) h_i, the base
    station broadcasts the mean x-bar, and h_i += (p/gamma)(x-bar - x^_i), x_i = x-bar (reset).
    h_{i,0} = 0. A device whose upload was lost keeps its h_i (A12 b)."""

    name = "scaffnew"
    Params = ScaffnewParams
    summary = "local steps with control variates, communication with probability p; one d-vector each way"
    resolved_attributes = ("lr", "p")
    held_arrays = 2  # x_i and h_i

    @classmethod
    def theory_needs(cls, params) -> list[tuple[str, str, tuple[str, ...]]]:
        needs = super().theory_needs(params)
        return needs + ([("p", "sqrt(mu / L)", ("L", "mu"))] if params.p is None else [])

    def setup(self) -> None:
        p = self.params
        self.lr = self.inverse_l_step()
        self.p = p.p
        if self.p is None:
            c = theory_value(self, "p", "sqrt(mu / L)", "L", "mu")
            if is_nonconvex(c):  # Table 1: Scaffnew's non-convex rate is unknown
                raise UserError(
                    f"algorithms '{p.display_name}': p defaults to sqrt(mu / L), which needs "
                    f"mu > 0, but this problem is non-convex (mu = {c['mu']:.4g} < 0), where "
                    "Scaffnew / ProxSkip has no theory (fedred.md Table 1: unknown); set p "
                    "explicitly (e.g. p: 0.1; fedred.md Sec. 5.1 / App. C try 0.05 - 0.2)")
            # p = 0 would never communicate: ProxSkip's rule needs mu > 0, and a mu within
            # eigenvalue rounding of 0 (a built mu = 0 instance measures about 1e-14 L) gives
            # Geom(p) local steps by the tens of millions [D]
            if c["mu"] <= MU_ROUNDING * c["L"]:
                raise UserError(
                    f"algorithms '{p.display_name}': p defaults to sqrt(mu / L), which is 0 "
                    f"here (mu = {c['mu']:.3g}, zero up to rounding: the problem is not strongly "
                    "convex); set p "
                    "explicitly (e.g. p: 0.1), or give the problem a mu > 0 (model.l2 for "
                    "logistic, problem.mu for the quadratic)")
            self.p = min(1.0, math.sqrt(c["mu"] / c["L"]))
        # x_i (x^0 until device i first steps) and h_i (0 until its first delivered upload):
        # rows only for the devices that took part
        x0 = self.theta.to(self.dtype)
        self.models = DeviceRows(self.ctx.num_devices, x0)
        self.h = DeviceRows(self.ctx.num_devices, torch.zeros_like(x0))

    def round(self, k: int):
        steps = coin_steps(self.ctx.seed, self.p, k)
        self.round_local_steps = steps
        active = self.holder_devices()
        models, h = self.models.get(active), self.h.get(active)
        hat = models
        for t in range(steps):
            models = hat
            hat = models - self.lr * (self.local_gradients(models, active, k, t) - h)
        d = self.theta.numel()
        sent = hat - (self.lr / self.p) * h
        delivered = yield from self.upload(self.gradient_cost(self.per_device(active, steps)),
                                           Payload.vectors(d, self.bits), active)
        mean = self.average(sent, active, delivered, "model", k)
        yield from self.broadcast_mean(mean, d)
        if mean is None:
            self.models.set(active, hat)
            return
        self.theta = mean
        x_bar = mean.to(self.dtype)
        rows = torch.as_tensor(np.searchsorted(active, delivered), device=hat.device)
        self.h.set(delivered, h[rows] + (self.p / self.lr) * (x_bar - hat[rows]))
        self.models.set(active, x_bar.expand_as(hat))
