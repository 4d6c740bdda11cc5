"""The CMOS dynamic-power compute model: E = kappa x cycles x f^2 [J], t = cycles / f [s].

Yang, Chen, Saad, Hong and Shikh-Bahaei, "Energy Efficient Federated Learning Over Wireless
Communication Networks", IEEE Trans. Wireless Commun. 20(3), 2021, Sec. II-B: user k computing
C_k cycles per sample on D_k samples at CPU frequency f_k spends C_k D_k / f_k seconds and
kappa C_k D_k f_k^2 joules, kappa being the chip's effective switched capacitance (kappa = 1e-28
in its Sec. VI). The energy per cycle kappa f^2 is dynamic CMOS power P = kappa f^3 (supply
voltage scaled with the clock) divided by f cycles per second, so a profile's kappa can be read
off a measured power: kappa = P / f^3.

Cycles of a forward pass over b samples: ``cycles_per_sample`` x b when the profile gives it (a
measured C_k), else ``cycles_per_mac`` x N_c(b). A backward pass costs
``BACKWARD_TO_FORWARD_MACS`` = 2 forward passes (gradients with respect to the inputs and to the
weights each take one forward's MACs; seed 002's eq. 10 counts 2 N_c likewise). The precision M
does not enter: this model prices cycles, whatever their width. Only the core's dynamic energy is
counted; a board's static draw while computing is not in it.
"""

from __future__ import annotations

from wirelessfl.energy.profile import CmosProfile
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.errors import UserError

BACKWARD_TO_FORWARD_MACS = 2  # backward = input gradients + weight gradients, one N_c each


def cmos_energy_j(kappa, cycles, frequency_hz):
    """kappa C f^2 [J] for C cycles at f [Hz] (Yang et al. 2021, Sec. II-B); arrays broadcast."""
    return kappa * cycles * frequency_hz ** 2


def cmos_time_s(cycles, frequency_hz):
    """C / f [s] for C cycles at f [Hz]; arrays broadcast."""
    return cycles / frequency_hz


def forward_cycles(profile: CmosProfile, model: ModelProfile, batch: int) -> float:
    """CPU cycles of one forward pass over ``batch`` samples."""
    macs = model.macs(batch)  # also checks that batch is a positive integer
    if profile.cycles_per_sample is not None:
        return profile.cycles_per_sample * batch
    return profile.cycles_per_mac * macs


def check_bits(profile: CmosProfile, bits: int) -> None:
    """M must be a positive bit count; the CMOS model does not use it."""
    if bits < 1:
        raise UserError(f"quantization_bits must be a positive number of bits; got {bits}")


def pass_costs(profile: CmosProfile, model: ModelProfile, batch: int,
               bits: int) -> tuple[float, float, float, float]:
    """(forward J, backward J, forward s, backward s) of one pass over ``batch`` samples."""
    f = profile.cpu_frequency_hz
    fwd = forward_cycles(profile, model, batch)
    bwd = BACKWARD_TO_FORWARD_MACS * fwd
    return (cmos_energy_j(profile.kappa, fwd, f), cmos_energy_j(profile.kappa, bwd, f),
            cmos_time_s(fwd, f), cmos_time_s(bwd, f))
