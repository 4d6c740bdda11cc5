"""Minibatch sampling shared by the problems whose minibatches are sets of stored samples.

Devices hold their samples one after another (device i: global indices offsets[i] ..
offsets[i] + sizes[i] - 1), so a minibatch is an index tensor into that array.
"""

from __future__ import annotations

import torch


def sample_minibatches(generator: torch.Generator, sizes: torch.Tensor, offsets: torch.Tensor,
                       batch_size: int, steps: int = 1,
                       device: torch.device | str | None = None) -> torch.Tensor:
    """Global sample indices [steps, N, b], without replacement within a minibatch.

    ``sizes`` and ``offsets`` [N] (CPU, int64) place each device's samples. Each device ranks
    its samples by uniform keys drawn from ``generator`` and takes the b smallest, so every
    b-subset of a device's samples is equally likely (b <= m_i); a device with fewer than b
    samples takes all of them and repeats some (cyclically). The keys are drawn on the CPU, in
    one call whatever the torch device, so the indices are the same everywhere.
    """
    n = len(sizes)
    width = max(int(sizes.max()), batch_size)
    keys = torch.rand((steps, n, width), generator=generator)
    keys.masked_fill_(torch.arange(width) >= sizes[:, None], 2.0)
    local = keys.topk(batch_size, dim=2, largest=False).indices
    local = torch.remainder(local, sizes[:, None])
    out = offsets[:, None] + local
    return out if device is None else out.to(device)
