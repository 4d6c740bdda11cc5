"""Heterogeneous populations: per-device compute prices [N], and draws of device classes and clocks.

``PopulationCompute`` has ``ComputeModel``'s four methods but returns arrays [N], device i priced
by the model of its class (and, for CMOS classes, optionally at its own CPU frequency), so the
engine's ``fwd_counts * compute.forward_energy_j(b)`` works unchanged for a mixed population.

The draws take an explicit ``numpy.random.Generator`` and nothing else random, so a scenario seed
fixes them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from wirelessfl.energy import cmos
from wirelessfl.energy.compute import ComputeModel, PassCosts
from wirelessfl.energy.profile import CmosProfile, EnergyProfile
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.errors import UserError


class PopulationCompute(PassCosts):
    """Per-device pass prices: device i by ``models[device_class[i]]``.

    ``frequency_hz`` [N] (optional, every model ``cmos``): device i runs at its own clock, so its
    pass costs kappa C f_i^2 [J] and C / f_i [s] with C its class's cycles.
    """

    def __init__(self, models: Sequence[ComputeModel], device_class,
                 frequency_hz=None):
        self.models = list(models)
        classes = np.asarray(device_class)
        if not self.models:
            raise UserError("PopulationCompute needs at least one ComputeModel")
        if classes.ndim != 1 or (classes.size and not np.issubdtype(classes.dtype, np.integer)):
            raise UserError("device_class must be a 1-D array of integer class indices [N]")
        if classes.size and (classes.min() < 0 or classes.max() >= len(self.models)):
            raise UserError(f"device_class holds indices outside [0, {len(self.models) - 1}] "
                            f"(one per model given)")
        self.device_class = classes.astype(np.int64)
        self.frequency_hz = None
        if frequency_hz is not None:
            f = np.asarray(frequency_hz, dtype=float)
            if f.shape != classes.shape or not np.all(np.isfinite(f)) or np.any(f <= 0):
                raise UserError(f"frequency_hz must be {classes.size} positive clocks [Hz], one "
                                "per device")
            kinds = sorted({m.energy.model for m in self.models} - {"cmos"})
            if kinds:
                raise UserError("per-device CPU frequencies need 'cmos' energy profiles; got "
                                f"model {kinds[0]!r}")
            self.frequency_hz = f
        self._cache: dict[int, tuple[np.ndarray, ...]] = {}

    @classmethod
    def from_profiles(cls, profiles: Sequence[EnergyProfile], model: ModelProfile, bits: int,
                      device_class, frequency_hz=None) -> PopulationCompute:
        """One ``ComputeModel`` per class profile, for the same profiled model and M bits."""
        return cls([ComputeModel(p, model, bits) for p in profiles], device_class, frequency_hz)

    @property
    def num_devices(self) -> int:
        return int(self.device_class.size)

    def _costs(self, batch: int) -> tuple[np.ndarray, ...]:
        """[N] arrays: forward J, backward J, forward s, backward s (read-only, cached)."""
        costs = self._cache.get(batch)
        if costs is None:
            if self.frequency_hz is None:
                table = np.array([m._costs(batch) for m in self.models])  # [classes, 4]
                costs = tuple(table[self.device_class, k] for k in range(4))
            else:
                costs = self._cmos_costs(batch)
            for array in costs:
                array.flags.writeable = False
            self._cache[batch] = costs
        return costs

    def _cmos_costs(self, batch: int) -> tuple[np.ndarray, ...]:
        profiles: list[CmosProfile] = [m.energy for m in self.models]
        cycles = np.array([cmos.forward_cycles(p, m.model, batch)
                           for p, m in zip(profiles, self.models, strict=True)])
        kappa = np.array([p.kappa for p in profiles])[self.device_class]
        fwd = cycles[self.device_class]
        bwd = cmos.BACKWARD_TO_FORWARD_MACS * fwd
        f = self.frequency_hz
        return (cmos.cmos_energy_j(kappa, fwd, f), cmos.cmos_energy_j(kappa, bwd, f),
                cmos.cmos_time_s(fwd, f), cmos.cmos_time_s(bwd, f))


def class_counts(fractions: Sequence[float], num_devices: int) -> np.ndarray:
    """Devices per class [K] summing to N, by largest remainder (Hamilton's method): each class
    gets floor(f_k N), and the devices left over go to the largest fractional parts (ties to the
    earlier class)."""
    f = np.asarray(fractions, dtype=float)
    if f.ndim != 1 or f.size == 0 or not np.all(np.isfinite(f)) or np.any(f < 0):
        raise UserError(f"class fractions must be non-negative numbers; got {list(fractions)}")
    if not math.isclose(f.sum(), 1.0, rel_tol=0, abs_tol=1e-9):
        raise UserError(f"class fractions must sum to 1; they sum to {f.sum():g}")
    if int(num_devices) != num_devices or num_devices < 0:
        raise UserError(f"num_devices must be a non-negative integer; got {num_devices!r}")
    quotas = f * num_devices
    counts = np.floor(quotas).astype(np.int64)
    left = int(num_devices) - int(counts.sum())
    order = np.argsort(-(quotas - counts), kind="stable")
    counts[order[:left]] += 1
    return counts


def draw_device_classes(fractions: Mapping[str, float], num_devices: int,
                        rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
    """(class names, device_class [N]): exact counts by largest remainder, then shuffled.

    ``fractions`` maps a class name (e.g. an energy profile) to its share, e.g.
    ``{"smartphone-soc": 0.3, "mcu-iot": 0.7}``; device_class[i] indexes the names.
    """
    names = list(fractions)
    try:
        counts = class_counts([fractions[n] for n in names], num_devices)
    except UserError as err:
        raise UserError(f"{err} ({', '.join(f'{n}: {fractions[n]}' for n in names)})") from None
    classes = np.repeat(np.arange(len(names), dtype=np.int64), counts)
    return names, rng.permutation(classes)


def uniform_frequencies_hz(num_devices: int, low_hz: float, high_hz: float,
                           rng: np.random.Generator) -> np.ndarray:
    """[N] CPU clocks drawn uniformly from [low_hz, high_hz] [Hz]."""
    if not 0 < low_hz <= high_hz:
        raise UserError(f"need 0 < low_hz <= high_hz; got {low_hz:g}, {high_hz:g}")
    return rng.uniform(low_hz, high_hz, size=int(num_devices))


def lognormal_frequencies_hz(num_devices: int, median_hz: float, sigma: float,
                             rng: np.random.Generator, low_hz: float | None = None,
                             high_hz: float | None = None) -> np.ndarray:
    """[N] CPU clocks median_hz x exp(sigma Z), Z ~ N(0, 1) [Hz], clipped to [low_hz, high_hz]
    when given (a CPU has a top clock)."""
    if not median_hz > 0 or not sigma >= 0:
        raise UserError(f"need median_hz > 0 and sigma >= 0; got {median_hz:g}, {sigma:g}")
    f = rng.lognormal(mean=math.log(median_hz), sigma=sigma, size=int(num_devices))
    if low_hz is not None or high_hz is not None:
        f = np.clip(f, low_hz, high_hz)
    return f
