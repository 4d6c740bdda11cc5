"""The batched multi-device evaluator every algorithm computes with (docs/architecture.md).

Parameters are one flat vector theta [d] (or a stack [n, d] for per-device models), so
perturbations, quantisation and aggregation are plain tensor algebra. Three kinds of work:

* shared-model passes (DZOFL's queries, FedSGD's gradients at the broadcast model): one forward pass
  over the concatenated device minibatches, per-device losses recovered by a reshape (a model
  with batch norm: one pass per device, each normalised with its own minibatch's statistics);
* per-device gradients at a shared model and per-device local SGD: ``torch.func.vmap`` over devices;
* test-set evaluation of the global model;
* exact training-set passes for the optimisation view (``Problem``, problems/base.py):
  f(theta) = (1/N) sum_i f_i(theta) with f_i the mean cross-entropy over device i's samples plus
  ``l2``/2 ||theta||^2, its gradient, every device's full local gradient, and for the convex
  ``logistic`` model with l2 > 0 the optimum by a float64 L-BFGS-B reference solve.

Devices are processed in chunks whose size keeps the estimated peak memory under ``max_chunk_mb``.
All random draws are made on the CPU from generators the caller passes, in an order that does not
depend on the chunk size or the torch device, so results are the same however the work is split.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

import numpy as np
import torch
import torch.nn.functional as F

from wirelessfl.contract.problem import Problem
from wirelessfl.errors import UserError
from wirelessfl.host.threads import parallel_map
from wirelessfl.learning.conv_chain import ConvChain
from wirelessfl.learning.flat_model import NORMALISATION_SAMPLES, FlatModel
from wirelessfl.learning.minibatch import (
    batch_counts,
    counts_of,
    mean_cross_entropy_gradient,
    minibatch_mean,
    owner_sizes,
    real_batch_sizes,
    sample_cross_entropy,
    sample_device_minibatches,
    sample_minibatches,
)
from wirelessfl.learning.stacked import (
    StackedForward,
    rowwise_update_exact,
)

BYTES_PER_FLOAT = 4
# Samples per piece when a threaded model's test-set and training-set passes are split over the
# thread pool: fixed, so the arithmetic never depends on the number of threads.
SAMPLE_BLOCK = 256
# A threaded model's shared-model minibatch passes (DZOFL's queries) split the devices into
# nearly equal pieces of whole devices, of about this many samples (a single-threaded pass of the
# seed-002 CNN costs ~1 ms per call on top of its samples) ...
PIECE_SAMPLES = 128
# Devices whose labels are counted at once for ``label_mix`` [D]: ~10^6 labels in flight.
LABEL_MIX_DEVICES = 50_000
# ... and at least this many (10 devices of 10 samples: two pieces of 50, as fast as torch's own
# two threads on one batch of 100; four pieces were ~20 % slower).
MIN_PIECES = 2
# Autograd keeps roughly this many float copies of each activation (output, its gradient, and
# the saved input of the next layer): a conservative factor for the memory estimate.
ACTIVATION_COPIES = 3


@dataclass
class DeviceData:
    """Training samples of all devices at positions device after device, plus the test set.

    Position p of device i (``offsets[i] <= p < offsets[i] + sizes[i]``) holds row p of ``x``
    and ``y``, or, when the population outgrows the dataset (``index`` set), row ``index[p]``
    of the shared dataset: a million devices hold int64 indices, not copies of their samples.
    Read positions through ``inputs`` / ``labels``."""

    x: torch.Tensor  # [rows, *input_shape]
    y: torch.Tensor  # [rows]
    offsets: torch.Tensor  # [N] first position of each device (CPU, int64)
    sizes: torch.Tensor  # [N] samples per device (CPU, int64)
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_server: torch.Tensor | None = None  # the base station's own samples (seed 000)
    y_server: torch.Tensor | None = None
    index: torch.Tensor | None = None  # [positions] row of x of each position; None: row p

    @property
    def num_samples(self) -> int:
        """Positions: the devices' samples counted with repeats."""
        return len(self.y) if self.index is None else len(self.index)

    def rows(self, positions) -> torch.Tensor | slice:
        """The rows of ``x`` / ``y`` holding ``positions`` (a tensor of positions or a slice)."""
        return positions if self.index is None else self.index[positions]

    def inputs(self, positions) -> torch.Tensor:
        return self.x[self.rows(positions)]

    def labels(self, positions) -> torch.Tensor:
        return self.y[self.rows(positions)]

    def row_weights(self, position_weights: torch.Tensor) -> tuple[torch.Tensor | None,
                                                                     torch.Tensor]:
        """(rows, weights): a sum over positions of w_p g(row of p) as a sum over distinct
        rows of W_r g(r), W_r the total weight of the positions holding row r; rows None: the
        positions themselves (no index: the same sum, term for term). With an index a training
        pass then costs the dataset's rows, not the population's positions."""
        if self.index is None:
            return None, position_weights
        index = self.index.to(position_weights.device)
        total = torch.zeros(len(self.y), dtype=position_weights.dtype,
                            device=position_weights.device)
        total.index_add_(0, index, position_weights)
        rows = torch.unique(index)
        return rows, total[rows]

    @classmethod
    def from_shards(cls, x_train, y_train, shards, x_test, y_test, device,
                    server: np.ndarray | None = None) -> DeviceData:
        """``shards``: training indices of each device; ``server``: those the base station keeps."""
        order = np.concatenate(shards)
        sizes = np.array([len(s) for s in shards], dtype=np.int64)
        return cls.from_index_sets(x_train, y_train, order, sizes, x_test, y_test, device, server)

    @classmethod
    def from_index_sets(cls, x_train, y_train, order: np.ndarray, sizes: np.ndarray, x_test,
                        y_test, device, server: np.ndarray | None = None) -> DeviceData:
        """Device i holds training samples ``order[offsets[i]:offsets[i] + sizes[i]]`` (global
        indices, device after device; an index may repeat across devices when the population
        outgrows the dataset); ``server``: the indices the base station keeps."""
        sizes = torch.as_tensor(np.asarray(sizes, dtype=np.int64))
        offsets = torch.cumsum(sizes, 0) - sizes

        def put(a, dtype):
            return torch.as_tensor(np.ascontiguousarray(a)).to(device=device, dtype=dtype)

        order = np.asarray(order, dtype=np.int64)
        test = put(x_test, torch.float32), put(y_test, torch.int64)
        if len(order) > len(x_train):  # positions outnumber the rows: keep indices [D]
            data = cls(put(x_train, torch.float32), put(y_train, torch.int64), offsets, sizes,
                       *test, index=put(order, torch.int64))
        else:  # each sample at most about once: the devices' copy, read without an index
            data = cls(put(x_train[order], torch.float32), put(y_train[order], torch.int64),
                       offsets, sizes, *test)
        if server is not None and len(server):
            data.x_server = put(x_train[server], torch.float32)
            data.y_server = put(y_train[server], torch.int64)
        return data

    @property
    def num_devices(self) -> int:
        return len(self.sizes)


class BatchedEvaluator(Problem):
    """Losses, gradients and local training for all devices at once, chunked by memory.

    The ``Problem`` of a torch classifier: f_i(theta) = mean cross-entropy over device i's samples
    + l2/2 ||theta||^2 (the l2 term also enters every minibatch loss and gradient). With
    ``train_metrics`` off, the training-set passes of ``metrics`` are skipped (NaN columns).
    """

    def __init__(self, flat: FlatModel, data: DeviceData, activations_per_sample: int,
                 input_size: int, max_chunk_mb: float = 1024.0, l2: float = 0.0,
                 train_metrics: bool = True):
        self.flat = flat
        if flat.chain is None:  # Conv/ReLU/MaxPool chains run layer by layer: same numbers
            flat.chain = ConvChain.of(flat)
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
        # Per-device and per-block pieces of shared-model passes go to the thread pool.
        self.threaded = self.stacked.strategy == "per-device" and self.stacked.threaded
        self.l2 = float(l2)
        self.train_metrics = train_metrics
        self.optimum_value: float | None = None
        self.optimum: torch.Tensor | None = None
        self.optimum_gradient_max: float | None = None  # of the reference solve, when run
        # The fewest samples a device holds: minibatches up to this width are full on every
        # device (``batch_counts`` returns None, a plain mean).
        self._smallest = int(data.sizes.min()) if len(data.sizes) else 0
        self._chunks: torch.Tensor | None = None  # ``local_sgd(reuse=True)``'s buffer
        # ``full_gradients``' gathered device blocks over every device, kept while a solver
        # holds them (``holding_full_batches``); None outside such a block.
        self._held_batches: list | None = None

    @cached_property
    def _owner_sizes(self) -> torch.Tensor:
        """Each position's device size: a minibatch row's real sample count (``batch_counts``).
        Made on first use, which comes only when a device holds fewer samples than a minibatch
        asks for: a million devices of 20 samples are spared 20 million int64."""
        return owner_sizes(self.data.sizes).to(self.device)

    def _batch_counts(self, idx: torch.Tensor) -> torch.Tensor | None:
        """``batch_counts`` of minibatch positions idx [n, w] (None: every row full)."""
        if idx.shape[1] <= self._smallest:
            return None
        return batch_counts(idx, self._owner_sizes, self._smallest)

    @property
    def d(self) -> int:
        return self.flat.d

    def initial(self) -> torch.Tensor:
        return self.flat.initial().to(self.device)

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
        """Minibatch sample indices [steps, N, w], without replacement within a minibatch.

        Each device ranks its samples by uniform keys and takes the b smallest; a device with
        m_i < b samples takes all of them once, the rest of its row padding weighted 0 by the
        minibatch losses and gradients (full local batches). Drawn on the CPU for determinism
        (``sample_minibatches``, learning/minibatch.py).
        """
        start = time.perf_counter()
        out = sample_minibatches(generator, self.data.sizes, self.data.offsets, batch_size,
                                 steps, self.device)
        self.compute_s += time.perf_counter() - start
        return out

    def sample_devices(self, seed, stream, keys, batch_size, steps, devices):
        """``sample``'s minibatches for the devices ``devices`` alone, keyed per device
        (``sample_device_minibatches``)."""
        start = time.perf_counter()
        out = sample_device_minibatches(seed, stream, keys, devices, self.data.sizes,
                                        self.data.offsets, batch_size, steps, self.device)
        self.compute_s += time.perf_counter() - start
        return out

    def minibatch_sizes(self, batch_size: int) -> np.ndarray:
        return real_batch_sizes(self.data.sizes.numpy(), batch_size)

    # ---- shared-model work -------------------------------------------------------------------
    @torch.no_grad()
    def device_losses(self, theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Per-device minibatch loss at a shared theta [N]: one forward pass per chunk of
        devices (a threaded model: per piece of whole devices, the pieces spread over the
        thread pool; the pieces depend only on N and the batch size)."""
        if not self.threaded and not self.flat.normalised:
            return self.device_losses_many([theta], idx)[0]
        start = time.perf_counter()
        n, b = idx.shape
        counts = self._batch_counts(idx)

        def piece(rows: slice) -> torch.Tensor:
            flat_idx = idx[rows].reshape(-1)
            return self._minibatch_losses(theta, self.data.inputs(flat_idx),
                                          self.data.labels(flat_idx), b,
                                          counts_of(counts, rows))

        if self.flat.normalised:  # batch norm: each device's minibatch normalised on its own
            pieces = [slice(i, i + 1) for i in range(n)]
            out = torch.cat(parallel_map(piece, pieces) if self.threaded else map(piece, pieces))
        else:  # about PIECE_SAMPLES samples a piece, at least MIN_PIECES pieces
            count = min(n, max(math.ceil(n / self.chunk_size(b, own_model=False)), MIN_PIECES,
                               math.ceil(n * b / PIECE_SAMPLES)))
            bounds = [n * k // count for k in range(count + 1)]  # as equal as devices allow
            out = torch.cat(parallel_map(piece, [slice(lo, hi) for lo, hi in pairwise(bounds)]))
        if self.l2:
            out += 0.5 * self.l2 * float(theta.square().sum())
        self.compute_s += time.perf_counter() - start
        return out

    @torch.no_grad()
    def device_losses_many(self, thetas: list[torch.Tensor], idx: torch.Tensor
                           ) -> list[torch.Tensor]:
        """``device_losses`` at each of ``thetas`` on the same minibatches (runs in lockstep,
        algorithms/lanes.py): each chunk's samples and labels are gathered once, and each
        theta's losses are the operations ``device_losses`` does on them, so the same bits. A
        threaded or batch-norm model takes ``device_losses`` theta by theta."""
        if self.threaded or self.flat.normalised:
            return [self.device_losses(theta, idx) for theta in thetas]
        start = time.perf_counter()
        n, b = idx.shape
        counts = self._batch_counts(idx)
        pieces: list[torch.Tensor] = []
        for rows in self.row_chunks(n, b, own_model=False):
            flat_idx = idx[rows].reshape(-1)
            x, y = self.data.inputs(flat_idx), self.data.labels(flat_idx)
            # one loss pass for every theta's logits: each row's loss is its own arithmetic
            logits = torch.cat([self.flat.predict(theta, x) for theta in thetas])
            losses = sample_cross_entropy(logits, y.repeat(len(thetas)))
            pieces.append(minibatch_mean(losses.view(len(thetas), -1, b), counts_of(counts, rows)))
        outs = list(torch.cat(pieces, 1).unbind(0))
        if self.l2:
            for theta, out in zip(thetas, outs, strict=True):
                out += 0.5 * self.l2 * float(theta.square().sum())
        self.compute_s += time.perf_counter() - start
        return outs

    def _minibatch_losses(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, b: int,
                          counts: torch.Tensor | None) -> torch.Tensor:
        """Each device's mean loss at theta over its rows of minibatch samples x, labels y
        (b a device; ``counts``: the real samples of short rows)."""
        return minibatch_mean(sample_cross_entropy(self.flat.predict(theta, x), y).view(-1, b),
                              counts)

    @torch.no_grad()
    def stacked_losses(self, models: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Each device's minibatch loss at its own model: models [n, d], idx [n, b] -> [n]."""
        start = time.perf_counter()
        y = self.data.labels(idx)
        logits = self.stacked(models, self.data.inputs(idx))
        losses = sample_cross_entropy(logits.flatten(0, 1), y.flatten())
        out = minibatch_mean(losses.view(y.shape),
                             self._batch_counts(idx))
        if self.l2:
            out += 0.5 * self.l2 * models.square().sum(1)
        self.compute_s += time.perf_counter() - start
        return out

    def stacked_gradients(self, models: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Gradient of each device's minibatch loss at its own model: models [n, d], idx [n, b]
        (global sample indices) -> [n, d]. One autograd call for all n devices."""
        _, grads = self._minibatch_pass(models, idx)
        return grads + self.l2 * models if self.l2 else grads

    def local_sgd(self, theta: torch.Tensor, idx: torch.Tensor, lr: float,
                  steps: torch.Tensor | None = None, reuse: bool = False
                  ) -> Iterator[tuple[slice, torch.Tensor]]:
        """``Problem.local_sgd``; a chain's devices each take all their steps in one task of
        the pool (``StackedForward.chain_local_sgd``: the same numbers, the pool waiting once
        instead of twice a step), a device stopped early (``steps``) computing no more. With
        ``reuse`` the chunks are rows of one buffer kept for the run: a large model's chunk
        (250 MB for 56 devices at d = 1.1M) is then not page-faulted in afresh every round."""
        chain = self.stacked.chain
        if chain is None or not rowwise_update_exact(self.flat.d, theta.dtype, str(self.device),
                                                     float(lr), self.l2):
            yield from super().local_sgd(theta, idx, lr, steps)
            return
        num_steps, count, b = idx.shape
        for rows in self.row_chunks(count, b, own_model=True):
            start = time.perf_counter()
            chunk = idx[:, rows]
            n = chunk.shape[1]
            taken = ([num_steps] * n if steps is None
                     else torch.as_tensor(steps)[rows].clamp(max=num_steps).tolist())
            counts = [self._batch_counts(chunk[e])
                      for e in range(num_steps)]

            def logit_gradient(e: int, i: int, logits: torch.Tensor, chunk=chunk,
                               counts=counts) -> torch.Tensor:
                return mean_cross_entropy_gradient(logits, self.data.labels(chunk[e, i:i + 1]),
                                                   counts_of(counts[e], slice(i, i + 1)))

            if reuse:
                models = self._chunk_buffer(n, theta)[:n].copy_(theta.expand(n, -1))
            else:
                models = theta.expand(n, -1).clone()
            self.stacked.chain_local_sgd(
                models, taken, lambda e, i, chunk=chunk: self.data.inputs(chunk[e, i]),
                logit_gradient, lr, self.l2)
            self.compute_s += time.perf_counter() - start
            yield rows, models
            del models  # the caller's to keep: not held while the next chunk is made

    def _chunk_buffer(self, n: int, theta: torch.Tensor) -> torch.Tensor:
        """[at least n, d] rows for ``local_sgd(reuse=True)``'s chunks, kept between calls."""
        buffer = self._chunks
        if buffer is None or len(buffer) < n or buffer.dtype != theta.dtype:
            buffer = self._chunks = None  # the old one freed before the new one is made
            buffer = self._chunks = torch.empty((n, len(theta)), dtype=theta.dtype,
                                                device=theta.device)
        return buffer

    def stacked_losses_and_gradients(self, models: torch.Tensor, idx: torch.Tensor
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """``stacked_losses`` and ``stacked_gradients`` from one forward and one backward pass."""
        losses, grads = self._minibatch_pass(models, idx)
        if self.l2:
            return losses + 0.5 * self.l2 * models.square().sum(1), grads + self.l2 * models
        return losses, grads

    def _minibatch_pass(self, models: torch.Tensor, idx: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """(minibatch loss [n], its gradient [n, d]) of each device at its own model, without
        the l2 term."""
        y = self.data.labels(idx)
        counts = self._batch_counts(idx)

        def device_losses(logits: torch.Tensor, rows: slice) -> torch.Tensor:
            target = y[rows]
            losses = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none")
            return minibatch_mean(losses.view(target.shape), counts_of(counts, rows))

        return self.stacked.losses_and_gradients(models, self.data.inputs(idx), device_losses)

    # ---- evaluation --------------------------------------------------------------------------
    @torch.no_grad()
    def server_gradient(self, theta: torch.Tensor, generator: torch.Generator,
                        batch_size: int) -> torch.Tensor:
        """Minibatch gradient [d] of the base station's own loss (mean cross-entropy on its data,
        plus the l2 term), the batch drawn with replacement (seed 000's f~_1(x, xi))."""
        if self.data.x_server is None:
            raise UserError("this algorithm needs data held by the base station: set "
                            "data.server_fraction (e.g. 0.3, seed 000 Sec. IV)")
        pick = torch.randint(len(self.data.y_server), (batch_size,), generator=generator)
        pick = pick.to(self.device)
        with torch.enable_grad():
            leaf = theta.detach().requires_grad_(True)
            loss = F.cross_entropy(self.flat.forward(leaf, self.data.x_server[pick]),
                                   self.data.y_server[pick])
            (g,) = torch.autograd.grad(loss, leaf)
        return g + self.l2 * theta if self.l2 else g

    def server_objective(self, theta: torch.Tensor, batch: int = 4096) -> float:
        """f_1(theta): mean cross-entropy over all of the base station's data, plus the l2 term
        (the loss whose minibatch gradient ``server_gradient`` is), in blocks of ``batch``."""
        if self.data.x_server is None:
            return super().server_objective(theta)
        y = self.data.y_server
        total = 0.0
        statistics = self.normalisation_statistics(theta)  # the evaluation's model, as evaluate
        with torch.no_grad():
            for lo in range(0, len(y), batch):
                logits = self._predict(theta, self.data.x_server[lo:lo + batch], statistics)
                total += float(F.cross_entropy(logits.double(), y[lo:lo + batch],
                                               reduction="sum"))
        value = total / len(y)
        if self.l2:
            value += 0.5 * self.l2 * float(theta.double().square().sum())
        return value

    def evaluate(self, theta: torch.Tensor, batch: int = 4096) -> tuple[float, float]:
        """(accuracy, mean loss) of theta on the test set."""
        return self.evaluate_devices(theta, batch)[:2]

    def evaluate_devices(self, theta: torch.Tensor, batch: int = 4096
                         ) -> tuple[float, float, np.ndarray]:
        """``evaluate_classes``' (accuracy, mean loss, device accuracies)."""
        return self.evaluate_classes(theta, batch)[:3]

    def evaluate_classes(self, theta: torch.Tensor, batch: int = 4096
                         ) -> tuple[float, float, np.ndarray, np.ndarray]:
        """(accuracy, mean loss) on the test set and, from the same pass, each device's accuracy
        on its own test distribution: the test set re-weighted to the device's training label
        mix p_i, acc_i = sum_c p_i(c) acc_c with acc_c the accuracy on the test samples of class
        c (classes absent from the test set are left out and p_i renormalised; NaN for a device
        holding only such classes). This is the expected accuracy on held-out samples drawn
        from device i's label mix, exact when devices differ only in which labels they hold;
        last, acc_c of each class present in the test set."""
        x, y = self.data.x_test, self.data.y_test
        classes = self.label_mix.shape[1]
        hits = torch.zeros(classes, dtype=torch.float64, device=self.device)
        loss_sum = 0.0
        statistics = self.normalisation_statistics(theta)
        for start in range(0, len(y), batch):
            logits = self._predict(theta, x[start:start + batch], statistics)
            target = y[start:start + batch]
            loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
            # counts of the right predictions per class (an unweighted bincount: a weighted
            # one has no deterministic GPU kernel, and these are whole numbers either way)
            right = target[logits.argmax(1) == target]
            hits += torch.bincount(right, minlength=classes)[:classes].double()
        counts = torch.bincount(y, minlength=classes)[:classes].double()
        n = max(len(y), 1)
        loss = loss_sum / n
        hits_np, counts_np = hits.cpu().numpy(), counts.cpu().numpy()
        present = counts_np > 0
        per_class = np.where(present, hits_np / np.maximum(counts_np, 1), 0.0)
        mass = self.label_mix[:, present].sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            devices = np.where(mass > 0, self.label_mix @ per_class / mass, np.nan)
        return (float(hits_np.sum()) / n, loss if math.isfinite(loss) else float("nan"), devices,
                per_class[present])

    def _predict(self, theta: torch.Tensor, x: torch.Tensor,
                 statistics: torch.Tensor | None = None) -> torch.Tensor:
        """``flat.predict(theta, x, statistics)``; for a threaded model in blocks of
        ``SAMPLE_BLOCK`` samples spread over the thread pool, concatenated in order."""
        if not self.threaded or len(x) <= SAMPLE_BLOCK:
            return self.flat.predict(theta, x, statistics)
        return torch.cat(parallel_map(
            lambda lo: self.flat.predict(theta, x[lo:lo + SAMPLE_BLOCK], statistics),
            range(0, len(x), SAMPLE_BLOCK)))

    def normalisation_statistics(self, theta: torch.Tensor) -> torch.Tensor | None:
        """A normalised model's population statistics at theta, re-estimated on
        ``_normalisation_positions``' training samples (``FlatModel.normalisation_statistics``,
        [D]); None for a model without batch norm. A measurement, like the test set: no
        device sends it and no energy is charged for it."""
        if not self.flat.normalised:
            return None
        start = time.perf_counter()
        out = self.flat.normalisation_statistics(
            theta, self.data.inputs(self._normalisation_positions))
        self.compute_s += time.perf_counter() - start
        return out

    @cached_property
    def _normalisation_positions(self) -> torch.Tensor:
        """``NORMALISATION_SAMPLES`` training positions (all of them when the devices hold
        fewer) in a fixed random order (seed 0 [D]: the same samples in every run on the same
        data), so each batch mixes devices as the population does."""
        total = int(self.data.sizes.sum())
        order = torch.randperm(total, generator=torch.Generator().manual_seed(0))
        return order[:NORMALISATION_SAMPLES].to(self.device)

    @cached_property
    def label_mix(self) -> np.ndarray:
        """[N, C] float64: each device's training label distribution (rows sum to 1). Counted
        in blocks of ``LABEL_MIX_DEVICES`` devices, so a million devices of 20 samples never
        hold their 20 million labels and owners at once (whole counts: the same numbers)."""
        sizes = self.data.sizes.numpy()
        offsets = self.data.offsets.numpy()
        y_held = self.data.y  # the labels the devices hold: every row, or the rows indexed
        if self.data.index is not None:
            used = torch.zeros(len(y_held), dtype=torch.bool, device=y_held.device)
            used[self.data.index] = True  # a mask, not the positions' [entries] labels
            y_held = y_held[used]
        classes = int(max(int(y_held.max()) if len(y_held) else 0,
                          self.data.y_test.max().item() if len(self.data.y_test) else 0)) + 1
        counts = np.zeros((self.num_devices, classes))
        for lo in range(0, self.num_devices, LABEL_MIX_DEVICES):
            hi = min(lo + LABEL_MIX_DEVICES, self.num_devices)
            start, stop = int(offsets[lo]), int(offsets[hi - 1] + sizes[hi - 1])
            y = self.data.labels(slice(start, stop)).cpu().numpy()
            owner = np.repeat(np.arange(hi - lo), sizes[lo:hi])
            counts[lo:hi] = np.bincount(owner * classes + y, minlength=(hi - lo) * classes
                                        ).reshape(hi - lo, classes)
        return counts / np.maximum(counts.sum(1, keepdims=True), 1.0)

    # ---- the training objective (exact, all samples) -------------------------------------------
    def _samples_per_chunk(self) -> int:
        """Training samples one autograd pass may hold under the memory bound."""
        per_sample = BYTES_PER_FLOAT * (self.input_size + ACTIVATION_COPIES
                                        * self.activations_per_sample)
        room = self.max_chunk_bytes - 4 * BYTES_PER_FLOAT * self.flat.d
        return max(1, int(room // per_sample))

    def _train_pass(self, theta: torch.Tensor, with_gradient: bool
                    ) -> tuple[float, torch.Tensor | None]:
        """(sum_s w_s loss_s, its gradient or None) over the training set, chunked by samples
        (a threaded model: each chunk in blocks of ``SAMPLE_BLOCK`` samples spread over the
        thread pool), the blocks' sums added in sample order. Devices holding indices into a
        shared dataset: each distinct sample once, weighted by all its positions
        (``DeviceData.row_weights``)."""
        start = time.perf_counter()
        total, grad = 0.0, torch.zeros_like(theta) if with_gradient else None
        rows, weights = self._row_weights
        size, count = self._samples_per_chunk(), len(weights)
        block = min(size, SAMPLE_BLOCK) if self.threaded else size
        statistics = self.normalisation_statistics(theta)  # batch norm: f at the population's

        def one(lo: int) -> tuple[torch.Tensor, torch.Tensor | None]:
            where = slice(lo, lo + block) if rows is None else rows[lo:lo + block]
            x, y = self.data.x[where], self.data.y[where]
            w = weights[lo:lo + block]
            if not with_gradient:
                with torch.no_grad():
                    losses = sample_cross_entropy(self.flat.predict(theta, x, statistics), y)
                    return (losses.double() * w).sum(), None
            with torch.enable_grad():
                leaf = theta.detach().requires_grad_(True)
                losses = F.cross_entropy(self.flat.forward(leaf, x, statistics), y,
                                         reduction="none")
                value = (losses.double() * w).sum()
                (g,) = torch.autograd.grad(value, leaf)
            return value.detach(), g

        for lo in range(0, count, size):
            blocks = range(lo, min(lo + size, count), block)
            for value, g in parallel_map(one, blocks) if self.threaded else map(one, blocks):
                total += float(value)
                if grad is not None:
                    grad += g
        self.compute_s += time.perf_counter() - start
        return total, grad

    @cached_property
    def _row_weights(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The training objective's (rows, weights) (``DeviceData.row_weights``): fixed for the
        run, so an index's distinct rows are found once, not at every evaluation."""
        # f = (1/N) sum_i (1/m_i) sum_{s on i} loss_s: sample s of device i weighs 1 / (N m_i).
        sizes = self.data.sizes.double()
        weights = (1.0 / (self.num_devices * sizes)).repeat_interleave(self.data.sizes)
        return self.data.row_weights(weights.to(self.device))

    def objective(self, theta: torch.Tensor) -> float:
        value, _ = self._train_pass(theta, with_gradient=False)
        return value + 0.5 * self.l2 * float(theta.double().square().sum())

    def objective_gradient(self, theta: torch.Tensor) -> torch.Tensor:
        _, grad = self._train_pass(theta, with_gradient=True)
        return grad + self.l2 * theta if self.l2 else grad

    def full_batch_sizes(self) -> np.ndarray:
        return self.data.sizes.numpy().copy()

    def sample_weights(self) -> np.ndarray:
        """n_k = device k's training samples: f_k is the mean loss over them."""
        return self.data.sizes.numpy().astype(np.float64)

    def server_sample_weight(self) -> float:
        """The base station's own samples (its loss is their mean; 0 without any: the server's
        gradient then refuses)."""
        return 0.0 if self.data.y_server is None else float(len(self.data.y_server))

    @contextmanager
    def holding_full_batches(self) -> Iterator[None]:
        """Keep ``full_gradients``' gathered inputs over every device for the block's later
        calls: the gather of every device's samples (a copy of its rows, padded to its chunk's
        widest device) was a third of a best-response solve on Fashion-MNIST. Holds one padded
        copy of the devices' data for the block's length; the numbers are the same bits."""
        outer = self._held_batches
        if outer is None:
            self._held_batches = []
        try:
            yield
        finally:
            if outer is None:
                self._held_batches = None

    def _device_blocks(self, devices: np.ndarray | None
                       ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``full_gradients``' data, one block at a time: per chunk of devices (``row_chunks``,
        rows of the output), its column blocks of (rows, inputs [n, w, ...], labels [n, w],
        weights [n, w] = 1 / m_i on a device's samples, 0 on the padding past its last;
        float32, cast to the model's dtype where used)."""
        sizes, offsets = self.data.sizes, self.data.offsets
        if devices is not None:
            picked = torch.as_tensor(devices, dtype=torch.int64)
            sizes, offsets = sizes[picked], offsets[picked]
        block = min(int(self.data.sizes.max()), self._samples_per_chunk())
        for rows in self.row_chunks(len(sizes), block, own_model=True):
            m = sizes[rows]
            for lo in range(0, int(m.max()), block):
                cols = torch.arange(lo, min(lo + block, int(m.max())))
                valid = cols[None, :] < m[:, None]
                idx = (offsets[rows][:, None] + torch.minimum(cols[None, :], m[:, None] - 1))
                idx = idx.to(self.device)
                weight = (valid / m[:, None]).to(device=self.device)
                yield rows, self.data.inputs(idx), self.data.labels(idx), weight

    def full_gradients(self, theta: torch.Tensor, devices: np.ndarray | None = None
                       ) -> torch.Tensor:
        """grad f_i over all of device i's samples, at theta [d] or at the devices' own models
        [n, d]: -> [n, d], for ``devices`` (increasing indices; None: every device).

        Devices are stacked as in ``stacked_gradients``, in chunks of the memory bound
        (``row_chunks``: a subset costs its own devices' samples); a device's samples are taken
        in column blocks that fit the bound (shorter devices pad with weight 0). Within
        ``holding_full_batches`` the blocks over every device are gathered once."""
        start = time.perf_counter()
        every = devices is None
        count = self.num_devices if every else len(devices)
        if every and self._held_batches is not None:
            if not self._held_batches:
                self._held_batches.extend(self._device_blocks(devices))
            blocks = iter(self._held_batches)
        else:
            blocks = self._device_blocks(devices)
        out = torch.zeros(count, self.flat.d, device=self.device)
        for rows, inputs, y, weight in blocks:
            models = theta.expand(rows.stop - rows.start, -1) if theta.dim() == 1 else theta[rows]
            weight = weight.to(dtype=theta.dtype)

            def device_losses(logits, rows, y=y, weight=weight):
                target = y[rows]
                losses = F.cross_entropy(logits.flatten(0, 1), target.flatten(),
                                         reduction="none")
                return (losses.view(target.shape) * weight[rows]).sum(1)

            out[rows] += self.stacked.losses_and_gradients(models, inputs, device_losses)[1]
        if self.l2:
            out += self.l2 * theta
        self.compute_s += time.perf_counter() - start
        return out

    def suboptimality(self, theta: torch.Tensor) -> float:
        return super().suboptimality(theta) if self.train_metrics else math.nan

    def grad_norm_sq(self, theta: torch.Tensor) -> float:
        return super().grad_norm_sq(theta) if self.train_metrics else math.nan

    def solve_optimum(self, gtol: float = 1e-10, max_iterations: int = 20000) -> None:
        """Set ``optimum`` x* [d] (float64) and ``optimum_value`` f* by a centralised reference
        solve: scipy L-BFGS-B (jac=True) on f in float64 over all training samples (each weighted
        1 / (N m_i), so unequal shards give the same f as the devices), from theta_0, until the
        largest gradient entry is below ``gtol`` or float64 allows no further progress (the
        final value is kept in ``optimum_gradient_max``). Only meaningful for a convex model (logistic)
        with l2 > 0, where f is l2-strongly convex and x* unique."""
        from scipy.optimize import minimize

        rows, weights = self._row_weights
        x, y = (self.data.x, self.data.y) if rows is None else (self.data.x[rows],
                                                               self.data.y[rows])
        size = self._samples_per_chunk()

        def value_and_gradient(z: np.ndarray) -> tuple[float, np.ndarray]:
            theta = torch.from_numpy(z).to(self.device)
            total, grad = 0.5 * self.l2 * float(theta @ theta), self.l2 * theta
            for lo in range(0, len(y), size):
                leaf = theta.detach().requires_grad_(True)
                with torch.enable_grad():
                    logits = self.flat.functional(leaf, x[lo:lo + size].double())
                    losses = F.cross_entropy(logits, y[lo:lo + size], reduction="none")
                    value = (losses * weights[lo:lo + size]).sum()
                    (g,) = torch.autograd.grad(value, leaf)
                total += float(value.detach())
                grad = grad + g
            return total, grad.cpu().numpy()

        start = self.flat.initial().double().numpy()
        result = minimize(value_and_gradient, start, jac=True, method="L-BFGS-B",
                          options={"maxiter": max_iterations, "maxcor": 30, "ftol": 0.0,
                                   "gtol": gtol, "maxfun": 2 * max_iterations})
        self.optimum = torch.from_numpy(result.x).to(self.device)
        self.optimum_value = float(result.fun)
        self.optimum_gradient_max = float(np.abs(result.jac).max())

    def describe(self) -> dict:
        return {"name": "classification", "d": self.d, "l2": self.l2,
                "optimum_value": self.optimum_value,
                "optimum_gradient_max": self.optimum_gradient_max}
