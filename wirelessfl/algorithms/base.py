"""The algorithm base class and its typed parameters (algorithms are found by name in
``wirelessfl.plugins.ALGORITHMS``).

An algorithm is the base station's SimPy process. The base owns the round loop (template method):
``setup`` once, then ``round(k)`` for k = 0..rounds-1, with evaluation and bookkeeping between
rounds done by the run context. A subclass writes ``round`` like its pseudocode: compute with the
batched evaluator, ``yield from self.collect(...)`` / ``self.broadcast(...)``, then update using
only what was delivered.

Devices that miss a downlink packet (``downlink.loss``) no longer hold the current model: they sit
out every collect until ``resync`` (run by the base before each round) has sent them what they
missed, so a stale model never feeds the aggregate (a missed ``unicast``, content for one device
only, does not make it stale). Devices whose battery ran out are left out of collects and
broadcasts by the network itself.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from wirelessfl.algorithms.participation import participant_count, participant_indices
from wirelessfl.contract.facts import SINGLE_LEVEL, ScenarioFacts
from wirelessfl.contract.memory import ROW_VALUE_COPIES, RoundShape
from wirelessfl.contract.payload import Payload
from wirelessfl.learning.quantize import FULL_PRECISION_BITS, quantize_rows, quantize_scalars
from wirelessfl.learning.seeds import counter_uniform, device_uniform, keyed_generator

if TYPE_CHECKING:
    from wirelessfl.contract.port import RunPort


# Local steps a round may hold at most [D]: the specs' settings are 1 to a few hundred (FedAvg's
# E, fgdro.md's I = 32, fedred.md's K = 10, ZO-HFL's cap of 1000); a million is far past them
# (hours a round at a millisecond a step), so a larger count is a slip or hostile input.
MAX_STEPS_PER_ROUND = 1_000_000


class AlgorithmParams(BaseModel):
    """Parameters every algorithm has; subclasses add their own (unknown keys are rejected)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str
    label: str | None = Field(None, description="name shown in tables and plots (default: name)")
    rounds: int = Field(100, gt=0, description="communication rounds (DZOFL: iterations)")
    batch_size: int = Field(10, gt=0, description="minibatch size per device per pass (a device "
                            "holding fewer samples passes over all of them, once each)")
    eval_every: int = Field(10, gt=0, description="evaluate the global model every this many rounds")
    bits: int | None = Field(None, ge=1, le=32,
                             description="M, bits per transmitted value (default: quantization_bits)")
    participation: float = Field(
        1.0, gt=0, le=1, description="beta, the fraction of devices asked to compute and upload "
                                     "each round (drawn anew every round from the run's seed)")

    @property
    def display_name(self) -> str:
        return self.label or self.name

    @model_validator(mode="after")
    def _bounded_round_work(self):
        """Every count of local steps a round (``*_steps``) is bounded, as rounds are bounded by
        what their records take: one past MAX_STEPS_PER_ROUND (9007199254740993 was accepted
        and the run never ended) is refused naming the key."""
        for key in type(self).model_fields:
            value = getattr(self, key)
            if key.endswith("_steps") and isinstance(value, int) and not isinstance(value, bool) \
                    and value > MAX_STEPS_PER_ROUND:
                raise ValueError(f"{key} = {value:,} is more local steps a round than the "
                                 f"{MAX_STEPS_PER_ROUND:,} a round may hold; the papers use "
                                 "1 to a few hundred")
        return self

    def bits_problem(self) -> str | None:
        """Why these parameters cannot send values of ``bits`` bits (checked by the loader once
        bits holds the scenario's quantization_bits), or None."""
        return None


# The fixed format's range when scalar_format is fixed and no scalar_range is given [D].
DEFAULT_SCALAR_RANGE = 1.0


class ScalarFormatParams(AlgorithmParams):
    """Parameters of algorithms that send quantised scalars (DZOFL, ZO-HFL's seed mode): the
    scalar format (wirelessfl.learning.quantize; docs/algorithms.md, "The scalar quantiser")."""

    scalar_format: Literal["float", "fixed"] = Field(
        "float", description="float: stochastic float (1 sign, min(6, M-1) exponent, the rest "
                             "mantissa bits), unbiased at every input with relative error; "
                             "fixed: 2^M levels on [-scalar_range, scalar_range] (clips beyond)")
    scalar_range: float | None = Field(
        None, gt=0, description="scalar_format fixed only: the range r of the uploaded scalars "
                                f"[-r, r] (default {DEFAULT_SCALAR_RANGE:g})")

    @model_validator(mode="after")
    def _range_needs_fixed_format(self):
        if self.scalar_format == "float" and self.scalar_range is not None:
            raise ValueError("scalar_range is the range of scalar_format: fixed; the default "
                             "float format needs none: remove scalar_range, or set "
                             "scalar_format: fixed to keep the fixed range")
        return self

    def bits_problem(self) -> str | None:
        if self.scalar_format == "float" and self.bits is not None and self.bits < 2:
            return (f"bits: the float scalar format needs M >= 2 (a sign and an exponent bit), "
                    f"got M = {self.bits} (bits or quantization_bits); set scalar_format: fixed "
                    "for 1-bit scalars")
        return None

    def fixed_range(self) -> float | None:
        """r of the fixed format, or None for the float format (quantize_scalars' ``scale``)."""
        if self.scalar_format == "float":
            return None
        return self.scalar_range if self.scalar_range is not None else DEFAULT_SCALAR_RANGE


class Algorithm:
    """Base station process of one federated algorithm; subclasses define Params and round()."""

    name: ClassVar[str]
    Params: ClassVar[type[AlgorithmParams]] = AlgorithmParams
    summary: ClassVar[str] = ""
    # True when the base station also learns from data of its own (ZO-HFL), so the model moves
    # even in a round in which no upload arrives.
    server_learns: ClassVar[bool] = False

    def __init__(self, params: AlgorithmParams, ctx: RunPort):
        self.params = params
        self.ctx = ctx
        self.bits = int(params.bits)
        self.theta: torch.Tensor = ctx.theta0.clone()
        # Downlink packets each device missed since it last held the current model.
        self.missed = np.zeros(ctx.num_devices, dtype=np.int64)
        self.round_index = 0

    # [N, d] arrays (in the problem's compute precision) the algorithm holds at its peak, beyond
    # the evaluator's chunked work: what the pre-run memory check (pipeline/memory.py) counts.
    peak_device_arrays: ClassVar[int] = 0

    # True when a round computes only for the devices it asks (their work alone can matter):
    # the memory check sizes the round's work by round(beta N), not N.
    computes_participants_only: ClassVar[bool] = False

    # True when the round reads its collect results by device index (``delivered_devices``)
    # only: with per-device random streams ``collect`` then asks the network by index, so the
    # engine's cost follows the participants, not N.
    reads_device_indices: ClassVar[bool] = False

    @classmethod
    def state_rows(cls, num_devices: int, params: AlgorithmParams) -> float:
        """Rows [d] of ``peak_device_arrays`` the algorithm holds at its peak, for the memory
        check: N each (dense per-device arrays) unless a subclass holds fewer."""
        return cls.peak_device_arrays * num_devices

    @classmethod
    def shared_stream_rows(cls, num_devices: int, params: AlgorithmParams) -> float:
        """Rows [d] held beyond ``state_rows`` when a round's random draws come from one stream
        over all N (``population.random_streams: shared``): a draw of every device's row, of
        which the participants take theirs. ``state_rows`` counts per-device streams; none
        by default."""
        return 0.0

    @classmethod
    def one_off_forward_devices(cls, num_devices: int, params: AlgorithmParams) -> int:
        """Devices a one-off exchange before round 0 runs a forward minibatch pass for (FGDRO
        KL's warm start: every holder of w_0), for the memory check; none by default."""
        return 0

    @classmethod
    def round_memory(cls, params: AlgorithmParams, shape: RoundShape) -> tuple[int, bool]:
        """(bytes, chunked) of the largest round temporaries beyond ``state_rows``, for the memory
        check (pipeline/memory.py); chunked: they shrink with engine.max_chunk_mb. By default one
        chunk's minibatches with autograd, ROW_VALUE_COPIES [chunk, d] blocks (models, gradients,
        updates) and the quantiser's work on the chunk's uploads. A subclass inherits its
        parent's rule (a plugin subclass of a built-in is sized as that built-in)."""
        chunk = shape.chunk
        return (chunk * (shape.minibatch_bytes + ROW_VALUE_COPIES * shape.d * shape.itemsize)
                + shape.quantized_bytes(chunk), True)

    # ---- what the algorithm needs of its scenario (checked before a run, pipeline/preflight.py)
    # The problem capability the algorithm runs on (contract/facts.py): a single-level problem
    # unless a subclass says otherwise (FedMSA: multi-sequence, FedNest: bilevel).
    problem_needs: ClassVar[str] = SINGLE_LEVEL
    # How its uploads cross the air (contract/port.py AIR_WAYS): "packets", each device's its
    # own (every network); "superposition", the channel-weighted sum of simultaneous analog
    # transmissions, which a scenario's network must implement (SuperposingAir).
    air: ClassVar[str] = "packets"

    @classmethod
    def check_scenario(cls, params: AlgorithmParams, facts: ScenarioFacts) -> str | None:
        """What makes ``params`` unrunnable in a scenario with ``facts`` (a count beyond N, ...),
        as the message a UserError gives, or None; what ``setup`` would otherwise refuse once
        the world is built. None by default."""
        return None

    @classmethod
    def check_constants(cls, params: AlgorithmParams, known: frozenset[str]) -> None:
        """Raise UserError when a default rule of ``params`` reads a problem constant the
        problem will not hold (``known``: the names it will); nothing is read by default."""

    @classmethod
    def needs_server_loss(cls, params: AlgorithmParams) -> bool:
        """True when the run needs a loss held by the base station: an algorithm whose base
        station learns (``server_learns``), or parameters asking it to take part with its own
        data (a ``server_data`` parameter set true)."""
        return cls.server_learns or bool(getattr(params, "server_data", False))

    # Parameters that change only theta's arithmetic, never what crosses the air or when (step
    # sizes): runs that differ only in them can run in lockstep (algorithms/lanes.py), which an
    # algorithm offers by naming them and writing its round as ``lanes_round``. None by default.
    lockstep_parameters: ClassVar[tuple[str, ...]] = ()

    # Upload phases of a round in which every packet arrives (two for methods that exchange a
    # gradient and then a model); the conformance suite reads it with ``declared_payloads``.
    uploads_per_round: ClassVar[int] = 1

    # Attributes that ``setup`` sets from the parameters or, for a parameter left out (None), from
    # a rule (the theory's value from the problem's constants: lambda = 2 delta_A, lr = 1/L, ...).
    # The manifest's params entry holds the user's None; ``resolved`` records the values used.
    resolved_attributes: ClassVar[tuple[str, ...]] = ()

    def resolved(self) -> dict[str, float]:
        """{name: value} of ``resolved_attributes`` as the run uses them, for the manifest entry's
        "resolved"; an attribute not set (before ``setup``, or unused: None) is left out."""
        values = {name: getattr(self, name, None) for name in self.resolved_attributes}
        return {name: float(v) for name, v in values.items() if v is not None}

    @classmethod
    def initial_payloads(cls, d: int, bits: int) -> tuple[Payload, Payload] | None:
        """(uplink, downlink) of a one-off exchange before round 0's work (FedRed's all-reduce
        at x^0), or None."""
        return None

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1
                          ) -> tuple[Payload, Payload]:
        """(uplink per device, downlink broadcast) of one round in which packets arrive, with
        ``participants`` devices taking part (for downlinks that carry something per device).

        The spec's statement of what crosses the air; the conformance suite checks the engine's
        ledger against it for every registered algorithm.
        """
        raise NotImplementedError

    @classmethod
    def declaration_keywords(cls, params: AlgorithmParams, problem: object) -> dict:
        """Keyword arguments of ``declared_payloads`` beyond (d, bits, participants), filled by
        name: from the parameters (ZO-HFL's ``payload``, ``directions``), else from the problem
        (FedNest's ``blocks``); one found in neither keeps its default. What the conformance
        suite and the run's notes price a round's packets with."""
        found = {}
        for key in inspect.signature(cls.declared_payloads).parameters:
            if key in ("d", "bits", "participants"):
                continue
            if key in type(params).model_fields:
                found[key] = getattr(params, key)
            elif hasattr(problem, key):
                found[key] = getattr(problem, key)
        return found

    def resync_payload(self, missed: int) -> Payload:
        """What a device that missed ``missed`` downlink packets needs to catch up: by default
        the current model as d float32 values."""
        return Payload.vectors(self.theta.numel(), 32, label="resync model")

    def participants(self, k: int, *stage: int) -> np.ndarray:
        """[N] bool: the round(beta N) devices (at least one) asked to take part in round k,
        drawn from a stream keyed by (seed, round), so every algorithm of a scenario with the
        same beta asks the same devices. ``stage``: extra keys for a method that draws anew for
        each stage of a round (FedNest's inner rounds and its outer stage)."""
        n = self.ctx.num_devices
        if self.params.participation >= 1:
            return np.ones(n, dtype=bool)
        chosen = np.zeros(n, dtype=bool)
        chosen[self.participant_devices(k, *stage)] = True
        return chosen

    def participant_devices(self, k: int, *stage: int) -> np.ndarray:
        """Round k's asked devices as increasing indices: those of ``participants``'s mask,
        drawn without building it (O(round(beta N)) whatever N; every device when beta = 1)."""
        n, beta = self.ctx.num_devices, self.params.participation
        if beta >= 1:
            return np.arange(n, dtype=np.int64)
        return participant_indices(self.ctx.seed, n, participant_count(beta, n), k, *stage)

    def collect(self, cost, payload: Payload, active: np.ndarray | None = None):
        """``net.collect`` over this round's participants that hold the current model (and
        ``active``). Devices left out compute and send nothing. An algorithm that reads its
        results by index (``reads_device_indices``) under per-device random streams asks the
        participants by index: the result's arrays are then aligned with ``result.devices``."""
        if self.reads_device_indices and self.ctx.per_device_streams:
            asked = self.participant_devices(self.round_index)
            keep = self.missed[asked] == 0
            if active is not None:
                keep &= np.asarray(active, dtype=bool)[asked]
            devices = asked[keep]
        else:
            devices = (self.missed == 0) & self.participants(self.round_index)
            if active is not None:
                devices &= np.asarray(active, dtype=bool)
        result = yield from self.ctx.net.collect(cost, payload, devices)
        self.ctx.health.collected(result.active, result.delivered)
        return result

    def holder_devices(self) -> np.ndarray:
        """Increasing indices of the devices asked this round that hold the current global
        state and have energy left: those a phase whose values are computed before it asks
        (an analog phase, ``superpose``; the drift family's exchanges)."""
        asked = self.participant_devices(self.round_index)
        return asked[(self.missed[asked] == 0) & self.ctx.net.alive[asked]]

    def superpose(self, cost, payload: Payload, values: torch.Tensor, devices: np.ndarray):
        """``net.superpose`` (the analog uplink, ``air = "superposition"``): the devices
        ``devices`` (from ``holder_devices``) compute ``cost`` and transmit ``values`` [n, k] at
        once, with the parameters' ``power_control``; a NaN or inf among them stops the run as
        diverged. Returns the ``SuperposedResult``: the received sum and who transmitted."""
        self.ctx.check_finite(values, "up", self.round_index)
        result = yield from self.ctx.net.superpose(cost, payload, values, devices,
                                                   self.params.power_control)
        self.ctx.health.collected(result.active, result.transmitted)
        return result

    def minibatches(self, k: int, devices: np.ndarray, steps: int = 1, stream: str = "batch",
                    *keys: int) -> torch.Tensor:
        """Round k's minibatches [steps, n, w] for the devices ``devices`` (increasing indices;
        a round computes only for the devices whose work can matter): the rows of the
        population's draw from (seed, stream, k, keys), or with per-device random streams each
        device's own (``Problem.minibatches``)."""
        return self.ctx.evaluator.minibatches(self.ctx.seed, stream, (k, *keys),
                                              self.params.batch_size, steps, devices,
                                              self.ctx.per_device_streams)

    def scalar_noise(self, stream: str, k: int, devices: np.ndarray) -> torch.Tensor:
        """Uniforms [n] for quantising one scalar of each of ``devices`` at round k: the rows
        of the population's draw from (seed, stream, k) (shared streams), or each device's own
        (per-device streams), so quantising a round's delivered scalars alone gives the values
        quantising everyone's gave."""
        if self.ctx.per_device_streams:
            return torch.from_numpy(counter_uniform(self.ctx.seed, stream, (k,), devices, 1)[:, 0])
        noise = torch.rand(self.ctx.num_devices, generator=keyed_generator(self.ctx.seed, stream, k))
        return noise[torch.as_tensor(devices)]

    def broadcast(self, payload: Payload, values: torch.Tensor | None = None):
        """``net.broadcast`` to every device; those that miss it become stale. ``values``: what
        it carries when the algorithm sends it unquantised (a NaN or inf there stops the run;
        quantised broadcasts are checked by ``quantize``)."""
        if values is not None:
            self.ctx.check_finite(values, "down", self.round_index)
        result = yield from self.ctx.net.broadcast(payload)
        # the devices with energy that lost it (a device without energy takes no further
        # part, so its count no longer matters): O(lost), not O(N)
        self.missed[result.lost_devices] += 1
        return result

    def unicast(self, payload: Payload, receivers: np.ndarray):
        """``net.unicast``: each device in ``receivers`` gets a packet of ``payload``'s size
        meant for it alone (one per device, at its own rate). A device that misses it still
        holds the current model, so it is not made stale; the result says who received it."""
        return (yield from self.ctx.net.unicast(payload, np.asarray(receivers, dtype=bool)))

    def resync(self):
        """Send stale devices what they missed (a packet of its own, which can be lost again);
        devices whose battery ran out are not resynced."""
        stale = (self.missed > 0) & self.ctx.net.alive
        if not stale.any():
            return
        missed = int(self.missed[stale].max())
        result = yield from self.ctx.net.broadcast(self.resync_payload(missed), receivers=stale)
        self.missed[stale & result.received] = 0

    def quantize(self, vectors: torch.Tensor, stream: str, k: int, rows: slice | np.ndarray,
                 delivered: torch.Tensor | np.ndarray | None = None, direction: str = "up"
                 ) -> torch.Tensor:
        """Per-vector-scaled unbiased M-bit quantisation of the rows of devices ``rows`` [n, d]
        (a slice or an increasing index array: the devices' uploads, or one row for a
        broadcast: ``direction`` "down"), noise keyed by (stream, round, device). ``delivered`` [n] bool: the uploads that reach the base station (default
        all rows); only those are checked for NaN/inf (which stops the run as diverged) and
        counted in the health columns. Per-vector scales never clip."""
        sent = self._sent(vectors, delivered)
        self.ctx.check_finite(vectors, direction, self.round_index, sent)
        if self.bits >= FULL_PRECISION_BITS:
            return vectors
        self.ctx.health.quantized(direction, int(sent.sum()) * vectors.shape[1])
        noise = device_uniform(self.ctx.seed, stream, k, rows, vectors.shape[1], vectors.device)
        return quantize_rows(vectors, self.bits, noise)[0]

    def quantize_scalars(self, values: torch.Tensor, scale: float | None,
                         generator: torch.Generator,
                         delivered: torch.Tensor | np.ndarray | None = None,
                         direction: str = "up") -> torch.Tensor:
        """M-bit quantisation of one scalar per device (or one broadcast scalar) in the stochastic
        float format (``scale`` None) or on the fixed range [-scale, scale] (quantize_scalars):
        like ``quantize``, the delivered values are checked for NaN/inf and counted, with those
        that clip (beyond the fixed range, or beyond the float format's largest level)."""
        keep = self._sent(values, delivered)
        self.ctx.check_finite(values, direction, self.round_index, keep)
        q, clipped = quantize_scalars(values, self.bits, scale, generator)
        if self.bits < FULL_PRECISION_BITS:
            self.ctx.health.quantized(direction, int(keep.sum()), int(clipped[keep].sum()))
        return q

    @staticmethod
    def _sent(values: torch.Tensor, delivered: torch.Tensor | np.ndarray | None) -> torch.Tensor:
        """[n] bool on ``values``' device: the rows that reach their receiver (default all)."""
        if delivered is None:
            return torch.ones(values.shape[0], dtype=torch.bool, device=values.device)
        return torch.as_tensor(delivered, dtype=torch.bool).to(values.device)

    def setup(self) -> None:
        """Per-run state beyond theta (control variates, momenta, ...)."""

    def round(self, k: int):
        """One round as a generator of SimPy events; updates ``self.theta``."""
        raise NotImplementedError

    def process(self, start: int = 0):
        """The base station's process: the round loop, with evaluation between rounds (from
        round ``start`` when resumed from a checkpoint). ``setup`` has run before (run_algorithm
        calls it when it builds the run, so a resumed run is built exactly as a fresh one)."""
        if start == 0:
            self.ctx.end_round(0, self.theta, self.own_objective())
        for k in range(start, self.params.rounds):
            self.begin_round(k)
            yield from self.resync()
            yield from self.round(k)
            self.finish_round(k)
            if self.ctx.on_checkpoint is not None:
                self.ctx.on_checkpoint(k + 1)

    def begin_round(self, k: int) -> None:
        """Round k starts: its index, its local iterations (``round`` overrides the count when
        it varies) and the health log's round (also a lockstep lane's, pipeline/lockstep.py)."""
        self.round_index = k
        steps = getattr(self.params, "local_steps", 1)
        self.round_local_steps = steps if steps is not None else 0
        self.ctx.health.begin_round()

    def finish_round(self, k: int) -> None:
        """Round k ended: the health log's round, the local iterations counted, and the run
        context's end of round (the evaluation when due, the stop rules)."""
        self.ctx.health.end_round()
        self.ctx.local_steps += self.round_local_steps
        self.ctx.end_round(k + 1, self.theta, self.own_objective())

    def own_objective(self):
        """The function the rounds table's ``objective`` records at each evaluation (theta ->
        float; ZO-HFL's global loss with log_objective), or None (NaN). A method, not a stored
        callable: a checkpoint holds data only."""
        return
