"""FedAvg with server momentum (FedAvgM), an algorithm in one user file.

Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
Classification", arXiv:1909.06335, 2019, Sec. 3: the server keeps a velocity
v <- beta v + Delta of the averaged client deltas Delta and steps theta <- theta + eta v
(eta = server_lr). With beta = 0 it is FedAvg.

Everything else (local SGD, quantised uploads over the wireless cell, energy) is FedAvg's: only
the server's update changes. Run it against FedAvg from this folder:

    wirelessfl run my-algorithm.yaml

The scenario names it ``my_algorithm:FedAvgM`` (module:attribute, imported from the folder you run
in); docs/plugins.md shows how to install it as a plugin under a short name instead.
"""

import torch
from pydantic import Field

from wirelessfl.algorithms.fedavg import FedAvg, FedAvgParams


class FedAvgMParams(FedAvgParams):
    """FedAvg's parameters plus the server momentum (read from the scenario's entry)."""

    momentum: float = Field(0.9, ge=0, lt=1, description="beta, the server momentum")


class FedAvgM(FedAvg):
    name = "fedavgm"  # the label tables and plots show when the scenario gives none
    Params = FedAvgMParams
    summary = "FedAvg with server momentum: v <- beta v + Delta, theta <- theta + server_lr v"

    def setup(self) -> None:
        super().setup()
        self.velocity = torch.zeros_like(self.theta)

    def apply(self, mean_vector: torch.Tensor) -> None:
        self.velocity = self.params.momentum * self.velocity + mean_vector
        self.theta = self.theta + self.params.server_lr * self.velocity
