"""The radio layer: channel profiles, the cell (placement, path loss, mean SNR) and the two links."""

from wirelessfl.channel.cell import (
    Cell,
    dbm_to_w,
    mean_snr,
    noise_power_dbm,
    path_loss_db,
    place_devices,
    w_to_dbm,
)
from wirelessfl.channel.config import (
    ChannelConfig,
    DownlinkConfig,
    PathLossConfig,
    UplinkConfig,
)
from wirelessfl.channel.link import (
    MIN_RATE_BPS,
    Downlink,
    LinkOutcome,
    Uplink,
    airtime_s,
    capacity_bps,
    fading_power,
    rayleigh_delivery_probability,
)

__all__ = [
    "MIN_RATE_BPS",
    "Cell",
    "ChannelConfig",
    "Downlink",
    "DownlinkConfig",
    "LinkOutcome",
    "PathLossConfig",
    "Uplink",
    "UplinkConfig",
    "airtime_s",
    "capacity_bps",
    "dbm_to_w",
    "fading_power",
    "mean_snr",
    "noise_power_dbm",
    "path_loss_db",
    "place_devices",
    "rayleigh_delivery_probability",
    "w_to_dbm",
]
