"""A device's hardware profile: radio, idle and battery figures plus one compute-energy model.

``model:`` picks the compute model and with it the fields that may appear (a discriminated
union on ``model``):

* ``seed002-accelerator``: the 16-bit MAC accelerator of seed 002 (Mhanna and Assaad, 2024,
  "Communication and Energy Efficient Federated Learning using Zero-Order Optimization
  Technique", Sec. III-C eqs. 5-10, numbers of Sec. V) -> ``Seed002AcceleratorProfile``;
* ``cmos``: E = kappa x cycles x f^2, t = cycles / f (Yang et al., IEEE TWC 2021) ->
  ``CmosProfile``;
* ``per-operation``: energy per MAC by precision and per memory access (Horowitz, ISSCC 2014,
  45 nm) -> ``PerOperationProfile``.
* a plugin (an entry point of group ``wirelessfl.compute`` or a ``module:attribute`` reference,
  docs/plugins.md): a subclass of ``EnergyProfile`` with its own fields and a method
  ``pass_costs(model, batch, bits)`` (energy/compute.py prices its passes with it).

``EnergyProfile`` is the common base. Validating or calling it (``EnergyProfile(**doc)``,
``EnergyProfile.model_validate(doc)``, a scenario's ``energy:`` section) returns the subclass that
``model`` names, ``seed002-accelerator`` when ``model`` is absent, so existing profiles load
unchanged. Errors keep their plain key path (``energy.kappa``), without the tag in it.
Fields marked [D] are our defaults where no source gives a number.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from wirelessfl.errors import UserError
from wirelessfl.plugins import COMPUTE, as_value_error

COMPUTE_MODELS = ("seed002-accelerator", "cmos", "per-operation")
_REDUMPING: ContextVar[object] = ContextVar("_REDUMPING", default=None)
DEFAULT_MODEL = "seed002-accelerator"


class EnergyProfile(BaseModel):
    """Hardware figures shared by every compute model: what the radio, the idle device and the
    battery cost or hold [W, J]. Instantiating it builds the subclass named by ``model``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = ""
    description: str = ""
    model: str = Field(
        DEFAULT_MODEL, description="which compute-energy model prices a pass: "
                                   + ", ".join(COMPUTE_MODELS) + ", or a compute plugin's name "
                                   "or 'module:attribute' reference")
    # [D] our default: seed 002 gives no downlink receive power.
    rx_power_w: NonNegativeFloat = Field(
        0.1, description="device draw while the downlink is on air [W]")
    # [D] 0: seed 002 charges no idle power.
    idle_power_w: NonNegativeFloat = Field(
        0.0, description="device draw while it waits for others (not computing, sending or "
                         "receiving) [W]")
    # [D] 0: seed 002 charges the RF output power only.
    tx_circuit_power_w: NonNegativeFloat = Field(
        0.0, description="transmitter electronics while sending, added to RF output / "
                         "pa_efficiency [W]")
    # [D] 1: an ideal amplifier, i.e. the battery pays the RF output power (seed 002's reading).
    pa_efficiency: float = Field(
        1.0, description="power-amplifier drain efficiency in (0, 1]: RF output / DC input")
    battery_j: PositiveFloat | None = Field(
        None, description="per-device energy budget [J]; null = unlimited")
    sources: dict[str, str] = Field(
        default_factory=dict, description="free-text citation per field name")

    _compute_classes: ClassVar[dict[str, type[EnergyProfile]]] = {}

    def __new__(cls, *args, **data):
        # EnergyProfile(model="cmos", ...) builds a CmosProfile: the base is a factory.
        tag = data.get("model", DEFAULT_MODEL)
        target = cls
        if cls is EnergyProfile and isinstance(tag, str):
            target = _compute_class(tag) or cls
        return super().__new__(target)

    @model_validator(mode="wrap")
    @classmethod
    def _dispatch_on_model(cls, data: Any, handler):
        """Validate a mapping as the subclass its ``model`` names (the union's discriminator)."""
        if cls is not EnergyProfile or isinstance(data, EnergyProfile) or not isinstance(data, dict):
            return handler(data)
        tag = data.get("model", DEFAULT_MODEL)
        target = _compute_class(tag) if isinstance(tag, str) else None
        if target is None:  # an unknown model: the error is reported on the 'model' key alone
            return handler({"model": tag})
        return target.model_validate(data)

    @model_validator(mode="before")
    @classmethod
    def _fields_of_another_model(cls, data: Any):
        """A key that belongs to another compute model gets an error that names that model."""
        if cls is EnergyProfile or not isinstance(data, dict):
            return data
        errors = []
        for key in data:
            owners = [name for name, other in EnergyProfile._compute_classes.items()
                      if key not in cls.model_fields and key in other.model_fields]
            if owners:
                errors.append(InitErrorDetails(type=PydanticCustomError(
                    "wrong_compute_model", "belongs to compute model {owners}, not '{model}'; "
                    "remove it or set model: {first}",
                    {"owners": " or ".join(repr(o) for o in owners), "first": owners[0],
                     "model": data.get("model", cls.model_fields["model"].default)}), loc=(key,),
                    input=data[key]))
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return data

    @model_serializer(mode="wrap")
    def _dump_own_fields(self, handler, info) -> dict[str, Any]:
        """Dump every field of the concrete class, also where a field is typed as the base (a
        scenario's ``energy``), so a resolved scenario records the whole profile, and always
        ``model``, so the dump validates back into the same class."""
        if type(self) is EnergyProfile or _REDUMPING.get() is self or info.include or info.exclude:
            return handler(self)
        token = _REDUMPING.set(self)  # the concrete class's serializer calls this hook again
        try:
            data = type(self).__pydantic_serializer__.to_python(
                self, mode=info.mode, by_alias=info.by_alias, exclude_unset=info.exclude_unset,
                exclude_defaults=info.exclude_defaults, exclude_none=info.exclude_none,
                round_trip=info.round_trip)
        finally:
            _REDUMPING.reset(token)
        # The discriminator survives exclude_defaults / exclude_unset.
        return data if "model" in data else {"model": self.model, **data}

    @field_validator("model")
    @classmethod
    def _known_model(cls, tag: str) -> str:
        as_value_error(lambda: COMPUTE.get(tag, "energy.model"), "energy.model")
        return tag

    @field_validator("pa_efficiency")
    @classmethod
    def _efficiency_is_a_fraction(cls, value: float) -> float:
        if not 0 < value <= 1:
            hint = f"; write {value / 100:g} for {value:g} %" if 1 < value <= 100 else ""
            raise ValueError("must be a fraction in (0, 1] (RF output power / DC input power)"
                             f"{hint}")
        return value

    @model_validator(mode="after")
    def _sources_name_fields(self):
        unknown = sorted(set(self.sources) - set(type(self).model_fields))
        if unknown:
            raise ValueError(f"sources: {unknown[0]!r} is not a field of a {self.model!r} energy "
                             f"profile; cite one of {', '.join(type(self).model_fields)}")
        return self


def _compute_class(tag: str) -> type[EnergyProfile] | None:
    """The profile class of compute model ``tag``: a built-in, or a plugin (plugins.COMPUTE);
    None when there is none (the 'model' field's validator then says why)."""
    if tag in EnergyProfile._compute_classes:
        return EnergyProfile._compute_classes[tag]

    try:
        return COMPUTE.get(tag, "energy.model")
    except UserError:
        return None


class Seed002AcceleratorProfile(EnergyProfile):
    """The seed-002 accelerator model (eqs. 5-10): MAC energy A (M / M_max)^mu, buffers, DRAM."""

    model: Literal["seed002-accelerator"] = "seed002-accelerator"
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


class CmosProfile(EnergyProfile):
    """A CPU priced by dynamic CMOS power: E = kappa x cycles x f^2 [J], t = cycles / f [s]."""

    model: Literal["cmos"] = "cmos"
    # Yang et al., IEEE TWC 20(3), 2021, Sec. VI: kappa = 1e-28 (the value most wireless-FL
    # papers use).
    kappa: PositiveFloat = Field(
        1e-28, description="effective switched capacitance [J/(cycle Hz^2)], E = kappa C f^2")
    # [D] 1 GHz: set it per device; every catalog profile gives its own.
    cpu_frequency_hz: PositiveFloat = Field(1.0e9, description="CPU clock f [Hz]")
    # [D] 1, one MAC per cycle, as seed 002's Sec. III example (one operation per cycle).
    cycles_per_mac: PositiveFloat = Field(
        1.0, description="CPU cycles per multiply-accumulate; cycles = cycles_per_mac x MACs")
    cycles_per_sample: PositiveFloat | None = Field(
        None, description="measured cycles of one sample's forward pass; overrides "
                          "cycles_per_mac x MACs (Yang et al.'s C_k)")

    @field_validator("cpu_frequency_hz")
    @classmethod
    def _frequency_in_hz(cls, value: float) -> float:
        if value < 1e3:
            raise ValueError(f"is in Hz: write e.g. {value:g}e9 for {value:g} GHz or {value:g}e6 "
                             f"for {value:g} MHz")
        return value

    @field_validator("kappa")
    @classmethod
    def _kappa_plausible(cls, value: float) -> float:
        if value > 1e-20:
            raise ValueError("is the effective switched capacitance in J/(cycle Hz^2), about "
                             "1e-28 for a phone CPU (Yang et al., 2021); values above 1e-20 are "
                             "not physical")
        return value


class PerOperationProfile(EnergyProfile):
    """Energy per MAC at the pass's precision plus per memory access (Horowitz, ISSCC 2014).

    Figures are Horowitz's 45 nm, 0.9 V numbers (Fig. 1.1.9 of the paper, as commonly reproduced,
    e.g. Han et al., NeurIPS 2015, Table 1); a MAC is one multiply plus one add at the same
    precision. Memory figures are per 64-bit access.
    """

    model: Literal["per-operation"] = "per-operation"
    # Horowitz 2014, 45 nm: FP32 multiply 3.7 pJ + FP32 add 0.9 pJ.
    mac_energy_fp32_j: PositiveFloat = Field(4.6e-12, description="one FP32 MAC [J]")
    # Horowitz 2014, 45 nm: FP16 multiply 1.1 pJ + FP16 add 0.4 pJ.
    mac_energy_fp16_j: PositiveFloat = Field(1.5e-12, description="one FP16 MAC [J]")
    # Horowitz 2014, 45 nm: INT8 multiply 0.2 pJ + INT8 add 0.03 pJ (an INT32 accumulator, as
    # most INT8 kernels use, would add 0.1 pJ instead of 0.03 pJ).
    mac_energy_int8_j: PositiveFloat = Field(0.23e-12, description="one INT8 MAC [J]")
    # Horowitz 2014, 45 nm: 64-bit read of a 1 MB SRAM cache, 100 pJ (8 KB: 10 pJ, 32 KB: 20 pJ).
    sram_access_energy_j: PositiveFloat = Field(
        100e-12, description="one access_bits-wide SRAM access [J]")
    # Horowitz 2014, 45 nm: a 64-bit DRAM access costs 1.3-2.6 nJ; we take 2.0 nJ, about the
    # middle of that range (not a measured point).
    dram_access_energy_j: PositiveFloat = Field(
        2.0e-9, description="one access_bits-wide DRAM access [J]")
    # Horowitz 2014 quotes memory energies per 64-bit access.
    access_bits: PositiveInt = Field(64, description="width of one memory access [bit]")
    # [D] 1 MiB, the size of Horowitz's largest on-chip SRAM figure (1 MB).
    sram_bits: PositiveFloat = Field(
        8388608.0, description="on-chip buffer; traffic beyond it goes to DRAM [bit]")
    # [D] seed 002, Sec. III: 16e6 operations take ~4 ms at 4 GHz, one per cycle.
    throughput_macs_per_s: PositiveFloat = Field(
        4.0e9, description="MACs per second; sets compute time [MAC/s]")


EnergyProfile._compute_classes.update({
    "seed002-accelerator": Seed002AcceleratorProfile,
    "cmos": CmosProfile,
    "per-operation": PerOperationProfile,
})
