"""The base station's view of the cell: broadcast, collect (compute then upload), in simulated time.

Two engines give the same seconds, joules and deliveries (a test checks it):

* ``VectorNetwork`` computes a synchronous phase for all devices with numpy and advances the clock
  once, to the last device's finish time (the fast default);
* ``ProcessNetwork`` runs every device as its own SimPy process that waits, computes and uploads,
  the literal discrete-event reading of the same phase (kept as the reference, and as the base for
  models with contention between devices).

Per-device physics (compute time and energy, fading, airtime, delivery) comes from one function,
``_plan_collect``, so the two engines differ only in how simulated time is advanced.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from wirelessfl.algorithms.types import Cost, Payload
from wirelessfl.energy.radio import radio_energy_j
from wirelessfl.engine.ledger import Ledger


@dataclass
class CollectResult:
    """What the base station learns from a collect phase."""

    delivered: np.ndarray  # [N] bool: packet decoded at the base station
    finish_s: np.ndarray  # [N] absolute simulated time the device finished [s] (start if inactive)
    active: np.ndarray  # [N] bool: devices that took part


@dataclass
class _Plan:
    forward_energy_j: np.ndarray
    backward_energy_j: np.ndarray
    forward_time_s: np.ndarray
    backward_time_s: np.ndarray
    airtime_s: np.ndarray
    uplink_energy_j: np.ndarray
    delivered: np.ndarray
    attempts: np.ndarray


class Network:
    """Shared state and physics of both engines; subclasses advance the clock."""

    def __init__(self, env: simpy.Environment, ledger: Ledger, uplink, downlink, compute,
                 rx_power_w: float, rng: np.random.Generator):
        self.env = env
        self.ledger = ledger
        self.uplink = uplink
        self.downlink = downlink
        self.compute = compute
        self.rx_power_w = float(rx_power_w)
        self.rng = rng
        self.num_devices = ledger.num_devices
        self._all = np.ones(self.num_devices, dtype=bool)

    def _active(self, active: np.ndarray | None) -> np.ndarray:
        return self._all if active is None else np.asarray(active, dtype=bool)

    def _plan_collect(self, cost: Cost, payload: Payload, active: np.ndarray) -> _Plan:
        """Per-device compute and uplink outcome of one phase (the same for both engines)."""
        on = active.astype(float)
        fwd, bwd = cost.per_device(self.num_devices)
        fwd, bwd = fwd * on, bwd * on
        b = cost.batch_size
        outcome = self.uplink.transmit(payload.bits, active, self.rng)
        return _Plan(
            forward_energy_j=fwd * self.compute.forward_energy_j(b),
            backward_energy_j=bwd * self.compute.backward_energy_j(b),
            forward_time_s=fwd * self.compute.forward_time_s(b),
            backward_time_s=bwd * self.compute.backward_time_s(b),
            airtime_s=outcome.airtime_s,
            uplink_energy_j=radio_energy_j(self.uplink.tx_power_w, outcome.airtime_s),
            delivered=outcome.delivered & active,
            attempts=outcome.attempts,
        )

    def _record_compute(self, plan: _Plan, devices) -> None:
        self.ledger.charge("compute_forward", plan.forward_energy_j[devices],
                           plan.forward_time_s[devices], devices)
        self.ledger.charge("compute_backward", plan.backward_energy_j[devices],
                           plan.backward_time_s[devices], devices)

    def _record_uplink(self, plan: _Plan, bits: int, active, devices) -> None:
        led = self.ledger
        led.charge("uplink", plan.uplink_energy_j[devices], plan.airtime_s[devices], devices)
        led.bits_up[devices] += bits * plan.attempts[devices]
        led.packets_sent[devices] += active[devices]
        led.packets_delivered[devices] += plan.delivered[devices]

    def _broadcast_cost(self, payload: Payload) -> tuple[float, float]:
        airtime = float(self.downlink.broadcast(payload.bits))
        return airtime, float(radio_energy_j(self.rx_power_w, airtime))

    def _record_downlink(self, payload: Payload, airtime: float, energy: float, devices) -> None:
        self.ledger.charge("downlink", energy, airtime, devices)
        self.ledger.bits_down[devices] += payload.bits


class VectorNetwork(Network):
    """A synchronous phase computed for all devices at once; one clock advance per phase."""

    def collect(self, cost: Cost, payload: Payload, active: np.ndarray | None = None):
        """Every active device computes ``cost`` then uploads ``payload``; waits for the last."""
        active = self._active(active)
        start = self.env.now
        plan = self._plan_collect(cost, payload, active)
        everyone = slice(None)
        self._record_compute(plan, everyone)
        self._record_uplink(plan, payload.bits, active, everyone)
        # Same float operations, in the same order, as a device process: (start + compute) + air.
        finish = (start + (plan.forward_time_s + plan.backward_time_s)) + plan.airtime_s
        finish = np.where(active, finish, start)
        end = float(finish.max()) if finish.size else start
        if end > start:
            yield self.env.timeout(end - start)
        return CollectResult(delivered=plan.delivered, finish_s=finish, active=active)

    def broadcast(self, payload: Payload):
        """The base station broadcasts ``payload``; every device receives it (reliable downlink)."""
        airtime, energy = self._broadcast_cost(payload)
        self._record_downlink(payload, airtime, energy, slice(None))
        if airtime > 0:
            yield self.env.timeout(airtime)


class ProcessNetwork(Network):
    """Every device is a SimPy process fed by the base station through its own inbox."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._inbox = [simpy.Store(self.env) for _ in range(self.num_devices)]
        for i in range(self.num_devices):
            self.env.process(self._device(i))

    def _device(self, i: int):
        """A device's life: wait for an order, carry it out in simulated time, report back."""
        while True:
            kind, args, done = yield self._inbox[i].get()
            if kind == "collect":
                plan, bits, active = args
                yield self.env.timeout(plan.forward_time_s[i] + plan.backward_time_s[i])
                self._record_compute(plan, i)
                yield self.env.timeout(plan.airtime_s[i])
                self._record_uplink(plan, bits, active, i)
            else:  # "receive"
                payload, airtime, energy = args
                yield self.env.timeout(airtime)
                self._record_downlink(payload, airtime, energy, i)
            done.succeed(self.env.now)

    def _order(self, i: int, kind: str, args) -> simpy.Event:
        done = self.env.event()
        self._inbox[i].put((kind, args, done))
        return done

    def collect(self, cost: Cost, payload: Payload, active: np.ndarray | None = None):
        active = self._active(active)
        start = self.env.now
        plan = self._plan_collect(cost, payload, active)
        finish = np.full(self.num_devices, start, dtype=float)
        events = {i: self._order(i, "collect", (plan, payload.bits, active))
                  for i in np.flatnonzero(active)}
        if events:
            yield simpy.AllOf(self.env, list(events.values()))
        for i, event in events.items():
            finish[i] = event.value
        return CollectResult(delivered=plan.delivered, finish_s=finish, active=active)

    def broadcast(self, payload: Payload):
        airtime, energy = self._broadcast_cost(payload)
        events = [self._order(i, "receive", (payload, airtime, energy))
                  for i in range(self.num_devices)]
        yield simpy.AllOf(self.env, events)


ENGINES = {"vectorized": VectorNetwork, "processes": ProcessNetwork}
