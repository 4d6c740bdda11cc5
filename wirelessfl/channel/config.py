"""A channel profile: the cell, path loss, fading, noise, slots and the two links, typed and checked.

Sources: seed 002 is Mhanna and Assaad (2024), "Communication and Energy Efficient Federated
Learning using Zero-Order Optimization Technique"; Sec. V gives the cell. Fields marked [D] are our
defaults where no source fixes them. The catalog files ``channels/*.yaml`` cite every value; the
models behind the fields are described in ``docs/radio.md``.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_serializer,
    model_validator,
)

from wirelessfl.channel.fading import FadingConfig
from wirelessfl.channel.mcs import McsConfig
from wirelessfl.channel.pathloss import THREE_GPP, PathLossConfig

TX_POWER_RANGE_DBM = (-50.0, 60.0)
# 3GPP TR 38.901 covers 0.5 to 100 GHz (its title and Sec. 7.4.1).
THREE_GPP_FREQUENCY_RANGE_HZ = (0.5e9, 100e9)
# 3GPP TS 38.211 Sec. 4.3.2: numerology mu = 0..4 in data channels, slot = 1 ms / 2^mu.
SUBFRAME_S = 1e-3


def _check_tx_power(value: float, link: str) -> float:
    lo, hi = TX_POWER_RANGE_DBM
    if not lo <= value <= hi:
        raise ValueError(f"The 'tx_power_dbm' parameter of the {link} must be a power in dBm in "
                         f"the range [{lo:g}, {hi:g}] (e.g. 23 for a phone, 46 for a macro base "
                         f"station; 60 dBm is already 1 kW). Got {value!r} instead.")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ArqConfig(_Strict):
    """Retransmission of a lost uplink packet (each attempt a fresh channel, no soft combining)."""

    max_attempts: PositiveInt = Field(
        1, le=32, description="transmissions per packet, first included (1 = no retransmission)")


class SpectrumConfig(_Strict):
    """Dedicated bands, or a shared pool of equal sub-bands that the engine schedules."""

    mode: Literal["dedicated", "shared"] = Field(
        "dedicated", description="dedicated: every device has uplink.bandwidth_hz of its own; "
                                 "shared: a pool split into 'channels' equal sub-bands")
    pool_bandwidth_hz: PositiveFloat | None = Field(
        None, description="shared: total uplink bandwidth of the pool [Hz]")
    channels: PositiveInt | None = Field(
        None, description="shared: number of equal sub-bands (1 = TDMA, default)")
    scheduler: Literal["round-robin", "proportional-fair"] | None = Field(
        None, description="shared: who gets a sub-band first (default round-robin)")

    @model_validator(mode="after")
    def _shared_fields(self):
        extra = [k for k in ("pool_bandwidth_hz", "channels", "scheduler")
                 if getattr(self, k) is not None]
        if self.mode == "dedicated" and extra:
            raise ValueError(f"spectrum.{extra[0]} is only read in mode 'shared' but mode is "
                             "'dedicated'; set spectrum.mode: shared, or remove it (set it to "
                             "null where a profile sets it)")
        if self.mode == "shared":
            if self.pool_bandwidth_hz is None:
                raise ValueError("spectrum mode 'shared' needs 'pool_bandwidth_hz' (the pool's "
                                 "total bandwidth [Hz], e.g. 20e6); add it")
            self.channels = self.channels or 1
            self.scheduler = self.scheduler or "round-robin"
        return self


class AnalogConfig(_Strict):
    """The analog uplink's radio (channel/analog.py; docs/radio.md "Analog uplink"), read by the
    algorithms whose uploads superpose on the air (1P-ZOFL, AirComp); whether the transmitters
    know their channel (the power control) is the algorithm's ``power_control``."""

    truncate_on: Literal["fading", "gain"] = Field(
        "fading", description="truncated inversion: the gain compared with the threshold: "
                              "fading, the small-scale |h|^2 (path loss always inverted); gain, "
                              "the whole large-scale x small-scale gain (Zhu et al.'s rule)")
    threshold_db: float | None = Field(
        None, description="truncated inversion: g_th [dB] (fading: of |h|^2, default -10 dB, "
                          "a tenth of the mean [D]; gain: of the whole path gain, e.g. -120, "
                          "no default)")
    interior_radius_m: PositiveFloat | None = Field(
        None, description="cell-interior scheduling (Zhu et al. 2020, Sec. IV): only devices "
                          "within this distance of the base station transmit (default: all)")

    @model_validator(mode="after")
    def _threshold(self):
        if self.threshold_db is None:
            if self.truncate_on == "gain":
                raise ValueError("truncate_on 'gain' compares the whole path gain (path loss x "
                                 "fading) with threshold_db, which has no default; add it (e.g. "
                                 "threshold_db: -120)")
            self.threshold_db = DEFAULT_FADING_THRESHOLD_DB
        return self


# g_th of truncation on the small-scale gain [dB] [D]: a tenth of its mean, silent w.p.
# 1 - exp(-0.1) = 9.5% under Rayleigh.
DEFAULT_FADING_THRESHOLD_DB = -10.0


class UplinkConfig(_Strict):
    """Device -> base station: power, bandwidth, and how rate and delivery are decided."""

    tx_power_dbm: float = Field(
        23.0, description="device transmit power [dBm] (3GPP TS 38.101-1 power class 3: 23)")
    bandwidth_hz: PositiveFloat = Field(
        2e6, description="dedicated spectrum: bandwidth of each device [Hz] (seed 002, Sec. V: "
                         "2 MHz); ignored in shared mode (see device_bandwidth_hz)")
    noise_figure_db: NonNegativeFloat = Field(
        0.0, description="base-station receiver noise figure [dB], added to the noise density")
    mode: Literal["adaptive", "fixed", "pinned", "mcs"] = Field(
        "fixed", description="adaptive: rate follows the faded SNR, always delivered; fixed: "
                             "rate_bps, lost in outage; pinned: rate_bps, delivered w.p. "
                             "delivery_probability; mcs: 5G NR CQI from the mean SNR, lost "
                             "w.p. BLER(faded SNR)")
    rate_bps: PositiveFloat = Field(
        4e6, description="packet rate in fixed and pinned modes [bit/s] ([D] 2 bit/s/Hz)")
    efficiency: float = Field(
        1.0, gt=0, le=1, description="adaptive mode: rate = efficiency * B log2(1 + SNR / gap)")
    snr_gap_db: NonNegativeFloat = Field(
        0.0, description="adaptive mode: SNR gap Gamma to capacity [dB] (0 = Shannon)")
    delivery_probability: float | None = Field(
        None, gt=0, le=1, description="pinned mode only: p, the seed's delivery probability")
    mcs: McsConfig | None = Field(
        None, description="mcs mode only: back-off, BLER slope, CQI thresholds")
    arq: ArqConfig = ArqConfig()
    spectrum: SpectrumConfig = SpectrumConfig()
    deadline_s: PositiveFloat | None = Field(
        None, description="upload-phase deadline [s] after which a packet counts as lost "
                          "(stored here, enforced by the engine)")
    circuit_power_w: NonNegativeFloat = Field(
        0.0, description="[D] transmitter circuit power while on air [W] (stored for energy work)")
    header_bits: NonNegativeInt = Field(0, description="bits added to every packet [bit]")
    analog: AnalogConfig | None = Field(
        None, description="the analog uplink that algorithms sending by superposition use "
                          "(1P-ZOFL, AirComp): truncation gain and threshold, interior radius "
                          "(default: -10 dB on the fading, every device); the uplink power "
                          "limit is tx_power_dbm")

    @field_validator("tx_power_dbm")
    @classmethod
    def _power(cls, value: float) -> float:
        return _check_tx_power(value, "uplink")

    @property
    def analog_settings(self) -> AnalogConfig:
        """The analog uplink's settings (``analog``, or its defaults)."""
        return self.analog if self.analog is not None else AnalogConfig()

    @model_serializer(mode="wrap")
    def _without_default_analog(self, handler):
        """analog is dumped only when given, so every scenario written before it existed keeps
        its resolved document and fingerprint (pipeline/fingerprint.py)."""
        doc = handler(self)
        if isinstance(doc, dict) and self.analog is None:
            doc.pop("analog", None)
        return doc

    @model_validator(mode="after")
    def _mode_fields(self):
        if self.mode == "pinned" and self.delivery_probability is None:
            raise ValueError("mode 'pinned' needs 'delivery_probability', a number in (0, 1]; "
                             "add it (e.g. delivery_probability: 0.9)")
        if self.mode != "pinned" and self.delivery_probability is not None:
            raise ValueError(f"'delivery_probability' is only read in mode 'pinned' but mode is "
                             f"{self.mode!r}; remove it or set mode: pinned")
        if self.mode != "mcs" and self.mcs is not None:
            raise ValueError(f"'mcs' is only read in mode 'mcs' but mode is {self.mode!r}; "
                             "set mode: mcs, or remove it (set it to null where a profile sets "
                             "it, e.g. --set channel.uplink.mcs=null)")
        if self.mode == "mcs" and self.mcs is None:
            self.mcs = McsConfig()
        return self

    @property
    def device_bandwidth_hz(self) -> float:
        """Bandwidth one device transmits on [Hz]: bandwidth_hz, or pool / channels if shared."""
        sp = self.spectrum
        if sp.mode == "shared":
            return float(sp.pool_bandwidth_hz / sp.channels)
        return float(self.bandwidth_hz)


# EARTH's macro base station (Auer et al., "How much energy is needed to run a wireless
# network?", IEEE Wireless Communications 18(5), 2011, Table 2 and eq. (1)): per transceiver
# (eq. (1) multiplies P_0, Delta_p P_out and P_sleep by N_TRX, and P_max is the RF output of one
# transceiver chain); N_TRX = 6 is 3 sectors x 2 antennas.
EARTH_MACRO = {"n_trx": 6, "p_max_w": 20.0, "p0_w": 130.0, "delta_p": 4.7, "p_sleep_w": 75.0}


class EarthConfig(_Strict):
    """The EARTH load-dependent base-station power model's constants (docs/energy.md): the
    station draws n_trx (p0_w + delta_p P_out) while on air, P_out its transmit power
    (``downlink.tx_power_dbm``, read as the RF output of each transceiver, at most p_max_w),
    and n_trx p_sleep_w while it is not."""

    n_trx: PositiveInt = Field(
        EARTH_MACRO["n_trx"], description="transceiver chains N_TRX (Auer et al. 2011, Table 2, "
                                          "macro: 6 = 3 sectors x 2 antennas)")
    p_max_w: PositiveFloat = Field(
        EARTH_MACRO["p_max_w"], description="maximum RF output power per transceiver P_max [W] "
                                            "(Auer et al. 2011, Table 2, macro: 20 W)")
    p0_w: NonNegativeFloat = Field(
        EARTH_MACRO["p0_w"], description="power draw per transceiver at zero RF output P_0 [W] "
                                         "(Auer et al. 2011, Table 2, macro: 130 W)")
    delta_p: NonNegativeFloat = Field(
        EARTH_MACRO["delta_p"], description="slope of the load-dependent draw Delta_p "
                                            "(Auer et al. 2011, Table 2, macro: 4.7)")
    p_sleep_w: NonNegativeFloat = Field(
        EARTH_MACRO["p_sleep_w"], description="draw per transceiver while not transmitting "
                                              "P_sleep [W] (Auer et al. 2011, Table 2, macro: "
                                              "75 W)")


class DownlinkConfig(_Strict):
    """Base station -> devices: one broadcast at the weakest receiver's rate, or unicasts."""

    tx_power_dbm: float = Field(
        46.0, description="base-station transmit power [dBm] (3GPP TR 36.814 Table A.2.1.1-2)")
    bandwidth_hz: PositiveFloat = Field(2e6, description="downlink bandwidth [Hz] ([D])")
    noise_figure_db: NonNegativeFloat = Field(
        0.0, description="device receiver noise figure [dB], added to the noise density")
    mode: Literal["broadcast", "unicast"] = Field(
        "broadcast", description="broadcast: one transmission at the rate of the weakest "
                                 "intended receiver's mean SNR; unicast: one per receiver at "
                                 "its own mean-SNR rate, one after another")
    loss: bool = Field(
        False, description="false: always received; true: a receiver whose faded SNR cannot "
                           "carry the rate loses the packet")
    efficiency: float = Field(
        1.0, gt=0, le=1, description="rate = efficiency * B log2(1 + mean SNR)")
    header_bits: NonNegativeInt = Field(0, description="bits added to every transmission [bit]")
    circuit_power_w: NonNegativeFloat = Field(
        0.0, description="[D] base-station transmitter circuit power while on air [W], added to "
                         "the transmit power in the base station's energy (energy_bs_j)")
    bs_power_model: Literal["transmit-only", "earth"] = Field(
        "transmit-only", description="the base station's power draw (energy_bs_j): "
                                     "transmit-only, (transmit + circuit power) x airtime; "
                                     "earth, EARTH's load-dependent model (Auer et al. 2011): "
                                     "n_trx (p0_w + delta_p P_out) on air, n_trx p_sleep_w the "
                                     "rest of the simulated time")
    earth: EarthConfig | None = Field(
        None, description="bs_power_model earth only: its constants (default: the macro base "
                          "station of Auer et al. 2011, Table 2)")

    @field_validator("tx_power_dbm")
    @classmethod
    def _power(cls, value: float) -> float:
        return _check_tx_power(value, "downlink")

    @model_validator(mode="after")
    def _power_model_fields(self):
        if self.bs_power_model != "earth":
            if self.earth is not None:
                raise ValueError("'earth' is only read with bs_power_model 'earth' but it is "
                                 f"{self.bs_power_model!r}; set bs_power_model: earth, or "
                                 "remove it (set it to null where a profile sets it)")
            return self
        if self.earth is None:
            self.earth = EarthConfig()
        if self.circuit_power_w:
            raise ValueError("circuit_power_w is the transmit-only model's; with "
                             "bs_power_model 'earth' the circuits are in earth.p0_w; set "
                             "circuit_power_w: 0, or bs_power_model: transmit-only")
        p_out = 10 ** ((self.tx_power_dbm - 30) / 10)
        if p_out > self.earth.p_max_w:
            limit = 10 * math.log10(self.earth.p_max_w) + 30
            raise ValueError(f"bs_power_model 'earth' reads tx_power_dbm as each transceiver's "
                             f"RF output P_out, at most earth.p_max_w = {self.earth.p_max_w:g} W "
                             f"({limit:.2f} dBm); tx_power_dbm {self.tx_power_dbm:g} is "
                             f"{p_out:.4g} W: set tx_power_dbm <= {math.floor(limit * 100) / 100:g}"
                             f" or raise earth.p_max_w")
        return self

    @model_serializer(mode="wrap")
    def _without_default_power_model(self, handler):
        """bs_power_model and earth are dumped only with the earth model, so every scenario
        written before they existed keeps its resolved document and fingerprint
        (pipeline/fingerprint.py)."""
        doc = handler(self)
        if isinstance(doc, dict) and self.bs_power_model == "transmit-only":
            doc.pop("bs_power_model", None)
            doc.pop("earth", None)
        return doc


class ChannelConfig(_Strict):
    """A complete channel profile (what ``channels/<name>.yaml`` becomes)."""

    name: str = ""
    description: str = ""
    cell_radius_m: PositiveFloat = Field(
        500.0, description="devices lie within this ground distance of the base station [m] "
                           "(seed 002, Sec. V: 500 m)")
    min_distance_m: NonNegativeFloat = Field(
        10.0, description="no device is closer than this to the base station [m] ([D])")
    carrier_frequency_hz: PositiveFloat | None = Field(
        None, description="carrier frequency f_c [Hz]; needed by free-space and 3GPP path loss "
                          "and by a Doppler given as a speed")
    path_loss: PathLossConfig = PathLossConfig()
    fading: FadingConfig = Field(
        FadingConfig(), description="small-scale fading (seed 002, Sec. V: Rayleigh per packet)")
    noise_density_dbm_hz: float = Field(
        -173.0, description="thermal noise density N0 [dBm/Hz] (seed 002, Sec. V: -173)")
    slot_s: PositiveFloat = Field(
        0.125e-3, description="airtime granularity [s] (5G NR mu = 3, 3GPP TS 38.211 sec. 4.3.2)")
    numerology: int | None = Field(
        None, ge=0, le=4, description="5G NR numerology mu: slot = 1 ms / 2^mu (TS 38.211 "
                                      "sec. 4.3.2); an alternative to slot_s")
    uplink: UplinkConfig = UplinkConfig()
    downlink: DownlinkConfig = DownlinkConfig()
    sources: dict[str, str] = Field(
        default_factory=dict, description="free-text citation per field (dotted path allowed)")

    @model_validator(mode="after")
    def _geometry(self):
        if self.min_distance_m >= self.cell_radius_m:
            raise ValueError(f"min_distance_m ({self.min_distance_m:g} m) must be smaller than "
                             f"cell_radius_m ({self.cell_radius_m:g} m)")
        return self

    @model_validator(mode="after")
    def _slot(self):
        mu = self.numerology
        if mu is not None:
            slot = SUBFRAME_S / 2**mu
            if "slot_s" in self.model_fields_set and not math.isclose(self.slot_s, slot,
                                                                       rel_tol=1e-9):
                raise ValueError(f"slot_s ({self.slot_s:g} s) disagrees with numerology {mu} "
                                 f"(slot = 1 ms / 2^{mu} = {slot:g} s, TS 38.211 sec. 4.3.2); "
                                 f"give only one of them, or set slot_s: {slot:g}")
            if "slot_s" not in self.model_fields_set:
                self.slot_s = slot
        return self

    @model_validator(mode="after")
    def _carrier(self):
        fc = self.carrier_frequency_hz
        pl = self.path_loss
        if fc is None and pl.needs_carrier_frequency():
            raise ValueError(f"path_loss model {pl.model!r} needs 'carrier_frequency_hz' (the "
                             "carrier frequency [Hz], e.g. 3.5e9); add it at the channel level")
        if fc is None and self.fading.speed_mps is not None:
            raise ValueError("fading.speed_mps needs 'carrier_frequency_hz' for the Doppler "
                             "shift f_D = v f_c / c; add it, or give fading.doppler_hz instead")
        if pl.is_3gpp:
            lo, hi = THREE_GPP_FREQUENCY_RANGE_HZ
            if not lo <= fc <= hi:
                raise ValueError(f"carrier_frequency_hz must be in [0.5e9, 100e9] Hz for "
                                 f"{pl.model} (3GPP TR 38.901); got {fc:g}")
            dmin, dmax = THREE_GPP[pl.model]["distance_range_m"]
            if pl.model == "3gpp-inh":
                far = math.hypot(self.cell_radius_m, pl.bs_height_m - pl.ut_height_m)
                if far > dmax:
                    raise ValueError(f"3gpp-inh is defined for d3D <= {dmax:g} m (TR 38.901 "
                                     f"Table 7.4.1-1) but the cell edge is at d3D = {far:.4g} m; "
                                     "lower cell_radius_m")
            elif self.min_distance_m < dmin or self.cell_radius_m > dmax:
                raise ValueError(f"{pl.model} is defined for {dmin:g} m <= d2D <= {dmax:g} m "
                                 "(TR 38.901 Table 7.4.1-1); set min_distance_m >= "
                                 f"{dmin:g} and cell_radius_m <= {dmax:g}")
        if self.fading.k_factor_applies_to == "los" and not pl.is_3gpp:
            raise ValueError("fading.k_factor_applies_to 'los' needs a path-loss model with LOS "
                             "states (3gpp-uma, 3gpp-umi, 3gpp-inh); use 'all' or change "
                             "path_loss.model")
        return self

    @model_validator(mode="after")
    def _sources_name_fields(self):
        for key in self.sources:
            model: type[BaseModel] | None = type(self)
            for part in key.split("."):
                field = model.model_fields.get(part) if model is not None else None
                if field is None:
                    raise ValueError(f"sources: {key!r} is not a field of the channel profile; "
                                     f"cite a field such as 'uplink.tx_power_dbm'")
                model = _submodel(field.annotation)
        return self


def _submodel(annotation) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (``X`` or ``X | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        for arg in typing.get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    return None
