"""A device's compute-energy profile: the parameters of the seed-002 accelerator model.

Sources: seed 002 is Mhanna and Assaad (2024), "Communication and Energy Efficient Federated
Learning using Zero-Order Optimization Technique"; its Sec. III-C gives the model (eqs. 5-10) and
Sec. V the numbers. Fields marked [D] are our defaults where the paper is silent.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    model_validator,
)


class EnergyProfile(BaseModel):
    """Hardware constants that price forward and backward passes [J, s] and downlink reception."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    description: str = ""
    model: Literal["seed002-accelerator"] = Field(
        "seed002-accelerator", description="which compute-energy model reads these numbers")
    # seed 002, Sec. V: A = 3.7 pJ.
    mac_energy_j: PositiveFloat = Field(
        3.7e-12, description="A, energy of one MAC at max_precision_bits [J]")
    # seed 002, Sec. V: mu = 1.25 (Sec. III-C requires 1 < mu < 2).
    mac_exponent: float = Field(
        1.25, gt=1, lt=2, description="mu, E_MAC(M) = A (M / M_max)^mu; must lie in (1, 2)")
    # seed 002, Sec. V: M_max = 32.
    max_precision_bits: PositiveInt = Field(32, description="M_max, the widest MAC precision [bit]")
    # seed 002, Sec. V: A_d = 150.
    dram_to_mac_ratio: PositiveFloat = Field(
        150.0, description="A_d, energy of one DRAM access over one MAC at M_max")
    # seed 002, Sec. V: p = 64 (written p_u here; the paper also uses p for delivery probability).
    mac_units: PositiveInt = Field(64, description="p_u, number of parallel MAC units")
    # seed 002, Sec. V: S = 8 MB, read as 8 MiB = 8 * 2^20 * 8 bits. For the paper CNN the
    # max(d M + O_c M - S, 0) DRAM term is 0 either way (8e6 * 8 bits gives the same result).
    sram_bits: PositiveFloat = Field(
        67108864.0, description="S, on-chip SRAM buffer size [bit]")
    # seed 002, Sec. III: 16e6 operations take ~4 ms on a 4 GHz CPU doing one op per cycle.
    throughput_macs_per_s: PositiveFloat = Field(
        4.0e9, description="MACs per second; sets compute time [MAC/s]")
    # [D] our default: the paper gives no downlink receive power.
    rx_power_w: NonNegativeFloat = Field(
        0.1, description="device receive power while the downlink is on air [W]")
    sources: dict[str, str] = Field(
        default_factory=dict, description="free-text citation per field name")

    @model_validator(mode="after")
    def _sources_name_fields(self):
        unknown = sorted(set(self.sources) - set(type(self).model_fields))
        if unknown:
            raise ValueError(f"sources: {unknown[0]!r} is not a field of the energy profile; "
                             f"cite one of {', '.join(type(self).model_fields)}")
        return self
