"""The base station's view of the cell: broadcast, collect (compute then upload), in simulated time.

Two engines give the same seconds, joules and deliveries (a test checks it):

* ``VectorNetwork`` computes a synchronous phase for all devices with numpy and advances the clock
  once, to the last device's finish time (the fast default);
* ``ProcessNetwork`` runs every device as its own SimPy process that waits, computes and uploads,
  the literal discrete-event reading of the same phase (kept as the reference, and as the base for
  models with contention between devices).

Per-device physics (compute time and energy, fading, airtime, delivery) comes from one function,
``_plan_collect``, so the two engines differ only in how simulated time is advanced.

Every phase ends by charging idle time (``_close_phase``): for each device that still has energy,
the phase's duration minus the time it computed, sent or received, at its idle power, so per
device busy + idle time equals the simulated time it was alive. A device whose cumulative energy
reaches its battery budget completes the phase it is in (its last phase may overshoot the
budget), is marked depleted at the phase's end, and from then on neither computes, sends,
listens nor idles: it is left out of every collect and broadcast.

Every downlink transmission also charges the base station (``Ledger.charge_base_station``): its
draw (the downlink's transmit + circuit power) x the time it is on air, a broadcast's airtime or
the sum of a unicast's packets. Uplink ARQ retries carry no acknowledgement or request in the
model, so the base station spends nothing on them. ``broadcast`` follows the profile's
``downlink.mode``; ``unicast`` is for content that differs per device (one packet each, whatever
the mode): each receiver listens to its own packet only.

``accounting`` picks how many forward passes a ``Cost`` is priced at (time and energy):
``physical`` every pass the algorithm makes, ``paper`` seed 002's count (``Cost.priced_passes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy

from wirelessfl.algorithms.types import Cost, Payload
from wirelessfl.energy.device import DevicePower
from wirelessfl.energy.radio import radio_energy_j
from wirelessfl.engine.ledger import Ledger
from wirelessfl.engine.spectrum import (
    PF_TIME_CONSTANT_PHASES,
    SharedSpectrum,
    schedule_uploads,
    scheduler_priorities,
)


@dataclass
class CollectResult:
    """What the base station learns from a collect phase."""

    delivered: np.ndarray  # [N] bool: packet decoded at the base station in time
    finish_s: np.ndarray  # [N] absolute simulated time the device finished [s] (start if inactive)
    active: np.ndarray  # [N] bool: devices that took part
    late: np.ndarray  # [N] bool: uploads cut off by the deadline (stragglers)


@dataclass
class BroadcastResult:
    """What a downlink transmission reached."""

    received: np.ndarray  # [N] bool: devices that decoded it
    airtime_s: float  # [s] the base station was on air


@dataclass
class _Plan:
    forward_energy_j: np.ndarray
    backward_energy_j: np.ndarray
    forward_time_s: np.ndarray  # [N] time computing [s], both parts cut at the deadline
    backward_time_s: np.ndarray
    backward_passes: np.ndarray  # [N] backward passes (gradient evaluations) of active devices
    hvp_passes: np.ndarray  # [N] Hessian-vector products of active devices
    ready_s: np.ndarray  # absolute time the packet is ready [s]
    hold_s: np.ndarray  # airtime the upload needs, all ARQ attempts [s]
    upload_start_s: np.ndarray  # absolute start of the upload [s] (after any queueing)
    priority: np.ndarray | None  # [N, 2] scheduler keys (shared spectrum only)
    cutoff_s: float  # absolute deadline of the phase [s] (inf without one)
    airtime_s: np.ndarray  # time actually on air [s] (cut at the deadline)
    uplink_energy_j: np.ndarray
    delivered: np.ndarray
    late: np.ndarray
    attempts: np.ndarray  # transmissions made (those started before the deadline)

    @property
    def busy_s(self) -> np.ndarray:
        """[N] time each device computed or was on air in this phase [s]."""
        return self.forward_time_s + self.backward_time_s + self.airtime_s


class Network:
    """Shared state and physics of both engines; subclasses advance the clock."""

    def __init__(self, env: simpy.Environment, ledger: Ledger, uplink, downlink, compute,
                 power: DevicePower | float, rng: np.random.Generator,
                 downlink_rng: np.random.Generator | None = None,
                 accounting: str = "physical"):
        """``power``: every device's draws and budget (``DevicePower``), or a receive power [W]
        alone for devices that draw the channel's transmit + circuit power while sending and
        nothing while idle, with no battery limit. ``accounting``: ``physical`` or ``paper``
        (the scenario's ``energy_accounting``)."""
        self.env = env
        self.ledger = ledger
        self.uplink = uplink
        self.downlink = downlink
        self.compute = compute
        n = ledger.num_devices
        if not isinstance(power, DevicePower):
            power = DevicePower(
                tx_draw_w=np.full(n, uplink.tx_power_w + uplink.circuit_power_w),
                rx_power_w=np.full(n, float(power)), idle_power_w=np.zeros(n),
                battery_j=np.full(n, np.inf))
        self.power = power
        self._batteries = power.has_batteries
        self._idle_draw = bool(np.any(power.idle_power_w))
        self.clock_s = float(env.now)  # every device's time is accounted for up to here [s]
        self.rng = rng
        self.downlink_rng = downlink_rng
        # The links' fading processes exist from the start (building one draws nothing), so a
        # run's state is in objects that are there when it starts: what a checkpoint restores
        # into (engine/checkpoint.py).
        uplink.fading_for(rng)
        if downlink_rng is not None:
            downlink.fading_for(downlink_rng)
        self.num_devices = ledger.num_devices
        self._all = np.ones(self.num_devices, dtype=bool)
        up = uplink.config.uplink
        self.deadline_s = up.deadline_s
        self.shared = up.spectrum.mode == "shared"
        self.channels = int(up.spectrum.channels or 1)
        self.scheduler = up.spectrum.scheduler or "round-robin"
        self.phase = 0  # upload phases so far: rotates the round-robin order
        self.pf_average_bps: np.ndarray | None = None  # proportional-fair served-rate average
        self.accounting = accounting

    @property
    def alive(self) -> np.ndarray:
        """[N] bool: devices whose battery has not run out."""
        return self.ledger.alive if self._batteries else self._all

    def _active(self, active: np.ndarray | None) -> np.ndarray:
        """The devices asked (default: all) that still have energy."""
        asked = self._all if active is None else np.asarray(active, dtype=bool)
        return asked & self.ledger.alive if self._batteries else asked

    def _charge_idle(self, idle_s: np.ndarray) -> None:
        self.ledger.charge("idle", self.power.idle_power_w * idle_s if self._idle_draw else 0.0,
                           idle_s)

    def settle(self) -> None:
        """Charge idle time for any simulated time that passed outside a phase (the base
        station's own work, say) to every device that still has energy."""
        now = float(self.env.now)
        if now > self.clock_s:
            self._charge_idle(np.where(self.alive, now - self.clock_s, 0.0))
            self.clock_s = now
            self._deplete()

    def _close_phase(self, start: float, busy_s: np.ndarray, alive: np.ndarray) -> None:
        """End of a phase that began at ``start``: devices alive then were idle for the phase's
        duration minus their busy time [s]; then mark batteries that ran out."""
        now = float(self.env.now)
        idle = np.maximum((now - start) - busy_s, 0.0)
        if self._batteries:
            idle = np.where(alive, idle, 0.0)
        self._charge_idle(idle)
        self.clock_s = now
        self._deplete()

    def _deplete(self) -> None:
        """Devices whose cumulative energy reached their budget stop, as of now."""
        if not self._batteries:
            return
        led = self.ledger
        out = led.alive & (led.energy_j.sum(axis=1) >= self.power.battery_j)
        led.depleted_at_s[out] = float(self.env.now)

    def _priorities(self, rate_bps: np.ndarray, active: np.ndarray) -> np.ndarray:
        """This phase's scheduler keys; updates the proportional-fair average afterwards."""
        if self.pf_average_bps is None:
            self.pf_average_bps = np.asarray(rate_bps, float).copy()
        keys = scheduler_priorities(self.scheduler, self.phase, rate_bps, self.pf_average_bps)
        beta = 1.0 / PF_TIME_CONSTANT_PHASES
        served = np.where(active, rate_bps, 0.0)
        self.pf_average_bps = (1 - beta) * self.pf_average_bps + beta * served
        return keys

    def _plan_collect(self, cost: Cost, payload: Payload, active: np.ndarray) -> _Plan:
        """Per-device compute, queueing and uplink outcome of one phase (the same for both
        engines): fading is drawn at each device's ready time, the deadline cuts late uploads."""
        start = self.env.now
        on = active.astype(float)
        fwd, bwd = cost.priced_passes(self.num_devices, self.accounting)
        fwd, bwd = fwd * on, bwd * on
        gradients = cost.per_device(self.num_devices)[1] * on
        hvps = cost.hvp_per_device(self.num_devices) * on
        e_fwd, e_bwd, t_fwd, t_bwd = self.compute.device_prices(cost.batch_size, self.num_devices)
        forward_time, backward_time = fwd * t_fwd, bwd * t_bwd
        forward_energy, backward_energy = fwd * e_fwd, bwd * e_bwd
        compute_time = forward_time + backward_time
        ready = start + compute_time
        outcome = self.uplink.transmit(payload.bits, active, self.rng, now_s=ready)
        hold = outcome.airtime_s
        priority = None
        upload_start = ready
        if self.shared:
            priority = self._priorities(outcome.rate_bps, active)
            upload_start = schedule_uploads(ready, hold, priority, self.channels, active)
        self.phase += 1
        self.ledger.exchanges += 1
        cutoff = start + self.deadline_s if self.deadline_s is not None else math.inf
        cut = active & (ready > cutoff)
        if cut.any():  # still computing at the deadline: stops there, pays for what it did
            share = np.where(cut, (cutoff - start) / np.where(cut, compute_time, 1.0), 1.0)
            forward_time, backward_time = forward_time * share, backward_time * share
            forward_energy, backward_energy = forward_energy * share, backward_energy * share
        late = active & (upload_start + hold > cutoff)
        air = np.where(late, np.clip(cutoff - upload_start, 0.0, None), hold)
        attempts = outcome.attempts
        if late.any():  # attempts begun before the cut (attempts are equally long but adaptive)
            per_attempt = np.maximum(outcome.attempt_airtime_s, 1e-300)
            attempts = np.where(late, np.minimum(attempts, np.ceil(air / per_attempt)),
                                attempts).astype(np.int64)
        return _Plan(
            forward_energy_j=forward_energy,
            backward_energy_j=backward_energy,
            forward_time_s=forward_time,
            backward_time_s=backward_time,
            backward_passes=gradients,
            hvp_passes=hvps,
            ready_s=ready,
            hold_s=hold,
            upload_start_s=upload_start,
            priority=priority,
            cutoff_s=cutoff,
            airtime_s=air,
            uplink_energy_j=radio_energy_j(self.power.tx_draw_w, air),
            delivered=outcome.delivered & active & ~late,
            late=late,
            attempts=attempts,
        )

    def _record_compute(self, plan: _Plan, devices) -> None:
        self.ledger.charge("compute_forward", plan.forward_energy_j[devices],
                           plan.forward_time_s[devices], devices)
        self.ledger.charge("compute_backward", plan.backward_energy_j[devices],
                           plan.backward_time_s[devices], devices)
        self.ledger.backward_passes[devices] += plan.backward_passes[devices]
        self.ledger.hvp_passes[devices] += plan.hvp_passes[devices]

    def _record_uplink(self, plan: _Plan, bits: int, active, devices) -> None:
        led = self.ledger
        led.charge("uplink", plan.uplink_energy_j[devices], plan.airtime_s[devices], devices)
        led.bits_up[devices] += bits * plan.attempts[devices]
        led.transmissions[devices] += plan.attempts[devices]
        led.packets_sent[devices] += active[devices]
        led.packets_delivered[devices] += plan.delivered[devices]
        led.late_uploads[devices] += plan.late[devices]
        led.queue_wait_s[devices] += np.where(active[devices], plan.upload_start_s[devices]
                                              - plan.ready_s[devices], 0.0)

    def unicast(self, payload: Payload, receivers: np.ndarray):
        """The base station sends each device in ``receivers`` a packet of ``payload``'s size
        meant for it alone, at its own rate, one after another, whatever ``downlink.mode``: the
        downlink of content that differs per device (ZO-HFL's direction v_i)."""
        return (yield from self.broadcast(payload, receivers, mode="unicast"))

    def _begin_broadcast(self, payload: Payload, receivers: np.ndarray | None,
                         mode: str | None = None):
        """(alive, receivers, start, outcome) of a downlink phase starting now: who is on air
        how long and who decodes it (both engines); ``mode`` as ``Downlink.transmit``'s."""
        self.settle()
        alive = self.alive
        receivers = self._active(receivers)
        out = self.downlink.transmit(payload.bits, receivers, rng=self.downlink_rng,
                                     now_s=self.env.now, mode=mode)
        self.ledger.charge_base_station(self.downlink.draw_w, out.airtime_s)
        return alive, receivers, self.env.now, out

    def _record_downlink(self, payload: Payload, out, receivers, devices) -> None:
        listen = out.per_device_airtime_s[devices]
        self.ledger.charge("downlink", radio_energy_j(self.power.rx_power_w[devices], listen),
                           listen, devices)
        self.ledger.bits_down[devices] += payload.bits * receivers[devices]
        self.ledger.broadcasts_missed[devices] += receivers[devices] & ~out.received[devices]


class VectorNetwork(Network):
    """A synchronous phase computed for all devices at once; one clock advance per phase."""

    def collect(self, cost: Cost, payload: Payload, active: np.ndarray | None = None):
        """Every active device computes ``cost`` then uploads ``payload``; waits for the last
        (or for the deadline)."""
        self.settle()
        alive = self.alive
        active = self._active(active)
        start = self.env.now
        plan = self._plan_collect(cost, payload, active)
        everyone = slice(None)
        self._record_compute(plan, everyone)
        self._record_uplink(plan, payload.bits, active, everyone)
        # Same float operations, in the same order, as a device process: start + compute, then
        # the upload's start (after queueing) + its airtime, or the deadline.
        finish = np.where(plan.late, plan.cutoff_s, plan.upload_start_s + plan.hold_s)
        finish = np.where(active, finish, start)
        end = float(finish.max()) if finish.size else start
        if end > start:
            yield self.env.timeout(end - start)
        self._close_phase(start, plan.busy_s, alive)
        return CollectResult(delivered=plan.delivered, finish_s=finish, active=active,
                             late=plan.late)

    def broadcast(self, payload: Payload, receivers: np.ndarray | None = None,
                  mode: str | None = None):
        """The base station sends ``payload`` to ``receivers`` (default: every device), as
        ``mode`` (default: the profile's ``downlink.mode``)."""
        alive, receivers, start, out = self._begin_broadcast(payload, receivers, mode)
        self._record_downlink(payload, out, receivers, slice(None))
        if out.airtime_s > 0:
            yield self.env.timeout(out.airtime_s)
        self._close_phase(start, out.per_device_airtime_s, alive)
        return BroadcastResult(received=out.received, airtime_s=out.airtime_s)


class ProcessNetwork(Network):
    """Every device is a SimPy process fed by the base station through its own inbox; a shared
    uplink pool is a SimPy component the devices queue on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool = SharedSpectrum(self.env, self.channels) if self.shared else None
        self._inbox = [simpy.Store(self.env) for _ in range(self.num_devices)]
        for i in range(self.num_devices):
            self.env.process(self._device(i))

    def _device(self, i: int):
        """A device's life: wait for an order, carry it out in simulated time, report back."""
        while True:
            kind, args, done = yield self._inbox[i].get()
            if kind == "collect":
                yield from self._upload(i, *args)
            else:  # "receive": wait for this device's packet, listen to it
                payload, out, receivers, offset = args
                if offset > 0:
                    yield self.env.timeout(offset)
                yield self.env.timeout(out.per_device_airtime_s[i])
                self._record_downlink(payload, out, receivers, i)
            done.succeed(self.env.now)

    def _upload(self, i: int, plan: _Plan, bits: int, active):
        env = self.env
        yield env.timeout(min(plan.forward_time_s[i] + plan.backward_time_s[i],
                              plan.cutoff_s - env.now))
        self._record_compute(plan, i)
        granted = None
        if self.pool is not None:
            granted = self.pool.request(i, plan.priority[i])
            if plan.cutoff_s < math.inf:
                yield granted | env.timeout(max(plan.cutoff_s - env.now, 0.0))
            else:
                yield granted
        if granted is None or granted.triggered:
            on_air = plan.hold_s[i]
            if plan.late[i]:
                on_air = max(plan.cutoff_s - env.now, 0.0)
            yield env.timeout(on_air)
            if granted is not None:
                self.pool.release()
        else:  # still queued at the deadline: give up the request
            self.pool.withdraw(granted)
        self._record_uplink(plan, bits, active, i)

    def _order(self, i: int, kind: str, args) -> simpy.Event:
        done = self.env.event()
        self._inbox[i].put((kind, args, done))
        return done

    def collect(self, cost: Cost, payload: Payload, active: np.ndarray | None = None):
        self.settle()
        alive = self.alive
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
        self._close_phase(start, plan.busy_s, alive)
        return CollectResult(delivered=plan.delivered, finish_s=finish, active=active,
                             late=plan.late)

    def broadcast(self, payload: Payload, receivers: np.ndarray | None = None,
                  mode: str | None = None):
        alive, receivers, start, out = self._begin_broadcast(payload, receivers, mode)
        # Unicast packets go out back to back in device order; a broadcast reaches all at once.
        unicast = (mode or self.downlink.config.downlink.mode) == "unicast"
        offsets = np.cumsum(out.per_device_airtime_s) - out.per_device_airtime_s
        events = [self._order(i, "receive", (payload, out, receivers,
                                             float(offsets[i]) if unicast else 0.0))
                  for i in np.flatnonzero(receivers)]
        if out.airtime_s > 0:
            events.append(self.env.timeout(out.airtime_s))
        if events:
            yield simpy.AllOf(self.env, events)
        self._close_phase(start, out.per_device_airtime_s, alive)
        return BroadcastResult(received=out.received, airtime_s=out.airtime_s)


ENGINES = {"vectorized": VectorNetwork, "processes": ProcessNetwork}
