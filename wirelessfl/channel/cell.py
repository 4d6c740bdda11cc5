"""Geometry and large-scale propagation: where devices are, their path loss, shadowing, LOS state,
and mean SNR per device.

The path-loss formulas live in ``pathloss.py``; this module places devices and turns losses into
mean (fading-averaged) SNRs. Random draws (placement, then LOS, then shadowing) happen once, at
cell build, from the generator passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wirelessfl.channel.config import ChannelConfig
from wirelessfl.channel.pathloss import draw_large_scale, los_probability, median_path_loss_db


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


def path_loss_db(distances_m, config: ChannelConfig, los=None) -> np.ndarray:
    """Median path loss [dB] (no shadowing), shape of ``distances_m`` (ground distance [m]).

    Default model: PL = intercept + slope * log10(d [km]). 3GPP models need ``los`` (bool per
    device) unless the profile forces the LOS condition.
    """
    return median_path_loss_db(distances_m, config.path_loss, config.carrier_frequency_hz, los)


def noise_power_dbm(bandwidth_hz: float, config: ChannelConfig,
                    noise_figure_db: float = 0.0) -> float:
    """Noise power [dBm] over ``bandwidth_hz`` [Hz]: N0 [dBm/Hz] + NF [dB] + 10 log10(B)."""
    return float(config.noise_density_dbm_hz + noise_figure_db + 10.0 * np.log10(bandwidth_hz))


def snr_from_loss(loss_db, tx_power_dbm: float, bandwidth_hz: float, config: ChannelConfig,
                  noise_figure_db: float = 0.0) -> np.ndarray:
    """Mean SNR, linear: SNR [dB] = P_tx [dBm] - loss [dB] - (N0 + NF + 10 log10 B) [dBm]."""
    snr_db = tx_power_dbm - loss_db - noise_power_dbm(bandwidth_hz, config, noise_figure_db)
    return 10.0 ** (snr_db / 10.0)


def mean_snr(distances_m, tx_power_dbm: float, bandwidth_hz: float,
             config: ChannelConfig) -> np.ndarray:
    """Mean (fading-averaged) SNR, linear, at the median path loss, shape of ``distances_m`` [m].

    SNR [dB] = P_tx [dBm] - PL(d) [dB] - (N0 [dBm/Hz] + 10 log10 B).
    """
    return snr_from_loss(path_loss_db(distances_m, config), tx_power_dbm, bandwidth_hz, config)


@dataclass
class Cell:
    """One cell: per device its ground distance [m], large-scale loss and mean SNRs (linear)."""

    distances_m: np.ndarray  # [N] [m], ground (2D) distance to the base station
    uplink_mean_snr: np.ndarray  # [N] linear, fading-averaged, shadowing included
    downlink_mean_snr: np.ndarray  # [N] linear
    path_loss_db: np.ndarray | None = None  # [N] [dB] median path loss
    shadowing_db: np.ndarray | None = None  # [N] [dB] log-normal shadowing (0 without)
    los: np.ndarray | None = None  # [N] bool, LOS state (3GPP models; False otherwise)

    def __post_init__(self):
        n = self.num_devices
        if self.path_loss_db is None:
            self.path_loss_db = np.zeros(n)
        if self.shadowing_db is None:
            self.shadowing_db = np.zeros(n)
        if self.los is None:
            self.los = np.zeros(n, dtype=bool)

    @property
    def num_devices(self) -> int:
        return int(self.distances_m.size)

    def __len__(self) -> int:
        return self.num_devices

    @classmethod
    def from_losses(cls, distances_m, path_loss_db, shadowing_db, los,
                    config: ChannelConfig) -> Cell:
        """A cell from given per-device losses [dB] (reciprocal: the same loss both ways)."""
        up, down = config.uplink, config.downlink
        loss = np.asarray(path_loss_db, dtype=float) + np.asarray(shadowing_db, dtype=float)
        return cls(
            distances_m=np.asarray(distances_m, dtype=float),
            uplink_mean_snr=snr_from_loss(loss, up.tx_power_dbm, up.device_bandwidth_hz, config,
                                          up.noise_figure_db),
            downlink_mean_snr=snr_from_loss(loss, down.tx_power_dbm, down.bandwidth_hz, config,
                                            down.noise_figure_db),
            path_loss_db=np.asarray(path_loss_db, dtype=float),
            shadowing_db=np.asarray(shadowing_db, dtype=float),
            los=np.asarray(los, dtype=bool),
        )

    @classmethod
    def from_distances(cls, distances_m, config: ChannelConfig,
                       rng: np.random.Generator | None = None) -> Cell:
        """A cell with devices at the given ground distances [m] (fixed positions, tests).

        ``rng`` draws the LOS states and shadowing when the profile has them (else unused).
        """
        d = np.asarray(distances_m, dtype=float)
        if d.ndim != 1 or d.size == 0:
            raise ValueError(f"distances_m must be a non-empty 1-D array of distances [m]; "
                             f"got shape {d.shape}")
        if not np.all(np.isfinite(d)) or np.any(d <= 0):
            raise ValueError("distances_m must all be positive and finite [m]")
        pl, shadow, los = draw_large_scale(d, config.path_loss, config.carrier_frequency_hz, rng)
        return cls.from_losses(d, pl, shadow, los, config)

    @classmethod
    def build(cls, num_devices: int, config: ChannelConfig, rng: np.random.Generator) -> Cell:
        """Place ``num_devices`` devices at random (uniform by area), then draw LOS and shadowing."""
        return cls.from_distances(place_devices(num_devices, config, rng), config, rng)

    @classmethod
    def median(cls, distances_m, config: ChannelConfig, los=None) -> Cell:
        """A cell at the median path loss (no shadowing drawn), for link budgets.

        3GPP models: ``los`` (bool or [N]) if given, else the profile's forced condition, else
        the more likely state at each distance (P_LOS >= 0.5).
        """
        d = np.atleast_1d(np.asarray(distances_m, dtype=float))
        pl_cfg = config.path_loss
        if los is None and pl_cfg.is_3gpp:
            if pl_cfg.los_condition == "stochastic":
                los = los_probability(pl_cfg.model, d, pl_cfg.office or "mixed") >= 0.5
            else:
                los = pl_cfg.los_condition == "los"
        los = np.broadcast_to(np.asarray(False if los is None else los, dtype=bool), d.shape)
        pl = path_loss_db(d, config, los if pl_cfg.is_3gpp else None)
        return cls.from_losses(d, pl, np.zeros(d.shape), los.copy(), config)
