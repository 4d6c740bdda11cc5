"""5G NR link adaptation: the CQI table, SNR thresholds at 10 % BLER, and a logistic BLER curve.

Spectral efficiencies: 3GPP TS 38.214 Table 5.2.2.1-2 (4-bit CQI table 1, QPSK to 64QAM; identical
to LTE's TS 36.213 Table 7.2.3-1). SNR thresholds: the AWGN link-level SNRs [dB] at which each CQI
reaches 10 % BLER, as tabulated for the LTE/NR CQI table 1 by J. Fan, Q. Yin, G. Y. Li, B. Peng and
X. Zhu, "MCS selection for throughput improvement in downlink LTE systems", Proc. IEEE ICCCN 2011
(the values widely reused in system-level studies); a profile may replace them
(``uplink.mcs.snr_thresholds_db``) with its own receiver's numbers.

BLER model [D]: BLER(x) = 1 / (1 + 9 exp(s (x - x_q))), x the SNR [dB], x_q the CQI's threshold,
s the slope [1/dB]; BLER(x_q) = 0.1 exactly, falling from 0.9 to 0.01 over (ln 81 + ln 11) / s dB.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, field_validator
from scipy import special

# TS 38.214 Table 5.2.2.1-2: efficiency [bit/s/Hz] of CQI 1..15 (code rate x 1024 / 1024 x Qm).
CQI_EFFICIENCY = np.array([0.1523, 0.2344, 0.3770, 0.6016, 0.8770, 1.1758, 1.4766, 1.9141,
                           2.4063, 2.7305, 3.3223, 3.9023, 4.5234, 5.1152, 5.5547])
CQI_MODULATION = ("QPSK",) * 6 + ("16QAM",) * 3 + ("64QAM",) * 6
# SNR [dB] at 10 % BLER of CQI 1..15, AWGN (Fan et al., ICCCN 2011; see the module docstring).
CQI_SNR_THRESHOLDS_DB = (-6.7, -4.7, -2.3, 0.2, 2.4, 4.3, 5.9, 8.1, 10.3, 11.7, 14.1, 16.3, 18.7,
                         21.0, 22.7)
TARGET_BLER = 0.1  # the thresholds' operating point (TS 38.214 Sec. 5.2.2.1: CQI at BLER <= 0.1)


class McsConfig(BaseModel):
    """Link adaptation from the mean SNR and the block-error curve of each CQI."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    backoff_db: float = Field(
        0.0, description="[D] margin subtracted from the mean SNR before choosing the CQI [dB]; "
                         "the transmitter knows the mean SNR, not the fading")
    bler_slope_per_db: PositiveFloat = Field(
        2.0, description="[D] steepness s of the logistic BLER curve [1/dB]")
    snr_thresholds_db: list[float] = Field(
        list(CQI_SNR_THRESHOLDS_DB), description="SNR [dB] at 10 % BLER of CQI 1..15 "
                                                 "(default: Fan et al., ICCCN 2011)")

    @field_validator("snr_thresholds_db")
    @classmethod
    def _fifteen_increasing(cls, value: list[float]) -> list[float]:
        if len(value) != 15 or any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError("snr_thresholds_db must list 15 strictly increasing SNRs [dB], one "
                             f"per CQI 1..15; got {len(value)} values")
        return value


def select_cqi(mean_snr_db, config: McsConfig) -> np.ndarray:
    """CQI [N] (int, 0 = out of range): the highest whose threshold <= mean SNR - back-off [dB]."""
    x = np.asarray(mean_snr_db, dtype=float) - config.backoff_db
    return np.searchsorted(np.asarray(config.snr_thresholds_db), x, side="right").astype(np.int64)


def cqi_efficiency(cqi) -> np.ndarray:
    """Spectral efficiency [bit/s/Hz] of each CQI; CQI 0 (outage) is charged CQI 1's."""
    return CQI_EFFICIENCY[np.maximum(np.asarray(cqi, dtype=np.int64), 1) - 1]


def carried_rate_range_bps(bandwidth_hz: float) -> tuple[float, float]:
    """The lowest and highest rate [bit/s] the CQI table carries on ``bandwidth_hz`` [Hz]:
    CQI 1's and CQI 15's efficiency x B (TS 38.214 Table 5.2.2.1-2), the rates ``mcs`` mode can
    pick (``cqi_efficiency``). No MCS of the table sends faster on that band, none slower
    (wirelessfl crossover bounds its rate axis by it)."""
    low, high = cqi_efficiency([1, len(CQI_EFFICIENCY)]) * float(bandwidth_hz)
    return float(low), float(high)


def bler(snr_db, threshold_db, slope_per_db: float) -> np.ndarray:
    """BLER = 1 / (1 + 9 exp(s (snr_db - threshold_db))); 0.1 at the threshold."""
    z = slope_per_db * (np.asarray(snr_db, dtype=float) - np.asarray(threshold_db, dtype=float))
    return special.expit(-(z + math.log(9.0)))


def snr_db(snr) -> np.ndarray:
    """Linear SNR -> dB (0 -> -inf, without a warning)."""
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(np.asarray(snr, dtype=float))
