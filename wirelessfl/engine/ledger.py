"""The Ledger: joules, busy seconds, bits and packets per device and per kind of activity.

Stored as dense numpy arrays [N, kinds] so a synchronous phase is recorded for all devices in
one vector operation; totals are exact sums of the entries (conservation is tested).

The kinds are exclusive in time: at every simulated instant a device that still has energy is
computing, sending, receiving or idle (waiting), so per device the ``busy_s`` of the five kinds
add up to the time it was alive (``alive_s``); the engine charges ``idle`` as the rest.

The base station's own transmit energy is kept beside the devices' accounts, not in them
(``bs_energy_j``, ``bs_airtime_s``): seed 002 counts "both the uplink and downlink" transmission
energies (Sec. III-C), so the system's energy is the devices' plus the base station's.

Lazy charging (per-device random streams without batteries, engine/network.py): a phase writes
the rows of the devices it involves only. What every device receives alike, a downlink
transmission to every device, is kept as a pending total (``charge_everyone``) and written into
every row by ``settle_everyone``; idle time is not charged per phase but set in closed form by
``settle_idle`` (alive time - busy time of the other kinds, the identity above). The arrays are
complete after ``Network.settle()``, which the run context calls before it reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

KINDS = ("compute_forward", "compute_backward", "uplink", "downlink", "idle")
KIND_INDEX = {kind: i for i, kind in enumerate(KINDS)}


@dataclass
class Ledger:
    """Cumulative per-device accounts of one algorithm's run."""

    num_devices: int
    energy_j: np.ndarray = field(init=False)
    busy_s: np.ndarray = field(init=False)
    bits_up: np.ndarray = field(init=False)
    bits_down: np.ndarray = field(init=False)
    packets_sent: np.ndarray = field(init=False)
    packets_delivered: np.ndarray = field(init=False)
    transmissions: np.ndarray = field(init=False)  # uplink attempts, ARQ retries included
    late_uploads: np.ndarray = field(init=False)  # uploads cut off by the round's deadline
    queue_wait_s: np.ndarray = field(init=False)  # time waiting for a shared sub-band [s]
    broadcasts_missed: np.ndarray = field(init=False)  # downlink packets not received
    # Stochastic-gradient evaluations: one per backward pass a device's Cost asked for.
    backward_passes: np.ndarray = field(init=False)
    # Hessian-vector products (double backward, bilevel methods): one per Cost.hvp_passes.
    hvp_passes: np.ndarray = field(init=False)
    # Simulated time at which the device's battery ran out [s]; NaN while it has energy.
    depleted_at_s: np.ndarray = field(init=False)
    # Upload phases (collects) so far: a round with a gradient all-reduce before its model
    # exchange counts two (fedred.md Sec. 3.1, `exchanges`).
    exchanges: int = field(init=False, default=0)
    # The base station: energy it drew while on air [J] (transmit + circuit power x airtime of
    # every downlink transmission, resends included) and that airtime [s], cumulative.
    bs_energy_j: float = field(init=False, default=0.0)
    bs_airtime_s: float = field(init=False, default=0.0)
    # Lazy charging: transmissions to every device not yet written into the rows: each
    # device's listening time in broadcast mode [s], the bits, and unicast ones by size
    # (bits -> count; each device listens to its own packet, of its own length).
    everyone_listen_s: float = field(init=False, default=0.0)
    everyone_bits: float = field(init=False, default=0.0)
    everyone_unicast: dict[int, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        n = self.num_devices
        self.energy_j = np.zeros((n, len(KINDS)))
        self.busy_s = np.zeros((n, len(KINDS)))
        self.bits_up = np.zeros(n)
        self.bits_down = np.zeros(n)
        self.packets_sent = np.zeros(n, dtype=np.int64)
        self.packets_delivered = np.zeros(n, dtype=np.int64)
        self.transmissions = np.zeros(n, dtype=np.int64)
        self.late_uploads = np.zeros(n, dtype=np.int64)
        self.queue_wait_s = np.zeros(n)
        self.broadcasts_missed = np.zeros(n, dtype=np.int64)
        self.backward_passes = np.zeros(n)
        self.hvp_passes = np.zeros(n)
        self.depleted_at_s = np.full(n, np.nan)

    def charge(self, kind: str, energy_j, busy_s, devices=slice(None)) -> None:
        """Add energy [J] and busy time [s] of ``kind`` to ``devices`` (index, mask or slice)."""
        k = KIND_INDEX[kind]
        self.energy_j[devices, k] += energy_j
        self.busy_s[devices, k] += busy_s

    def charge_base_station(self, draw_w: float, airtime_s: float) -> None:
        """Add one downlink transmission of the base station: ``draw_w`` [W] for ``airtime_s``
        [s] on air."""
        self.bs_energy_j += draw_w * airtime_s
        self.bs_airtime_s += airtime_s

    def charge_everyone(self, listen_s: float | None, bits: int) -> None:
        """One downlink transmission of ``bits`` payload bits that every device receives,
        written into the rows later (``settle_everyone``): each listens ``listen_s`` [s] (a
        broadcast), or its own packet's airtime (None: a unicast to every device)."""
        if listen_s is None:
            self.everyone_unicast[int(bits)] = self.everyone_unicast.get(int(bits), 0) + 1
        else:
            self.everyone_listen_s += listen_s
        self.everyone_bits += bits

    def settle_everyone(self, rx_power_w: np.ndarray, unicast_airtimes_s) -> None:
        """Write the pending transmissions to every device into every row: downlink time and
        energy (receive power [W] ``rx_power_w`` [N]) and bits; ``unicast_airtimes_s(bits)``
        gives each device's airtime [N] of a unicast of that size."""
        listen = self.everyone_listen_s
        for bits, count in self.everyone_unicast.items():
            listen = listen + count * unicast_airtimes_s(bits)
        if np.any(listen) or self.everyone_bits:
            self.charge("downlink", rx_power_w * listen, listen)
            self.bits_down += self.everyone_bits
        self.everyone_listen_s, self.everyone_bits, self.everyone_unicast = 0.0, 0.0, {}

    def settle_idle(self, now_s: float, idle_power_w: np.ndarray | None,
                    since_s: float = 0.0) -> None:
        """Set every device's idle time to its alive time from ``since_s`` (when its accounts
        began) to ``now_s`` minus its busy time of every other kind (none negative), and its
        idle energy to ``idle_power_w`` [N] [W] x that (None: devices that draw nothing while
        idle)."""
        k = KIND_INDEX["idle"]
        alive = self.alive_s(now_s) - since_s
        idle = np.maximum(alive - self.busy_s[:, :k].sum(axis=1), 0.0)
        self.busy_s[:, k] = idle
        self.energy_j[:, k] = 0.0 if idle_power_w is None else idle_power_w * idle

    def system_energy_j(self) -> float:
        """Devices' energy (every kind) + the base station's [J]."""
        return self.total_energy_j() + self.bs_energy_j

    def energy_by_kind(self) -> dict[str, float]:
        """Network-wide energy per kind [J]."""
        sums = self.energy_j.sum(axis=0)
        return {kind: float(sums[i]) for i, kind in enumerate(KINDS)}

    def gradient_evaluations(self) -> float:
        """Backward passes (gradient evaluations) per device, averaged over all devices."""
        return float(self.backward_passes.mean()) if self.num_devices else 0.0

    def hessian_vector_products(self) -> float:
        """Hessian-vector products per device, averaged over all devices."""
        return float(self.hvp_passes.mean()) if self.num_devices else 0.0

    def total_energy_j(self) -> float:
        return float(self.energy_j.sum())

    @property
    def alive(self) -> np.ndarray:
        """[N] bool: devices whose battery has not run out (all of them without budgets)."""
        return np.isnan(self.depleted_at_s)

    def alive_s(self, now_s: float) -> np.ndarray:
        """[N] time each device has been alive by ``now_s`` [s]: until now or its depletion."""
        return np.where(self.alive, now_s, np.minimum(self.depleted_at_s, now_s))

    def active_s(self) -> np.ndarray:
        """[N] time spent computing, sending or receiving [s] (every kind but idle)."""
        return self.busy_s[:, :KIND_INDEX["idle"]].sum(axis=1)

    def delivered_fraction(self) -> float:
        """Uplink packets decoded / sent so far, over all devices (NaN before any upload)."""
        sent = int(self.packets_sent.sum())
        return float(self.packets_delivered.sum()) / sent if sent else float("nan")
