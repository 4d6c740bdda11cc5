"""A channel profile: the cell, path loss, fading, noise, slots and the two links, typed and checked.

Sources: seed 002 is Mhanna and Assaad (2024), "Communication and Energy Efficient Federated
Learning using Zero-Order Optimization Technique"; Sec. V gives the cell. Fields marked [D] are our
defaults where the paper is silent. The catalog file ``channels/seed002-cell.yaml`` cites every value.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    field_validator,
    model_validator,
)

TX_POWER_RANGE_DBM = (-50.0, 60.0)


def _check_tx_power(value: float, link: str) -> float:
    lo, hi = TX_POWER_RANGE_DBM
    if not lo <= value <= hi:
        raise ValueError(f"The 'tx_power_dbm' parameter of the {link} must be a power in dBm in "
                         f"the range [{lo:g}, {hi:g}] (e.g. 23 for a phone, 46 for a macro base "
                         f"station; 60 dBm is already 1 kW). Got {value!r} instead.")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PathLossConfig(_Strict):
    """PL [dB] = intercept_db + slope_db_per_decade * log10(d [km])."""

    # 3GPP TR 36.814 Table A.2.1.1-2, macro cell: 128.1 + 37.6 log10(R [km]).
    intercept_db: float = Field(128.1, description="path loss at 1 km [dB]")
    slope_db_per_decade: float = Field(37.6, description="increase per decade of distance [dB]")


class UplinkConfig(_Strict):
    """Device -> base station: power, dedicated bandwidth, and how rate and delivery are decided."""

    tx_power_dbm: float = Field(
        23.0, description="device transmit power [dBm] (3GPP TS 38.101-1 power class 3: 23)")
    bandwidth_hz: PositiveFloat = Field(
        2e6, description="bandwidth dedicated to each device [Hz] (seed 002, Sec. V: 2 MHz)")
    mode: Literal["adaptive", "fixed", "pinned"] = Field(
        "fixed", description="adaptive: rate follows the faded SNR, always delivered; fixed: "
                             "rate_bps, lost in outage; pinned: rate_bps, delivered w.p. "
                             "delivery_probability")
    rate_bps: PositiveFloat = Field(
        4e6, description="packet rate in fixed and pinned modes [bit/s] ([D] 2 bit/s/Hz)")
    efficiency: float = Field(
        1.0, gt=0, le=1, description="adaptive mode: rate = efficiency * B log2(1 + SNR)")
    delivery_probability: float | None = Field(
        None, gt=0, le=1, description="pinned mode only: p, the seed's delivery probability")
    header_bits: NonNegativeInt = Field(0, description="bits added to every packet [bit]")

    @field_validator("tx_power_dbm")
    @classmethod
    def _power(cls, value: float) -> float:
        return _check_tx_power(value, "uplink")

    @model_validator(mode="after")
    def _pinned_needs_p(self):
        if self.mode == "pinned" and self.delivery_probability is None:
            raise ValueError("mode 'pinned' needs 'delivery_probability', a number in (0, 1]; "
                             "add it (e.g. delivery_probability: 0.9)")
        if self.mode != "pinned" and self.delivery_probability is not None:
            raise ValueError(f"'delivery_probability' is only read in mode 'pinned' but mode is "
                             f"{self.mode!r}; remove it or set mode: pinned")
        return self


class DownlinkConfig(_Strict):
    """Base station -> all devices: a reliable broadcast at the rate the weakest device supports."""

    tx_power_dbm: float = Field(
        46.0, description="base-station transmit power [dBm] (3GPP TR 36.814 Table A.2.1.1-2)")
    bandwidth_hz: PositiveFloat = Field(2e6, description="broadcast bandwidth [Hz] ([D])")
    efficiency: float = Field(
        1.0, gt=0, le=1, description="rate = efficiency * B log2(1 + min_i mean SNR_i)")
    header_bits: NonNegativeInt = Field(0, description="bits added to every broadcast [bit]")

    @field_validator("tx_power_dbm")
    @classmethod
    def _power(cls, value: float) -> float:
        return _check_tx_power(value, "downlink")


class ChannelConfig(_Strict):
    """A complete channel profile (what ``channels/<name>.yaml`` becomes)."""

    name: str = ""
    description: str = ""
    cell_radius_m: PositiveFloat = Field(
        500.0, description="devices lie within this distance of the base station [m] "
                           "(seed 002, Sec. V: 500 m)")
    min_distance_m: NonNegativeFloat = Field(
        10.0, description="no device is closer than this to the base station [m] ([D])")
    path_loss: PathLossConfig = PathLossConfig()
    fading: Literal["rayleigh", "none"] = Field(
        "rayleigh", description="small-scale fading, drawn independently per packet "
                                "(seed 002, Sec. V: Rayleigh)")
    noise_density_dbm_hz: float = Field(
        -173.0, description="thermal noise density N0 [dBm/Hz] (seed 002, Sec. V: -173)")
    slot_s: PositiveFloat = Field(
        0.125e-3, description="airtime granularity [s] (5G NR mu = 3, 3GPP TS 38.211 sec. 4.3.2)")
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
    def _sources_name_fields(self):
        for key in self.sources:
            model: type[BaseModel] | None = type(self)
            for part in key.split("."):
                field = model.model_fields.get(part) if model is not None else None
                if field is None:
                    raise ValueError(f"sources: {key!r} is not a field of the channel profile; "
                                     f"cite a field such as 'uplink.tx_power_dbm'")
                sub = field.annotation
                model = sub if isinstance(sub, type) and issubclass(sub, BaseModel) else None
        return self
