"""The learning problem as algorithms see it: the ``Problem`` interface (N devices' local
objectives f_i and their mean f, batched over devices), the multi-sequence and bilevel
interfaces FedMSA and FedNest compute with (``MSAProblem``, ``BilevelProblem``), and
``ProblemFacts``, a problem's size as the memory check reads it.

These are seams, not implementations: the problems (wirelessfl/problems/) implement them, the
algorithms and the engine read them, and neither side imports the other. A run reaches its
problem through the run port (``ctx.evaluator``, contract/port.py).

**The interface.** With x = theta a flat vector [d],

    f(x) = (1/N) sum_i f_i(x)                                      (fedred.md, Sec. 1.1)

Shapes: N devices, d parameters, b samples per minibatch, E local steps; ``models`` [n, d] holds
one model per device of a chunk of n devices, ``idx`` [n, b] their minibatches (as ``sample``
returned them, rows of the same devices).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from wirelessfl.contract.payload import Cost
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_generator

# Sample keys are drawn below this bound (int64-safe, stored as uint64).
KEY_LIMIT = 2**62


@dataclass(frozen=True)
class ProblemFacts:
    """What the estimate needs to know of the learning problem, found without building it."""

    d: int  # parameters
    itemsize: int  # bytes per value in the compute precision
    data_bytes: int  # the problem's arrays as the run holds them
    load_bytes: int  # the loader's peak (the data as read, before selection and subsampling)
    train_samples: int = 0  # on devices (0: a problem without data)
    test_samples: int = 0
    input_size: int = 0  # values per sample
    activations_per_sample: int = 0
    num_classes: int = 0  # 0: no per-device accuracy or label counts



class Problem(ABC):
    """N devices' local objectives f_i and their mean f, batched over devices.

    Subclasses set ``num_devices``, ``d``, ``device`` and ``compute_s`` (host seconds spent in
    learning compute) and, when known, ``optimum`` x* [d] and ``optimum_value`` f* = f(x*).
    """

    num_devices: int
    d: int
    device: torch.device
    compute_s: float
    optimum_value: float | None = None
    optimum: torch.Tensor | None = None
    # Precision of local computation algorithms may use (models on the air stay float32).
    compute_dtype: torch.dtype = torch.float32

    # ---- what every problem defines ---------------------------------------------------------
    @abstractmethod
    def initial(self) -> torch.Tensor:
        """theta_0 [d], float32, a fresh copy on ``device``."""

    @abstractmethod
    def chunks(self, batch_size: int, own_model: bool) -> Iterator[slice]:
        """Consecutive slices of devices whose work fits the memory bound."""

    @abstractmethod
    def sample(self, generator: torch.Generator, batch_size: int, steps: int = 1) -> torch.Tensor:
        """Minibatches idx [steps, N, w] drawn from ``generator`` (rows in device order). Where
        a minibatch is a set of stored samples, a device holding m_i < b samples gets all of
        them once, in the first m_i slots of its row (the rest is padding the losses and
        gradients weight 0), and w = min(b, max_i m_i) (learning/minibatch.py)."""

    @abstractmethod
    def device_losses(self, theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """f_i(theta; idx_i) of every device at a shared theta [d]: idx [N, b] -> [N]."""

    def device_losses_many(self, thetas: list[torch.Tensor], idx: torch.Tensor
                           ) -> list[torch.Tensor]:
        """``device_losses`` at each of ``thetas`` on the same minibatches (runs in lockstep,
        algorithms/lanes.py); a problem may share the work that does not depend on theta, but
        each result must be the bits ``device_losses`` gives."""
        return [self.device_losses(theta, idx) for theta in thetas]

    @abstractmethod
    def stacked_losses(self, models: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """f_i(models_i; idx_i), each device at its own model, no gradient: [n, d], [n, b] -> [n]."""

    @abstractmethod
    def stacked_gradients(self, models: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """grad f_i(models_i; idx_i), each device at its own model: [n, d], [n, b] -> [n, d]."""

    @abstractmethod
    def full_gradients(self, theta: torch.Tensor, devices: np.ndarray | None = None
                       ) -> torch.Tensor:
        """Exact local gradients grad f_i over all of each device's data, at a shared point
        theta [d] or at each device's own model theta [n, d]: -> [n, d], for the devices
        ``devices`` (increasing indices; None: all N). A device's gradient reads its own data
        only, so a subset costs its own samples, not the population's (cross-device rounds)."""

    @contextmanager
    def holding_full_batches(self) -> Iterator[None]:
        """Within the block, ``full_gradients`` over every device may keep the device data it
        gathers for the next call, for a solver that calls it many times (ZO-HFL's best
        responses, the drift family's exact local solves). The same numbers either way; a
        problem without such a cost does nothing here."""
        yield

    @abstractmethod
    def objective(self, theta: torch.Tensor) -> float:
        """f(theta) = (1/N) sum_i f_i(theta), exact (all data, regulariser included)."""

    @abstractmethod
    def objective_gradient(self, theta: torch.Tensor) -> torch.Tensor:
        """grad f(theta) [d], exact."""

    @abstractmethod
    def evaluate(self, theta: torch.Tensor) -> tuple[float, float]:
        """(accuracy, loss) of theta as the rounds table records them (test_accuracy, test_loss)."""

    # ---- facts a problem may know --------------------------------------------------------------
    @property
    def constants(self) -> dict[str, float] | None:
        """L, mu, delta_A, delta_A_exact, delta_B (fedred.md Sec. 1.2-1.3) when the problem knows
        or can bound them (the parameter rules of the drift-corrected methods read them); None
        for a neural network."""
        return None

    def full_batch_sizes(self) -> np.ndarray:
        """[N] samples one exact local gradient passes over (the batch a full-gradient step is
        costed at)."""
        return np.ones(self.num_devices, dtype=np.int64)

    def minibatch_sizes(self, batch_size: int) -> np.ndarray:
        """[N] samples a minibatch of ``batch_size`` really holds on each device, what its passes
        are costed at (``Cost.batch_size``): b here (the quadratic's minibatch is a noise
        level, not a set of samples); min(b, m_i) where minibatches are stored samples."""
        return np.full(self.num_devices, int(batch_size), dtype=np.int64)

    def sample_weights(self) -> np.ndarray:
        """[N] float64: device k's weight n_k in McMahan et al.'s (2017) sample-weighted
        average sum_k n_k Delta_k / sum_k n_k, for this problem's f_k: the device's sample count
        where f_k is the mean loss over its samples; equal weights (here) where there are no
        samples or f_k already carries its share of them."""
        return np.ones(self.num_devices)

    def server_sample_weight(self) -> float:
        """The base station's weight beside ``sample_weights`` when it trains on a loss of its
        own (``server_data``): here one more device's (a loss without samples)."""
        return 1.0

    def sample_devices(self, seed: int, stream: str, keys: tuple[int, ...], batch_size: int,
                       steps: int, devices: np.ndarray) -> torch.Tensor:
        """Minibatches [steps, n, w] of the devices ``devices`` only, each device's from its own
        stream keyed by (seed, stream, keys, device) (per-device random streams): a device's
        minibatches do not depend on which other devices are drawn for."""
        raise UserError(f"problem: {type(self).__name__} has no per-device random streams; set "
                        "population.random_streams: shared")

    # ---- built on the above -----------------------------------------------------------------
    def minibatches(self, seed: int, stream: str, keys: tuple[int, ...], batch_size: int,
                    steps: int, devices: np.ndarray, per_device: bool) -> torch.Tensor:
        """This round's minibatches [steps, n, w] for the devices ``devices`` (increasing
        indices), rows in their order. Shared streams: the population's draw from
        (seed, stream, keys) (``sample``), of which the devices' rows are taken, so computing a
        round's participants alone gives the numbers computing everyone gave; per-device
        streams: drawn for these devices alone (``sample_devices``)."""
        if per_device:
            return self.sample_devices(seed, stream, keys, batch_size, steps, devices)
        idx = self.sample(keyed_generator(seed, stream, *keys), batch_size, steps)
        if len(devices) == self.num_devices:
            return idx
        return idx[:, torch.as_tensor(devices, device=idx.device)]

    def row_chunks(self, count: int, batch_size: int, own_model: bool) -> Iterator[slice]:
        """Consecutive slices of ``count`` rows (devices of a round, in any selection) no larger
        than ``chunks``' first one: the memory bound of a chunk of devices, for any subset."""
        first = next(iter(self.chunks(batch_size, own_model)))
        size = first.stop - first.start
        for start in range(0, count, size):
            yield slice(start, min(start + size, count))

    def device_gradients(self, theta: torch.Tensor, idx: torch.Tensor
                         ) -> Iterator[tuple[slice, torch.Tensor]]:
        """Per-device minibatch gradients at a shared theta, chunk by chunk of idx's rows [n, b]
        (any selection of devices): (rows, [rows, d])."""
        b = idx.shape[1]
        for rows in self.row_chunks(idx.shape[0], b, own_model=True):
            start = time.perf_counter()
            models = theta.expand(rows.stop - rows.start, -1)
            grads = self.stacked_gradients(models, idx[rows])
            self.compute_s += time.perf_counter() - start
            yield rows, grads

    def local_sgd(self, theta: torch.Tensor, idx: torch.Tensor, lr: float,
                  steps: torch.Tensor | None = None, reuse: bool = False
                  ) -> Iterator[tuple[slice, torch.Tensor]]:
        """Each device runs SGD from theta on its minibatches idx [E, n, b] (the rows of any
        selection of devices); yields (rows of idx, [rows, d]).

        ``steps`` [n] (optional) lets devices stop early: row i takes only its first steps[i].
        ``reuse``: the caller is done with each chunk before it asks for the next, so a problem
        may hand out every chunk in the same memory (this one does not).
        """
        num_steps, count, b = idx.shape
        for rows in self.row_chunks(count, b, own_model=True):
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
            del models, g  # the caller's to keep: not held while the next chunk is made

    def stacked_losses_and_gradients(self, models: torch.Tensor, idx: torch.Tensor
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """(f_i(models_i; idx_i) [n], grad f_i(models_i; idx_i) [n, d]): the loss and the
        gradient of one minibatch at each device's own model (one pass where the problem can)."""
        return self.stacked_losses(models, idx), self.stacked_gradients(models, idx)

    def evaluate_devices(self, theta: torch.Tensor) -> tuple[float, float, np.ndarray | None]:
        """``evaluate``'s (accuracy, loss) and the [N] accuracy of theta on each device's own
        test distribution (None for a problem without accuracy, such as the quadratic)."""
        return (*self.evaluate(theta), None)

    def evaluate_classes(self, theta: torch.Tensor
                         ) -> tuple[float, float, np.ndarray | None, np.ndarray | None]:
        """``evaluate_devices``'s three and, from the same pass, the accuracy on the test samples
        of each class present in the test set (None for a problem without classes). Their
        minimum is the worst-class accuracy, seed 003's "worst acc" on CIFAR-10 (fgdro.md
        Sec. 6 item 16): a balanced view of the test set, whatever its class shares."""
        return (*self.evaluate_devices(theta), None)

    def suboptimality(self, theta: torch.Tensor) -> float:
        """f(theta) - f*, NaN when f* is unknown."""
        if self.optimum_value is None:
            return math.nan
        return self.objective(theta) - self.optimum_value

    def grad_norm_sq(self, theta: torch.Tensor) -> float:
        """||grad f(theta)||^2, in float64."""
        g = self.objective_gradient(theta).double()
        return float(g @ g)

    def metrics(self, theta: torch.Tensor) -> dict:
        """What the rounds table records at an evaluation point (``device_accuracy``: [N] or
        None; ``class_accuracy``: one per class of the test set, or None)."""
        accuracy, loss, devices, classes = self.evaluate_classes(theta)
        return {"test_accuracy": float(accuracy), "test_loss": float(loss),
                "suboptimality": float(self.suboptimality(theta)),
                "grad_norm_sq": float(self.grad_norm_sq(theta)),
                "device_accuracy": devices, "class_accuracy": classes}

    def server_gradient(self, theta: torch.Tensor, generator: torch.Generator,
                        batch_size: int) -> torch.Tensor:
        """Minibatch gradient [d] of the base station's own loss (seed 000's f_1), for problems
        whose base station holds data; others refuse with a clear message."""
        raise UserError(f"this algorithm needs a loss held by the base station, which problem "
                        f"'{type(self).__name__}' does not have; set data.server_fraction > 0 "
                        "(classification) or problem.server_loss: true (quadratic)")

    def server_objective(self, theta: torch.Tensor) -> float:
        """The base station's own loss f_1(theta) over all of its data (seed 000's f_1, whose
        minibatch gradient is ``server_gradient``); problems without one refuse."""
        raise UserError(f"problem '{type(self).__name__}' has no full loss of the base station "
                        "(server_objective), which log_objective records; set log_objective: "
                        "false, or use a problem whose base station holds data "
                        "(classification with data.server_fraction > 0, or the quadratic "
                        "with problem.server_loss: true)")

    def describe(self) -> dict:
        """Facts for the run manifest (``problem`` entry)."""
        return {"d": self.d, "optimum_value": self.optimum_value}


# Below this many multiply-adds per map evaluation, torch's intra-op threads cost more than they
# save (measured: a 50-value state on 2 shared cores ran 10x slower with 2 threads than with 1).
SINGLE_THREAD_MACS = 2**20


@contextmanager
def single_thread_if_small(macs: int):
    """Run tiny tensor work on one intra-op thread (results do not depend on it)."""
    before = torch.get_num_threads()
    if macs >= SINGLE_THREAD_MACS or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class EpochBatch:
    """One minibatch per client: ``positions`` [n, b] of its training samples (0 .. m_i - 1)
    and ``weights`` [n, b], 1 for a sample in the batch, 0 past the client's last sample."""

    positions: torch.Tensor
    weights: torch.Tensor


class MSAProblem(Problem):
    """A federated MSA problem (fedmsa.md Sec. 1.2): per-client maps on a block state.

    Subclasses set ``blocks`` and define ``maps``; ``solution`` (x*, the true x part of the
    fixed point) when known. Algorithms for single-level problems (gradients of one f_i) are
    refused with a clear message.
    """

    blocks: tuple[int, ...]
    compute_dtype = torch.float64
    solution: torch.Tensor | None = None

    @abstractmethod
    def maps(self, states: torch.Tensor, devices: torch.Tensor,
             keys: np.ndarray | None = None) -> torch.Tensor:
        """Map evaluations [n, P] of clients ``devices`` [n] at their own states [n, P]
        (float64): exact (all local data) when ``keys`` is None, else one stochastic sample per
        row keyed by ``keys`` [n] (the same key gives the same sample, so two states evaluated
        with one key share it, as the variance-reduced differences need)."""

    @abstractmethod
    def evaluation_cost(self, evaluations, full_batch: bool, batch_size: int) -> Cost:
        """What ``evaluations`` map evaluations (scalar or [N]) cost a device."""

    def step_sizes(self, rates: tuple[float, ...]) -> torch.Tensor:
        """[P] the step of each state entry: rates[0] on x, rates[n] on z^n."""
        if len(rates) != len(self.blocks):
            raise ValueError(f"{len(rates)} step sizes for {len(self.blocks)} blocks")
        return torch.cat([torch.full((size,), float(rate), dtype=torch.float64)
                          for size, rate in zip(self.blocks, rates, strict=True)]).to(self.device)

    def sample_keys(self, generator: torch.Generator) -> np.ndarray:
        """[N] sample keys, one per device, from ``generator``."""
        keys = torch.randint(0, KEY_LIMIT, (self.num_devices,), generator=generator)
        return keys.numpy().astype(np.uint64)

    def x_part(self, theta: torch.Tensor) -> torch.Tensor:
        return theta[..., :self.blocks[0]]

    def pooled_gradient(self, theta: torch.Tensor, key: int, batch: int) -> torch.Tensor:
        """The gradient at theta's x part [d_0] (float64) of the composed objective estimated
        on ``batch`` samples drawn (keyed by ``key``) from every client's samples pooled: what a
        centralized method steps along (problems with the ``compositional`` capability)."""
        raise UserError(f"problem '{self.name}' has no composed objective to pool: centralized "
                        "SGD needs a compositional problem (risk-averse-mco)")

    def pooled_maps(self, states: torch.Tensor, key: int, batch: int) -> torch.Tensor:
        """Map evaluations [n, P] at states [n, P] (float64) on one sample of ``batch`` samples
        drawn (keyed by ``key``, the same for every row) from every client's samples pooled:
        what a centralized tracking method steps along (problems with the ``compositional``
        capability)."""
        raise UserError(f"problem '{self.name}' has no composed objective to pool: a "
                        "centralized method needs a compositional problem (risk-averse-mco)")

    def relative_error(self, theta: torch.Tensor) -> float:
        """||x - x*|| / ||x*|| of the state's x part (NaN when x* is unknown)."""
        if self.solution is None:
            return math.nan
        x = self.x_part(theta).to(torch.float64)
        return float(torch.linalg.vector_norm(x - self.solution)
                     / torch.linalg.vector_norm(self.solution))

    def suboptimality(self, theta: torch.Tensor) -> float:
        """For an MSA problem the relative error ||x - x*|| / ||x*|| (docs/results.md)."""
        return self.relative_error(theta)

    # ---- a multi-sequence problem has no single f_i to take gradients of ----------------------
    def _single_level(self, *_args, **_kwargs):
        raise UserError(f"problem '{self.name}' is a multi-sequence (bilevel) problem: it has no "
                        "single loss f_i to take gradients of; run it with algorithm 'fedmsa', "
                        "or use a single-level problem (classification, quadratic, logistic)")

    device_losses = stacked_losses = stacked_gradients = full_gradients = _single_level

    def chunks(self, batch_size: int, own_model: bool) -> Iterator[slice]:
        yield slice(0, self.num_devices)

    def sample(self, generator: torch.Generator, batch_size: int, steps: int = 1) -> torch.Tensor:
        self._single_level()

    def initial(self) -> torch.Tensor:
        """theta_0 = 0: x_0 = w_0 = v_0 = 0 (fedmsa.md Sec. 5.1, A13)."""
        return torch.zeros(self.d, device=self.device)


class BilevelProblem(MSAProblem):
    """min_x (1/M) sum_m f^m(x, w*(x)), w*(x) = argmin_w (1/M) sum_m g^m(x, w) (Sec. 1.4);
    state [x; w; v], blocks (d_x, 2 d_w) (N = 1: z = [w; v], one step size beta for both)."""

    dx: int
    dw: int

    @abstractmethod
    def inner_loss(self, x: torch.Tensor, w: torch.Tensor, devices: torch.Tensor,
                   keys: np.ndarray | None, batch: EpochBatch | None = None) -> torch.Tensor:
        """sum over rows of g^{m}(x_i, w_i; sample_i), m = devices[i]: a scalar. ``batch``:
        only these of each client's training samples (its mean over them; ``epoch_batches``),
        None for all of them."""

    @abstractmethod
    def outer_loss(self, x: torch.Tensor, w: torch.Tensor, devices: torch.Tensor,
                   keys: np.ndarray | None) -> torch.Tensor:
        """sum over rows of f^{m}(x_i, w_i; sample_i), m = devices[i]: a scalar."""

    def work(self, rows: int) -> int:
        """Multiply-adds of one map evaluation for ``rows`` clients (picks the thread count)."""
        return rows * self.model_profile.macs_per_sample

    def maps(self, states, devices, keys=None):
        """(p, s_w, s_v) by one backward with the graph kept and one double backward
        (module docstring); rows are independent, so the sums give per-device derivatives."""
        start = time.perf_counter()
        s = states.to(torch.float64)
        dx, dw = self.dx, self.dw
        x = s[:, :dx].detach().requires_grad_(True)
        w = s[:, dx:dx + dw].detach().requires_grad_(True)
        v = s[:, dx + dw:].detach()
        with torch.enable_grad(), single_thread_if_small(self.work(len(states))):
            (g_w,) = torch.autograd.grad(self.inner_loss(x, w, devices, keys), w,
                                         create_graph=True)
            # One reverse sweep over <grad_w g, v> - f gives, with respect to w,
            # grad^2_ww g v - grad_w f = s_v and, with respect to x, grad^2_xw g v - grad_x f = -p:
            # the double backward and the outer backward share the sweep.
            s_v, minus_p = torch.autograd.grad((g_w * v).sum()
                                               - self.outer_loss(x, w, devices, keys), (w, x),
                                               allow_unused=True)
        minus_p = torch.zeros_like(x) if minus_p is None else minus_p
        out = torch.cat([-minus_p, g_w.detach(), s_v], dim=1)
        self.compute_s += time.perf_counter() - start
        return out

    # ---- the separate oracles of methods that do not evaluate the maps whole (FedNest) -------
    def _leaves(self, x: torch.Tensor, w: torch.Tensor):
        return (x.to(torch.float64).detach().requires_grad_(True),
                w.to(torch.float64).detach().requires_grad_(True))

    def inner_gradients(self, x, w, devices, keys=None, batch: EpochBatch | None = None
                        ) -> torch.Tensor:
        """grad_w g^m(x_i, w_i) [n, d_w] (one forward + one backward), over the minibatch
        ``batch`` of each client's training samples or over all of them."""
        x, w = self._leaves(x, w)
        with torch.enable_grad(), single_thread_if_small(self.work(len(w))):
            return torch.autograd.grad(self.inner_loss(x, w, devices, keys, batch), w)[0]

    def epoch_batches(self, generator: torch.Generator, batch_size: int, devices: torch.Tensor
                      ) -> tuple[list[EpochBatch], np.ndarray]:
        """One local epoch over the training samples of clients ``devices`` [n]: each client's
        samples in a random order (drawn from ``generator``, on the CPU) cut into ceil(m_i / b)
        minibatches of b, the last one smaller when b does not divide m_i (a data loader's
        epoch with shuffling). Returns the batches of step j = 0, 1, ... (a client whose epoch
        has ended has no sample in the later ones) and the steps per client [n]."""
        sizes = torch.as_tensor(self.full_batch_sizes(), dtype=torch.int64)[devices.cpu()]
        slots = int(sizes.max()) if len(sizes) else 0
        order = torch.rand((len(sizes), slots), generator=generator, dtype=torch.float64)
        order.masked_fill_(torch.arange(slots) >= sizes[:, None], 2.0)  # padding sorts last
        order = order.argsort(dim=1)
        steps = (sizes + batch_size - 1) // batch_size
        batches = []
        for start in range(0, slots, batch_size):
            rank = torch.arange(start, min(start + batch_size, slots))
            batches.append(EpochBatch(
                positions=order[:, rank].to(self.device),
                weights=(rank[None, :] < sizes[:, None]).to(torch.float64).to(self.device)))
        return batches, steps.numpy()

    def outer_gradients(self, x, w, devices, keys=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(grad_x f^m [n, d_x], grad_w f^m [n, d_w]) (one forward + one backward)."""
        x, w = self._leaves(x, w)
        with torch.enable_grad(), single_thread_if_small(self.work(len(w))):
            f_x, f_w = torch.autograd.grad(self.outer_loss(x, w, devices, keys), (x, w),
                                           allow_unused=True)
        return (torch.zeros_like(x) if f_x is None else f_x), f_w

    def second_order(self, x, w, u, devices, keys=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(grad^2_ww g^m u [n, d_w], grad^2_xw g^m u [n, d_x]) at (x_i, w_i): one forward,
        one backward with the graph kept, one double backward."""
        x, w = self._leaves(x, w)
        u = u.to(torch.float64)
        with torch.enable_grad(), single_thread_if_small(self.work(len(w))):
            (g_w,) = torch.autograd.grad(self.inner_loss(x, w, devices, keys), w,
                                         create_graph=True)
            hvp, jvp = torch.autograd.grad((g_w * u).sum(), (w, x), allow_unused=True)
        return hvp, (torch.zeros_like(x) if jvp is None else jvp)

    def evaluation_cost(self, evaluations, full_batch, batch_size):
        """One map evaluation = 2 forward + 2 backward passes (inner and outer batch) + 1
        Hessian-vector product (fedmsa.md Sec. 3.1)."""
        batch = self.full_batch_sizes() if full_batch else batch_size
        return Cost(forward_passes=2 * np.asarray(evaluations), backward_passes=2 * np.asarray(
            evaluations), hvp_passes=np.asarray(evaluations), batch_size=batch)
