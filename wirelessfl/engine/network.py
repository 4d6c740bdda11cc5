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

Random streams (``population.random_streams``, docs/architecture.md "Cross-device populations"):

* shared (``per_device`` False; every population up to 1,000 devices by default): a phase draws
  the channel of all N devices from the run's generators and computes every array over N, as
  every run recorded before cross-device populations did (their numbers are unchanged);
* per-device (cross-device populations): a phase works on the devices it involves only. The
  asked devices' compute, fading, erasures and ARQ are drawn per (phase, device) (channel/link.py
  ``transmit_devices``), the scheduler's keys and proportional-fair averages are those devices'
  (a device's average decays lazily over the phases it sat out, (1 - beta)^gap, and starts at its
  mean-SNR rate [D]), the ledger is charged at their rows. What every device receives alike is
  charged lazily, without a pass over the population per phase: idle time is the closed form
  alive time - busy time (``Ledger.settle_idle``; the eager per-phase sums equal it up to float
  rounding), and a model broadcast to every device (``receivers`` None) is one pending entry
  written into every row when the accounts are read (``settle``, at each evaluation and at the
  run's end). Its reception: without ``downlink.loss`` every device decodes it, so nothing is
  drawn; with loss, or with batteries (where who is alive decides who listens and who depletes
  when), a phase is computed over the population as in shared mode, with the keyed draws (the
  resync that follows a lossy broadcast is sent at the rate of the weakest device that missed
  it, so the cell's state, not only the asked devices', sets its airtime). Collect and broadcast
  accept the asked devices as int indices (in both modes); results then come back aligned with
  them (``devices``, sorted), a ``Cost`` may give its per-device arrays for them alone, and a
  broadcast names the receivers that lost it (``lost_devices``), so a round's engine cost is
  O(participants).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import simpy
import torch

from wirelessfl.channel.analog import AnalogUplink
from wirelessfl.channel.link import DOWNLINK_FADING_STREAM, UPLINK_FADING_STREAM
from wirelessfl.contract.payload import Cost, Payload
from wirelessfl.contract.port import (
    BroadcastResult,
    CollectResult,
    PowerControl,
    SuperposedResult,
)
from wirelessfl.energy.device import DevicePower
from wirelessfl.energy.radio import radio_energy_j
from wirelessfl.engine.ledger import Ledger
from wirelessfl.engine.spectrum import (
    PF_TIME_CONSTANT_PHASES,
    SharedSpectrum,
    schedule_uploads,
    scheduler_priorities,
)
from wirelessfl.learning.seeds import keyed_rng

_NO_DEVICES = np.zeros(0, dtype=np.int64)
# The receiver noise of analog phases under per-device streams: keyed per (seed, phase).
ANALOG_NOISE_STREAM = "uplink-analog-noise"


@dataclass
class _Work:
    """The asked devices' compute in a phase (arrays aligned with them; zero without energy):
    what ``_record_compute`` charges, for a packet phase (``_Plan``) or an analog one."""

    forward_energy_j: np.ndarray
    backward_energy_j: np.ndarray
    forward_time_s: np.ndarray
    backward_time_s: np.ndarray
    backward_passes: np.ndarray  # backward passes (gradient evaluations)
    hvp_passes: np.ndarray  # Hessian-vector products

    def cut_at(self, share: np.ndarray) -> None:
        """Scale each device's compute times and energies by ``share`` (1 for a device the
        deadline did not cut): it stopped computing there and pays for what it did."""
        for name in ("forward_time_s", "backward_time_s", "forward_energy_j",
                     "backward_energy_j"):
            setattr(self, name, getattr(self, name) * share)


@dataclass
class _Plan(_Work):
    """A packet phase's work and uplink outcome per device."""

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


@dataclass
class _Asked:
    """The devices a phase involves. Shared streams: ``devices`` is slice(None) and the arrays
    cover all N; per-device streams: the sorted device indices the arrays are aligned with."""

    devices: slice | np.ndarray
    active: np.ndarray  # bool, aligned with ``devices``: asked and with energy
    given: np.ndarray | None = None  # the indices the caller asked (results aligned with them)


@dataclass
class _Sent:
    """A downlink transmission under way."""

    alive: np.ndarray | None  # [N] alive at its start (idle charging; None: charged lazily)
    asked: _Asked | None  # its receivers (None: every device, charged lazily)
    start: float
    out: object | None  # the DownlinkOutcome (None with asked)
    airtime_s: float

    def devices_at(self, rows) -> np.ndarray:
        """The device indices of ``rows`` (of the arrays aligned with the receivers)."""
        devices = self.asked.devices
        return np.arange(len(self.asked.active))[rows] if isinstance(devices, slice) \
            else devices[rows]


# Rows of an analog phase's values summed at once in float64 [D]: a fixed block, so the sum's
# order (and its last bits) never depends on how many devices transmit.
SUM_BLOCK_ROWS = 256


def _weighted_sum(values: torch.Tensor, weights: np.ndarray, sending: np.ndarray
                  ) -> tuple[torch.Tensor, float]:
    """(sum_i w_i x_i in float64 [k], the largest root mean square of a transmitting row, 0 when
    none transmits) of ``values`` [n, k], block by block: the float64 copies an analog phase
    makes stay SUM_BLOCK_ROWS rows whatever n."""
    total = torch.zeros(values.shape[1], dtype=torch.float64, device=values.device)
    amplitude = 0.0
    for start in range(0, values.shape[0], SUM_BLOCK_ROWS):
        block = values[start:start + SUM_BLOCK_ROWS].to(torch.float64)
        w = torch.as_tensor(weights[start:start + SUM_BLOCK_ROWS], dtype=torch.float64,
                            device=values.device)
        total += (block * w[:, None]).sum(0)
        on = torch.as_tensor(np.flatnonzero(sending[start:start + SUM_BLOCK_ROWS]),
                             device=values.device)
        if len(on):
            amplitude = max(amplitude, float(block[on].square().mean(1).sqrt().max()))
    return total.cpu(), amplitude


def _cost_for(cost: Cost, asked: _Asked, num_devices: int) -> Cost:
    """``cost`` with its per-device arrays aligned with the phase's arrays. An array is either
    [N] (one value per registered device) or, when the devices were asked by index, one value
    per asked device in the order of ``result.devices`` (sorted); per-device streams take the
    asked devices' values, shared streams spread the asked devices' values over N."""
    if asked.given is None and isinstance(asked.devices, slice):
        return cost
    n = len(asked.given) if asked.given is not None else len(asked.devices)

    def aligned(name, value):
        if value is None or np.ndim(value) == 0:
            return value
        value = np.asarray(value)
        if len(value) == num_devices:
            return value if isinstance(asked.devices, slice) else value[asked.devices]
        if len(value) != n or asked.given is None:
            raise ValueError(f"Cost.{name} has {len(value)} values: give one per registered "
                             f"device ({num_devices}) or one per asked device ({n})")
        if not isinstance(asked.devices, slice):
            return value
        # devices not asked take an asked one's value (they are inactive: priced at zero
        # passes), so no count is priced that the caller did not give (a batch of 0, say)
        spread = np.full(num_devices, value[0] if n else 0, dtype=value.dtype)
        spread[asked.given] = value
        return spread

    return dataclasses.replace(cost, **{f.name: aligned(f.name, getattr(cost, f.name))
                                        for f in dataclasses.fields(cost)})


class Network:
    """Shared state and physics of both engines; subclasses advance the clock."""

    # Rebuilt from the cell and the profile when an analog phase first needs it: not state a
    # checkpoint holds (pipeline/state_tree.py).
    derived_state = ("_analog_uplink",)

    def __init__(self, env: simpy.Environment, ledger: Ledger, uplink, downlink, compute,
                 power: DevicePower | float, rng: np.random.Generator,
                 downlink_rng: np.random.Generator | None = None,
                 accounting: str = "physical", per_device: bool = False, seed: int = 0):
        """``power``: every device's draws and budget (``DevicePower``), or a receive power [W]
        alone for devices that draw the channel's transmit + circuit power while sending and
        nothing while idle, with no battery limit. ``accounting``: ``physical`` or ``paper``
        (the scenario's ``energy_accounting``). ``per_device``: per-device random streams keyed
        by ``seed`` (``population.random_streams``; the generators are then not drawn from)."""
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
                battery_j=np.full(n, np.inf), pa_efficiency=np.ones(n),
                tx_fixed_w=np.full(n, uplink.circuit_power_w))
        self.power = power
        self._batteries = power.has_batteries
        self._idle_draw = bool(np.any(power.idle_power_w))
        self.clock_s = float(env.now)  # every device's time is accounted for up to here [s]
        self.origin_s = self.clock_s  # when the accounts began [s] (lazy idle counts from it)
        self.rng = rng
        self.downlink_rng = downlink_rng
        self.per_device = bool(per_device)
        self.seed = int(seed)
        # Per-device streams without batteries: idle time and broadcasts to every device are
        # charged lazily (module docstring); with batteries every phase is settled over N.
        self._lazy = self.per_device and not self._batteries
        # The links' fading processes exist from the start (building one draws nothing), so a
        # run's state is in objects that are there when it starts: what a checkpoint restores
        # into (pipeline/checkpoint.py).
        if self.per_device:
            uplink.keyed_fading(self.seed, UPLINK_FADING_STREAM)
            downlink.keyed_fading(self.seed, DOWNLINK_FADING_STREAM)
        else:
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
        self.downlink_phase = 0  # downlink transmissions so far (keys per-device downlink draws)
        self.pf_average_bps: np.ndarray | None = None  # proportional-fair served-rate average
        self.pf_phase: np.ndarray | None = None  # per-device streams: phase of each average
        self.accounting = accounting
        self._analog_uplink: AnalogUplink | None = None

    @property
    def alive(self) -> np.ndarray:
        """[N] bool: devices whose battery has not run out."""
        return self.ledger.alive if self._batteries else self._all

    def _active(self, active: np.ndarray | None) -> np.ndarray:
        """The devices asked (default: all) that still have energy."""
        asked = self._all if active is None else np.asarray(active, dtype=bool)
        return asked & self.ledger.alive if self._batteries else asked

    def _asked(self, asked) -> _Asked:
        """The devices a phase involves from what the caller asked: None (every device), an [N]
        bool mask, or int device indices (results then come back aligned with them)."""
        n = self.num_devices
        given = None
        values = None if asked is None else np.asarray(asked)
        if values is not None and values.dtype != bool:
            given = np.unique(values.astype(np.int64))
            if len(given) and (given[0] < 0 or given[-1] >= n):
                raise ValueError(f"device indices must lie in [0, {n}), got {given[0]} .. "
                                 f"{given[-1]}")
        elif values is not None and values.shape != (n,):
            raise ValueError(f"a device mask must have shape ({n},), got {values.shape}")
        if not self.per_device:
            if given is not None:
                values = np.zeros(n, dtype=bool)
                values[given] = True
            return _Asked(slice(None), self._active(values), given)
        if given is not None:
            devices = given
        else:
            devices = np.arange(n) if values is None else np.flatnonzero(values)
        active = (np.isnan(self.ledger.depleted_at_s[devices]) if self._batteries
                  else np.ones(len(devices), dtype=bool))
        return _Asked(devices, active, given)

    def _shape(self, asked: _Asked, values: np.ndarray, fill) -> np.ndarray:
        """A result array as the caller asked: aligned with its indices, or over all N."""
        if isinstance(asked.devices, slice):
            return values if asked.given is None else values[asked.given]
        if asked.given is not None:
            return values
        full = np.full(self.num_devices, fill, dtype=values.dtype)
        full[asked.devices] = values
        return full

    def _charge_idle(self, idle_s: np.ndarray) -> None:
        self.ledger.charge("idle", self.power.idle_power_w * idle_s if self._idle_draw else 0.0,
                           idle_s)

    def settle(self) -> None:
        """Bring every device's accounts up to now: charge idle time for any simulated time that
        passed outside a phase (the base station's own work, say) to every device that still has
        energy; with lazy charging (per-device streams), write what every device received and
        its idle time into the ledger (O(N): at evaluations and at the run's end)."""
        now = float(self.env.now)
        if self._lazy:
            self.clock_s = max(self.clock_s, now)
            self.ledger.settle_everyone(self.power.rx_power_w, self.downlink.unicast_airtimes_s)
            self.ledger.settle_idle(now, self.power.idle_power_w if self._idle_draw else None,
                                    self.origin_s)
            return
        if now > self.clock_s:
            self._charge_idle(np.where(self.alive, now - self.clock_s, 0.0))
            self.clock_s = now
            self._deplete()

    def close(self) -> None:
        """At a run's end, whatever ended it: lazily charged accounts written into the ledger
        (nothing to do where they are charged eagerly)."""
        if self._lazy:
            self.settle()

    def _catch_up(self) -> None:
        """Before a phase: idle time outside phases charged (eagerly, or lazily: nothing)."""
        if self._lazy:
            self.clock_s = float(self.env.now)
        else:
            self.settle()

    def _close_phase(self, start: float, busy_s: np.ndarray | None, alive: np.ndarray | None,
                     devices=slice(None)) -> None:
        """End of a phase that began at ``start``: devices alive then were idle for the phase's
        duration minus their busy time [s] (``busy_s`` aligned with ``devices``); then mark
        batteries that ran out. Lazy charging: nothing to do (idle is settled in closed form)."""
        now = float(self.env.now)
        if self._lazy:
            self.clock_s = now
            return
        span = now - start
        if isinstance(devices, slice):
            busy = busy_s
        else:  # per-device streams with batteries: the phase's busy rows, idle for the rest
            busy = np.zeros(self.num_devices)
            if busy_s is not None:
                busy[devices] = busy_s
        idle = np.maximum(span - busy, 0.0)
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

    def _priorities(self, rate_bps: np.ndarray, active: np.ndarray,
                    devices=slice(None)) -> np.ndarray:
        """This phase's scheduler keys; updates the proportional-fair average afterwards."""
        beta = 1.0 / PF_TIME_CONSTANT_PHASES
        if self.per_device:
            return self._device_priorities(rate_bps, active, devices, beta)
        if self.pf_average_bps is None:
            self.pf_average_bps = np.asarray(rate_bps, float).copy()
        keys = scheduler_priorities(self.scheduler, self.phase, rate_bps, self.pf_average_bps)
        served = np.where(active, rate_bps, 0.0)
        self.pf_average_bps = (1 - beta) * self.pf_average_bps + beta * served
        return keys

    def _device_priorities(self, rate_bps: np.ndarray, active: np.ndarray, devices: np.ndarray,
                           beta: float) -> np.ndarray:
        """Per-device streams: the keys of ``devices``; a device's proportional-fair average is
        brought forward over the phases since it was last updated ((1 - beta)^gap, what the
        shared engine's per-phase decay of a device that is not served gives) and starts at
        its rate at its mean SNR [D] (the shared engine starts every device at its faded
        first-phase rate, which for all but adaptive mode is the same number)."""
        n = self.num_devices
        if self.scheduler != "proportional-fair":
            return scheduler_priorities(self.scheduler, self.phase, rate_bps, rate_bps,
                                        devices, n)
        if self.pf_average_bps is None:
            self.pf_average_bps = np.full(n, np.nan)
            self.pf_phase = np.full(n, -1, dtype=np.int64)
        stored = self.pf_average_bps[devices]
        new = np.isnan(stored)
        if new.any():
            mean = self.uplink.cell.uplink_mean_snr[devices[new]]
            stored[new] = self.uplink.rate_at(mean, devices[new])
        average = stored * (1 - beta) ** (self.phase - 1 - self.pf_phase[devices])
        keys = scheduler_priorities(self.scheduler, self.phase, rate_bps, average, devices, n)
        served = np.where(active, rate_bps, 0.0)
        self.pf_average_bps[devices] = (1 - beta) * average + beta * served
        self.pf_phase[devices] = self.phase
        return keys

    def _prices(self, batch, devices) -> tuple:
        """(forward J, backward J, forward s, backward s) of one pass of each of ``devices``;
        ``batch``: one sample count or one per device (aligned with ``devices``)."""
        if not self.per_device:
            return self.compute.device_prices(batch, self.num_devices)
        n, sizes = self.num_devices, np.asarray(batch)

        def rows(price, which):  # one value where every device pays the same, else its rows
            price = np.asarray(price)
            return price if price.ndim == 0 else price[which]

        if sizes.ndim == 0:
            return tuple(rows(p, devices) for p in self.compute.device_prices(batch, n))
        out = np.zeros((4, len(devices)))
        for value in np.unique(sizes):
            here = sizes == value
            for k, price in enumerate(self.compute.device_prices(int(value), n)):
                out[k, here] = rows(price, devices[here])
        return tuple(out)

    def _compute(self, cost: Cost, asked: _Asked) -> _Work:
        """The asked devices' work on ``cost``: forward and backward energy [J] and time [s],
        backward passes and Hessian-vector products, zero for devices without energy."""
        active, devices = asked.active, asked.devices
        on = active.astype(float)
        cost, count = _cost_for(cost, asked, self.num_devices), len(active)
        fwd, bwd = cost.priced_passes(count, self.accounting)
        fwd, bwd = fwd * on, bwd * on
        gradients = cost.per_device(count)[1] * on
        hvps = cost.hvp_per_device(count) * on
        e_fwd, e_bwd, t_fwd, t_bwd = self._prices(cost.batch_size, devices)
        return _Work(fwd * e_fwd, bwd * e_bwd, fwd * t_fwd, bwd * t_bwd, gradients, hvps)

    def superpose(self, cost: Cost, payload: Payload, values: torch.Tensor,
                  active: np.ndarray | None = None,
                  power_control: PowerControl = "truncated-inversion"):
        """Each asked device (int indices, an [N] mask or None: all) computes ``cost``; then, when
        the last of them is ready, the devices transmit their ``values`` (rows aligned with the
        asked devices in increasing order, [n, k]) at once on the analog uplink
        (channel/analog.py), one channel use per value; returns a ``SuperposedResult``: the
        base station's estimate of the weighted sum and who transmitted (arrays aligned with
        the asked devices, ``devices``; all N when none were named), never a device's value.
        ``power_control``: one of contract/port.py's POWER_CONTROLS (channel/analog.py). Both
        engines advance the clock once: an analog phase is synchronous."""
        self._catch_up()
        alive = None if self._lazy else self.alive
        if active is not None and np.asarray(active).dtype == bool:
            # a mask asks its devices as indices: the values' rows are theirs in either mode
            active = np.flatnonzero(np.asarray(active))
        asked = self._asked(active)
        start = float(self.env.now)
        analog = self._analog()
        work = self._compute(cost, asked)
        compute_time = work.forward_time_s + work.backward_time_s
        ready = start + compute_time
        air = analog.airtime_s(payload.values)
        cutoff = start + self.deadline_s if self.deadline_s is not None else math.inf
        # a device not ready in time to finish the phase before the deadline stays silent
        late = asked.active & (ready + air > cutoff)
        on_time = asked.active & ~late
        begin = float(ready[on_time].max()) if on_time.any() else start
        if late.any():  # computing at the deadline: stops there, pays for what it did
            work.cut_at(np.where(late, np.clip((cutoff - start) / np.where(late, compute_time, 1.0),
                                               0.0, 1.0), 1.0))
        devices = asked.devices
        if self.per_device:
            fading = self.uplink.keyed_fading(self.seed, UPLINK_FADING_STREAM)
            fading.mark(start)
            power = fading.power(devices, np.full(len(devices), begin), (self.phase, 0))
            noise = keyed_rng(self.seed, ANALOG_NOISE_STREAM, self.phase)
        else:
            power = self.uplink.fading_for(self.rng).power(np.full(self.num_devices, begin))
            noise = self.rng
        out = analog.transmit(power_control, power, on_time, devices)
        rows = self._asked_rows(asked)
        values = torch.as_tensor(values)
        if values.ndim != 2 or values.shape[0] != len(rows) \
                or values.shape[1] != payload.values:
            raise ValueError(f"superpose needs values [asked devices, payload values] = "
                             f"[{len(rows)}, {payload.values}], got {list(values.shape)}")
        total, amplitude = _weighted_sum(values, out.weight[rows], out.transmitting[rows])
        z = torch.from_numpy(noise.standard_normal(payload.values))
        if amplitude > 0:  # nobody transmitted: an empty sum (the base station knows it, K = 0)
            total = total + amplitude * out.noise_std * z
        received = total.to(values.dtype)
        self.phase += 1
        self.ledger.exchanges += 1
        busy_air = np.where(out.transmitting, air, 0.0)
        led = self.ledger
        self._record_compute(work, slice(None), devices)
        # the profile's rule at the power the control chose (rf / pa_efficiency + circuits)
        draw = np.where(out.transmitting, self.power.draw_at(out.tx_power_w, devices), 0.0)
        led.charge("uplink", radio_energy_j(draw, busy_air), busy_air, devices)
        # asked devices with energy count as sent, those in the sum as delivered: a device that
        # truncation, scheduling or the deadline silenced is a lost upload
        led.transmissions[devices] += out.transmitting
        led.packets_sent[devices] += asked.active
        led.packets_delivered[devices] += out.transmitting
        led.late_uploads[devices] += late
        end = begin + air if on_time.any() else start + float(compute_time.max(initial=0.0))
        end = min(end, cutoff)
        if end > start:
            yield self.env.timeout(end - start)
        busy = work.forward_time_s + work.backward_time_s + busy_air
        self._close_phase(start, busy, alive, devices)
        finish = np.where(asked.active, np.where(late, cutoff, end), start)
        return SuperposedResult(received=received,
                                active=self._shape(asked, asked.active, False),
                                finish_s=self._shape(asked, finish, start),
                                devices=asked.given,
                                transmitted=self._shape(asked, out.transmitting, False))

    def _analog(self) -> AnalogUplink:
        """The cell's analog uplink (built on first use: O(N) once)."""
        if self._analog_uplink is None:
            self._analog_uplink = AnalogUplink(self.uplink.cell, self.uplink.config)
        return self._analog_uplink

    def _asked_rows(self, asked: _Asked) -> np.ndarray:
        """The rows of the phase's arrays that hold the asked devices, in increasing device
        order (the rows of the values a caller passes)."""
        if not isinstance(asked.devices, slice):
            return np.arange(len(asked.devices))
        if asked.given is not None:
            return asked.given
        return np.arange(self.num_devices)

    def _plan_collect(self, cost: Cost, payload: Payload, asked: _Asked) -> _Plan:
        """Per-device compute, queueing and uplink outcome of one phase (the same for both
        engines): fading is drawn at each device's ready time, the deadline cuts late uploads.
        ``asked.devices``: slice(None) (shared streams, every array over N) or the phase's
        device indices (per-device streams, arrays aligned with them)."""
        start = self.env.now
        active, devices = asked.active, asked.devices
        work = self._compute(cost, asked)
        compute_time = work.forward_time_s + work.backward_time_s
        ready = start + compute_time
        if self.per_device:
            outcome = self.uplink.transmit_devices(payload.bits, devices, ready, self.seed,
                                                   self.phase, float(start), active)
        else:
            outcome = self.uplink.transmit(payload.bits, active, self.rng, now_s=ready)
        hold = outcome.airtime_s
        priority = None
        upload_start = ready
        if self.shared:
            priority = self._priorities(outcome.rate_bps, active, devices)
            upload_start = schedule_uploads(ready, hold, priority, self.channels, active)
        self.phase += 1
        self.ledger.exchanges += 1
        cutoff = start + self.deadline_s if self.deadline_s is not None else math.inf
        cut = active & (ready > cutoff)
        if cut.any():  # still computing at the deadline: stops there, pays for what it did
            work.cut_at(np.where(cut, (cutoff - start) / np.where(cut, compute_time, 1.0), 1.0))
        late = active & (upload_start + hold > cutoff)
        air = np.where(late, np.clip(cutoff - upload_start, 0.0, None), hold)
        attempts = outcome.attempts
        if late.any():  # attempts begun before the cut (attempts are equally long but adaptive)
            per_attempt = np.maximum(outcome.attempt_airtime_s, 1e-300)
            attempts = np.where(late, np.minimum(attempts, np.ceil(air / per_attempt)),
                                attempts).astype(np.int64)
        return _Plan(
            **vars(work),
            ready_s=ready,
            hold_s=hold,
            upload_start_s=upload_start,
            priority=priority,
            cutoff_s=cutoff,
            airtime_s=air,
            uplink_energy_j=radio_energy_j(self.power.tx_draw_w[devices], air),
            delivered=outcome.delivered & active & ~late,
            late=late,
            attempts=attempts,
        )

    def _record_compute(self, plan: _Work, rows, where) -> None:
        """Charge the compute of the phase's ``rows`` (a ``_Work``, or the ``_Plan`` that holds
        one) to the ledger's devices ``where``."""
        self.ledger.charge("compute_forward", plan.forward_energy_j[rows],
                           plan.forward_time_s[rows], where)
        self.ledger.charge("compute_backward", plan.backward_energy_j[rows],
                           plan.backward_time_s[rows], where)
        self.ledger.backward_passes[where] += plan.backward_passes[rows]
        self.ledger.hvp_passes[where] += plan.hvp_passes[rows]

    def _record_uplink(self, plan: _Plan, bits: int, active, rows, where) -> None:
        led = self.ledger
        led.charge("uplink", plan.uplink_energy_j[rows], plan.airtime_s[rows], where)
        led.bits_up[where] += bits * plan.attempts[rows]
        led.transmissions[where] += plan.attempts[rows]
        led.packets_sent[where] += active[rows]
        led.packets_delivered[where] += plan.delivered[rows]
        led.late_uploads[where] += plan.late[rows]
        led.queue_wait_s[where] += np.where(active[rows], plan.upload_start_s[rows]
                                            - plan.ready_s[rows], 0.0)

    def _collect_result(self, asked: _Asked, plan: _Plan, finish: np.ndarray,
                        start: float) -> CollectResult:
        return CollectResult(delivered=self._shape(asked, plan.delivered, False),
                             finish_s=self._shape(asked, finish, start),
                             active=self._shape(asked, asked.active, False),
                             late=self._shape(asked, plan.late, False), devices=asked.given)

    def unicast(self, payload: Payload, receivers: np.ndarray):
        """The base station sends each device in ``receivers`` a packet of ``payload``'s size
        meant for it alone, at its own rate, one after another, whatever ``downlink.mode``: the
        downlink of content that differs per device (ZO-HFL's direction v_i)."""
        return (yield from self.broadcast(payload, receivers, mode="unicast"))

    def _begin_broadcast(self, payload: Payload, receivers: np.ndarray | None,
                         mode: str | None = None) -> _Sent:
        """A downlink phase starting now: who is on air how long and who decodes it (both
        engines); ``mode`` as ``Downlink.transmit``'s. Lazy charging and every device asked
        without loss: one pending entry in the ledger, nothing per device."""
        self._catch_up()
        alive = None if self._lazy else self.alive
        start = self.env.now
        down = self.downlink
        if self._lazy and receivers is None and not down.config.downlink.loss:
            air, listen = down.everyone_airtime_s(payload.bits, mode)
            self.ledger.charge_everyone(listen, payload.bits)
            self.ledger.charge_base_station(down.draw_w, air)
            return _Sent(alive, None, start, None, air)
        asked = self._asked(receivers)
        if self.per_device:
            out = down.transmit_devices(payload.bits, asked.devices, asked.active, self.seed,
                                        self.downlink_phase, now_s=start, mode=mode)
        else:
            out = down.transmit(payload.bits, asked.active, rng=self.downlink_rng, now_s=start,
                                mode=mode)
        self.downlink_phase += 1
        self.ledger.charge_base_station(down.draw_w, out.airtime_s)
        return _Sent(alive, asked, start, out, out.airtime_s)

    def _record_downlink(self, payload: Payload, sent: _Sent, rows, where) -> None:
        out, receivers = sent.out, sent.asked.active
        listen = out.per_device_airtime_s[rows]
        self.ledger.charge("downlink", radio_energy_j(self.power.rx_power_w[where], listen),
                           listen, where)
        self.ledger.bits_down[where] += payload.bits * receivers[rows]
        self.ledger.broadcasts_missed[where] += receivers[rows] & ~out.received[rows]

    def _close_broadcast(self, sent: _Sent) -> BroadcastResult:
        if sent.asked is None:  # every device, without loss: all received it
            self._close_phase(sent.start, None, None)
            return BroadcastResult(None, sent.airtime_s, num_devices=self.num_devices)
        asked, out = sent.asked, sent.out
        self._close_phase(sent.start, out.per_device_airtime_s, sent.alive, asked.devices)
        lost = sent.devices_at(np.flatnonzero(asked.active & ~out.received))
        return BroadcastResult(self._shape(asked, out.received, False), out.airtime_s,
                               devices=asked.given, lost_devices=lost)


class VectorNetwork(Network):
    """A synchronous phase computed for all devices at once; one clock advance per phase."""

    def collect(self, cost: Cost, payload: Payload, active: np.ndarray | None = None):
        """Every active device computes ``cost`` then uploads ``payload``; waits for the last
        (or for the deadline). ``active``: an [N] bool mask, int device indices (the result's
        arrays are then aligned with them) or None (every device)."""
        self._catch_up()
        alive = None if self._lazy else self.alive
        asked = self._asked(active)
        active = asked.active
        start = self.env.now
        plan = self._plan_collect(cost, payload, asked)
        everyone = slice(None)
        self._record_compute(plan, everyone, asked.devices)
        self._record_uplink(plan, payload.bits, active, everyone, asked.devices)
        # Same float operations, in the same order, as a device process: start + compute, then
        # the upload's start (after queueing) + its airtime, or the deadline.
        finish = np.where(plan.late, plan.cutoff_s, plan.upload_start_s + plan.hold_s)
        finish = np.where(active, finish, start)
        end = float(finish.max()) if finish.size else start
        if end > start:
            yield self.env.timeout(end - start)
        self._close_phase(start, plan.busy_s, alive, asked.devices)
        return self._collect_result(asked, plan, finish, start)

    def broadcast(self, payload: Payload, receivers: np.ndarray | None = None,
                  mode: str | None = None):
        """The base station sends ``payload`` to ``receivers`` (default: every device; an [N]
        bool mask or int device indices), as ``mode`` (default: the profile's
        ``downlink.mode``)."""
        sent = self._begin_broadcast(payload, receivers, mode)
        if sent.asked is not None:
            self._record_downlink(payload, sent, slice(None), sent.asked.devices)
        if sent.airtime_s > 0:
            yield self.env.timeout(sent.airtime_s)
        return self._close_broadcast(sent)


class ProcessNetwork(Network):
    """Every device is a SimPy process fed by the base station through its own inbox; a shared
    uplink pool is a SimPy component the devices queue on. With per-device streams a device's
    process starts when it is first given an order (a broadcast to every device, charged
    lazily, gives none)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool = SharedSpectrum(self.env, self.channels) if self.shared else None
        self._inbox: dict[int, simpy.Store] = {}
        if not self.per_device:
            for i in range(self.num_devices):
                self._start(i)

    def _start(self, i: int) -> simpy.Store:
        self._inbox[i] = simpy.Store(self.env)
        self.env.process(self._device(i))
        return self._inbox[i]

    def _device(self, i: int):
        """A device's life: wait for an order, carry it out in simulated time, report back."""
        while True:
            kind, args, done = yield self._inbox[i].get()
            if kind == "collect":
                yield from self._upload(*args)
            else:  # "receive": wait for this device's packet, listen to it
                payload, sent, row, offset = args
                if offset > 0:
                    yield self.env.timeout(offset)
                yield self.env.timeout(sent.out.per_device_airtime_s[row])
                self._record_downlink(payload, sent, row, i)
            done.succeed(self.env.now)

    def _upload(self, row: int, i: int, plan: _Plan, bits: int, active):
        """Device ``i`` (row ``row`` of the plan's arrays) computes and uploads."""
        env = self.env
        yield env.timeout(min(plan.forward_time_s[row] + plan.backward_time_s[row],
                              plan.cutoff_s - env.now))
        self._record_compute(plan, row, i)
        granted = None
        if self.pool is not None:
            granted = self.pool.request(i, plan.priority[row])
            if plan.cutoff_s < math.inf:
                yield granted | env.timeout(max(plan.cutoff_s - env.now, 0.0))
            else:
                yield granted
        if granted is None or granted.triggered:
            on_air = plan.hold_s[row]
            if plan.late[row]:
                on_air = max(plan.cutoff_s - env.now, 0.0)
            yield env.timeout(on_air)
            if granted is not None:
                self.pool.release()
        else:  # still queued at the deadline: give up the request
            self.pool.withdraw(granted)
        self._record_uplink(plan, bits, active, row, i)

    def _order(self, i: int, kind: str, args) -> simpy.Event:
        done = self.env.event()
        inbox = self._inbox.get(i)
        (inbox if inbox is not None else self._start(i)).put((kind, args, done))
        return done

    def collect(self, cost: Cost, payload: Payload, active: np.ndarray | None = None):
        self._catch_up()
        alive = None if self._lazy else self.alive
        asked = self._asked(active)
        start = self.env.now
        plan = self._plan_collect(cost, payload, asked)
        finish = np.full(len(asked.active), start, dtype=float)
        rows = np.flatnonzero(asked.active)
        devices = rows if isinstance(asked.devices, slice) else asked.devices[rows]
        events = {row: self._order(int(i), "collect", (row, int(i), plan, payload.bits,
                                                       asked.active))
                  for row, i in zip(rows, devices, strict=True)}
        if events:
            yield simpy.AllOf(self.env, list(events.values()))
        for row, event in events.items():
            finish[row] = event.value
        self._close_phase(start, plan.busy_s, alive, asked.devices)
        return self._collect_result(asked, plan, finish, start)

    def broadcast(self, payload: Payload, receivers: np.ndarray | None = None,
                  mode: str | None = None):
        sent = self._begin_broadcast(payload, receivers, mode)
        events = []
        if sent.asked is not None:
            # Unicast packets go out back to back in device order; a broadcast reaches all at
            # once.
            out = sent.out
            unicast = (mode or self.downlink.config.downlink.mode) == "unicast"
            offsets = np.cumsum(out.per_device_airtime_s) - out.per_device_airtime_s
            rows = np.flatnonzero(sent.asked.active)
            events = [self._order(int(i), "receive", (payload, sent, row,
                                                      float(offsets[row]) if unicast else 0.0))
                      for row, i in zip(rows, sent.devices_at(rows), strict=True)]
        if sent.airtime_s > 0:
            events.append(self.env.timeout(sent.airtime_s))
        if events:
            yield simpy.AllOf(self.env, events)
        return self._close_broadcast(sent)


ENGINES = {"vectorized": VectorNetwork, "processes": ProcessNetwork}
