"""What happens to a packet: its rate, airtime [s], retransmissions and whether it is decoded.

Uplink modes (``uplink.mode``), on the instantaneous SNR = mean SNR x |h|^2:

* ``adaptive``: rate = efficiency * B log2(1 + SNR / Gamma); always delivered;
* ``fixed``: rate_bps; lost when B log2(1 + SNR) < rate_bps (outage = erasure; seed 002);
* ``pinned``: rate_bps; delivered with probability p whatever the channel (seed 002's abstraction);
* ``mcs``: CQI chosen from the mean SNR minus a back-off (TS 38.214 Table 5.2.2.1-2), rate =
  efficiency(CQI) * B, delivered with probability 1 - BLER(SNR) (see ``mcs.py``).

ARQ: a lost packet is sent again, up to ``uplink.arq.max_attempts`` transmissions, each on the
channel at that attempt's start time; every attempt costs airtime. The downlink is one broadcast at
the weakest intended receiver's mean-SNR rate, or one unicast per receiver.

Shared random streams (``transmit``): every call draws for all N devices from the run's
generators, active or not. Per-device streams (``transmit_devices``, cross-device populations):
a call draws for the devices it is given only, keyed per (phase, attempt, device) (fading by
``KeyedFading``, the pinned/mcs erasure uniforms by ``counter_uniform`` on the stream
UPLINK_ERASURE_STREAM), so its cost follows the transmitters and a device's outcome does not
depend on which other devices transmit. Both run the same per-attempt arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wirelessfl.channel.cell import Cell, dbm_to_w
from wirelessfl.channel.config import ChannelConfig
from wirelessfl.channel.fading import FadingProcess, KeyedFading
from wirelessfl.channel.mcs import bler, cqi_efficiency, select_cqi, snr_db
from wirelessfl.learning.seeds import counter_uniform

# Rates are clamped to at least this [bit/s] before dividing: a faded SNR can be exactly 0.0 in
# float (adaptive mode then gives rate 0). The clamp keeps airtime finite (very long), never inf.
MIN_RATE_BPS = 1e-3
# Relative slack on the slot count, so float rounding of an exact multiple does not add a slot
# (64e5 bits at 10 Mbit/s is 5120 slots of 0.125 ms, not 5121).
_SLOT_RTOL = 1e-12
# Names of the per-device keyed streams (population.random_streams: per-device).
UPLINK_FADING_STREAM = "uplink-fading"
UPLINK_ERASURE_STREAM = "uplink-erasure"
DOWNLINK_FADING_STREAM = "downlink-fading"


def airtime_s(bits, rate_bps, slot_s: float) -> np.ndarray:
    """Airtime [s] of ``bits`` at ``rate_bps`` [bit/s], whole slots: ceil(bits / (R slot)) * slot.

    Vectorized over ``bits`` and ``rate_bps``; rates below MIN_RATE_BPS are clamped to it.
    """
    bits = np.asarray(bits, dtype=float)
    rate = np.maximum(np.asarray(rate_bps, dtype=float), MIN_RATE_BPS)
    slots = np.ceil(bits / (rate * slot_s) * (1.0 - _SLOT_RTOL))
    return np.maximum(slots, 0.0) * slot_s


def capacity_bps(snr, bandwidth_hz: float) -> np.ndarray:
    """Shannon capacity [bit/s]: C = B log2(1 + SNR), SNR linear."""
    return bandwidth_hz * np.log2(1.0 + np.asarray(snr, dtype=float))


def rayleigh_delivery_probability(rate_bps, bandwidth_hz, mean_snr) -> np.ndarray:
    """P[B log2(1 + snr |h|^2) >= R] under Rayleigh fading: exp(-(2^(R/B) - 1) / mean_snr)."""
    threshold = 2.0 ** (np.asarray(rate_bps, dtype=float) / bandwidth_hz) - 1.0
    return np.exp(-threshold / np.asarray(mean_snr, dtype=float))


@dataclass
class LinkOutcome:
    """Per-device result of one uplink phase, each of shape [N]."""

    airtime_s: np.ndarray  # [s] total over attempts; 0 for inactive devices
    delivered: np.ndarray  # bool; False for inactive devices
    snr: np.ndarray  # faded SNR of the last attempt, linear (the first for inactive devices)
    attempts: np.ndarray  # int; transmissions made (1..max_attempts), 0 for inactive devices
    attempt_airtime_s: np.ndarray  # [s] airtime of one (the last) attempt; 0 for inactive
    rate_bps: np.ndarray  # [bit/s] rate of the last attempt (every device)


@dataclass
class DownlinkOutcome:
    """Result of one downlink transmission to the intended receivers."""

    airtime_s: float  # [s] total time the base station is on air
    per_device_airtime_s: np.ndarray  # [N] [s] each receiver's listening time (0 if not one)
    received: np.ndarray  # [N] bool; False for devices that were not receivers
    rate_bps: np.ndarray  # [N] [bit/s] rate each device's packet was sent at


class _FadingOwner:
    """A link whose fading process lives as long as the generator that drives it."""

    cell: Cell
    config: ChannelConfig
    _fading: FadingProcess | None = None
    _keyed: KeyedFading | None = None

    def fading_for(self, rng: np.random.Generator) -> FadingProcess:
        """The link's fading process on ``rng`` (a new process when the generator changes)."""
        if self._fading is None or self._fading.rng is not rng:
            self._fading = FadingProcess(self.cell.num_devices, self.config, rng, self.cell.los)
        return self._fading

    def keyed_fading(self, seed: int, stream: str) -> KeyedFading:
        """The link's per-device keyed fading for (``seed``, ``stream``) (one per run: it holds
        the Gauss-Markov state)."""
        if self._keyed is None or (self._keyed.seed, self._keyed.stream) != (seed, stream):
            self._keyed = KeyedFading(self.cell.num_devices, self.config, seed, stream,
                                      self.cell.los)
        return self._keyed


class Uplink(_FadingOwner):
    """Every device's uplink to the base station, on its own band (or sub-band of a pool).

    Correlated fading (block, gauss-markov) is state: use one Uplink and one generator per run.
    """

    def __init__(self, cell: Cell, config: ChannelConfig):
        self.cell = cell
        self.config = config
        up = config.uplink
        self.bandwidth_hz = up.device_bandwidth_hz
        if up.mode == "mcs":
            # Link adaptation from the mean SNR (the transmitter does not know the fading).
            self.cqi = select_cqi(snr_db(cell.uplink_mean_snr), up.mcs)  # [N] int, 0 = outage
            thresholds = np.asarray(up.mcs.snr_thresholds_db)
            self.cqi_threshold_db = thresholds[np.maximum(self.cqi, 1) - 1]  # [N] [dB]
            self.mcs_rate_bps = cqi_efficiency(self.cqi) * self.bandwidth_hz  # [N] [bit/s]

    @property
    def tx_power_w(self) -> float:
        """Device transmit power [W]."""
        return float(dbm_to_w(self.config.uplink.tx_power_dbm))

    @property
    def circuit_power_w(self) -> float:
        """Device transmitter circuit power while on air [W] (profile value; 0 by default)."""
        return float(self.config.uplink.circuit_power_w)

    def rate_at(self, snr: np.ndarray, devices=slice(None)) -> np.ndarray:
        """Rate [bit/s] of an attempt of ``devices`` at faded ``snr`` (the mode's rate rule)."""
        up = self.config.uplink
        if up.mode == "adaptive":
            gap = 10.0 ** (up.snr_gap_db / 10.0)
            return up.efficiency * capacity_bps(snr / gap, self.bandwidth_hz)
        if up.mode == "mcs":
            return self.mcs_rate_bps[devices].copy()
        return np.full(len(snr), up.rate_bps)

    def _attempt(self, snr: np.ndarray, uniform, devices=slice(None)):
        """Rate [bit/s] and decoded mask of one attempt of ``devices`` (default every device) at
        faded ``snr``; ``uniform(n)`` gives the erasure uniforms (pinned and mcs modes)."""
        up, n, bw = self.config.uplink, len(snr), self.bandwidth_hz
        rate = self.rate_at(snr, devices)
        if up.mode == "adaptive":
            return rate, np.ones(n, dtype=bool)
        if up.mode == "fixed":
            return rate, capacity_bps(snr, bw) >= up.rate_bps
        if up.mode == "pinned":  # the seed's abstraction, p independent of the channel
            return rate, uniform(n) < up.delivery_probability
        error = bler(snr_db(snr), self.cqi_threshold_db[devices], up.mcs.bler_slope_per_db)
        ok = (uniform(n) >= error) & (self.cqi[devices] > 0)  # out of range: lost, still on air
        return rate, ok

    def transmit(self, bits, active, rng: np.random.Generator, now_s=0.0) -> LinkOutcome:
        """Send ``bits`` payload bits (+ header) from every active device, starting at ``now_s``.

        ``now_s`` [s] is the simulated time of the first attempt: a float, or [N] per device
        (e.g. phase start + compute time). Correlated fading is evaluated there, and each retry
        at the end of the previous attempt; iid fading ignores time.

        Per attempt, draws the fading of all N devices (then, in pinned and mcs modes, N
        uniforms), active or not, so the random stream does not depend on who is active or who
        needs a retry. With max_attempts = 1 this is one fading draw and at most one uniform draw.
        """
        n = self.cell.num_devices
        active = np.asarray(active, dtype=bool)
        if active.shape != (n,):
            raise ValueError(f"active must be a bool array of shape ({n},), got {active.shape}")
        fading = self.fading_for(rng)
        return self._arq(bits, active, now_s, slice(None), lambda start, k: fading.power(start),
                         lambda k: rng.random)

    def transmit_devices(self, bits, devices: np.ndarray, now_s, seed: int, phase: int,
                         start_s: float, active: np.ndarray | None = None) -> LinkOutcome:
        """``transmit`` for the devices ``devices`` only ([n] int indices; ``active`` [n] bool,
        default all), with per-device streams: attempt k of device i draws from the keys
        (seed, phase, k, i) alone. ``start_s``: the phase's start [s], the grid of the lazy
        Gauss-Markov steps. Every array of the outcome is [n], aligned with ``devices``."""
        devices = np.asarray(devices, dtype=np.int64)
        fading = self.keyed_fading(seed, UPLINK_FADING_STREAM)
        fading.mark(start_s)

        def erasures(k):
            return lambda n: counter_uniform(seed, UPLINK_ERASURE_STREAM, (phase, k), devices,
                                             1)[:, 0]

        active = np.ones(len(devices), dtype=bool) if active is None else active
        return self._arq(bits, active, now_s, devices,
                         lambda start, k: fading.power(devices, start, (phase, k)), erasures)

    def _arq(self, bits, active: np.ndarray, now_s, devices, power, erasures) -> LinkOutcome:
        """The attempts of ``devices`` (``active`` of them sending): ``power(start, k)`` the
        faded |h|^2 of attempt k at its start times, ``erasures(k)`` its uniform source."""
        up, n = self.config.uplink, len(active)
        mean = self.cell.uplink_mean_snr[devices]
        packet_bits = np.asarray(bits, dtype=float) + up.header_bits
        start = np.broadcast_to(np.asarray(now_s, dtype=float), (n,)).copy()  # next attempt [s]
        trying = active.copy()
        delivered = np.zeros(n, dtype=bool)
        attempts = np.zeros(n, dtype=np.int64)
        total = np.zeros(n)
        for k in range(up.arq.max_attempts):
            snr_k = mean * power(start, k)
            rate_k, ok_k = self._attempt(snr_k, erasures(k), devices)
            air_k = airtime_s(packet_bits, rate_k, self.config.slot_s)
            if k == 0:
                snr, rate, attempt_air = snr_k, rate_k, np.where(active, air_k, 0.0)
            else:
                snr = np.where(trying, snr_k, snr)
                rate = np.where(trying, rate_k, rate)
                attempt_air = np.where(trying, air_k, attempt_air)
            attempts += trying
            total += np.where(trying, air_k, 0.0)
            delivered |= trying & ok_k
            start = np.where(trying, start + air_k, start)
            trying = trying & ~ok_k
        return LinkOutcome(airtime_s=total, delivered=delivered, snr=snr, attempts=attempts,
                           attempt_airtime_s=attempt_air, rate_bps=rate)


class Downlink(_FadingOwner):
    """The base station's transmissions to the devices (broadcast or unicast)."""

    def __init__(self, cell: Cell, config: ChannelConfig):
        self.cell = cell
        self.config = config
        self._worst: float | None = None  # min over all devices of the mean SNR
        self._unicast_total_s: dict[int, float] = {}  # bits -> unicast airtime to everyone [s]

    @property
    def tx_power_w(self) -> float:
        """Base-station transmit power [W]."""
        return float(dbm_to_w(self.config.downlink.tx_power_dbm))

    @property
    def circuit_power_w(self) -> float:
        """Base-station transmitter circuit power while on air [W] (profile value; 0 by default)."""
        return float(self.config.downlink.circuit_power_w)

    @property
    def draw_w(self) -> float:
        """What the base station draws while on air [W]: transmit + circuit power
        (``bs_power_model`` transmit-only), or EARTH's N_TRX (P_0 + Delta_p P_out), P_out the
        transmit power (earth; docs/energy.md)."""
        earth = self.config.downlink.earth
        if self.config.downlink.bs_power_model == "earth":
            return float(earth.n_trx * (earth.p0_w + earth.delta_p * self.tx_power_w))
        return self.tx_power_w + self.circuit_power_w

    @property
    def sleep_w(self) -> float:
        """What the base station draws while not on air [W]: nothing (transmit-only), or
        EARTH's N_TRX P_sleep (earth)."""
        earth = self.config.downlink.earth
        if self.config.downlink.bs_power_model == "earth":
            return float(earth.n_trx * earth.p_sleep_w)
        return 0.0

    def power_record(self) -> dict:
        """The manifest's ``base_station`` entry: the power model, its constants, and the draws
        on and off air [W] they give."""
        down = self.config.downlink
        record = {"power_model": down.bs_power_model, "tx_power_w": self.tx_power_w}
        if down.bs_power_model == "earth":
            record["earth"] = down.earth.model_dump(mode="json")
        else:
            record["circuit_power_w"] = self.circuit_power_w
        return {**record, "on_air_w": self.draw_w, "sleep_w": self.sleep_w}

    def energy_j(self, on_air_j: float, airtime_s: float, now_s: float) -> float:
        """The base station's energy by ``now_s`` [J]: what it drew on air (``on_air_j``, the
        ledger's, over ``airtime_s``) + its sleep draw for the rest of the simulated time."""
        sleep_w = self.sleep_w
        if not sleep_w:
            return float(on_air_j)
        return float(on_air_j) + sleep_w * max(float(now_s) - float(airtime_s), 0.0)

    @property
    def rate_bps(self) -> float:
        """Broadcast rate to every device [bit/s]: efficiency * B log2(1 + min_i mean SNR_i)."""
        down = self.config.downlink
        worst = float(np.min(self.cell.downlink_mean_snr))
        return float(down.efficiency * capacity_bps(worst, down.bandwidth_hz))

    def broadcast(self, bits) -> float:
        """Airtime [s] of one broadcast of ``bits`` payload bits (+ header) to every device."""
        packet_bits = float(bits) + self.config.downlink.header_bits
        return float(airtime_s(packet_bits, self.rate_bps, self.config.slot_s))

    def transmit(self, bits, receivers, rng: np.random.Generator | None = None,
                 now_s: float = 0.0, mode: str | None = None) -> DownlinkOutcome:
        """Send ``bits`` payload bits (+ header) to the devices in ``receivers`` (bool [N]).

        broadcast: one transmission at efficiency * B log2(1 + min over receivers of mean SNR);
        unicast: one per receiver at its own mean-SNR rate, back to back (airtime = their sum).
        ``mode``: this transmission's, or None for the profile's ``downlink.mode`` (a packet whose
        content differs per receiver is sent as ``unicast`` whatever the profile says).
        With ``downlink.loss`` a receiver loses the packet when B log2(1 + faded SNR) < rate;
        the fading comes from ``rng`` (a stream of its own, required then) at ``now_s`` [s].
        """
        down, n = self.config.downlink, self.cell.num_devices
        receivers = np.asarray(receivers, dtype=bool)
        if receivers.shape != (n,):
            raise ValueError(f"receivers must be a bool array of shape ({n},), got "
                             f"{receivers.shape}")
        faded = None
        if down.loss:
            if rng is None:
                raise ValueError("downlink.loss is on: pass the downlink's own random generator "
                                 "(rng) so each receiver's fading can be drawn")
            fading = self.fading_for(rng)

            def faded():
                return fading.power(now_s)

        return self._send(bits, receivers, self.cell.downlink_mean_snr, mode, faded)

    def transmit_devices(self, bits, devices: np.ndarray, receivers: np.ndarray, seed: int,
                         event: int, now_s: float = 0.0, mode: str | None = None
                         ) -> DownlinkOutcome:
        """``transmit`` to the devices ``devices`` ([m] int indices, ``receivers`` [m] bool of
        them), with per-device streams: with ``downlink.loss`` receiver i's fading of
        transmission ``event`` draws from the keys (seed, event, i) alone. Every array of the
        outcome is [m], aligned with ``devices``."""
        devices = np.asarray(devices, dtype=np.int64)
        faded = None
        if self.config.downlink.loss:
            fading = self.keyed_fading(seed, DOWNLINK_FADING_STREAM)

            def faded():
                fading.mark(now_s)  # every lossy transmission is a step of the whole cell
                return fading.power(devices, now_s, (event,))

        return self._send(bits, np.asarray(receivers, dtype=bool),
                          self.cell.downlink_mean_snr[devices], mode, faded)

    def everyone_airtime_s(self, bits, mode: str | None = None) -> tuple[float, float | None]:
        """(base-station airtime [s], each device's listening time [s], or None in unicast
        mode: ``unicast_airtimes_s``) of one ``bits`` transmission to all N devices without
        loss; O(1) after the first of each size (per-device streams charge it lazily)."""
        down = self.config.downlink
        mode = down.mode if mode is None else mode
        if mode == "broadcast":
            worst = self._worst_mean_snr()
            air = float(airtime_s(float(bits) + down.header_bits,
                                  down.efficiency * float(capacity_bps(worst, down.bandwidth_hz)),
                                  self.config.slot_s))
            return air, air
        key = int(bits)
        if key not in self._unicast_total_s:
            self._unicast_total_s[key] = float(self.unicast_airtimes_s(bits).sum())
        return self._unicast_total_s[key], None

    def unicast_airtimes_s(self, bits) -> np.ndarray:
        """[N] each device's airtime [s] of its own ``bits`` packet at its mean-SNR rate."""
        down = self.config.downlink
        rate = down.efficiency * capacity_bps(self.cell.downlink_mean_snr, down.bandwidth_hz)
        return airtime_s(float(bits) + down.header_bits, rate, self.config.slot_s)

    def _worst_mean_snr(self) -> float:
        if self._worst is None:
            self._worst = float(np.min(self.cell.downlink_mean_snr))
        return self._worst

    def _send(self, bits, receivers: np.ndarray, mean: np.ndarray, mode: str | None,
              faded) -> DownlinkOutcome:
        """One transmission to ``receivers`` (bool, aligned with their mean SNRs ``mean``);
        ``faded()`` gives their |h|^2 when the downlink can lose packets (None: it cannot)."""
        down, n = self.config.downlink, len(receivers)
        mode = down.mode if mode is None else mode
        packet_bits = float(bits) + down.header_bits
        if mode == "broadcast":
            worst = float(np.min(mean[receivers])) if receivers.any() else 0.0
            rate = np.full(n, down.efficiency * float(capacity_bps(worst, down.bandwidth_hz)))
            air = float(airtime_s(packet_bits, rate[0], self.config.slot_s)) \
                if receivers.any() else 0.0
            per_device = np.where(receivers, air, 0.0)
            total = air
        else:  # unicast
            rate = down.efficiency * capacity_bps(mean, down.bandwidth_hz)
            per_device = np.where(receivers, airtime_s(packet_bits, rate, self.config.slot_s), 0.0)
            total = float(per_device.sum())
        received = receivers.copy()
        if faded is not None:
            snr = mean * faded()
            received &= capacity_bps(snr, down.bandwidth_hz) >= rate
        return DownlinkOutcome(airtime_s=total, per_device_airtime_s=per_device,
                               received=received, rate_bps=rate)
