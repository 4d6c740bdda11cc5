"""The typed scenario: what a YAML file becomes once validated and resolved from the catalogs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator, model_validator

from wirelessfl.algorithms.base import AlgorithmParams
from wirelessfl.channel.config import ChannelConfig
from wirelessfl.energy.profile import EnergyProfile
from wirelessfl.learning.datasets import DataConfig
from wirelessfl.learning.models import MODEL_NAMES


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PopulationConfig(_Strict):
    num_devices: int = Field(50, gt=0, description="N devices in the cell (seed 002, Sec. V: 50)")
    distances_m: list[float] | None = Field(
        None, description="fixed device distances to the base station [m] instead of random "
                          "placement; its length must equal num_devices")

    @model_validator(mode="after")
    def _distances_match(self):
        if self.distances_m is not None:
            if len(self.distances_m) != self.num_devices:
                raise ValueError(f"distances_m has {len(self.distances_m)} entries but num_devices "
                                 f"is {self.num_devices}; give one distance per device")
            if min(self.distances_m) <= 0:
                raise ValueError("distances_m must all be positive [m]")
        return self


class PartitionConfig(_Strict):
    scheme: Literal["iid"] = Field("iid", description="how training data is split over devices")


class ModelConfig(_Strict):
    name: str = Field("mlp", description=f"one of {', '.join(MODEL_NAMES)}")
    hidden: list[int] = Field([64], description="hidden layer widths (mlp only)")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in MODEL_NAMES:
            raise ValueError(f"unknown model '{name}'; choose one of {', '.join(MODEL_NAMES)}")
        return name

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


class Scenario(_Strict):
    """A complete, resolved scenario: every profile looked up, every default filled in."""

    name: str = ""
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
    quantization_bits: int = Field(
        16, ge=1, le=32, description="M, bits per transmitted value and MAC precision "
                                     "(seed 002, Sec. V: 16)")
    target_accuracy: float | None = Field(
        None, gt=0, le=1, description="test accuracy that counts as converged in the summary")
    engine: EngineConfig = EngineConfig()
    algorithms: list[SerializeAsAny[AlgorithmParams]] = Field(min_length=1)

    @model_validator(mode="after")
    def _labels_unique(self):
        labels = [a.display_name for a in self.algorithms]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(f"algorithms: two entries are both called {dupes[0]!r}; give each "
                             "a distinct 'label'")
        return self
