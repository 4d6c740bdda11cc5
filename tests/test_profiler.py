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


# ---- per-layer counts, each against the layer formulas written out by hand ----

def _out(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """Output length of a convolution or pooling window (PyTorch's formula)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def test_mlp_per_layer_by_hand():
    model = build_model("mlp", (8, 8), 10, hidden=(32, 16))
    profile = profile_model(model, (8, 8))
    rows = [(layer.name, layer.type, layer.macs, layer.params, layer.activations)
            for layer in profile.layers]
    assert rows == [
        ("net.0", "Flatten", 0, 0, 64),
        ("net.1", "Linear", 64 * 32, 64 * 32 + 32, 32),
        ("net.2", "ReLU", 0, 0, 0),
        ("net.3", "Linear", 32 * 16, 32 * 16 + 16, 16),
        ("net.4", "ReLU", 0, 0, 0),
        ("net.5", "Linear", 16 * 10, 16 * 10 + 10, 10),
    ]
    assert profile.macs_per_sample == 64 * 32 + 32 * 16 + 16 * 10 == 2_720
    assert profile.params == sum(r[3] for r in rows) == 2_778
    assert profile.activations_per_sample == sum(r[4] for r in rows)


def test_conv2d_padding_dilation_stride_groups():
    conv = nn.Conv2d(6, 9, kernel_size=(3, 5), stride=(2, 1), padding=(1, 2), dilation=(2, 1),
                     groups=3)
    profile = profile_model(conv, (6, 11, 13))
    h, w = _out(11, 3, 2, 1, 2), _out(13, 5, 1, 2, 1)
    assert (h, w) == (5, 13)
    out = 9 * h * w
    assert profile.macs_per_sample == out * (6 // 3) * 3 * 5
    assert profile.activations_per_sample == out
    assert profile.params == 9 * 2 * 3 * 5 + 9


def test_conv1d_groups_padding_dilation():
    conv = nn.Conv1d(4, 8, kernel_size=3, stride=2, padding=2, dilation=3, groups=4, bias=False)
    profile = profile_model(conv, (4, 20))
    length = _out(20, 3, 2, 2, 3)
    assert length == 9  # (20 + 4 - 6 - 1) // 2 + 1
    assert profile.macs_per_sample == 8 * length * (4 // 4) * 3
    assert profile.params == 8 * 1 * 3


def test_pooling_and_norms_have_no_macs_but_activations():
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.MaxPool2d(2), nn.AvgPool2d(2, stride=1), nn.Flatten(),
                          nn.LayerNorm(36), nn.Linear(36, 3))
    profile = profile_model(model, (2, 8, 8))
    by_type = {layer.type: layer for layer in profile.layers}
    for kind, acts, params in (("BatchNorm2d", 4 * 64, 8), ("MaxPool2d", 4 * 16, 0),
                               ("AvgPool2d", 4 * 9, 0), ("Flatten", 36, 0),
                               ("LayerNorm", 36, 72), ("ReLU", 0, 0)):
        assert (by_type[kind].macs, by_type[kind].activations, by_type[kind].params) == (
            0, acts, params)
    assert profile.macs_per_sample == 4 * 64 * 2 * 9 + 3 * 36


def test_embedding_counts_params_not_macs():
    model = nn.Sequential(nn.Embedding(100, 8), nn.Flatten(), nn.Linear(5 * 8, 2))
    profile = profile_model(model, (5,))  # five token ids, fed as torch.long
    emb = profile.layers[0]
    assert (emb.type, emb.macs, emb.params, emb.activations) == ("Embedding", 0, 800, 40)
    assert profile.macs_per_sample == 40 * 2
    assert profile.params == 800 + 40 * 2 + 2


class _SelfAttention(nn.Module):
    def __init__(self, embed: int, heads: int, batch_first: bool):
        super().__init__()
        self.batch_first = batch_first
        self.attn = nn.MultiheadAttention(embed, heads, batch_first=batch_first)
        self.fc = nn.Linear(embed, 3)

    def forward(self, x):
        if not self.batch_first:
            x = x.transpose(0, 1)  # (L, batch, E)
        y, _ = self.attn(x, x, x)
        return self.fc(y)


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_by_hand(batch_first):
    length, embed, heads = 5, 16, 4
    model = _SelfAttention(embed, heads, batch_first)
    profile = profile_model(model, (length, embed))
    attn = profile.layers[0]
    assert [layer.name for layer in profile.layers] == ["attn", "fc"]  # out_proj not on its own
    projections = 3 * length * embed * embed + length * embed * embed  # Q, K, V, output
    matmuls = 2 * length * length * embed  # Q K^T and A V, all heads together
    assert attn.macs == projections + matmuls == 5_920
    # Q, K, V; attention weights per head; context; output.
    assert attn.activations == 3 * length * embed + heads * length * length + 2 * length * embed
    assert attn.params == 3 * embed * embed + 3 * embed + embed * embed + embed == 1_088
    assert profile.params == 1_088 + embed * 3 + 3
    assert profile.macs_per_sample == 5_920 + length * embed * 3


def test_repeated_module_lists_its_params_once():
    shared = nn.Linear(4, 4)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = shared

        def forward(self, x):
            return self.fc(self.fc(x))

    profile = profile_model(Twice(), (4,))
    assert [(layer.name, layer.macs, layer.params) for layer in profile.layers] == [
        ("fc", 16, 20), ("fc", 16, 0)]
    assert profile.macs_per_sample == 32 and profile.params == 20


def test_resnet18_cifar_counts_by_hand():
    # He et al. 2016 as adapted for CIFAR (kuangliu/pytorch-cifar): 3x3 stride-1 stem, no
    # max-pool, BasicBlocks [2, 2, 2, 2] of 64/128/256/512 channels, 1x1 stride-2 shortcuts
    # with BN, global average pool, linear. Convolutions have no bias; BN has 2 params/channel.
    def conv(c_in, c_out, k):
        return c_in * c_out * k * k

    params = conv(3, 64, 3) + 2 * 64  # stem conv + BN
    macs = 32 * 32 * 64 * conv(3, 1, 3)  # stem: 65,536 outputs x 27
    side, width = 32, 64
    for channels, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        side //= stride
        outputs = side * side * channels
        for block in range(2):
            c_in = width if block == 0 else channels
            params += conv(c_in, channels, 3) + conv(channels, channels, 3) + 4 * channels
            macs += outputs * (c_in * 9 + channels * 9)
            if block == 0 and (stride != 1 or c_in != channels):
                params += conv(c_in, channels, 1) + 2 * channels
                macs += outputs * c_in
        width = channels
    params += 512 * 10 + 10
    macs += 512 * 10
    assert params == 11_173_962
    assert macs == 555_422_720  # about 0.556 GMAC
    model = build_model("resnet18-cifar", (3, 32, 32), 10)
    profile = profile_model(model, (3, 32, 32))
    assert (profile.params, profile.macs_per_sample) == (params, macs)
    # Activations: conv and BN outputs (stem, 4 per stage at 32/16/8/4 pixels, plus the two
    # shortcut layers of stages 2-4), pool, flatten, linear; ReLUs and the residual adds none.
    acts = 2 * 65_536 + 8 * 65_536 + 10 * 32_768 + 10 * 16_384 + 10 * 8_192 + 512 + 512 + 10
    assert profile.activations_per_sample == acts
    assert sum(layer.macs for layer in profile.layers) == macs
    assert sum(layer.params for layer in profile.layers) == params
    assert model.training  # left as it was built


def test_profile_command_per_layer_table_and_json(capsys):
    import json

    from wirelessfl.cli import main

    assert main(["profile", "seed002-cnn", "--per-layer"]) == 0
    out = capsys.readouterr().out
    assert "conv2    Conv2d" in out and "10,035,200" in out and "total" in out
    assert main(["profile", "mlp", "--energy", "smartphone-soc", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [layer["type"] for layer in got["layers"]] == ["Flatten", "Linear", "ReLU", "Linear"]
    assert got["layers"][1] == {"name": "net.1", "type": "Linear", "macs": 64 * 64,
                                "params": 64 * 64 + 64, "activations": 64}
    assert got["energy_forward_j"] == pytest.approx(1e-28 * (64 * 64 + 64 * 10) * 2.84e9 ** 2)
