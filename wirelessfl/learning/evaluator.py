"""The batched multi-device evaluator every algorithm computes with (DESIGN.md, section 5).

Parameters are one flat vector theta [d] (or a stack [n, d] for per-device models), so
perturbations, quantisation and aggregation are plain tensor algebra. Three kinds of work:

* shared-model passes (DZOFL's queries, FedSGD's gradients at the broadcast model): one forward pass
  over the concatenated device minibatches, per-device losses recovered by a reshape;
* per-device gradients at a shared model and per-device local SGD: ``torch.func.vmap`` over devices;
* test-set evaluation of the global model.

Devices are processed in chunks whose size keeps the estimated peak memory under ``max_chunk_mb``.
All random draws are made on the CPU from generators the caller passes, in an order that does not
depend on the chunk size or the torch device, so results are the same however the work is split.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from wirelessfl.learning.stacked import StackedForward, to_channels_last, uses_convolutions

BYTES_PER_FLOAT = 4
# Autograd keeps roughly this many float copies of each activation (output, its gradient, and
# the saved input of the next layer): a conservative factor for the memory estimate.
ACTIVATION_COPIES = 3


class FlatModel:
    """A model used functionally through one flat parameter vector."""

    def __init__(self, model: nn.Module):
        self.model = model
        params = dict(model.named_parameters())
        self.names = list(params)
        self.shapes = [p.shape for p in params.values()]
        self.numels = [p.numel() for p in params.values()]
        self.d = int(sum(self.numels))
        # theta_0 is kept apart: predict() repoints the module's parameters at other vectors.
        self._theta0 = torch.cat([p.detach().reshape(-1) for p in params.values()]).float().clone()
        # Convolutions run in channels-last layout (faster on CPU with mkldnn; same values).
        self.channels_last = uses_convolutions(model)

    def initial(self) -> torch.Tensor:
        """theta_0 as a flat float32 vector [d] (a fresh copy)."""
        return self._theta0.clone()

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of ``theta`` [d] shaped as the model's parameters."""
        chunks = torch.split(theta, self.numels)
        return {n: c.view(s) for n, c, s in zip(self.names, chunks, self.shapes)}

    def functional(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The model at theta, differentiable in theta; safe under torch.func transforms."""
        return functional_call(self.model, self.unflatten(theta), (x,))

    def forward(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """As ``functional``, with convolutional models in channels-last layout (not for vmap)."""
        if not self.channels_last:
            return self.functional(theta, x)
        params = {name: to_channels_last(p) for name, p in self.unflatten(theta).items()}
        return functional_call(self.model, params, (to_channels_last(x),))

    @torch.no_grad()
    def predict(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Forward pass without gradients: the module's parameters are pointed at views of theta
        (no copy), which skips functional_call's per-call overhead on the hot no-grad path."""
        for p, view in zip(self.model.parameters(), self.unflatten(theta).values()):
            p.data = to_channels_last(view) if self.channels_last else view
        return self.model(to_channels_last(x) if self.channels_last else x)

    def loss(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of one minibatch (the f_i(theta, xi) of the specs)."""
        return F.cross_entropy(self.functional(theta, x), y)


@dataclass
class DeviceData:
    """Training samples of all devices, stored device after device, plus the test set."""

    x: torch.Tensor  # [n_total, *input_shape]
    y: torch.Tensor  # [n_total]
    offsets: torch.Tensor  # [N] first sample of each device (CPU, int64)
    sizes: torch.Tensor  # [N] samples per device (CPU, int64)
    x_test: torch.Tensor
    y_test: torch.Tensor

    @classmethod
    def from_shards(cls, x_train, y_train, shards, x_test, y_test, device) -> DeviceData:
        order = np.concatenate(shards)
        sizes = torch.tensor([len(s) for s in shards], dtype=torch.int64)
        offsets = torch.cumsum(sizes, 0) - sizes

        def put(a, dtype):
            return torch.as_tensor(np.ascontiguousarray(a)).to(device=device, dtype=dtype)

        return cls(put(x_train[order], torch.float32), put(y_train[order], torch.int64),
                   offsets, sizes, put(x_test, torch.float32), put(y_test, torch.int64))

    @property
    def num_devices(self) -> int:
        return len(self.sizes)


class BatchedEvaluator:
    """Losses, gradients and local training for all devices at once, chunked by memory."""

    def __init__(self, flat: FlatModel, data: DeviceData, activations_per_sample: int,
                 input_size: int, max_chunk_mb: float = 1024.0):
        self.flat = flat
        self.data = data
        self.device = data.x.device
        self.num_devices = data.num_devices
        self.activations_per_sample = activations_per_sample
        self.input_size = input_size
        self.max_chunk_bytes = max_chunk_mb * 2**20
        # Host seconds spent in learning compute (sampling, passes): the benchmark's split of a
        # round into learning compute and engine overhead. perf_counter costs ~0.1 us a call.
        self.compute_s = 0.0
        self.stacked = StackedForward(flat)

    # ---- chunking --------------------------------------------------------------------------
    def device_bytes(self, batch_size: int, own_model: bool) -> float:
        """Estimated peak bytes one device adds to a chunk [B]."""
        per_sample = self.input_size + ACTIVATION_COPIES * self.activations_per_sample
        model_copies = 4 if own_model else 0  # stacked theta, gradient, update, temporary
        return BYTES_PER_FLOAT * (batch_size * per_sample + model_copies * self.flat.d)

    def chunk_size(self, batch_size: int, own_model: bool) -> int:
        per = self.device_bytes(batch_size, own_model)
        return max(1, min(self.num_devices, int(self.max_chunk_bytes // per)))

    def chunks(self, batch_size: int, own_model: bool) -> Iterator[slice]:
        size = self.chunk_size(batch_size, own_model)
        for start in range(0, self.num_devices, size):
            yield slice(start, min(start + size, self.num_devices))

    # ---- sampling ----------------------------------------------------------------------------
    def sample(self, generator: torch.Generator, batch_size: int, steps: int = 1) -> torch.Tensor:
        """Minibatch sample indices [steps, N, b], without replacement within a minibatch.

        Each device ranks its samples by uniform keys and takes the b smallest; a device with
        fewer than b samples repeats some (cyclically). Drawn on the CPU for determinism.
        """
        start = time.perf_counter()
        sizes, n = self.data.sizes, self.num_devices
        width = max(int(sizes.max()), batch_size)
        keys = torch.rand((steps, n, width), generator=generator)
        keys.masked_fill_(torch.arange(width) >= sizes[:, None], 2.0)
        local = keys.topk(batch_size, dim=2, largest=False).indices
        local = torch.remainder(local, sizes[:, None])
        out = (self.data.offsets[:, None] + local).to(self.device)
        self.compute_s += time.perf_counter() - start
        return out

    # ---- shared-model work -------------------------------------------------------------------
    @torch.no_grad()
    def device_losses(self, theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Per-device minibatch loss at a shared theta: one forward pass per chunk [N]."""
        start = time.perf_counter()
        n, b = idx.shape
        out = torch.empty(n, device=self.device)
        for rows in self.chunks(b, own_model=False):
            flat_idx = idx[rows].reshape(-1)
            logits = self.flat.predict(theta, self.data.x[flat_idx])
            losses = F.cross_entropy(logits, self.data.y[flat_idx], reduction="none")
            out[rows] = losses.view(-1, b).mean(1)
        self.compute_s += time.perf_counter() - start
        return out

    def stacked_gradients(self, models: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Gradient of each device's minibatch loss at its own model: models [n, d], idx [n, b]
        (global sample indices) -> [n, d]. One autograd call for all n devices."""
        y = self.data.y[idx]

        def device_losses(logits: torch.Tensor) -> torch.Tensor:
            losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
            return losses.view(y.shape).mean(1)

        return self.stacked.gradients(models, self.data.x[idx], device_losses)

    def device_gradients(self, theta: torch.Tensor, idx: torch.Tensor
                         ) -> Iterator[tuple[slice, torch.Tensor]]:
        """Per-device minibatch gradients at a shared theta, chunk by chunk: (rows, [n, d])."""
        b = idx.shape[1]
        for rows in self.chunks(b, own_model=True):
            start = time.perf_counter()
            models = theta.expand(rows.stop - rows.start, -1)
            grads = self.stacked_gradients(models, idx[rows])
            self.compute_s += time.perf_counter() - start
            yield rows, grads

    # ---- per-device models -------------------------------------------------------------------
    def local_sgd(self, theta: torch.Tensor, idx: torch.Tensor, lr: float,
                  steps: torch.Tensor | None = None) -> Iterator[tuple[slice, torch.Tensor]]:
        """Each device runs SGD from theta on its minibatches idx [E, N, b]; yields (rows, [n, d]).

        ``steps`` [N] (optional) lets devices stop early: device i takes only its first steps[i].
        """
        num_steps, _, b = idx.shape
        for rows in self.chunks(b, own_model=True):
            start = time.perf_counter()
            models = theta.expand(rows.stop - rows.start, -1).clone()
            for e in range(num_steps):
                g = self.stacked_gradients(models, idx[e, rows])
                if steps is None:
                    models.sub_(g, alpha=lr)
                else:
                    keep = (e < steps[rows]).to(device=self.device, dtype=g.dtype)[:, None]
                    models.sub_(g * keep, alpha=lr)
            self.compute_s += time.perf_counter() - start
            yield rows, models

    # ---- evaluation --------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, theta: torch.Tensor, batch: int = 4096) -> tuple[float, float]:
        """(accuracy, mean loss) of theta on the test set."""
        x, y = self.data.x_test, self.data.y_test
        correct, loss_sum = 0, 0.0
        for start in range(0, len(y), batch):
            logits = self.flat.predict(theta, x[start:start + batch])
            target = y[start:start + batch]
            loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
            correct += int((logits.argmax(1) == target).sum())
        n = max(len(y), 1)
        loss = loss_sum / n
        return correct / n, loss if math.isfinite(loss) else float("nan")
