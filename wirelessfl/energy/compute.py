"""Energy [J] and time [s] of forward and backward passes over a batch, for one model on one device.

A pass over b samples is charged for what the batch computes: N_c = b x MACs per sample,
O_c = b x activations per sample, x_in = b x input size (the whole batch is read from DRAM), and
d once. So the paper's Sec. V inputs (N_c of one sample, O_c of a batch of 10) are not both one
pass's counts; see spec dzofl.md, section 5. Forward runs at M bits, backward at M_max (eq. 10).
Time: forward N_c / throughput; backward 2 N_c / throughput (eq. 10 counts 2 N_c MACs: input
gradients and weight gradients).
"""

from __future__ import annotations

import numpy as np

from wirelessfl.energy.accelerator import backward_energy_j, forward_energy_j
from wirelessfl.energy.profile import EnergyProfile
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.errors import UserError


class ComputeModel:
    """Prices passes of a profiled model on an ``EnergyProfile`` device at ``bits`` precision."""

    def __init__(self, energy: EnergyProfile, model: ModelProfile, bits: int):
        if not 1 <= bits <= energy.max_precision_bits:
            raise UserError(f"quantization_bits must be in [1, {energy.max_precision_bits}] (the "
                            f"energy profile's max_precision_bits); got {bits}")
        self.energy = energy
        self.model = model
        self.bits = int(bits)
        self._cache: dict[int, tuple[float, float, float, float]] = {}

    def _costs(self, batch: int) -> tuple[float, float, float, float]:
        """(forward J, backward J, forward s, backward s) of one pass over ``batch`` samples."""
        costs = self._cache.get(batch)
        if costs is None:
            m, e = self.model, self.energy
            macs, activations = m.macs(batch), m.activations(batch)
            costs = (
                forward_energy_j(e, macs=macs, activations=activations, params=m.params,
                                 input_size=batch * m.input_size, bits=self.bits),
                backward_energy_j(e, macs=macs, activations=activations, params=m.params),
                macs / e.throughput_macs_per_s,
                2 * macs / e.throughput_macs_per_s,
            )
            self._cache[batch] = costs
        return costs

    def forward_energy_j(self, batch: int) -> float:
        """Energy of one forward pass over ``batch`` samples at M bits [J] (eqs. 5-9)."""
        return self._costs(batch)[0]

    def backward_energy_j(self, batch: int) -> float:
        """Energy of one backward pass over ``batch`` samples at M_max bits [J] (eq. 10)."""
        return self._costs(batch)[1]

    def forward_time_s(self, batch: int) -> float:
        """Duration of one forward pass over ``batch`` samples [s]."""
        return self._costs(batch)[2]

    def backward_time_s(self, batch: int) -> float:
        """Duration of one backward pass over ``batch`` samples [s]."""
        return self._costs(batch)[3]

    def energy_j(self, forward_passes, backward_passes, batch: int) -> np.ndarray:
        """Per-device compute energy [J] for arrays of pass counts [N], all of ``batch`` samples."""
        e_fwd, e_bwd, _, _ = self._costs(batch)
        return np.asarray(forward_passes) * e_fwd + np.asarray(backward_passes) * e_bwd

    def time_s(self, forward_passes, backward_passes, batch: int) -> np.ndarray:
        """Per-device compute time [s] for arrays of pass counts [N], all of ``batch`` samples."""
        _, _, t_fwd, t_bwd = self._costs(batch)
        return np.asarray(forward_passes) * t_fwd + np.asarray(backward_passes) * t_bwd
