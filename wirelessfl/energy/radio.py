"""Radio energy: a constant power drawn for the time the radio is on air."""

from __future__ import annotations

import numpy as np


def radio_energy_j(power_w, airtime_s):
    """E = P t [J] from power [W] and airtime [s]; scalars or numpy arrays (broadcast)."""
    return np.multiply(power_w, airtime_s)
