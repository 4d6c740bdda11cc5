"""Compute energy (seed-002 accelerator, CMOS and per-operation models), radio energy, populations
of heterogeneous devices and the torch model profiler. See docs/energy.md."""

from wirelessfl.energy.accelerator import (
    backward_energy_j,
    forward_energy_j,
    forward_energy_terms,
    mac_energy_j,
)
from wirelessfl.energy.compute import ComputeModel
from wirelessfl.energy.device import DevicePower
from wirelessfl.energy.population import (
    PopulationCompute,
    class_counts,
    draw_device_classes,
    lognormal_frequencies_hz,
    uniform_frequencies_hz,
)
from wirelessfl.energy.profile import (
    COMPUTE_MODELS,
    CmosProfile,
    EnergyProfile,
    PerOperationProfile,
    Seed002AcceleratorProfile,
)
from wirelessfl.energy.profiler import LayerProfile, ModelProfile, profile_model
from wirelessfl.energy.radio import radio_energy_j, transmit_power_draw_w

__all__ = [
    "COMPUTE_MODELS",
    "CmosProfile",
    "ComputeModel",
    "DevicePower",
    "EnergyProfile",
    "LayerProfile",
    "ModelProfile",
    "PerOperationProfile",
    "PopulationCompute",
    "Seed002AcceleratorProfile",
    "backward_energy_j",
    "class_counts",
    "draw_device_classes",
    "forward_energy_j",
    "forward_energy_terms",
    "lognormal_frequencies_hz",
    "mac_energy_j",
    "profile_model",
    "radio_energy_j",
    "transmit_power_draw_w",
    "uniform_frequencies_hz",
]
