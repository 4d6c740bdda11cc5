"""The radio layer: channel profiles, the cell (placement, path loss, shadowing, mean SNR), fading,
link adaptation and the two links. See docs/radio.md for the models and their sources."""

from wirelessfl.channel.analysis import (
    arq_delivery_probability,
    ergodic_capacity_rayleigh_bps,
    link_budget,
    mean_arq_attempts,
    outage_probability,
)
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
    ArqConfig,
    ChannelConfig,
    DownlinkConfig,
    SpectrumConfig,
    UplinkConfig,
)
from wirelessfl.channel.fading import FadingConfig, FadingProcess, fading_power
from wirelessfl.channel.link import (
    MIN_RATE_BPS,
    Downlink,
    DownlinkOutcome,
    LinkOutcome,
    Uplink,
    airtime_s,
    capacity_bps,
    rayleigh_delivery_probability,
)
from wirelessfl.channel.mcs import McsConfig
from wirelessfl.channel.pathloss import PathLossConfig, los_probability

__all__ = [
    "MIN_RATE_BPS",
    "ArqConfig",
    "Cell",
    "ChannelConfig",
    "Downlink",
    "DownlinkConfig",
    "DownlinkOutcome",
    "FadingConfig",
    "FadingProcess",
    "LinkOutcome",
    "McsConfig",
    "PathLossConfig",
    "SpectrumConfig",
    "Uplink",
    "UplinkConfig",
    "airtime_s",
    "arq_delivery_probability",
    "capacity_bps",
    "dbm_to_w",
    "ergodic_capacity_rayleigh_bps",
    "fading_power",
    "link_budget",
    "los_probability",
    "mean_arq_attempts",
    "mean_snr",
    "noise_power_dbm",
    "outage_probability",
    "path_loss_db",
    "place_devices",
    "rayleigh_delivery_probability",
    "w_to_dbm",
]
