"""Regularised binary logistic regression split over devices, with f* known (fedred.md Sec. 4.2).

Device i holds m_i samples (a_ij, y_ij), a_ij in R^d, y_ij in {-1, +1}; M = sum_i m_i, n = N
devices. The paper's local objectives and their mean are

    f_i(x) = (n/M) sum_{j on i} log(1 + exp(-y_ij a_ij^T x)) + (l2/2) ||x||^2,
    f(x)   = (1/n) sum_i f_i(x) = (1/M) sum_{all samples} log(1 + exp(-y a^T x)) + (l2/2) ||x||^2,

with l2 = 1/M by default (the paper's mu = 1/M). The model is linear without a bias term, as in
the paper (a constant feature in the data plays that role when wanted). A minibatch is a set of
sample indices, as for the torch classifier (``sample_minibatches``).

Everything is computed in float64 (numbers come back in theta's dtype); sums over samples are
elementwise products and reductions, which give the same bits however devices and samples are
split into chunks (a BLAS matrix-vector product would not), so ``max_chunk_mb`` never changes a
result. x* and f* are computed once at construction by Newton's method (exact Hessian,
backtracking line search), or scipy L-BFGS-B when d is large.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from functools import cached_property, partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from wirelessfl.contract.problem import ProblemFacts
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.errors import UserError
from wirelessfl.learning.datasets import BUILTIN_CLASSES
from wirelessfl.learning.minibatch import (
    batch_counts,
    minibatch_mean,
    minibatch_scale,
    owner_sizes,
    real_batch_sizes,
    sample_device_minibatches,
    sample_minibatches,
)
from wirelessfl.learning.partition import DeviceSamples
from wirelessfl.problems.base import (
    ALL_CONSTANTS,
    BuiltProblem,
    Problem,
    ProblemConfig,
    ProblemSpec,
    default_field,
    similarity_constants,
    unread_section,
)
from wirelessfl.problems.data import SplitData, check_partition, server_keeps_data, split_data
from wirelessfl.problems.data_size import data_bytes

if TYPE_CHECKING:
    from wirelessfl.learning.datasets import DataFacts
    from wirelessfl.scenario.schema import Scenario

# Defaults of the `problem: {name: logistic}` scenario section.
LOGISTIC_DEFAULTS = {
    "l2": None,  # None: 1/M, the paper's mu = 1/M (fedred.md Sec. 4.2)
    "normalize_rows": True,  # rows rescaled to average norm 1 (fedred.md Sec. 5.2), L near 1/4
}
# Above this dimension (or when the N dense d x d Hessians would pass DENSE_HESSIAN_MAX_BYTES)
# x* comes from L-BFGS-B instead of Newton, and only L is computed (by Lanczos), not delta.
DENSE_HESSIAN_MAX_D = 2000
DENSE_HESSIAN_MAX_BYTES = 2 * 2**30
NEWTON_GRADIENT_TOL = 1e-12  # stop Newton once ||grad f(x)|| <= this
NEWTON_MAX_ITERATIONS = 200
ARMIJO = 1e-4


def softplus(t: torch.Tensor | np.ndarray):
    """log(1 + exp(t)) without overflow or the approximation torch's softplus makes above its
    threshold: max(t, 0) + log1p(exp(-|t|))."""
    if isinstance(t, np.ndarray):
        return np.maximum(t, 0.0) + np.log1p(np.exp(-np.abs(t)))
    return t.clamp(min=0) + torch.log1p(torch.exp(-t.abs()))


def _sigmoid_np(t: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(t))
    return np.where(t >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def logistic_optimum(a: np.ndarray, y: np.ndarray, l2: float,
                     tol: float = NEWTON_GRADIENT_TOL) -> tuple[np.ndarray, float, float]:
    """(x*, f*, ||grad f(x*)||) of f(x) = mean_j log(1 + exp(-y_j a_j^T x)) + l2/2 ||x||^2.

    Newton's method from 0 with the exact Hessian (1/M) A^T diag(s (1 - s)) A + l2 I
    (s = sigmoid(y a^T x)), the step by Cholesky, and an Armijo backtracking line search; it
    stops when ||grad|| <= tol, or when a full step no longer lowers ||grad|| once f cannot
    resolve the decrease (float64's floor). For d > DENSE_HESSIAN_MAX_D, scipy L-BFGS-B instead
    (gtol = tol, ftol = 0: until float64 allows no progress).
    """
    m, d = a.shape

    def value(x: np.ndarray) -> float:
        return float(softplus(-y * (a @ x)).sum() / m + 0.5 * l2 * (x @ x))

    def gradient(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z = y * (a @ x)
        return a.T @ (-y * _sigmoid_np(-z)) / m + l2 * x, z

    if d > DENSE_HESSIAN_MAX_D:
        from scipy.optimize import minimize

        result = minimize(lambda x: (value(x), gradient(x)[0]), np.zeros(d), jac=True,
                          method="L-BFGS-B", options={"maxiter": 100000, "maxfun": 200000,
                                                      "maxcor": 30, "ftol": 0.0, "gtol": tol})
        x = result.x
        return x, value(x), float(np.linalg.norm(gradient(x)[0]))

    x = np.zeros(d)
    f = value(x)
    g, z = gradient(x)
    for _ in range(NEWTON_MAX_ITERATIONS):
        g_norm = float(np.linalg.norm(g))
        if g_norm <= tol:
            break
        s = _sigmoid_np(z)
        hessian = (a.T * (s * (1.0 - s) / m)) @ a + l2 * np.eye(d)
        chol = np.linalg.cholesky(hessian)
        step = -np.linalg.solve(chol.T, np.linalg.solve(chol, g))
        decrement = -float(g @ step)  # g^T H^-1 g > 0
        if decrement <= 1e-14 * max(abs(f), 1.0):
            # f cannot resolve the decrease any more: accept the full step while ||grad| falls.
            x_new = x + step
            g_new, z_new = gradient(x_new)
            if np.linalg.norm(g_new) >= g_norm:
                break
            x, g, z, f = x_new, g_new, z_new, value(x_new)
            continue
        t = 1.0
        while True:
            x_new = x + t * step
            f_new = value(x_new)
            if f_new <= f - ARMIJO * t * decrement:
                break
            t *= 0.5
            if t < 1e-12:
                break
        if t < 1e-12:
            break  # no progress possible
        x, f = x_new, f_new
        g, z = gradient(x)
    return x, value(x), float(np.linalg.norm(g))


def _largest_eigenvalue(a: np.ndarray) -> float:
    """lambda_max(A^T A) by Lanczos (scipy eigsh) on the operator v -> A^T (A v)."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    d = a.shape[1]
    if min(a.shape) <= 2:
        return float(np.linalg.eigvalsh(a.T @ a)[-1]) if d <= DENSE_HESSIAN_MAX_D else \
            float(np.linalg.svd(a, compute_uv=False)[0] ** 2)
    op = LinearOperator((d, d), matvec=lambda v: a.T @ (a @ v), dtype=np.float64)
    return float(eigsh(op, k=1, which="LA", return_eigenvectors=False, tol=1e-12)[0])


class LogisticProblem(Problem):
    """The paper's regularised logistic regression (fedred.md Sec. 4.2) as a ``Problem``.

    ``x_train`` [n_train, d] with labels ``y_train`` in {0, 1} (or {-1, +1}; 0 maps to -1),
    ``shards`` the training indices of each device (a ``DeviceSamples``, as ``partition``
    returns them, or one index array per device), the test
    set ``x_test``, ``y_test``; ``server`` optional training indices the base station keeps (its
    own loss, ``server_gradient``). With ``normalize_rows`` every input (training, test and
    server) is divided by the mean norm of the devices' training rows, so that the average row
    norm is 1 (fedred.md Sec. 5.2) and L stays near 1/4.

    Samples are stored device after device (global index = position in that order), so a
    minibatch ``idx`` [n, b] holds global indices, each row one device's. Per-sample weights:
    a minibatch gradient of device i is (n m_i / M) mean_{j in batch} grad loss_j + l2 x, an
    unbiased estimate of grad f_i (batches are uniform b-subsets for b <= m_i; for b >= m_i the
    batch is all of device i's samples and the gradient is exactly grad f_i).

    Compute is costed (``model_profile``) as a linear model: the forward pass a^T x is d MACs
    per sample with one output activation and d inputs.
    """

    compute_dtype = torch.float64  # the arithmetic is float64: local models may be kept so

    def __init__(self, x_train, y_train, shards, x_test, y_test, l2: float | None = None,
                 normalize_rows: bool = True, device: torch.device | str = "cpu",
                 max_chunk_mb: float = 1024.0, server: np.ndarray | None = None):
        self.device = torch.device(device)
        self.max_chunk_bytes = max_chunk_mb * 2**20
        self.compute_s = 0.0
        x_train = np.asarray(x_train)
        if x_train.ndim != 2:
            raise UserError(f"problem 'logistic' needs flat inputs [samples, features], got "
                            f"shape {x_train.shape}; use a tabular dataset (breast_cancer, "
                            "libsvm, synthetic, digits)")
        samples = DeviceSamples.coerce(shards)  # index sets, or one array per device
        sizes = samples.sizes
        if len(sizes) == 0 or sizes.min() < 1:
            raise UserError("problem 'logistic': every device needs at least one training "
                            "sample; use fewer devices or partition.min_samples")
        order = samples.order
        self.num_devices, self.d = len(sizes), x_train.shape[1]
        self.M = int(sizes.sum())
        a = x_train[order].astype(np.float64)
        self.normalize_rows = bool(normalize_rows)
        norms = np.linalg.norm(a, axis=1).mean()
        self.row_scale = float(1.0 / norms) if self.normalize_rows and norms > 0 else 1.0
        a *= self.row_scale
        y = self._signs(np.asarray(y_train)[order])
        self.l2 = float(1.0 / self.M if l2 is None else l2)
        if not self.l2 > 0:
            raise UserError(f"problem.l2 must be positive (f is then l2-strongly convex and x* "
                            f"unique), got {self.l2:g}; omit it for the default 1/M")
        self.a_np, self.y_np, self.sizes_np = a, y, sizes
        self.sizes = torch.from_numpy(sizes)
        self.offsets = torch.cumsum(self.sizes, 0) - self.sizes
        self.a = torch.from_numpy(a).to(self.device)
        self.y = torch.from_numpy(y).to(self.device)
        self.owner = torch.repeat_interleave(torch.arange(self.num_devices), self.sizes
                                             ).to(self.device)
        self._owner_sizes = owner_sizes(self.sizes).to(self.device)  # ``batch_counts``
        # f_i's sample weight n / M: a device's minibatch mean is scaled by n m_i / M.
        self.device_weight = torch.from_numpy(self.num_devices * sizes / self.M).to(self.device)
        self.a_test = torch.from_numpy(np.asarray(x_test, np.float64) * self.row_scale
                                       ).to(self.device)
        self.y_test = torch.from_numpy(self._signs(np.asarray(y_test))).to(self.device)
        self.a_server = self.y_server = None
        if server is not None and len(server):
            server = np.asarray(server, dtype=np.int64)
            self.a_server = torch.from_numpy(x_train[server].astype(np.float64) * self.row_scale
                                             ).to(self.device)
            self.y_server = torch.from_numpy(self._signs(np.asarray(y_train)[server])
                                             ).to(self.device)
        self.model_profile = ModelProfile(params=self.d, macs_per_sample=self.d,
                                          activations_per_sample=1, input_size=self.d)
        x_star, f_star, g_norm = logistic_optimum(a, y, self.l2)
        self.optimum = torch.from_numpy(x_star).to(self.device)
        self.optimum_value = f_star
        self.optimum_gradient_norm = g_norm
        # -y a^T x* per sample, for suboptimality without cancellation.
        self._opt_neg_margin = torch.from_numpy(-y * (a @ x_star)).to(self.device)

    @staticmethod
    def _signs(labels: np.ndarray) -> np.ndarray:
        values = set(np.unique(labels).tolist())
        if values <= {0, 1}:
            return 2.0 * labels.astype(np.float64) - 1.0
        if values <= {-1, 1}:
            return labels.astype(np.float64)
        raise UserError(f"problem 'logistic' is binary but the labels are {sorted(values)}; set "
                        "data.positive_classes (one class against the rest) or data.classes "
                        "with two labels")

    # ---- facts ---------------------------------------------------------------------------------
    def _dense_hessians(self) -> bool:
        return (self.d <= DENSE_HESSIAN_MAX_D
                and 8 * self.num_devices * self.d**2 <= DENSE_HESSIAN_MAX_BYTES)

    @cached_property
    def constants(self) -> dict[str, float]:  # type: ignore[override]
        """L = max_i lambda_max(Hessian of f_i at 0) = max_i (n/(4M)) lambda_max(A_i^T A_i) + l2
        (fedred.md Sec. 4.2's L_i), mu = l2 (every f_i is l2-strongly convex), and, from the
        Hessians at 0 (fedred.md A20: an estimate, the Hessians vary with x),
        ``similarity_constants``' delta_A (the paper's formula), delta_A_exact and delta_B.
        Without dense Hessians (d > DENSE_HESSIAN_MAX_D, or n d^2 float64 above
        DENSE_HESSIAN_MAX_BYTES) only L (by Lanczos) and mu: the delta keys are left out."""
        n, scale = self.num_devices, self.num_devices / (4.0 * self.M)
        bounds = np.concatenate([[0], np.cumsum(self.sizes_np)])
        blocks = [self.a_np[bounds[i]:bounds[i + 1]] for i in range(n)]
        if not self._dense_hessians():
            top = max(_largest_eigenvalue(b) for b in blocks)
            return {"L": float(scale * top + self.l2), "mu": self.l2}
        hessians = np.stack([scale * (b.T @ b) + self.l2 * np.eye(self.d) for b in blocks])
        out = similarity_constants(hessians)
        out["mu"] = self.l2
        return out

    def full_batch_sizes(self) -> np.ndarray:
        """m_i: a full local gradient is a pass over device i's samples."""
        return self.sizes_np.copy()

    def sample_weights(self) -> np.ndarray:
        """M / n for every device: f_i = (n m_i / M) F_i already carries its share m_i of the
        samples (F_i its mean loss), so sum_i m_i F_i = (M / n) sum_i f_i weighs the f_i
        equally; a sample-weighted average must not weigh them by m_i again."""
        return np.full(self.num_devices, self.M / self.num_devices)

    def server_sample_weight(self) -> float:
        """The base station's samples: its loss is their plain mean (``server_gradient``)."""
        return 0.0 if self.y_server is None else float(len(self.y_server))

    def describe(self) -> dict:
        return {"name": "logistic", "clients": self.num_devices, "d": self.d, "M": self.M,
                "l2": self.l2, "normalize_rows": self.normalize_rows,
                "row_scale": self.row_scale, **self.constants,
                "optimum_value": self.optimum_value,
                "optimum_norm": float(torch.linalg.vector_norm(self.optimum)),
                "optimum_gradient_norm": self.optimum_gradient_norm}

    def initial(self) -> torch.Tensor:
        """x^0 = 0."""
        return torch.zeros(self.d, device=self.device)

    # ---- chunks and minibatches ----------------------------------------------------------------
    def chunks(self, batch_size: int, own_model: bool) -> Iterator[slice]:
        # float64: the gathered rows [b, d] and their product with the model, a few [b]
        # vectors, and model-sized rows (model, gradient, update, temporaries).
        per_device = 8 * (batch_size * (2 * self.d + 4) + (6 if own_model else 2) * self.d)
        size = max(1, min(self.num_devices, int(self.max_chunk_bytes // per_device)))
        for start in range(0, self.num_devices, size):
            yield slice(start, min(start + size, self.num_devices))

    def _rows_per_block(self) -> int:
        """Samples one pass over the training set takes at a time (float64 [rows, d] twice)."""
        return max(1, int(self.max_chunk_bytes // (8 * (2 * self.d + 6))))

    def sample(self, generator: torch.Generator, batch_size: int, steps: int = 1) -> torch.Tensor:
        """Global sample indices [steps, N, w], uniform without replacement within a minibatch;
        a device with m_i < b gets all of its samples once (``sample_minibatches``)."""
        start = time.perf_counter()
        out = sample_minibatches(generator, self.sizes, self.offsets, batch_size, steps,
                                 self.device)
        self.compute_s += time.perf_counter() - start
        return out

    def sample_devices(self, seed, stream, keys, batch_size, steps, devices):
        """``sample``'s minibatches for the devices ``devices`` alone, keyed per device."""
        start = time.perf_counter()
        out = sample_device_minibatches(seed, stream, keys, devices, self.sizes, self.offsets,
                                        batch_size, steps, self.device)
        self.compute_s += time.perf_counter() - start
        return out

    def minibatch_sizes(self, batch_size: int) -> np.ndarray:
        return real_batch_sizes(self.sizes_np, batch_size)

    # ---- minibatch losses and gradients -----------------------------------------------------------
    def _minibatch(self, models: torch.Tensor, idx: torch.Tensor):
        """(x [n, d], rows [n, w, d], labels [n, w], margins y a^T x [n, w], weight n m_i / M,
        real samples of each row [n] (``batch_counts``))."""
        x = models.to(torch.float64)
        rows, labels = self.a[idx], self.y[idx]
        margins = labels * (rows * x[:, None, :]).sum(2)
        return (x, rows, labels, margins, self.device_weight[self.owner[idx[:, 0]]],
                batch_counts(idx, self._owner_sizes))

    def _loss(self, x, margins, weight, counts) -> torch.Tensor:
        mean = minibatch_mean(softplus(-margins), counts)
        return weight * mean + 0.5 * self.l2 * x.square().sum(1)

    def _gradient(self, x, rows, labels, margins, weight, counts) -> torch.Tensor:
        """The minibatch mean's gradient: padding slots weigh 0, real ones weight / count
        (written weight / w * scale, which is weight / w bit for bit on a full row)."""
        width = margins.shape[1]
        mask, scale = minibatch_scale(counts, width, margins.dtype)
        coef = -labels * torch.sigmoid(-margins) * (weight / width * scale)[:, None]
        coef = torch.where(mask, coef, 0.0)
        return (coef[:, :, None] * rows).sum(1) + self.l2 * x

    def stacked_losses(self, models: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        x, _, _, margins, weight, counts = self._minibatch(models, idx)
        return self._loss(x, margins, weight, counts).to(models.dtype)

    def device_losses(self, theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        out = torch.empty(idx.shape[0], dtype=theta.dtype, device=self.device)
        for rows in self.chunks(idx.shape[1], own_model=False):
            out[rows] = self.stacked_losses(theta.expand(rows.stop - rows.start, -1), idx[rows])
        self.compute_s += time.perf_counter() - start
        return out

    def stacked_gradients(self, models: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        batch = self._minibatch(models, idx)
        return self._gradient(*batch).to(models.dtype)

    def stacked_losses_and_gradients(self, models: torch.Tensor, idx: torch.Tensor
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both of the above from one gather of the minibatch rows."""
        batch = self._minibatch(models, idx)
        x, margins, weight, counts = batch[0], batch[3], batch[4], batch[5]
        return (self._loss(x, margins, weight, counts).to(models.dtype),
                self._gradient(*batch).to(models.dtype))

    # ---- exact passes over the training set ---------------------------------------------------
    def _blocks(self) -> Iterator[slice]:
        size = self._rows_per_block()
        for lo in range(0, self.M, size):
            yield slice(lo, min(lo + size, self.M))

    def full_gradients(self, theta: torch.Tensor, devices: np.ndarray | None = None
                       ) -> torch.Tensor:
        """grad f_i over all of device i's samples, at a shared theta [d] or at each device's own
        model theta [n, d]: -> [n, d], for ``devices`` (None: all N). Samples are taken in
        blocks under the memory bound and summed into their device's row (index_add in sample
        order, so a subset's rows equal the whole population's bit for bit)."""
        start = time.perf_counter()
        x = theta.to(torch.float64)
        g = self._sample_sums(x, devices) * (self.num_devices / self.M) + self.l2 * x
        self.compute_s += time.perf_counter() - start
        return g.to(theta.dtype)

    def _sample_sums(self, x: torch.Tensor, devices: np.ndarray | None = None) -> torch.Tensor:
        """[n, d] float64: sum over device i's samples of grad log(1 + exp(-y a^T x_i)), x [d]
        shared or [n, d] per device, for ``devices`` (None: all N; a subset passes over its
        own samples only)."""
        if devices is None:
            samples, owner, count = None, self.owner, self.num_devices
        else:
            rows = torch.as_tensor(devices, dtype=torch.int64)
            sizes = self.sizes[rows]
            count = len(rows)
            local = torch.repeat_interleave(torch.arange(count), sizes)
            first = torch.cumsum(sizes, 0) - sizes
            samples = (self.offsets[rows][local] + torch.arange(int(sizes.sum())) - first[local]
                       ).to(self.device)
            owner = local.to(self.device)
        total = torch.zeros(count, self.d, dtype=torch.float64, device=self.device)
        size = self._rows_per_block()
        for lo in range(0, len(owner), size):
            block = slice(lo, min(lo + size, len(owner)))
            at = block if samples is None else samples[block]
            a, y, who = self.a[at], self.y[at], owner[block]
            point = x[who] if x.dim() == 2 else x
            margins = y * (a * point).sum(1)
            total.index_add_(0, who, (-y * torch.sigmoid(-margins))[:, None] * a)
        return total

    def objective(self, theta: torch.Tensor) -> float:
        """f(theta); the per-sample losses are summed in one reduction (chunking-invariant)."""
        x = theta.to(torch.float64)
        losses = torch.cat([softplus(-self.y[b] * (self.a[b] * x).sum(1)) for b in self._blocks()])
        return float(losses.sum()) / self.M + 0.5 * self.l2 * float(x @ x)

    def objective_gradient(self, theta: torch.Tensor) -> torch.Tensor:
        """grad f(theta) = mean_i grad f_i(theta) = (1/M) sum_j grad loss_j + l2 theta."""
        x = theta.to(torch.float64)
        return (self._sample_sums(x).sum(0) / self.M + self.l2 * x).to(theta.dtype)

    def suboptimality(self, theta: torch.Tensor) -> float:
        """f(theta) - f* without the cancellation of subtracting two O(1) numbers: per sample,
        with v = -y a^T x* and t = -y a^T (x - x*),
        softplus(v + t) - softplus(v) = log1p(expm1(t) sigmoid(v)) (for |t| < 1; directly
        otherwise), and l2/2 (||x||^2 - ||x*||^2) = l2 e^T (x* + e/2) with e = x - x*. Accurate
        to about 1e-16 ||e|| (not clipped at 0: x* is exact to ~1e-12 in gradient norm)."""
        e = theta.to(torch.float64) - self.optimum
        parts = []
        for block in self._blocks():
            v = self._opt_neg_margin[block]
            t = -self.y[block] * (self.a[block] * e).sum(1)
            near = t.abs() < 1
            small = torch.log1p(torch.expm1(torch.where(near, t, 0.0)) * torch.sigmoid(v))
            parts.append(torch.where(near, small, softplus(v + t) - softplus(v)))
        total = float(torch.cat(parts).sum())
        return total / self.M + self.l2 * float(e @ (self.optimum + 0.5 * e))

    def evaluate(self, theta: torch.Tensor) -> tuple[float, float]:
        """(test accuracy, mean test log-loss log(1 + exp(-y a^T x)), no regulariser); the
        prediction is +1 when a^T x > 0, else -1."""
        scores = self.a_test @ theta.to(torch.float64)
        n = max(len(self.y_test), 1)
        correct = int(((scores > 0) == (self.y_test > 0)).sum())
        return correct / n, float(softplus(-self.y_test * scores).sum()) / n

    def evaluate_devices(self, theta: torch.Tensor) -> tuple[float, float, np.ndarray]:
        """``evaluate_classes``' (accuracy, loss, device accuracies)."""
        return self.evaluate_classes(theta)[:3]

    def evaluate_classes(self, theta: torch.Tensor
                         ) -> tuple[float, float, np.ndarray, np.ndarray]:
        """``evaluate``'s (accuracy, loss), each device's accuracy on its own test
        distribution: the test set re-weighted to the device's training label mix p_i,
        acc_i = sum_c p_i(c) acc_c with acc_c the test accuracy on class c (a class absent from
        the test set is left out and p_i renormalised; NaN for a device holding only such a
        class), as the torch classifier defines it, and the accuracy on each label present in
        the test set (-1, then +1)."""
        accuracy, loss = self.evaluate(theta)
        scores = self.a_test @ theta.to(torch.float64)
        positive = self.y_test > 0
        right = ((scores > 0) == positive).double()
        hits = torch.stack([right[~positive].sum(), right[positive].sum()]).cpu().numpy()
        counts = torch.stack([(~positive).sum(), positive.sum()]).double().cpu().numpy()
        present = counts > 0
        per_class = np.where(present, hits / np.maximum(counts, 1), 0.0)
        mass = self.label_mix[:, present].sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            devices = np.where(mass > 0, self.label_mix @ per_class / mass, np.nan)
        return accuracy, loss, devices, per_class[present]

    @cached_property
    def label_mix(self) -> np.ndarray:
        """[N, 2] float64: each device's share of label -1 and of label +1."""
        bounds = np.concatenate([[0], np.cumsum(self.sizes_np)])
        positive = np.add.reduceat((self.y_np > 0).astype(np.float64), bounds[:-1])
        share = positive / self.sizes_np
        return np.stack([1.0 - share, share], axis=1)

    def server_gradient(self, theta: torch.Tensor, generator: torch.Generator,
                        batch_size: int) -> torch.Tensor:
        """Minibatch gradient [d] of the base station's own loss, the mean logistic loss on its
        samples + l2/2 ||x||^2, the batch drawn with replacement (as the classifier's)."""
        if self.a_server is None:
            return super().server_gradient(theta, generator, batch_size)
        pick = torch.randint(len(self.y_server), (batch_size,), generator=generator)
        pick = pick.to(self.device)
        x = theta.to(torch.float64)
        a, y = self.a_server[pick], self.y_server[pick]
        coef = -y * torch.sigmoid(-y * (a * x).sum(1))
        return ((coef[:, None] * a).mean(0) + self.l2 * x).to(theta.dtype)

    def __repr__(self) -> str:
        return (f"LogisticProblem(N={self.num_devices}, d={self.d}, M={self.M}, "
                f"l2={self.l2:.3g}, f*={self.optimum_value:.6g})")


# ---- the problem as a plugin (problems/base.py) -------------------------------------------------
_key = partial(default_field, LOGISTIC_DEFAULTS)  # a key of this problem's section

class LogisticConfig(ProblemConfig):
    """``problem: {name: logistic}``: fedred.md Sec. 4.2's regularised binary logistic
    regression (no bias) on a binary dataset split over devices (the ``data`` and ``partition``
    sections), f* known."""

    l2: float | None = _key("l2", "logistic: weight of l2/2 ||x||^2 in every f_i (default 1/M, M "
                                  "the devices' training samples: the paper's mu = 1/M)", gt=0)
    normalize_rows: bool = _key("normalize_rows", "logistic: rescale inputs so the devices' rows "
                                                  "have mean norm 1 (fedred.md Sec. 5.2; default "
                                                  "true)")


def build(scenario: Scenario, device: torch.device, split: SplitData | None = None
          ) -> BuiltProblem:
    """fedred.md Sec. 4.2's logistic regression on the scenario's data, split as for a
    classifier (``split_data``, loaded here when not given); the dataset must be binary."""
    split = split or split_data(scenario)
    dataset, p = split.dataset, scenario.problem
    if dataset.num_classes != 2:
        raise UserError(f"problem 'logistic' is binary but dataset '{dataset.name}' has "
                        f"{dataset.num_classes} classes; set data.positive_classes (e.g. [0]: "
                        "class 0 against the rest) or data.classes with two labels")
    if len(dataset.input_shape) != 1:
        raise UserError(f"problem 'logistic' needs flat inputs, but dataset '{dataset.name}' has "
                        f"shape {dataset.input_shape}; use a tabular dataset (breast_cancer, "
                        "libsvm, synthetic, digits)")
    problem = LogisticProblem(dataset.x_train, dataset.y_train, split.shards, dataset.x_test,
                              dataset.y_test, l2=p.l2, normalize_rows=p.normalize_rows,
                              device=device, max_chunk_mb=scenario.engine.max_chunk_mb,
                              server=split.server)
    return BuiltProblem(problem, dataset=dataset, shards=split.shards)


def fit(scenario: Scenario) -> None:
    """Logistic regression is its own linear model, on a binary dataset."""
    if unread_section(scenario, ("model",)):
        raise ValueError("model: not read by problem 'logistic' (a linear model without bias; "
                         "its regulariser is problem.l2); remove the model section or set "
                         "problem.name: classification")
    data = scenario.data
    classes = (data.synthetic.num_classes if data.name == "synthetic"
               else BUILTIN_CLASSES.get(data.name))
    if data.classes is not None and len(data.classes) != 2:
        raise ValueError(f"data.classes={data.classes} keeps {len(data.classes)} labels but "
                         "problem 'logistic' is binary; list two labels (e.g. [3, 8]) or use "
                         "data.positive_classes")
    if (classes is not None and classes > 2 and data.classes is None
            and data.positive_classes is None):
        raise ValueError(f"data: problem 'logistic' is binary but dataset '{data.name}' has "
                         f"{classes} classes; set data.positive_classes (e.g. [0]: class 0 "
                         "against the rest) or data.classes with two labels (e.g. [3, 8]), "
                         "or use data.name: breast_cancer")


def check(scenario: Scenario, facts: DataFacts | None) -> None:
    """Flat inputs; every device gets samples."""
    shape = facts.input_shape if facts is not None else None
    if shape is not None and len(shape) != 1:
        raise UserError(f"problem 'logistic' needs flat inputs, but dataset "
                        f"'{scenario.data.name}' has shape {shape}; use a tabular dataset "
                        "(breast_cancer, libsvm, synthetic, digits)")
    check_partition(scenario, facts)


def constants(scenario: Scenario, facts: DataFacts | None) -> set[str] | None:
    """The delta keys only with dense Hessians (``LogisticProblem.constants``)."""
    shape = facts.input_shape if facts is not None else None
    if shape is None:
        return None
    d, n = math.prod(shape), scenario.population.num_devices
    dense = d <= DENSE_HESSIAN_MAX_D and 8 * n * d * d <= DENSE_HESSIAN_MAX_BYTES
    return set(ALL_CONSTANTS) if dense else {"L", "mu"}


def memory(scenario: Scenario, limit_bytes: float) -> ProblemFacts:
    """The data, and the float64 copy of the devices' rows the problem keeps."""
    data = data_bytes(scenario, limit_bytes)
    size = data.input_size
    return ProblemFacts(size, 8, data.held + 8 * size * data.shape.train, data.load,
                        data.on_devices, data.shape.test, size, 1, data.shape.classes)


SPEC = ProblemSpec(
    name="logistic", Config=LogisticConfig, build=build, memory=memory, fit=fit, check=check,
    constants=constants, server_loss=server_keeps_data, reads_data=True,
    summary="fedred.md's regularised binary logistic regression, f* known (data, partition)")
