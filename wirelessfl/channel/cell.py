"""Geometry and large-scale propagation: where devices are, path loss, and mean SNR per device.

Deterministic given the distances: everything here is in dB or linear power, with no fading.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wirelessfl.channel.config import ChannelConfig


def dbm_to_w(power_dbm):
    """Power [dBm] -> [W]: P = 10^((P_dBm - 30) / 10)."""
    return 10.0 ** ((np.asarray(power_dbm, dtype=float) - 30.0) / 10.0)


def w_to_dbm(power_w):
    """Power [W] -> [dBm]: P_dBm = 10 log10(P) + 30."""
    return 10.0 * np.log10(np.asarray(power_w, dtype=float)) + 30.0


def place_devices(num_devices: int, config: ChannelConfig, rng: np.random.Generator) -> np.ndarray:
    """Distances [m], shape [N], uniform by area over the annulus [min_distance_m, cell_radius_m].

    Inverse CDF of F(r) = (r^2 - r0^2) / (R^2 - r0^2): r = sqrt(U (R^2 - r0^2) + r0^2).
    """
    r0, radius = config.min_distance_m, config.cell_radius_m
    u = rng.random(int(num_devices))
    return np.sqrt(u * (radius**2 - r0**2) + r0**2)


def path_loss_db(distances_m, config: ChannelConfig) -> np.ndarray:
    """Path loss [dB], shape of ``distances_m`` [m]: PL = intercept + slope * log10(d [km])."""
    pl = config.path_loss
    d_km = np.asarray(distances_m, dtype=float) / 1000.0
    return pl.intercept_db + pl.slope_db_per_decade * np.log10(d_km)


def noise_power_dbm(bandwidth_hz: float, config: ChannelConfig) -> float:
    """Thermal noise power [dBm] over ``bandwidth_hz`` [Hz]: N0 [dBm/Hz] + 10 log10(B)."""
    return float(config.noise_density_dbm_hz + 10.0 * np.log10(bandwidth_hz))


def mean_snr(distances_m, tx_power_dbm: float, bandwidth_hz: float,
             config: ChannelConfig) -> np.ndarray:
    """Mean (fading-averaged) SNR, linear, shape of ``distances_m`` [m].

    SNR [dB] = P_tx [dBm] - PL(d) [dB] - (N0 [dBm/Hz] + 10 log10 B).
    """
    snr_db = tx_power_dbm - path_loss_db(distances_m, config) - noise_power_dbm(bandwidth_hz, config)
    return 10.0 ** (snr_db / 10.0)


@dataclass
class Cell:
    """One cell: device distances [m] and each device's mean uplink and downlink SNR (linear)."""

    distances_m: np.ndarray  # [N] [m]
    uplink_mean_snr: np.ndarray  # [N] linear
    downlink_mean_snr: np.ndarray  # [N] linear

    @property
    def num_devices(self) -> int:
        return int(self.distances_m.size)

    def __len__(self) -> int:
        return self.num_devices

    @classmethod
    def from_distances(cls, distances_m, config: ChannelConfig) -> Cell:
        """A cell with devices at the given distances [m] (fixed positions, tests)."""
        d = np.asarray(distances_m, dtype=float)
        if d.ndim != 1 or d.size == 0:
            raise ValueError(f"distances_m must be a non-empty 1-D array of distances [m]; "
                             f"got shape {d.shape}")
        if not np.all(np.isfinite(d)) or np.any(d <= 0):
            raise ValueError("distances_m must all be positive and finite [m]")
        up, down = config.uplink, config.downlink
        return cls(
            distances_m=d,
            uplink_mean_snr=mean_snr(d, up.tx_power_dbm, up.bandwidth_hz, config),
            downlink_mean_snr=mean_snr(d, down.tx_power_dbm, down.bandwidth_hz, config),
        )

    @classmethod
    def build(cls, num_devices: int, config: ChannelConfig, rng: np.random.Generator) -> Cell:
        """Place ``num_devices`` devices at random (uniform by area) and compute their mean SNRs."""
        return cls.from_distances(place_devices(num_devices, config, rng), config)
