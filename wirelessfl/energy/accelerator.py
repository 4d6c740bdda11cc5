"""The seed-002 accelerator energy model (seed 002, Sec. III-C, eqs. 5-10, after its refs [19, 20]).

Symbols: N_c MACs (``macs``), O_c activations (``activations``), d parameters (``params``), x_in
input elements (``input_size``), M the MAC precision (``bits``), and from the profile A, mu, M_max,
A_d, p_u and S (the SRAM size, in bits, as are d M and O_c M). The counts are whatever the pass
computes: the caller scales them for a batch (see ``compute.ComputeModel``).
"""

from __future__ import annotations

import math

from wirelessfl.energy.profile import EnergyProfile, Seed002AcceleratorProfile
from wirelessfl.errors import UserError


def _seed002(profile: EnergyProfile) -> Seed002AcceleratorProfile:
    if not isinstance(profile, Seed002AcceleratorProfile):
        raise UserError(f"energy profile '{profile.name or profile.model}' uses the "
                        f"'{profile.model}' compute model, not the seed-002 accelerator model "
                        "(eqs. 5-10); price it with ComputeModel (e.g. 'wirelessfl profile MODEL "
                        f"--energy {profile.name or 'PROFILE'}')")
    return profile


def mac_energy_j(profile: EnergyProfile, bits: float) -> float:
    """E_MAC(M) = A (M / M_max)^mu, energy of one MAC at M bits [J] (seed 002, Sec. III-C)."""
    profile = _seed002(profile)
    return profile.mac_energy_j * (bits / profile.max_precision_bits) ** profile.mac_exponent


def forward_energy_terms(profile: EnergyProfile, *, macs: float, activations: float,
                         params: float, input_size: float, bits: float) -> dict[str, float]:
    """The four terms of E_FP [J]: ``computing`` (eq. 6), ``weights`` E_w (eq. 7),
    ``activations`` E_b (eq. 8) and ``dram`` (eq. 9)."""
    profile = _seed002(profile)
    e_m = mac_energy_j(profile, bits)
    e_max = mac_energy_j(profile, profile.max_precision_bits)  # = A
    buffer = e_m * macs * math.sqrt(bits / (profile.mac_units * profile.max_precision_bits))
    spill_bits = max(params * bits + activations * bits - profile.sram_bits, 0.0)
    return {
        "computing": e_m * macs + 3 * activations * e_max,
        "weights": 2 * e_m * params + buffer,
        "activations": 2 * e_m * activations + buffer,
        "dram": (profile.dram_to_mac_ratio * e_max * input_size
                 + 2 * profile.dram_to_mac_ratio * e_m * spill_bits),
    }


def forward_energy_j(profile: EnergyProfile, *, macs: float, activations: float, params: float,
                     input_size: float, bits: float) -> float:
    """E_FP = E_computing + E_w + E_b + E_DRAM, one forward pass at M bits [J] (eq. 5)."""
    terms = forward_energy_terms(profile, macs=macs, activations=activations, params=params,
                                 input_size=input_size, bits=bits)
    return terms["computing"] + terms["weights"] + terms["activations"] + terms["dram"]


def backward_energy_j(profile: EnergyProfile, *, macs: float, activations: float,
                      params: float) -> float:
    """E_BP, one backward pass at M_max bits [J] (eq. 10)."""
    profile = _seed002(profile)
    e_max = mac_energy_j(profile, profile.max_precision_bits)  # = A
    m_max = profile.max_precision_bits
    spill_bits = max(params * m_max + activations * m_max - profile.sram_bits, 0.0)
    return (2 * macs * e_max + 2 * activations * e_max + params * e_max
            + 2 * macs * e_max * math.sqrt(1 / profile.mac_units)
            + 2 * profile.dram_to_mac_ratio * e_max * spill_bits)
