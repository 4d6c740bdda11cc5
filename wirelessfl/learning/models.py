"""The model zoo: the seed-002 CNN, an MLP, a logistic (softmax-linear) model and ResNet-18 (CIFAR).

Models are plain ``torch.nn.Module`` objects; the batched evaluator treats their parameters
functionally (``torch.func.functional_call``), so a model is only ever instantiated once per run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from wirelessfl.errors import UserError
from wirelessfl.plugins import MODELS


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

    def layers(self) -> list[nn.Module]:
        """The modules in the order forward() calls them (lets the evaluator run the devices'
        passes layer by layer, learning/conv_chain.py)."""
        return [self.conv1, self.relu1, self.conv2, self.relu2, self.pool, self.flatten, self.fc]


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


class BasicBlock(nn.Module):
    """ResNet's basic block: 3x3 conv-BN-ReLU, 3x3 conv-BN, plus the shortcut, then ReLU.

    The shortcut is the identity, or a 1x1 convolution with BN when the stride or the width
    changes (He et al., 2016, option B).
    """

    def __init__(self, in_channels: int, channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(channels))
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + self.shortcut(x))


class ResNet18Cifar(nn.Module):
    """ResNet-18 for 32x32 images (He, Zhang, Ren and Sun, "Deep Residual Learning for Image
    Recognition", CVPR 2016, Table 1's 18-layer net, as adapted for CIFAR in kuangliu/pytorch-cifar,
    models/resnet.py): a 3x3 stride-1 stem with no max-pool, BasicBlocks [2, 2, 2, 2] of
    64/128/256/512 channels (stride 2 from the second stage on, 1x1 stride-2 downsampling with
    BN), global average pooling and a linear classifier.

    For a 3x32x32 input and 10 classes: d = 11,173,962 parameters and 555,422,720 MACs per sample
    in the convolutions and the linear layer (tests/test_profiler.py derives both by hand).
    """

    def __init__(self, input_shape: Sequence[int] = (3, 32, 32), num_classes: int = 10):
        super().__init__()
        channels = input_shape[0]
        self.conv1 = nn.Conv2d(channels, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        stages, width = [], 64
        for out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(width, out, stride), BasicBlock(out, out, 1)))
            width = out
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.flatten(self.pool(x)))


def seed002_cnn(input_shape: Sequence[int], num_classes: int, **_: object) -> nn.Module:
    """The CNN of seed 002, Sec. V (image inputs of at least 14x14)."""
    shape = tuple(input_shape)
    if len(shape) != 3:
        raise UserError(
            f"model 'seed002-cnn' needs image inputs (channels, height, width), got shape "
            f"{shape}; use dataset 'digits28', 'mnist', 'fashionmnist' or 'cifar10'"
        )
    return Seed002CNN(shape, num_classes)


def mlp(input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (64,),
        **_: object) -> nn.Module:
    """A fully connected ReLU network of model.hidden widths."""
    return MLP(input_shape, num_classes, hidden)


def logistic(input_shape: Sequence[int], num_classes: int, **_: object) -> nn.Module:
    """Multinomial logistic regression."""
    return Logistic(input_shape, num_classes)


def resnet18_cifar(input_shape: Sequence[int], num_classes: int, **_: object) -> nn.Module:
    """ResNet-18 for 32x32 images (He et al., 2016; CIFAR variant)."""
    shape = tuple(input_shape)
    if len(shape) != 3 or min(shape[1:]) < 8:
        raise UserError(
            f"model 'resnet18-cifar' needs image inputs (channels, height, width) of at "
            f"least 8x8 pixels, got shape {shape}; it is built for 3x32x32 (CIFAR-10)"
        )
    return ResNet18Cifar(shape, num_classes)


# The built-in models' names, as plugins.MODELS declares them (kept for imports of old).
MODEL_NAMES = ("seed002-cnn", "mlp", "logistic", "resnet18-cifar")


def build_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    hidden: Sequence[int] = (64,),
    seed: int = 0,
    options: dict | None = None,
    device: str | None = None,
) -> nn.Module:
    """Instantiate the model ``name`` (a built-in, a plugin or a ``module:attribute`` reference,
    plugins.MODELS) with deterministic initial weights: the builder runs under
    ``torch.manual_seed(seed)``, the global generator restored afterwards. Built-ins get
    ``hidden``; a plugin gets ``model.options`` as keyword arguments. A plugin that raises or
    returns something other than a ``torch.nn.Module`` is one ``UserError`` naming it.
    ``device="meta"``: parameters without storage (shapes only), for counting a model's size
    before a run without allocating it."""
    builder = MODELS.get(name, "model.name")
    builtin = name in MODEL_NAMES
    kwargs = {"hidden": tuple(hidden)} if builtin else dict(options or {})
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        if device is None:
            model = builder(tuple(input_shape), int(num_classes), **kwargs)
        else:
            with torch.device(device):
                model = builder(tuple(input_shape), int(num_classes), **kwargs)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - the plugin's own failure, reported as such
        raise UserError(f"model.name: the model plugin '{name}' failed to build for input "
                        f"shape {tuple(input_shape)} and {num_classes} classes: "
                        f"{type(err).__name__}: {str(err)[:200]}") from None
    finally:
        torch.random.set_rng_state(generator_state)
    if not isinstance(model, nn.Module):
        raise UserError(f"model.name: the model plugin '{name}' returned a "
                        f"{type(model).__name__}, not a torch.nn.Module; return the module")
    if not any(p.requires_grad for p in model.parameters()):
        raise UserError(f"model.name: the model plugin '{name}' has no trainable parameters; "
                        "give it some (e.g. an nn.Linear)")
    return model


def count_parameters(model: nn.Module) -> int:
    """d, the number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
