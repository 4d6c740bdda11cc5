"""The model zoo: the seed-002 CNN, an MLP and a logistic (softmax-linear) model.

Models are plain ``torch.nn.Module`` objects; the batched evaluator treats their parameters
functionally (``torch.func.functional_call``), so a model is only ever instantiated once per run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from wirelessfl.errors import UserError


class Seed002CNN(nn.Module):
    """The CNN of seed 002, Sec. V: conv 20@7x7 -> conv 40@7x7 -> 2x2 max-pool -> linear.

    ReLU after each convolution, no padding, stride 1. With a 1x28x28 input and 2 outputs it has
    d = 45,362 parameters and 25,042 activations per sample (spec dzofl.md, section 5).
    """

    def __init__(self, input_shape: Sequence[int] = (1, 28, 28), num_classes: int = 2):
        super().__init__()
        channels, height, width = input_shape
        self.conv1 = nn.Conv2d(channels, 20, kernel_size=7)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(20, 40, kernel_size=7)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        out_h, out_w = (height - 12) // 2, (width - 12) // 2
        if out_h < 1 or out_w < 1:
            raise UserError(
                f"model 'seed002-cnn' needs inputs of at least 14x14 pixels, got {height}x{width}; "
                "use dataset 'digits28' or a 28x28 dataset"
            )
        self.fc = nn.Linear(40 * out_h * out_w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.conv1(x))
        x = self.relu2(self.conv2(x))
        return self.fc(self.flatten(self.pool(x)))


class MLP(nn.Module):
    """A fully connected network with ReLU hidden layers (input flattened)."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (64,)):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def layers(self) -> list[nn.Module]:
        """The modules in the order forward() calls them (lets the evaluator stack devices)."""
        return list(self.net)


class Logistic(nn.Module):
    """Multinomial logistic regression: one linear layer on the flattened input."""

    def __init__(self, input_shape: Sequence[int], num_classes: int):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flatten(x))

    def layers(self) -> list[nn.Module]:
        """The modules in the order forward() calls them (lets the evaluator stack devices)."""
        return [self.flatten, self.fc]


MODEL_NAMES = ("seed002-cnn", "mlp", "logistic")


def build_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    hidden: Sequence[int] = (64,),
    seed: int = 0,
) -> nn.Module:
    """Instantiate a zoo model with deterministic initial weights (``seed``)."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        if name == "seed002-cnn":
            shape = tuple(input_shape)
            if len(shape) != 3:
                raise UserError(
                    f"model 'seed002-cnn' needs image inputs (channels, height, width), got shape "
                    f"{shape}; use dataset 'digits28', 'mnist' or 'fashionmnist'"
                )
            model: nn.Module = Seed002CNN(shape, num_classes)
        elif name == "mlp":
            model = MLP(input_shape, num_classes, hidden)
        elif name == "logistic":
            model = Logistic(input_shape, num_classes)
        else:
            raise UserError(f"unknown model '{name}'; choose one of {', '.join(MODEL_NAMES)}")
    finally:
        torch.random.set_rng_state(generator_state)
    return model


def count_parameters(model: nn.Module) -> int:
    """d, the number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
