"""The typed scenario: what a YAML file becomes once validated and resolved from the catalogs."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from wirelessfl.algorithms.base import AlgorithmParams
from wirelessfl.channel.config import ChannelConfig
from wirelessfl.energy.profile import EnergyProfile
from wirelessfl.errors import UserError
from wirelessfl.learning.datasets import DataConfig
from wirelessfl.learning.models import MODEL_NAMES
from wirelessfl.learning.partition import OPTIONAL_PARAMS, PARAM_DEFAULTS, SCHEME_PARAMS
from wirelessfl.plugins import (
    MODELS,
    PROBLEMS,
    drop_empty_options,
    is_reference,
    name_validator,
    options_field,
)
from wirelessfl.results.health import HealthConfig
from wirelessfl.scenario.names import validated_name
from wirelessfl.scenario.problem_section import ProblemConfig


class _Strict(BaseModel):
    # Unknown keys are typos; NaN and inf are never a meaningful setting (they turned into
    # silent garbage: nothing delivered, NaN energies).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DeviceClassConfig(_Strict):
    """One class of a mixed population: its share of the devices and its hardware. The loader
    looks the profile up in ``energy/`` (the class's name, or ``profile:``) and applies the
    entry's other keys to it, as for the scenario's ``energy``."""

    fraction: float = Field(ge=0, le=1, allow_inf_nan=False,
                            description="share of the N devices in this class")
    energy: EnergyProfile = Field(description="the class's energy profile, resolved")


class CpuFrequencyConfig(_Strict):
    """Per-device CPU clocks of a population of ``cmos`` devices (Yang et al. 2021's f_k)."""

    distribution: Literal["uniform", "lognormal"] = Field(
        description="uniform: f ~ U[low_hz, high_hz]; lognormal: f = median_hz exp(sigma Z), "
                    "clipped to [low_hz, high_hz] when given")
    low_hz: PositiveFloat | None = Field(None, description="lowest clock [Hz]")
    high_hz: PositiveFloat | None = Field(None, description="highest clock [Hz]")
    median_hz: PositiveFloat | None = Field(None, description="lognormal: median clock [Hz]")
    sigma: NonNegativeFloat | None = Field(None, description="lognormal: sigma of ln f")

    @model_validator(mode="after")
    def _params_match_distribution(self):
        needs = {"uniform": ("low_hz", "high_hz"), "lognormal": ("median_hz", "sigma")}
        for key in needs[self.distribution]:
            if getattr(self, key) is None:
                raise ValueError(f"distribution {self.distribution!r} needs '{key}'")
        if self.distribution == "uniform":
            for key in ("median_hz", "sigma"):
                if getattr(self, key) is not None:
                    raise ValueError(f"'{key}' is only read by distribution 'lognormal'; "
                                     "remove it or set distribution: lognormal")
        for key in ("low_hz", "high_hz", "median_hz"):
            value = getattr(self, key)
            if value is not None and value < 1e3:
                raise ValueError(f"'{key}' is in Hz: write e.g. {value:g}e9 for {value:g} GHz")
        if self.low_hz is not None and self.high_hz is not None and self.low_hz > self.high_hz:
            raise ValueError(f"low_hz ({self.low_hz:g}) must not exceed high_hz "
                             f"({self.high_hz:g})")
        return self

    @model_serializer(mode="wrap")
    def _only_given(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}


# Populations up to this size draw each round's randomness from one stream over all devices, as
# every run recorded before cross-device populations did; larger ones key it per device, so a
# round's cost follows its participants, not the registered population [D].
SHARED_STREAMS_MAX_DEVICES = 1000


class PopulationConfig(_Strict):
    num_devices: int = Field(50, gt=0, description="N devices in the cell (seed 002, Sec. V: 50)")
    distances_m: list[float] | None = Field(
        None, description="fixed device distances to the base station [m] instead of random "
                          "placement; its length must equal num_devices")
    classes: dict[str, DeviceClassConfig] | None = Field(
        None, description="a mixed population: energy profile name -> fraction of the devices "
                          "(summing to 1), e.g. {smartphone-soc: 0.3, mcu-iot: 0.7}, or -> "
                          "{fraction: f, <profile fields to override>}; the scenario's energy "
                          "profile is used when absent")
    cpu_frequency: CpuFrequencyConfig | None = Field(
        None, description="per-device CPU clocks drawn for cmos profiles: {distribution: "
                          "uniform, low_hz, high_hz} or {distribution: lognormal, median_hz, "
                          "sigma[, low_hz, high_hz]}")
    random_streams: Literal["shared", "per-device"] | None = Field(
        None, description="how a round's random draws (minibatches, quantiser noise, channels) "
                          "are keyed: shared: one stream per round over all N devices (the "
                          "results of every run recorded before cross-device populations); "
                          "per-device: a stream per (round, device), so a round costs what its "
                          "participants cost; default: shared up to "
                          f"{SHARED_STREAMS_MAX_DEVICES} devices, per-device above [D]")

    @model_validator(mode="after")
    def _distances_match(self):
        if self.distances_m is not None:
            if len(self.distances_m) != self.num_devices:
                raise ValueError(f"distances_m has {len(self.distances_m)} entries but num_devices "
                                 f"is {self.num_devices}; give one distance per device")
            if min(self.distances_m) <= 0:
                raise ValueError("distances_m must all be positive [m]")
        return self

    @model_validator(mode="after")
    def _fractions_sum_to_one(self):
        if self.classes is not None:
            if not self.classes:
                raise ValueError("classes is empty; name at least one energy profile, e.g. "
                                 "{smartphone-soc: 0.3, mcu-iot: 0.7}, or remove it")
            total = sum(c.fraction for c in self.classes.values())
            if not math.isclose(total, 1.0, rel_tol=0, abs_tol=1e-9):
                shares = ", ".join(f"{k}: {c.fraction:g}" for k, c in self.classes.items())
                raise ValueError(f"classes: fractions must sum to 1; they sum to {total:g} "
                                 f"({shares})")
        return self

    @model_serializer(mode="wrap")
    def _only_given(self, handler):
        """Leave the optional sections out when absent (runs recorded before them match)."""
        return {k: v for k, v in handler(self).items()
                if v is not None or k == "distances_m"}

    @property
    def per_device_streams(self) -> bool:
        """True when every random draw of a round is keyed by (round, device) (cross-device
        populations), False for one stream per round over all devices (``random_streams``)."""
        if self.random_streams is None:
            return self.num_devices > SHARED_STREAMS_MAX_DEVICES
        return self.random_streams == "per-device"

    def profiles(self, default: EnergyProfile) -> list[EnergyProfile]:
        """The energy profiles in use: the classes', or ``default`` alone."""
        if self.classes is None:
            return [default]
        return [c.energy for c in self.classes.values()]


class PartitionConfig(_Strict):
    """How the training set is split over devices; each scheme reads only its own parameters
    (``SCHEME_PARAMS``), whose defaults are filled in when the scheme reads them."""

    scheme: Literal["iid", "dirichlet", "shards", "quantity-skew", "label-skew",
                    "client-dirichlet"] = Field(
        "iid", description="iid: equal random shards (seed 002); dirichlet: per-class Dir(alpha) "
                           "label skew; shards: sorted-label shards (McMahan et al. 2017); "
                           "quantity-skew: i.i.d. labels, Dir(beta) sizes; label-skew: exactly "
                           "classes_per_device classes each (Li et al. 2022, #C = k); "
                           "client-dirichlet: a Dir(alpha) label mix per device, rare classes, "
                           "log-normal sizes (fgdro.md Sec. 5)")
    alpha: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description=f"dirichlet, client-dirichlet: concentration (default "
                    f"{PARAM_DEFAULTS['alpha']}); large -> "
                    "i.i.d.-like, small -> one or two classes per device")
    shards_per_device: int | None = Field(
        None, gt=0, description=f"shards: shards per device (default "
                                f"{PARAM_DEFAULTS['shards_per_device']}, McMahan et al. 2017)")
    beta: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description=f"quantity-skew: Dirichlet concentration of device sizes (default "
                    f"{PARAM_DEFAULTS['beta']}); small -> very unequal sizes")
    classes_per_device: int | None = Field(
        None, gt=0, description=f"label-skew: classes each device holds (default "
                                f"{PARAM_DEFAULTS['classes_per_device']})")
    min_samples: int | None = Field(
        None, gt=0, description=f"dirichlet, quantity-skew, client-dirichlet: fewest samples a "
                                f"device may get (default {PARAM_DEFAULTS['min_samples']})")
    rare_classes: list[int] | None = Field(
        None, description="client-dirichlet: labels whose weight in every device's mix is "
                          "multiplied by rare_weight (default none; fgdro.md Sec. 5: [5..9])")
    rare_weight: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description=f"client-dirichlet: weight factor of the rare classes (default "
                    f"{PARAM_DEFAULTS['rare_weight']}, fgdro.md Sec. 5)")
    size_median: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description=f"client-dirichlet: median device size, LogNormal(ln median, sigma) "
                    f"(default {PARAM_DEFAULTS['size_median']:g}, fgdro.md Sec. 5)")
    size_sigma: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description=f"client-dirichlet: sigma of the log device size (default "
                    f"{PARAM_DEFAULTS['size_sigma']}, fgdro.md Sec. 5)")
    samples_per_device: int | None = Field(
        None, gt=0, description="iid, dirichlet, shards, quantity-skew, label-skew: every device "
                                "draws this many samples (the mean size for quantity-skew) from "
                                "the whole training set, independently of the other devices (a "
                                "sample may be on several), keeping the scheme's label skew [D]; "
                                "default: the split of the training set, or, where the population "
                                "outgrows it, the fewest samples the scheme allows a device")

    @model_validator(mode="after")
    def _params_match_scheme(self):
        reads = SCHEME_PARAMS[self.scheme]
        for name in (*PARAM_DEFAULTS, *OPTIONAL_PARAMS):
            if name not in reads and getattr(self, name) is not None:
                readers = [s for s, p in SCHEME_PARAMS.items() if name in p]
                raise ValueError(f"'{name}' is only read by scheme {' or '.join(map(repr, readers))}"
                                 f" but scheme is {self.scheme!r}; remove it or set scheme: "
                                 f"{readers[0]}")
            if name in reads and getattr(self, name) is None and name in PARAM_DEFAULTS:
                setattr(self, name, PARAM_DEFAULTS[name])
        return self

    @model_serializer(mode="wrap")
    def _only_read_params(self, handler):
        """Dump the scheme and the parameters it reads, nothing else (so the resolved scenario
        validates again)."""
        return {k: v for k, v in handler(self).items() if v is not None}

    def params(self) -> dict:
        """The keyword parameters the scheme's partitioner reads, defaults filled in (an
        optional one without a default only when given)."""
        return {name: getattr(self, name) for name in SCHEME_PARAMS[self.scheme]
                if name not in OPTIONAL_PARAMS or getattr(self, name) is not None}


class ModelConfig(_Strict):
    name: str = Field("mlp", description=f"one of {', '.join(MODEL_NAMES)}, a plugin's name "
                                         "(wirelessfl list) or a 'module:attribute' reference")
    hidden: list[int] = Field([64], description="hidden layer widths (mlp only)")
    l2: float = Field(
        0.0, ge=0, allow_inf_nan=False,
        description="weight of l2/2 ||theta||^2 in every f_i (and minibatch loss); with the "
                    "logistic model and l2 > 0, f* is found by a reference solve")
    options: dict[str, Any] = options_field("model")

    _known = field_validator("name")(name_validator(MODELS, (), "model.name"))

    _dump = model_serializer(mode="wrap")(drop_empty_options)

    @model_validator(mode="after")
    def _options_for_plugins(self):
        if self.options and self.name in MODEL_NAMES:
            raise ValueError(f"model.options is read by plugin models only, not by the built-in "
                             f"'{self.name}'; remove it (use model.hidden for mlp)")
        return self

    @field_validator("hidden")
    @classmethod
    def _positive(cls, hidden: list[int]) -> list[int]:
        if any(h <= 0 for h in hidden):
            raise ValueError("hidden layer widths must be positive integers")
        return hidden


class EngineConfig(_Strict):
    mode: Literal["vectorized", "processes"] = Field(
        "vectorized", description="vectorized: one numpy step per synchronous phase (fast); "
                                  "processes: one SimPy process per device (reference)")
    max_chunk_mb: float = Field(1024.0, gt=0, description="memory bound per chunk of devices [MiB]")
    memory_limit_mb: float | None = Field(
        None, gt=0, description="refuse a run whose estimated memory exceeds this [MiB] "
                                "(default: 80 % of the memory available when it starts)")


def _spec(name: str):
    """The registered problem called ``name``; a validation error at ``problem.name`` if none
    (a plain unknown name lists the built-ins, as a Literal field did; a plugin that fails to
    load says why)."""
    try:
        return PROBLEMS.get(name, "problem.name")
    except UserError as err:
        if name in PROBLEMS.names() or is_reference(name):
            error = PydanticCustomError("problem_plugin", "{reason}",
                                        {"reason": str(err).removeprefix("problem.name: ")})
        else:
            *first, last = map(repr, PROBLEMS.names())
            expected = f"{', '.join(first)} or {last}" if first else last
            error = PydanticCustomError(
                "literal_error", "Input should be {expected} (or a problem plugin: registered, "
                "installed, or a 'module:attribute' reference)", {"expected": expected})
        raise ValidationError.from_exception_data(
            "ProblemConfig", [{"type": error, "loc": ("name",), "input": name}]) from None


def _default_problem() -> ProblemConfig:
    return _spec("classification").Config(name="classification")


# Targets that read a rounds column some problems leave NaN: the scenario key -> (the column,
# what it holds). A problem names the columns it leaves NaN in its ``unrecorded`` hook
# (problems/base.py), and the scenario refuses a target on one of them.
TARGET_COLUMNS = {
    "target_grad_norm_sq": ("grad_norm_sq", ""),
    "target_worst_device_accuracy": ("worst_device_accuracy",
                                     " (each device's accuracy on its own label mix)"),
}


def unrecorded_target(scenario: Scenario, key: str) -> str | None:
    """Why the target ``key`` (a ``TARGET_COLUMNS`` key) could never be met in ``scenario``:
    the problem leaves its column NaN (the error's text, naming the fix); None when recorded."""
    column, what = TARGET_COLUMNS[key]
    why = _spec(scenario.problem.name).unrecorded(scenario).get(column)
    if why is None:
        return None
    return f"{key} needs the {column} column{what}, which problem '{scenario.problem.name}' {why}"


class Scenario(_Strict):
    """A complete, resolved scenario: every profile looked up, every default filled in."""

    name: str = Field("", description="names the run's folder, runs/<name>-<time> (default: "
                                       "the file's name); letters, digits and . _ + -")
    description: str = ""
    seed: int = Field(0, ge=0, description="one seed drives placement, data, fading and sampling")
    device: Literal["cpu", "cuda", "auto"] = Field(
        "cpu", description="where the learning compute runs; 'auto' picks cuda when present")
    channel: ChannelConfig
    energy: EnergyProfile
    population: PopulationConfig = PopulationConfig()
    data: DataConfig = DataConfig()
    partition: PartitionConfig = PartitionConfig()
    model: ModelConfig = ModelConfig()
    problem: SerializeAsAny[ProblemConfig] = Field(
        default_factory=_default_problem,
        description="what the algorithms optimise: {name: <problem>, <its keys>}; each problem "
                    "validates its own keys (wirelessfl/problems/, 'wirelessfl list')")
    quantization_bits: int = Field(
        16, ge=1, le=32, description="M, bits per transmitted value and MAC precision "
                                     "(seed 002, Sec. V: 16)")
    target_accuracy: float | None = Field(
        None, gt=0, le=1, description="test accuracy that counts as converged in the summary")
    target_suboptimality: float | None = Field(
        None, gt=0, description="gap f - f* that counts as converged in the summary (problems "
                                "with a known optimum: quadratic, logistic; with "
                                "target_accuracy too, both must hold)")
    target_loss: float | None = Field(
        None, gt=0, description="test loss at or below which a run counts as converged (with "
                                "the other targets, all must hold); a stricter test than "
                                "accuracy on tasks whose accuracy saturates early")
    target_grad_norm_sq: float | None = Field(
        None, gt=0, description="squared gradient norm ||grad f(theta)||^2 (the rounds column "
                                "grad_norm_sq) at or below which a run counts as converged "
                                "(with the other targets, all must hold): the measure where f* "
                                "is unknown (quadratic instance: non-convex, fedred.md A14); "
                                "only for problems that record grad_norm_sq")
    target_worst_device_accuracy: float | None = Field(
        None, gt=0, le=1, description="the worst device's accuracy on its own label mix (the "
                                      "rounds column worst_device_accuracy) at or above which a "
                                      "run counts as converged (with the other targets, all "
                                      "must hold): seed 003's worst-client accuracy target "
                                      "(fgdro.md Sec. 5); only for problems with per-device "
                                      "accuracy (classification, logistic)")
    stop_at_target: bool = Field(
        False, description="end each algorithm at the first evaluated round where every target "
                           "holds (what to-target comparisons and tuning need; final-round "
                           "columns then describe that round)")
    stop_when_unhealthy: bool = Field(
        False, description="end each algorithm at the first evaluated round where its loss has "
                           "grown past health.max_loss_growth times its start: its health "
                           "verdict can no longer be healthy (what tuning studies use to skip "
                           "the rest of a diverging run)")
    worst_fraction: float = Field(
        0.1, gt=0, le=1, description="worst_k_device_accuracy averages the k = max(1, ceil("
                                     "worst_fraction N)) devices with the lowest accuracy")
    energy_accounting: Literal["physical", "paper"] = Field(
        "physical", description="how many forward passes a zeroth-order iteration is charged "
                                "(time and energy): physical, the two queries it makes [D]; "
                                "paper, seed 002's E_FP once per iteration (Sec. III-C)")
    engine: EngineConfig = EngineConfig()
    health: HealthConfig = HealthConfig()
    algorithms: list[SerializeAsAny[AlgorithmParams]] = Field(min_length=1)

    _safe_name = field_validator("name")(validated_name)  # names the run folder

    @field_validator("problem", mode="before")
    @classmethod
    def _problem_section(cls, value):
        """The section is validated by the named problem's own Config (problems/)."""
        if isinstance(value, dict):
            name = value.get("name", "classification")
            if isinstance(name, str):
                return _spec(name).Config.model_validate({**value, "name": name})
        return value

    @model_validator(mode="after")
    def _stop_needs_a_target(self):
        if self.stop_at_target and self.target_accuracy is None \
                and self.target_suboptimality is None and self.target_loss is None \
                and self.target_grad_norm_sq is None \
                and self.target_worst_device_accuracy is None:
            raise ValueError("stop_at_target needs target_accuracy, target_suboptimality, "
                             "target_loss, target_grad_norm_sq or "
                             "target_worst_device_accuracy; set one, or drop stop_at_target")
        return self

    @model_validator(mode="after")
    def _targets_recorded(self):
        """A target on a column the problem leaves NaN (its ``unrecorded`` hook: e.g.
        grad_norm_sq for a classifier without problem.train_metrics, worst_device_accuracy for
        the quadratic) could never be met: refused, naming the fix."""
        for key in TARGET_COLUMNS:
            if getattr(self, key) is not None:
                why = unrecorded_target(self, key)
                if why is not None:
                    raise ValueError(why)
        return self

    @model_serializer(mode="wrap")
    def _without_unset_loss_target(self, handler):
        """target_loss, target_grad_norm_sq and target_worst_device_accuracy are dumped only
        when set, so every scenario written before they existed keeps its resolved document and
        fingerprint (pipeline/fingerprint.py)."""
        doc = handler(self)
        if isinstance(doc, dict):
            for key in ("target_loss", "target_grad_norm_sq", "target_worst_device_accuracy"):
                if key in doc and doc[key] is None:
                    del doc[key]
        return doc

    @model_validator(mode="after")
    def _labels_unique(self):
        labels = [a.display_name for a in self.algorithms]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(f"algorithms: two entries are both called {dupes[0]!r}; give each "
                             "a distinct 'label'")
        return self

    @model_validator(mode="after")
    def _clocks_need_cmos(self):
        """Per-device clocks scale kappa C f^2 and C / f: only the cmos model has a clock."""
        population = self.population
        if population.cpu_frequency is None:
            return self
        names = list(population.classes or {"energy": None})
        for name, profile in zip(names, population.profiles(self.energy), strict=True):
            if profile.model != "cmos":
                where = "energy" if population.classes is None else f"population.classes.{name}"
                raise ValueError(f"population.cpu_frequency needs 'cmos' energy profiles, but "
                                 f"{where} uses model {profile.model!r}; remove cpu_frequency or "
                                 "use a cmos profile (e.g. smartphone-soc)")
        return self

    @model_validator(mode="after")
    def _problem_fits(self):
        """The problem's own rules across sections (its ``ProblemSpec.fit``: e.g. a quadratic has
        one device per client and no data, model or partition section)."""
        _spec(self.problem.name).fit(self)
        return self

