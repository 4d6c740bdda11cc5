"""Compute energy (seed-002 accelerator model), radio energy and the torch model profiler."""

from wirelessfl.energy.accelerator import (
    backward_energy_j,
    forward_energy_j,
    forward_energy_terms,
    mac_energy_j,
)
from wirelessfl.energy.compute import ComputeModel
from wirelessfl.energy.profile import EnergyProfile
from wirelessfl.energy.profiler import ModelProfile, profile_model
from wirelessfl.energy.radio import radio_energy_j

__all__ = [
    "ComputeModel",
    "EnergyProfile",
    "ModelProfile",
    "backward_energy_j",
    "forward_energy_j",
    "forward_energy_terms",
    "mac_energy_j",
    "profile_model",
    "radio_energy_j",
]
