"""The run port: everything an algorithm may ask of the run while it runs, as typed interfaces.

An algorithm (wirelessfl/algorithms/) is the base station's SimPy process. It is written against
``RunPort`` (``Algorithm.ctx``) and never imports the engine; the engine's run context
(engine/context.py ``RunContext``) implements the port, and the pipeline builds one per run.
The two sides meet only here, which is what lets a plugin algorithm be written, checked
(``wirelessfl.testing.check_algorithm``) and run without knowing how the cell is simulated.

**Ways of crossing the air.** What an algorithm sends is a ``Payload`` (contract/payload.py)
and what a device computes first a ``Cost``; how the values reach the base station is the
network's business. There are two ways. The first, ``Air.collect``: every device's upload is a packet
of its own, decoded or lost (fading, deadline, ARQ), and the algorithm learns who delivered
(``CollectResult``) and aggregates those devices' values, which it quantised itself. In the
second, the channel transforms the values on the way rather than carrying packets: devices
transmit at once on one resource and the base station receives the fading-weighted sum plus
noise (over-the-air aggregation, channel/analog.py). Both engines implement it as
``SuperposingAir`` (``superpose`` returns a ``SuperposedResult``: the received sum,
not a delivered mask), and an algorithm that needs it declares so (``Algorithm.air``), so that
a scenario whose network cannot superpose is refused before it runs. The packet way is then one
implementation of "values transformed by the channel": erased or delivered, per device.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import numpy as np
import torch

from wirelessfl.contract.payload import Cost, Payload
from wirelessfl.contract.problem import Problem

_NO_DEVICES = np.zeros(0, dtype=np.int64)

# The ways an algorithm's uploads may cross the air (``Algorithm.air``): "packets", one decoded
# or lost packet per device (every network); "superposition", the channel-weighted sum of
# simultaneous analog transmissions (a network that implements ``SuperposingAir``).
AIR_WAYS = ("packets", "superposition")
# How the transmitters of an analog phase set their power (``superpose``'s ``power_control``,
# channel/analog.py): truncated inversion with channel state, or large-scale inversion without.
PowerControl = Literal["truncated-inversion", "large-scale-inversion"]
POWER_CONTROLS: tuple[str, ...] = get_args(PowerControl)


@dataclass
class CollectResult:
    """What the base station learns from a collect phase (packets: who delivered, when)."""

    delivered: np.ndarray  # [N] bool: packet decoded at the base station in time
    finish_s: np.ndarray  # [N] absolute simulated time the device finished [s] (start if inactive)
    active: np.ndarray  # [N] bool: devices that took part
    late: np.ndarray  # [N] bool: uploads cut off by the deadline (stragglers)
    # The devices the arrays are aligned with when they were asked as int indices (sorted,
    # unique); None: the arrays cover all N devices.
    devices: np.ndarray | None = None

    def device_indices(self, mask: np.ndarray) -> np.ndarray:
        """The indices (increasing) of the devices where ``mask`` (one of the result's arrays,
        or a mask aligned with them) holds, whether the phase asked a mask or indices."""
        rows = np.flatnonzero(mask)
        return rows if self.devices is None else self.devices[rows]

    @property
    def delivered_devices(self) -> np.ndarray:
        """Indices of the devices whose upload reached the base station in time."""
        return self.device_indices(self.delivered)


@dataclass
class BroadcastResult:
    """What a downlink transmission reached."""

    # [N] bool: devices that decoded it (aligned with ``devices`` when given); for a broadcast
    # that every one of ``num_devices`` devices decoded, None until read (``received``), so
    # a caller that reads ``lost_devices`` only pays nothing per device.
    received_mask: np.ndarray | None
    airtime_s: float  # [s] the base station was on air
    devices: np.ndarray | None = None  # as CollectResult's (receivers asked as int indices)
    # Intended receivers (with energy) that did not decode it, as device indices: what a caller
    # updates in O(lost) instead of reading ``received`` over every device.
    lost_devices: np.ndarray = field(default_factory=lambda: _NO_DEVICES)
    num_devices: int = 0

    @property
    def received(self) -> np.ndarray:
        if self.received_mask is None:
            self.received_mask = np.ones(self.num_devices, dtype=bool)
        return self.received_mask


@dataclass
class SuperposedResult:
    """What the base station receives from one analog phase: the sum over the transmitting
    devices of each one's values as the channel weighted them, plus the receiver's noise
    (``received`` [k]); who took part (``active``: asked, with energy) and who of them
    transmitted (``transmitted``: not silenced by truncation, scheduling or the deadline;
    each device signals it [D]), aligned with ``devices`` when asked by index; when each
    finished [s]. Never a device's own values."""

    received: torch.Tensor
    active: np.ndarray
    finish_s: np.ndarray
    devices: np.ndarray | None = None
    transmitted: np.ndarray | None = None

    @property
    def count(self) -> int:
        """K, the number of devices whose values are in the sum."""
        return int(np.count_nonzero(self.transmitted))


# A SimPy process step: what ``yield from`` on a port method gives back at its end.
Phase = Generator[Any, Any, Any]


@runtime_checkable
class Air(Protocol):
    """The cell as the base station's process uses it: downlinks and packet uplinks, each a
    generator of SimPy events (``yield from``) returning its result."""

    @property
    def alive(self) -> np.ndarray:
        """[N] bool: devices whose battery has not run out (the others take no part)."""

    def collect(self, cost: Cost, payload: Payload,
                active: np.ndarray | None = None) -> Phase:
        """Each asked device (an [N] mask or int indices; None: all) computes ``cost``, then
        uploads ``payload`` as its own packet; returns a ``CollectResult``."""

    def broadcast(self, payload: Payload, receivers: np.ndarray | None = None,
                  mode: str | None = None) -> Phase:
        """The base station sends ``payload`` to ``receivers`` (default every device); returns
        a ``BroadcastResult``."""

    def unicast(self, payload: Payload, receivers: np.ndarray) -> Phase:
        """A packet of ``payload``'s size to each receiver, meant for it alone; returns a
        ``BroadcastResult``."""


@runtime_checkable
class SuperposingAir(Air, Protocol):
    """A cell whose uplink can also superpose: the second way of crossing the air (module
    docstring; engine/network.py implements it in both engines); ``Algorithm.air`` says who
    needs it."""

    def superpose(self, cost: Cost, payload: Payload, values: torch.Tensor,
                  active: np.ndarray | None = None,
                  power_control: PowerControl = "truncated-inversion") -> Phase:
        """Each asked device computes ``cost``, then all transmit their ``values`` [n, k] (rows
        aligned with the asked devices, increasing) at once as ``payload``'s analog symbols,
        setting their power by ``power_control`` (channel/analog.py); returns a
        ``SuperposedResult``."""


class HealthLog(Protocol):
    """Where an algorithm reports what shows its run left its valid regime (the health columns
    of rounds.parquet: quantised and clipped values, rounds in which nothing arrived)."""

    def quantized(self, direction: str, values: int, clipped: int = 0) -> None: ...

    def collected(self, active: np.ndarray, delivered: np.ndarray) -> None: ...

    def begin_round(self) -> None: ...

    def end_round(self) -> None: ...


class RunPort(Protocol):
    """Everything an algorithm may ask of its run (``Algorithm.ctx``): the air, its problem,
    the run's seed and random-stream mode, where it reports health, and the round hooks."""

    net: Air  # the cell: collect, broadcast, unicast (and superpose where implemented)
    evaluator: Problem  # the learning problem (contract/problem.py)
    theta0: torch.Tensor  # the initial model [d]
    seed: int
    # True: random draws keyed per (round, device), a round draws for the devices it asks only;
    # False: one stream per round over all devices.
    per_device_streams: bool
    health: HealthLog
    # Local iterations so far (an algorithm adds each round's count).
    local_steps: float
    # Called with the rounds completed after each round (checkpointing); None: no checkpoints.
    on_checkpoint: Callable[[int], None] | None

    @property
    def num_devices(self) -> int: ...

    def check_finite(self, values: torch.Tensor, direction: str, round_index: int,
                     sent: torch.Tensor | None = None) -> None:
        """Stop the run as diverged when values about to be sent hold a NaN or an infinity."""

    def end_round(self, completed: int, theta: torch.Tensor,
                  objective: Callable[[torch.Tensor], float] | None = None) -> None:
        """After ``completed`` rounds: evaluate ``theta`` when due (and ``objective`` of it, the
        rounds table's "objective", when given), record, apply stop rules."""
