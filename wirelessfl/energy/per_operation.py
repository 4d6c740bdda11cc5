"""The per-operation compute model: energy per MAC at the pass's precision plus memory traffic.

Source of every default: M. Horowitz, "Computing's energy problem (and what we can do about it)",
ISSCC 2014, pp. 10-14 (45 nm, 0.9 V): see ``PerOperationProfile`` for each constant.

Precision from M (the scenario's quantization bits): M > 16 -> FP32, 9 <= M <= 16 -> FP16,
M <= 8 -> INT8; a value then occupies the format's width w (32, 16 or 8 bits) in memory.

Forward pass over b samples (N_c, O_c and x_in for the batch, d once):

* compute: N_c E_MAC(format);
* memory: every parameter and every activation moves once, (d + O_c) w bits. The part that fits
  the on-chip buffer, min((d + O_c) w, S), costs SRAM accesses; the rest, max((d + O_c) w - S, 0),
  costs DRAM accesses (as seed 002's eq. 9 spills past S); the input, x_in w bits, is read from
  DRAM. An access moves ``access_bits`` (64) bits, so a bit costs E_access / 64.

Backward pass, at FP32 as seed 002's eq. 10 trains at M_max: 2 N_c FP32 MACs (input and weight
gradients), and parameters and activations are read once and their gradients written once,
2 (d + O_c) 32 bits, split between SRAM and DRAM by the same rule.

Time: N_c / ``throughput_macs_per_s`` forward, 2 N_c / throughput backward.
This is a lower bound on traffic: no re-reads for data reuse beyond one pass.
"""

from __future__ import annotations

from wirelessfl.energy.profile import PerOperationProfile
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.errors import UserError

FORMAT_BITS = {"fp32": 32, "fp16": 16, "int8": 8}
MAX_BITS = 32
BACKWARD_TO_FORWARD_MACS = 2


def precision_for_bits(bits: int) -> str:
    """The arithmetic format of an M-bit pass: 'fp32' (M > 16), 'fp16' (9..16), 'int8' (<= 8)."""
    if bits > 16:
        return "fp32"
    return "fp16" if bits > 8 else "int8"


def mac_energy_j(profile: PerOperationProfile, precision: str) -> float:
    """Energy of one MAC in ``precision`` ('fp32', 'fp16', 'int8') [J]."""
    return {"fp32": profile.mac_energy_fp32_j, "fp16": profile.mac_energy_fp16_j,
            "int8": profile.mac_energy_int8_j}[precision]


def memory_energy_j(profile: PerOperationProfile, footprint_bits: float) -> tuple[float, float]:
    """(SRAM J, DRAM J) to move ``footprint_bits`` once: up to S on chip, the rest off chip."""
    on_chip = min(footprint_bits, profile.sram_bits)
    spill = max(footprint_bits - profile.sram_bits, 0.0)
    return (on_chip * profile.sram_access_energy_j / profile.access_bits,
            spill * profile.dram_access_energy_j / profile.access_bits)


def forward_energy_terms(profile: PerOperationProfile, *, macs: float, activations: float,
                         params: float, input_size: float, bits: int) -> dict[str, float]:
    """``compute``, ``sram`` and ``dram`` energy of one forward pass at M bits [J]."""
    precision = precision_for_bits(bits)
    width = FORMAT_BITS[precision]
    sram, dram = memory_energy_j(profile, (params + activations) * width)
    dram += input_size * width * profile.dram_access_energy_j / profile.access_bits
    return {"compute": macs * mac_energy_j(profile, precision), "sram": sram, "dram": dram}


def backward_energy_terms(profile: PerOperationProfile, *, macs: float, activations: float,
                          params: float) -> dict[str, float]:
    """``compute``, ``sram`` and ``dram`` energy of one backward pass at FP32 [J]."""
    sram, dram = memory_energy_j(profile, (params + activations) * FORMAT_BITS["fp32"])
    return {"compute": BACKWARD_TO_FORWARD_MACS * macs * profile.mac_energy_fp32_j,
            "sram": 2 * sram, "dram": 2 * dram}


def check_bits(profile: PerOperationProfile, bits: int) -> None:
    """M must lie in [1, 32]: the widest format priced is FP32."""
    if not 1 <= bits <= MAX_BITS:
        raise UserError(f"quantization_bits must be in [1, {MAX_BITS}] for the per-operation "
                        f"model (FP32 is its widest format); got {bits}")


def pass_costs(profile: PerOperationProfile, model: ModelProfile, batch: int,
               bits: int) -> tuple[float, float, float, float]:
    """(forward J, backward J, forward s, backward s) of one pass over ``batch`` samples."""
    macs, activations = model.macs(batch), model.activations(batch)
    fwd = forward_energy_terms(profile, macs=macs, activations=activations, params=model.params,
                               input_size=batch * model.input_size, bits=bits)
    bwd = backward_energy_terms(profile, macs=macs, activations=activations, params=model.params)
    rate = profile.throughput_macs_per_s
    return (sum(fwd.values()), sum(bwd.values()), macs / rate,
            BACKWARD_TO_FORWARD_MACS * macs / rate)
