"""Large-scale propagation: path-loss models [dB], LOS probability and log-normal shadowing.

``path_loss.model`` picks one of:

* ``log-distance-km``: PL = A + B log10(d [km]), the 3GPP TR 36.814 Table A.2.1.1-2 form (our [D]
  choice for the seed-002 profiles: seed 002 states no path-loss model);
* ``free-space``: Friis, PL = 20 log10(4 pi d f_c / c);
* ``log-distance``: PL = PL(d0) + 10 n log10(d / d0), PL(d0) = free space at d0 unless given;
* ``3gpp-uma``, ``3gpp-umi``, ``3gpp-inh``: 3GPP TR 38.901 V17.0.0 Table 7.4.1-1 (UMa, UMi-Street
  Canyon, InH-Office), NLOS = max(LOS, NLOS'), LOS probability from Table 7.4.2-1, shadow-fading
  std sigma_SF per LOS/NLOS from Table 7.4.1-1.

Distances: ``d2d`` [m] is the ground distance (what placement draws); 3GPP formulas use
d3D = sqrt(d2D^2 + (h_BS - h_UT)^2) where the table says so. Everything is vectorized over devices.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, model_validator

SPEED_OF_LIGHT_M_S = 299_792_458.0  # exact, SI definition (Friis and Doppler)
# TR 38.901 Table 7.4.1-1 Note 1: the breakpoint distance uses c = 3.0e8 m/s.
C_38901_M_S = 3.0e8
# TR 38.901 Table 7.4.1-1 Note 1: effective environment height h_E = 1 m (UMi always; UMa when
# h_UT <= 13 m, where C(d2D, h_UT) = 0; taller UMa terminals are rejected by the config).
H_E_M = 1.0

THREE_GPP_MODELS = ("3gpp-uma", "3gpp-umi", "3gpp-inh")

# Per-scenario constants of TR 38.901 V17.0.0. heights [m]: Table 7.4.1-1 (h_BS = 25 m UMa,
# 10 m UMi) and Table 7.2-3 (InH: BS 3 m on the ceiling, UT 1 m); sigma_SF [dB]: Table 7.4.1-1;
# validity of the distance [m] (d2D for UMa/UMi, d3D for InH): Table 7.4.1-1; UT heights: same.
THREE_GPP = {
    "3gpp-uma": {"bs_height_m": 25.0, "ut_height_m": 1.5, "sigma_los_db": 4.0,
                 "sigma_nlos_db": 6.0, "distance_range_m": (10.0, 5000.0),
                 "ut_height_range_m": (1.5, 13.0)},
    "3gpp-umi": {"bs_height_m": 10.0, "ut_height_m": 1.5, "sigma_los_db": 4.0,
                 "sigma_nlos_db": 7.82, "distance_range_m": (10.0, 5000.0),
                 "ut_height_range_m": (1.5, 22.5)},
    "3gpp-inh": {"bs_height_m": 3.0, "ut_height_m": 1.0, "sigma_los_db": 3.0,
                 "sigma_nlos_db": 8.03, "distance_range_m": (1.0, 150.0),
                 "ut_height_range_m": (0.0, np.inf)},
}
# Default of the km log-distance model: 3GPP TR 36.814 Table A.2.1.1-2 (macro), 128.1 + 37.6 log10.
KM_INTERCEPT_DB, KM_SLOPE_DB = 128.1, 37.6

_ONLY = {  # field -> the models that read it
    "intercept_db": ("log-distance-km",),
    "slope_db_per_decade": ("log-distance-km",),
    "reference_distance_m": ("log-distance",),
    "reference_loss_db": ("log-distance",),
    "exponent": ("log-distance",),
    "bs_height_m": THREE_GPP_MODELS,
    "ut_height_m": THREE_GPP_MODELS,
    "los_condition": THREE_GPP_MODELS,
    "office": ("3gpp-inh",),
}


class PathLossConfig(BaseModel):
    """Which path-loss model, and its parameters (each read only by the models that use it)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: Literal["log-distance-km", "free-space", "log-distance",
                   "3gpp-uma", "3gpp-umi", "3gpp-inh"] = Field(
        "log-distance-km", description="path-loss model (see docs/radio.md)")
    intercept_db: float | None = Field(
        None, description="log-distance-km: path loss at 1 km [dB] (default 128.1, TR 36.814)")
    slope_db_per_decade: float | None = Field(
        None, description="log-distance-km: increase per decade of distance [dB] (default 37.6)")
    reference_distance_m: PositiveFloat | None = Field(
        None, description="log-distance: reference distance d0 [m] (default 1 m)")
    reference_loss_db: float | None = Field(
        None, description="log-distance: PL(d0) [dB] (default: free space at d0, needs "
                          "carrier_frequency_hz)")
    exponent: PositiveFloat | None = Field(
        None, description="log-distance: path-loss exponent n (2 = free space)")
    shadowing_std_db: NonNegativeFloat | None = Field(
        None, description="log-normal shadowing std [dB], drawn once per device; default 0, or "
                          "sigma_SF of TR 38.901 Table 7.4.1-1 for the 3GPP models (0 turns it off)")
    bs_height_m: PositiveFloat | None = Field(
        None, description="3GPP models: base-station antenna height h_BS [m] (UMa 25, UMi 10, "
                          "InH 3)")
    ut_height_m: PositiveFloat | None = Field(
        None, description="3GPP models: device antenna height h_UT [m] (UMa/UMi 1.5, InH 1)")
    los_condition: Literal["stochastic", "los", "nlos"] | None = Field(
        None, description="3GPP models: 'stochastic' draws each device's LOS state once from "
                          "TR 38.901 Table 7.4.2-1 (default); 'los'/'nlos' force it")
    office: Literal["mixed", "open"] | None = Field(
        None, description="3gpp-inh: LOS probability of the mixed (default) or open office")

    @model_validator(mode="after")
    def _fields_match_model(self):
        stray = [name for name, models in _ONLY.items()
                 if getattr(self, name) is not None and self.model not in models]
        if stray:
            readers = " / ".join(sorted({m for name in stray for m in _ONLY[name]}))
            fields = ", ".join(f"path_loss.{name}" for name in stray)
            raise ValueError(
                f"{fields} {'is' if len(stray) == 1 else 'are'} not read by model "
                f"{self.model!r} (only by {readers}); remove {'it' if len(stray) == 1 else 'them'}"
                f", or set to null what a profile sets (e.g. --set "
                f"channel.path_loss.{stray[0]}=null)")
        if self.model == "log-distance-km":
            if self.intercept_db is None:
                self.intercept_db = KM_INTERCEPT_DB
            if self.slope_db_per_decade is None:
                self.slope_db_per_decade = KM_SLOPE_DB
        elif self.model == "log-distance":
            if self.exponent is None:
                raise ValueError("path_loss model 'log-distance' needs 'exponent' (the path-loss "
                                 "exponent n, e.g. 2 for free space, 3.5 for urban); add it")
            if self.reference_distance_m is None:
                self.reference_distance_m = 1.0
        elif self.model in THREE_GPP:
            table = THREE_GPP[self.model]
            if self.bs_height_m is None:
                self.bs_height_m = table["bs_height_m"]
            if self.ut_height_m is None:
                self.ut_height_m = table["ut_height_m"]
            if self.los_condition is None:
                self.los_condition = "stochastic"
            if self.model == "3gpp-inh" and self.office is None:
                self.office = "mixed"
            lo, hi = table["ut_height_range_m"]
            if not lo <= self.ut_height_m <= hi:
                why = (" (above 13 m TR 38.901 Note 1 draws a random effective environment "
                       "height, which is not modelled)") if self.model == "3gpp-uma" else ""
                raise ValueError(f"path_loss.ut_height_m must be in [{lo:g}, {hi:g}] m for "
                                 f"{self.model} (TR 38.901 Table 7.4.1-1){why}; got "
                                 f"{self.ut_height_m:g}")
            if self.ut_height_m >= self.bs_height_m:
                raise ValueError(f"path_loss.ut_height_m ({self.ut_height_m:g} m) must be below "
                                 f"bs_height_m ({self.bs_height_m:g} m)")
        return self

    @property
    def is_3gpp(self) -> bool:
        return self.model in THREE_GPP

    def needs_carrier_frequency(self) -> bool:
        """Whether the model reads the channel's carrier_frequency_hz."""
        return self.model in ("free-space", *THREE_GPP_MODELS) or (
            self.model == "log-distance" and self.reference_loss_db is None)


# ---- formulas -----------------------------------------------------------------------------------

def free_space_db(distance_m, carrier_frequency_hz: float) -> np.ndarray:
    """Friis free-space loss [dB]: 20 log10(4 pi d f_c / c), d [m], f_c [Hz]."""
    d = np.asarray(distance_m, dtype=float)
    return 20.0 * np.log10(4.0 * np.pi * d * carrier_frequency_hz / SPEED_OF_LIGHT_M_S)


def distance_3d(d2d, h_bs: float, h_ut: float) -> np.ndarray:
    """d3D [m] = sqrt(d2D^2 + (h_BS - h_UT)^2)."""
    return np.hypot(np.asarray(d2d, dtype=float), h_bs - h_ut)


def breakpoint_distance_m(h_bs: float, h_ut: float, carrier_frequency_hz: float) -> float:
    """d'_BP [m] = 4 h'_BS h'_UT f_c / c, h' = h - h_E (TR 38.901 Table 7.4.1-1 Note 1)."""
    return 4.0 * (h_bs - H_E_M) * (h_ut - H_E_M) * carrier_frequency_hz / C_38901_M_S


def uma_db(d2d, fc_hz: float, h_bs: float, h_ut: float, los) -> np.ndarray:
    """3GPP UMa path loss [dB] (TR 38.901 Table 7.4.1-1), d2D [m], f_c [Hz], LOS mask."""
    d2d = np.asarray(d2d, dtype=float)
    d3d, f = distance_3d(d2d, h_bs, h_ut), np.log10(fc_hz / 1e9)
    dbp = breakpoint_distance_m(h_bs, h_ut, fc_hz)
    pl1 = 28.0 + 22.0 * np.log10(d3d) + 20.0 * f
    pl2 = 28.0 + 40.0 * np.log10(d3d) + 20.0 * f - 9.0 * np.log10(dbp**2 + (h_bs - h_ut) ** 2)
    pl_los = np.where(d2d <= dbp, pl1, pl2)
    pl_nlos = 13.54 + 39.08 * np.log10(d3d) + 20.0 * f - 0.6 * (h_ut - 1.5)
    return np.where(los, pl_los, np.maximum(pl_los, pl_nlos))


def umi_db(d2d, fc_hz: float, h_bs: float, h_ut: float, los) -> np.ndarray:
    """3GPP UMi-Street Canyon path loss [dB] (TR 38.901 Table 7.4.1-1)."""
    d2d = np.asarray(d2d, dtype=float)
    d3d, f = distance_3d(d2d, h_bs, h_ut), np.log10(fc_hz / 1e9)
    dbp = breakpoint_distance_m(h_bs, h_ut, fc_hz)
    pl1 = 32.4 + 21.0 * np.log10(d3d) + 20.0 * f
    pl2 = 32.4 + 40.0 * np.log10(d3d) + 20.0 * f - 9.5 * np.log10(dbp**2 + (h_bs - h_ut) ** 2)
    pl_los = np.where(d2d <= dbp, pl1, pl2)
    pl_nlos = 35.3 * np.log10(d3d) + 22.4 + 21.3 * f - 0.3 * (h_ut - 1.5)
    return np.where(los, pl_los, np.maximum(pl_los, pl_nlos))


def inh_db(d2d, fc_hz: float, h_bs: float, h_ut: float, los) -> np.ndarray:
    """3GPP InH-Office path loss [dB] (TR 38.901 Table 7.4.1-1)."""
    d3d, f = distance_3d(d2d, h_bs, h_ut), np.log10(fc_hz / 1e9)
    pl_los = 32.4 + 17.3 * np.log10(d3d) + 20.0 * f
    pl_nlos = 38.3 * np.log10(d3d) + 17.30 + 24.9 * f
    return np.where(los, pl_los, np.maximum(pl_los, pl_nlos))


def los_probability(model: str, d2d, office: str = "mixed") -> np.ndarray:
    """P_LOS(d2D) of TR 38.901 Table 7.4.2-1 (outdoor devices; UMa for h_UT <= 13 m)."""
    d = np.maximum(np.asarray(d2d, dtype=float), 1e-9)
    if model == "3gpp-uma":
        return np.where(d <= 18.0, 1.0, 18.0 / d + np.exp(-d / 63.0) * (1.0 - 18.0 / d))
    if model == "3gpp-umi":
        return np.where(d <= 18.0, 1.0, 18.0 / d + np.exp(-d / 36.0) * (1.0 - 18.0 / d))
    if model == "3gpp-inh" and office == "mixed":
        return np.where(d <= 1.2, 1.0, np.where(d < 6.5, np.exp(-(d - 1.2) / 4.7),
                                                 0.32 * np.exp(-(d - 6.5) / 32.6)))
    if model == "3gpp-inh":
        return np.where(d <= 5.0, 1.0, np.where(d <= 49.0, np.exp(-(d - 5.0) / 70.8),
                                                 0.54 * np.exp(-(d - 49.0) / 211.7)))
    raise ValueError(f"model {model!r} has no LOS probability; use one of {THREE_GPP_MODELS}")


def median_path_loss_db(d2d, config: PathLossConfig, carrier_frequency_hz: float | None,
                        los=None) -> np.ndarray:
    """Median path loss [dB] (no shadowing), shape of ``d2d`` [m]; ``los`` for 3GPP models."""
    d = np.asarray(d2d, dtype=float)
    if config.model == "log-distance-km":
        return config.intercept_db + config.slope_db_per_decade * np.log10(d / 1000.0)
    if config.model == "free-space":
        return free_space_db(d, carrier_frequency_hz)
    if config.model == "log-distance":
        d0 = config.reference_distance_m
        pl0 = (config.reference_loss_db if config.reference_loss_db is not None
               else free_space_db(d0, carrier_frequency_hz))
        return pl0 + 10.0 * config.exponent * np.log10(d / d0)
    if los is None:
        if config.los_condition == "stochastic":
            raise ValueError(f"path loss of {config.model} with los_condition 'stochastic' "
                             "needs each device's LOS state: pass los")
        los = config.los_condition == "los"
    los = np.broadcast_to(np.asarray(los, dtype=bool), d.shape)
    formula = {"3gpp-uma": uma_db, "3gpp-umi": umi_db, "3gpp-inh": inh_db}[config.model]
    return formula(d, carrier_frequency_hz, config.bs_height_m, config.ut_height_m, los)


def shadowing_std_db(config: PathLossConfig, los) -> np.ndarray:
    """Shadowing std [dB] per device: the override, else sigma_SF (LOS/NLOS) for 3GPP, else 0."""
    los = np.asarray(los, dtype=bool)
    if config.shadowing_std_db is not None:
        return np.full(los.shape, float(config.shadowing_std_db))
    if config.is_3gpp:
        table = THREE_GPP[config.model]
        return np.where(los, table["sigma_los_db"], table["sigma_nlos_db"])
    return np.zeros(los.shape)


def draw_large_scale(d2d, config: PathLossConfig, carrier_frequency_hz: float | None,
                     rng: np.random.Generator | None):
    """Per device: (median path loss [dB], shadowing [dB], LOS bool), each shape [N].

    Draw order, only where the model needs it: LOS uniforms (3GPP, stochastic), then shadowing
    normals (std > 0). Raises ValueError when a draw is needed and ``rng`` is None.
    """
    d = np.asarray(d2d, dtype=float)
    n = d.size
    los = np.zeros(n, dtype=bool)
    if config.is_3gpp:
        if config.los_condition == "stochastic":
            _need_rng(rng, f"{config.model} draws each device's LOS state")
            los = rng.random(n) < los_probability(config.model, d, config.office or "mixed")
        else:
            los = np.full(n, config.los_condition == "los")
    pl = median_path_loss_db(d, config, carrier_frequency_hz, los)
    sigma = shadowing_std_db(config, los)
    shadow = np.zeros(n)
    if np.any(sigma > 0):
        _need_rng(rng, "log-normal shadowing is drawn once per device")
        shadow = sigma * rng.standard_normal(n)
    return pl, shadow, los


def _need_rng(rng, why: str) -> None:
    if rng is None:
        raise ValueError(f"this channel profile needs a random generator ({why}): pass rng, "
                         "e.g. Cell.from_distances(d, config, rng=keyed_rng(seed, 'placement'))")
