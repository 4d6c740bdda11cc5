"""Per-device radio, idle and battery figures [N]: what each device's energy profile draws.

A homogeneous population repeats one profile; a mixed population (``population.classes``) takes
each device's class profile. The engine multiplies these arrays by per-device durations, one
numpy operation per phase, whatever the mix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wirelessfl.energy.profile import EnergyProfile
from wirelessfl.energy.radio import transmit_power_draw_w


@dataclass(frozen=True)
class DevicePower:
    """Battery-side draws and budgets of N devices [W, J]."""

    # Built from the profiles with the rest, never changed by a run: not state a checkpoint
    # holds (pipeline/state_tree.py), so checkpoints written before they existed still resume.
    derived_state = ("pa_efficiency", "tx_fixed_w")

    tx_draw_w: np.ndarray  # [N] while sending: rf / pa_efficiency + tx circuit + channel circuit
    rx_power_w: np.ndarray  # [N] while the device's own downlink packet is on air
    idle_power_w: np.ndarray  # [N] while waiting: not computing, sending or receiving
    battery_j: np.ndarray  # [N] energy budget [J]; inf = unlimited
    # [N] the draw's parts, for a radiated power other than the channel's (the analog uplink's
    # power control): pa_efficiency, and tx circuit + channel circuit [W]; None: 1 and 0
    pa_efficiency: np.ndarray | None = None
    tx_fixed_w: np.ndarray | None = None

    def draw_at(self, rf_output_w: np.ndarray, devices=slice(None)) -> np.ndarray:
        """[n] DC draw [W] of ``devices`` while radiating ``rf_output_w`` [W] each (aligned with
        them): rf / pa_efficiency + tx circuit + channel circuit, the rule of ``tx_draw_w``."""
        rf = np.asarray(rf_output_w, dtype=float)
        if self.pa_efficiency is None:
            return rf
        return rf / self.pa_efficiency[devices] + self.tx_fixed_w[devices]

    @classmethod
    def from_profiles(cls, profiles: Sequence[EnergyProfile], device_class, rf_output_w: float,
                      channel_circuit_w: float = 0.0) -> DevicePower:
        """Device i takes ``profiles[device_class[i]]``. ``rf_output_w`` is the radiated power
        [W] (the channel's ``uplink.tx_power_dbm``), ``channel_circuit_w`` the channel profile's
        ``uplink.circuit_power_w`` [W], added to every device's draw while it sends.

        With the profile defaults (pa_efficiency 1, tx circuit 0) the draw is
        rf_output_w + channel_circuit_w, to the last bit (seed 002's reading).
        """
        classes = np.asarray(device_class, dtype=np.int64)

        def per_device(values) -> np.ndarray:
            return np.asarray(values, dtype=float)[classes]

        tx = per_device([transmit_power_draw_w(rf_output_w, p) for p in profiles])
        return cls(
            tx_draw_w=tx + channel_circuit_w,
            rx_power_w=per_device([p.rx_power_w for p in profiles]),
            idle_power_w=per_device([p.idle_power_w for p in profiles]),
            battery_j=per_device([np.inf if p.battery_j is None else p.battery_j
                                  for p in profiles]),
            pa_efficiency=per_device([p.pa_efficiency for p in profiles]),
            tx_fixed_w=per_device([p.tx_circuit_power_w for p in profiles]) + channel_circuit_w,
        )

    @classmethod
    def uniform(cls, profile: EnergyProfile, num_devices: int, rf_output_w: float,
                channel_circuit_w: float = 0.0) -> DevicePower:
        """Every device with the same ``profile``."""
        return cls.from_profiles([profile], np.zeros(int(num_devices), dtype=np.int64),
                                 rf_output_w, channel_circuit_w)

    @property
    def has_batteries(self) -> bool:
        """True when at least one device has a finite energy budget."""
        return bool(np.isfinite(self.battery_j).any())
