"""The model profiler: MACs, activations, parameters and input size counted from layer shapes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from wirelessfl.energy import ModelProfile, profile_model
from wirelessfl.errors import UserError
from wirelessfl.learning.models import build_model


def test_seed002_cnn_matches_the_paper():
    # 1x28x28 -> conv1 20@7x7 -> 20x22x22 -> conv2 40@7x7 -> 40x16x16 -> pool 2 -> 40x8x8 -> fc 2.
    conv1_out, conv2_out, pool_out = 20 * 22 * 22, 40 * 16 * 16, 40 * 8 * 8
    assert (conv1_out, conv2_out, pool_out) == (9_680, 10_240, 2_560)
    macs = conv1_out * (1 * 7 * 7) + conv2_out * (20 * 7 * 7) + 2 * pool_out
    activations = conv1_out + conv2_out + pool_out + pool_out + 2  # flatten counts; ReLUs do not
    params = (20 * 49 + 20) + (40 * 20 * 49 + 40) + (pool_out * 2 + 2)
    profile = profile_model(build_model("seed002-cnn", (1, 28, 28), 2), (1, 28, 28))
    assert profile == ModelProfile(params=params, macs_per_sample=macs,
                                   activations_per_sample=activations, input_size=28 * 28)
    assert (params, macs, activations) == (45_362, 10_514_640, 25_042)


def test_mlp():
    model = build_model("mlp", (64,), 10, hidden=(32,))
    profile = profile_model(model, (64,))
    assert profile.macs_per_sample == 64 * 32 + 32 * 10
    assert profile.params == 64 * 32 + 32 + 32 * 10 + 10
    assert profile.activations_per_sample == 64 + 32 + 10  # flatten + hidden + output
    assert profile.input_size == 64


def test_grouped_strided_conv():
    # 4 channels, 9x9, 6 filters 3x3, stride 2, 2 groups: out 6 x 4 x 4, each from 2 x 3 x 3 inputs.
    conv = nn.Conv2d(4, 6, kernel_size=3, stride=2, groups=2)
    profile = profile_model(conv, (4, 9, 9))
    out = 6 * ((9 - 3) // 2 + 1) ** 2
    assert out == 96
    assert profile.macs_per_sample == out * (4 // 2) * 3 * 3 == 1_728
    assert profile.activations_per_sample == 96
    assert profile.params == 6 * 2 * 3 * 3 + 6


def test_conv1d_and_norm_layers():
    model = nn.Sequential(nn.Conv1d(3, 5, kernel_size=4), nn.BatchNorm1d(5), nn.GELU(),
                          nn.AdaptiveAvgPool1d(2), nn.Flatten(), nn.Dropout(0.5), nn.Linear(10, 3))
    profile = profile_model(model, (3, 12))
    # conv 5 x 9 outputs of 3 x 4 MACs; linear 3 outputs of 10 MACs.
    assert profile.macs_per_sample == 45 * 12 + 3 * 10
    # conv 45, batchnorm 45, pool 10, flatten 10, linear 3; GELU and Dropout in place.
    assert profile.activations_per_sample == 45 + 45 + 10 + 10 + 3


def test_batch_scaling():
    profile = ModelProfile(params=7, macs_per_sample=100, activations_per_sample=11, input_size=5)
    assert profile.macs(10) == 1_000
    assert profile.activations(10) == 110
    with pytest.raises(ValueError):
        profile.macs(0)


def _hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


@pytest.mark.parametrize("train", [True, False])
def test_model_left_unchanged(train):
    model = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Dropout(0.5),
                          nn.Linear(4, 2))
    model.train(train)
    model[1].eval()  # a mixed setting must come back as it was
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profile = profile_model(model, (8,))  # BatchNorm1d on one sample works only in eval mode
    assert profile.macs_per_sample == 8 * 4 + 4 * 2
    assert profile.activations_per_sample == 4 + 4 + 2
    assert [m.training for m in model.modules()] == [train, train, False, train, train, train]
    assert _hook_count(model) == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_unknown_weighted_layer_is_refused_and_hooks_removed():
    model = nn.Sequential(nn.ConvTranspose1d(2, 3, kernel_size=3))
    with pytest.raises(UserError, match="ConvTranspose1d"):
        profile_model(model, (2, 5))
    assert _hook_count(model) == 0
    assert model.training
