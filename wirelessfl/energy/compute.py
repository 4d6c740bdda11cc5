"""Energy [J] and time [s] of forward and backward passes over a batch, for one model on one device.

One interface for every compute model (the profile's ``model:``): ``ComputeModel(profile,
model_profile, bits)`` with ``forward_energy_j(b)``, ``backward_energy_j(b)``,
``forward_time_s(b)`` and ``backward_time_s(b)``. Each model prices a pass in its own module:

* ``seed002-accelerator`` (``accelerator.py``, seed 002 eqs. 5-10): forward at M bits, backward
  at M_max; time N_c / throughput forward, 2 N_c / throughput backward (eq. 10 counts 2 N_c MACs:
  input gradients and weight gradients);
* ``cmos`` (``cmos.py``): kappa x cycles x f^2 and cycles / f, backward = 2 x forward;
* ``per-operation`` (``per_operation.py``): MAC energy by precision plus SRAM/DRAM traffic.
* a plugin (energy/profile.py): its profile's own ``pass_costs(model, batch, bits)`` and, when
  it has one, ``check_bits(bits)`` (raise ``ValueError`` for a width it cannot price).

A pass over b samples is charged for what the batch computes: N_c = b x MACs per sample,
O_c = b x activations per sample, x_in = b x input size (the whole batch is read), and d once.
So the paper's Sec. V inputs (N_c of one sample, O_c of a batch of 10) are not both one pass's
counts; see spec dzofl.md, section 5.
"""

from __future__ import annotations

import numpy as np

from wirelessfl.energy import cmos, per_operation
from wirelessfl.energy.accelerator import backward_energy_j, forward_energy_j
from wirelessfl.energy.profile import EnergyProfile, Seed002AcceleratorProfile
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.errors import UserError


def _seed002_check_bits(profile: Seed002AcceleratorProfile, bits: int) -> None:
    if not 1 <= bits <= profile.max_precision_bits:
        raise UserError(f"quantization_bits must be in [1, {profile.max_precision_bits}] (the "
                        f"energy profile's max_precision_bits); got {bits}")


def _seed002_costs(profile: Seed002AcceleratorProfile, model: ModelProfile, batch: int,
                   bits: int) -> tuple[float, float, float, float]:
    macs, activations = model.macs(batch), model.activations(batch)
    return (
        forward_energy_j(profile, macs=macs, activations=activations, params=model.params,
                         input_size=batch * model.input_size, bits=bits),
        backward_energy_j(profile, macs=macs, activations=activations, params=model.params),
        macs / profile.throughput_macs_per_s,
        2 * macs / profile.throughput_macs_per_s,
    )


# model tag -> (check of M, (profile, model, batch, bits) -> (fwd J, bwd J, fwd s, bwd s))
_MODELS = {
    "seed002-accelerator": (_seed002_check_bits, _seed002_costs),
    "cmos": (cmos.check_bits, cmos.pass_costs),
    "per-operation": (per_operation.check_bits, per_operation.pass_costs),
}


def _plugin_check_bits(profile: EnergyProfile, bits: int) -> None:
    check = getattr(profile, "check_bits", None)
    if check is None:
        return
    try:
        check(bits)
    except Exception as err:  # noqa: BLE001 - the plugin's refusal or failure, reported
        raise UserError(f"energy.model: the compute plugin '{profile.model}' cannot price "
                        f"{bits}-bit passes: {type(err).__name__}: {str(err)[:200]}") from None


def _plugin_costs(profile: EnergyProfile, model: ModelProfile, batch: int,
                  bits: int) -> tuple[float, float, float, float]:
    """The plugin's ``pass_costs``, checked: four finite non-negative numbers."""
    where = f"energy.model: the compute plugin '{profile.model}'"
    try:
        costs = tuple(float(c) for c in profile.pass_costs(model, batch, bits))
    except Exception as err:  # noqa: BLE001 - the plugin's own failure, reported as such
        raise UserError(f"{where} failed in pass_costs(model, {batch}, {bits}): "
                        f"{type(err).__name__}: {str(err)[:200]}") from None
    if len(costs) != 4 or not all(np.isfinite(c) and c >= 0 for c in costs):
        raise UserError(f"{where}: pass_costs must return four finite numbers >= 0 (forward J, "
                        f"backward J, forward s, backward s); got {costs}")
    return costs


def _functions(energy: EnergyProfile):
    """(check of M, pass prices) of ``energy``'s compute model, built-in or plugin."""
    return _MODELS.get(energy.model, (_plugin_check_bits, _plugin_costs))


def check_bits(energy: EnergyProfile, bits: int) -> None:
    """Refuse a bit width M that ``energy``'s compute model cannot price (UserError); checked
    when a run prices its passes and, before it starts, by pipeline/preflight.py."""
    _functions(energy)[0](energy, bits)


class PassCosts:
    """What the engine reads: energy and time of one forward or backward pass over a batch, as a
    float (one device model) or an [N] array (a population); subclasses give ``_costs``."""

    def _costs(self, batch: int) -> tuple:
        """(forward J, backward J, forward s, backward s) of one pass over ``batch`` samples."""
        raise NotImplementedError

    def forward_energy_j(self, batch: int) -> float | np.ndarray:
        """Energy of one forward pass over ``batch`` samples at M bits [J]."""
        return self._costs(batch)[0]

    def backward_energy_j(self, batch: int) -> float | np.ndarray:
        """Energy of one backward pass over ``batch`` samples [J]."""
        return self._costs(batch)[1]

    def forward_time_s(self, batch: int) -> float | np.ndarray:
        """Duration of one forward pass over ``batch`` samples [s]."""
        return self._costs(batch)[2]

    def backward_time_s(self, batch: int) -> float | np.ndarray:
        """Duration of one backward pass over ``batch`` samples [s]."""
        return self._costs(batch)[3]

    def device_prices(self, batch, num_devices: int) -> tuple[np.ndarray, ...]:
        """(forward J, backward J, forward s, backward s) of one pass for each device, as [N]
        arrays, or as one value each where every device pays the same (one batch size on one
        device model: the engine broadcasts it, no [N] arrays built per phase); ``batch`` is
        one sample count or [N] counts (a full local gradient passes over each device's own
        m_i samples)."""
        sizes = np.asarray(batch)
        if sizes.ndim and sizes.size and (sizes == sizes.flat[0]).all():
            sizes = sizes.flat[0]  # one batch size for all (every device full): no np.unique
        if sizes.ndim == 0:
            return tuple(np.asarray(c, float) for c in self._costs(int(sizes)))
        out = np.zeros((4, num_devices))
        for value in np.unique(sizes):
            mask = sizes == value
            for k, c in enumerate(self._costs(int(value))):
                out[k, mask] = np.broadcast_to(np.asarray(c, float), (num_devices,))[mask]
        return tuple(out)

    def energy_j(self, forward_passes, backward_passes, batch: int) -> np.ndarray:
        """Per-device compute energy [J] for arrays of pass counts [N], all of ``batch`` samples."""
        e_fwd, e_bwd, _, _ = self._costs(batch)
        return np.asarray(forward_passes) * e_fwd + np.asarray(backward_passes) * e_bwd

    def time_s(self, forward_passes, backward_passes, batch: int) -> np.ndarray:
        """Per-device compute time [s] for arrays of pass counts [N], all of ``batch`` samples."""
        _, _, t_fwd, t_bwd = self._costs(batch)
        return np.asarray(forward_passes) * t_fwd + np.asarray(backward_passes) * t_bwd


class ComputeModel(PassCosts):
    """Prices passes of a profiled model on an ``EnergyProfile`` device at ``bits`` precision."""

    def __init__(self, energy: EnergyProfile, model: ModelProfile, bits: int):
        self._price = _functions(energy)[1]
        check_bits(energy, bits)
        self.energy = energy
        self.model = model
        self.bits = int(bits)
        self._cache: dict[int, tuple[float, float, float, float]] = {}

    def _costs(self, batch: int) -> tuple[float, float, float, float]:
        """(forward J, backward J, forward s, backward s) of one pass over ``batch`` samples."""
        costs = self._cache.get(batch)
        if costs is None:
            costs = tuple(float(c) for c in self._price(self.energy, self.model, batch, self.bits))
            self._cache[batch] = costs
        return costs

