"""Radio energy: the battery's draw while sending or receiving, times the airtime.

Transmit draw = RF output power / PA drain efficiency + transmitter circuit power (the usual
split of a transmitter's consumption into amplifier and electronics of Cui, Goldsmith and Bahai,
"Energy-constrained modulation optimization", IEEE TWC 4(5), 2005, Sec. II: P_PA = (1 + alpha)
P_out with alpha = xi / eta - 1, here with peak-to-average ratio xi = 1, plus circuit power P_c).
With the profile defaults (eta = 1, circuit 0) it is the RF output power, seed 002's reading.
"""

from __future__ import annotations

import numpy as np

from wirelessfl.energy.profile import EnergyProfile


def radio_energy_j(power_w, airtime_s):
    """E = P t [J] from power [W] and airtime [s]; scalars or numpy arrays (broadcast)."""
    return np.multiply(power_w, airtime_s)


def transmit_power_draw_w(rf_output_w, profile: EnergyProfile):
    """DC power the device draws while sending [W]: rf / pa_efficiency + tx_circuit_power_w.

    ``rf_output_w`` [W] is the radiated (antenna) power, a scalar or an array [N].
    """
    return np.asarray(rf_output_w, dtype=float) / profile.pa_efficiency \
        + profile.tx_circuit_power_w
