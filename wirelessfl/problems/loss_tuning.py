"""Federated loss-function tuning on class-imbalanced data (fedmsa.md Sec. 4.2 / 5.2): the paper's
Fed-BLO experiment on any classification dataset, with the linear softmax model of Sec. 5.2 or
the authors' one-hidden-layer ReLU MLP (784-200-10 on MNIST, Sec. 4.5 [C]).

Data (Sec. 4.2, 4.5 [C], A18): the training set is cut to a long tail, class c keeping
ceil(n_0 imbalance_ratio^(c / (C - 1))) samples (n_0 the largest class's count); C clients of
equal size take a share q of their quota from "their" class c (capped by what it has) and the rest
uniformly from the pool left; each is then cut into ``clients_per_class`` clients (the paper: 10
x 10 = 100; here population.num_devices / C) and each client's samples into train (g) and
validation (f) parts (80 / 20 [C]).
The test set is the dataset's own, which is about class-balanced.

Bilevel problem (Sec. 2.4): w the model's weights, x = (kappa, l) in R^{2C}, inner g^m = mean
CE(sigmoid(kappa) * z(a; w) + l, y) + weight_decay / 2 ||w||^2 over the client's train part,
outer f^m = class-weighted CE on the raw logits z(a; w) over its validation part,
weights omega_c proportional to 1 / n_c (the long-tailed training counts), normalised by the sum
of omega_y over the part. Clients hold different sample counts: their rows are padded and masked,
so one batched pass serves all of them. ``test_accuracy`` is the *balanced* test accuracy (the
mean over classes of the per-class accuracy of argmax z(a; w)), the paper's metric.

Models (``hidden_units``): 0, z = W^T a with W [(D + 1) x C] (bias appended; Sec. 5.2, starting
at W = 0 as the rest of the state); H > 0, z = W2^T [relu(W1^T a); 1] with W1 [(D + 1) x H] and
W2 [(H + 1) x C], w = [vec W1; vec W2] (d_w = 159,010 for 784-200-10, fedmsa.md 3.5), started
where torch.nn.Linear starts, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases, drawn
from the stream (seed, "loss-tuning-init") [D] (a zero start is a saddle of the MLP). The
authors' MLP has dropout; it is left out here, so that the two evaluations of a difference see
one function (fedmsa.md A19) [D].
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from wirelessfl.contract.payload import Cost
from wirelessfl.contract.problem import BilevelProblem, ProblemFacts
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.errors import UserError
from wirelessfl.learning.datasets import load_dataset
from wirelessfl.learning.seeds import keyed_rng
from wirelessfl.problems.base import (
    BuiltProblem,
    ProblemConfig,
    ProblemSpec,
    default_field,
    unread_section,
    without_device_accuracy,
)
from wirelessfl.problems.data import selected_classes
from wirelessfl.problems.data_size import data_bytes

if TYPE_CHECKING:
    from wirelessfl.learning.datasets import DataFacts
    from wirelessfl.scenario.schema import Scenario

# Defaults of `problem: {name: loss-tuning}` (fedmsa.md Sec. 4.2, 4.5 [C], 5.2).
LOSS_TUNING_DEFAULTS = {
    "imbalance_ratio": 0.01,  # smallest / largest class = 0.01 (Sec. 4.5 [C]: mu^9 = 0.01)
    "heterogeneity_q": 0.5,  # q (Sec. 4.2: {0.1, 0.3, 0.5})
    "validation_fraction": 0.2,  # per-client 80/20 train/validation split (Sec. 4.5 [C])
    "weight_decay": 1e-2,  # lambda_w (Sec. 5.2)
    "hidden_units": 0,  # the linear softmax model of Sec. 5.2
}


def model_size(features: int, hidden: int, classes: int) -> int:
    """d_w of the model on ``features`` inputs: (D + 1) C for the linear one, (D + 1) H +
    (H + 1) C for the D-H-C MLP (784-200-10: 159,010, fedmsa.md 3.5)."""
    if not hidden:
        return (features + 1) * classes
    return (features + 1) * hidden + (hidden + 1) * classes


def long_tail(y: np.ndarray, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of a long-tailed subset: class c keeps ceil(n_0 ratio^(c / (C-1))) samples,
    n_0 the largest class count (Sec. 4.5 [C]: ceil(6000 mu^c), mu = 0.01^(1/9))."""
    classes = int(y.max()) + 1
    top = max(int((y == c).sum()) for c in range(classes))
    keep = []
    for c in range(classes):
        members = rng.permutation(np.flatnonzero(y == c))
        size = math.ceil(top * ratio ** (c / max(classes - 1, 1)))
        keep.append(members[:size])
    return np.sort(np.concatenate(keep))


def q_partition(y: np.ndarray, classes: int, q: float, rng: np.random.Generator
                ) -> list[np.ndarray]:
    """A18: C clients of equal size floor(n / C); client c takes round(q * quota) samples of
    class c (capped by availability), the rest uniformly from the pool left. Positions in y."""
    n = len(y)
    quota = n // classes
    free = np.ones(n, dtype=bool)
    own = []
    for c in range(classes):
        members = rng.permutation(np.flatnonzero((y == c) & free))
        take = members[:min(round(q * quota), len(members))]
        free[take] = False
        own.append(take)
    shards = []
    for c in range(classes):
        pool = rng.permutation(np.flatnonzero(free))
        fill = pool[:quota - len(own[c])]
        free[fill] = False
        shards.append(np.sort(np.concatenate([own[c], fill])))
    return shards


def _padded(x: np.ndarray, y: np.ndarray, parts: list[np.ndarray], device):
    """(a [M, n_max, D+1] with the bias column, y [M, n_max], mask [M, n_max] float64)."""
    n_max = max(max(len(p) for p in parts), 1)
    m, dim = len(parts), x.shape[1]
    a = np.zeros((m, n_max, dim + 1))
    labels = np.zeros((m, n_max), dtype=np.int64)
    mask = np.zeros((m, n_max))
    for i, p in enumerate(parts):
        a[i, :len(p), :dim] = x[p]
        a[i, :len(p), dim] = 1.0
        labels[i, :len(p)] = y[p]
        mask[i, :len(p)] = 1.0
    t = lambda v: torch.as_tensor(v, device=device)
    return t(a), t(labels), t(mask)


class LossTuning(BilevelProblem):
    """Loss-function tuning on long-tailed data split by the q-partition (module docstring)."""

    name = "loss-tuning"

    def __init__(self, x_train, y_train, x_test, y_test, num_classes: int, clients: int,
                 rng: np.random.Generator, imbalance_ratio: float = 0.01,
                 heterogeneity_q: float = 0.5, validation_fraction: float = 0.2,
                 weight_decay: float = 1e-2, device: torch.device | str = "cpu",
                 hidden_units: int = 0, init_rng: np.random.Generator | None = None):
        self.device = torch.device(device)
        self.compute_s = 0.0
        x_train = np.asarray(x_train, dtype=np.float64).reshape(len(y_train), -1)
        x_test = np.asarray(x_test, dtype=np.float64).reshape(len(y_test), -1)
        c = int(num_classes)
        if clients % c:
            raise UserError(f"problem 'loss-tuning': population.num_devices ({clients}) must be a "
                            f"multiple of the {c} classes (one client per class, each cut into "
                            "problem.clients_per_class)")
        keep = long_tail(y_train, imbalance_ratio, rng)
        x_lt, y_lt = x_train[keep], y_train[keep]
        self.class_counts = np.bincount(y_lt, minlength=c)
        shards = []
        for shard in q_partition(y_lt, c, heterogeneity_q, rng):
            shards.extend(np.array_split(rng.permutation(shard), clients // c))
        train, val = [], []
        for shard in shards:
            cut = round(len(shard) * (1 - validation_fraction))
            train.append(np.sort(shard[:cut]))
            val.append(np.sort(shard[cut:]))
        if min(len(t) for t in train) == 0 or min(len(v) for v in val) == 0:
            raise UserError("problem 'loss-tuning': some client has no training or no validation "
                            "sample; use fewer clients, a larger imbalance_ratio or a "
                            "validation_fraction nearer 0.5")
        self.num_devices, self.num_classes = clients, c
        self.dim = x_lt.shape[1] + 1
        self.hidden = int(hidden_units)
        self.dw = model_size(self.dim - 1, self.hidden, c)
        self.dx = 2 * c
        self.blocks = (self.dx, 2 * self.dw)
        self.d = self.dx + 2 * self.dw
        self.weight_decay = float(weight_decay)
        self.train = _padded(x_lt, y_lt, train, self.device)
        self.val = _padded(x_lt, y_lt, val, self.device)
        omega = 1.0 / np.maximum(self.class_counts, 1)
        self.omega = torch.as_tensor(omega / omega.sum(), device=self.device)
        self.train_sizes = np.array([len(t) for t in train], dtype=np.int64)
        self.test_x = torch.as_tensor(np.c_[x_test, np.ones(len(x_test))], device=self.device)
        self.test_y = torch.as_tensor(np.asarray(y_test, dtype=np.int64), device=self.device)
        self.model_profile = ModelProfile(params=self.dw, macs_per_sample=self.dw,
                                          activations_per_sample=self.hidden + c,
                                          input_size=self.dim)
        self.w0 = torch.zeros(self.dw, dtype=torch.float64, device=self.device)
        if self.hidden:
            init_rng = init_rng if init_rng is not None else np.random.default_rng(0)
            first = self.dim * self.hidden
            bound1, bound2 = 1 / math.sqrt(self.dim - 1), 1 / math.sqrt(self.hidden)
            self.w0[:first] = torch.as_tensor(init_rng.uniform(-bound1, bound1, first))
            self.w0[first:] = torch.as_tensor(init_rng.uniform(-bound2, bound2, self.dw - first))

    def work(self, rows: int) -> int:
        """Multiply-adds of one map evaluation for ``rows`` clients (their padded samples)."""
        return rows * self.train[0].shape[1] * self.model_profile.macs_per_sample

    def logits(self, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """z(a; w) [n, s, C] of samples a [n, s, D + 1] (bias column last) under each row's
        weights w [n, d_w] (module docstring)."""
        n, c, h = w.shape[0], self.num_classes, self.hidden
        if not h:
            return torch.bmm(a, w.reshape(n, self.dim, c))
        first = self.dim * h
        hidden = torch.relu(torch.bmm(a, w[:, :first].reshape(n, self.dim, h)))
        w2 = w[:, first:].reshape(n, h + 1, c)
        return torch.bmm(hidden, w2[:, :h]) + w2[:, h:]

    def initial(self) -> torch.Tensor:
        """x_0 = 0, w_0 (zero for the linear model, torch.nn.Linear's start for the MLP;
        module docstring), v_0 = 0."""
        theta = super().initial()
        theta[self.dx:self.dx + self.dw] = self.w0.to(theta.dtype)
        return theta

    def inner_loss(self, x, w, devices, keys, batch=None):
        if batch is None:
            a, y, mask = (t[devices] for t in self.train)
        else:  # the batch's samples only, each client's mean over them
            rows = devices.to(self.device)[:, None]
            a, y = self.train[0][rows, batch.positions], self.train[1][rows, batch.positions]
            mask = batch.weights
        kappa, shift = x[:, :self.num_classes], x[:, self.num_classes:]
        logits = torch.sigmoid(kappa)[:, None] * self.logits(a, w) + shift[:, None]
        ce = -torch.log_softmax(logits, -1).gather(-1, y[..., None])[..., 0]
        # a client whose epoch has ended has an empty batch (its step is not taken): no 0 / 0
        per_client = (ce * mask).sum(1) / mask.sum(1).clamp_min(1.0)
        return per_client.sum() + 0.5 * self.weight_decay * w.square().sum()

    def outer_loss(self, x, w, devices, keys):
        a, y, mask = (t[devices] for t in self.val)
        logits = self.logits(a, w)
        ce = -torch.log_softmax(logits, -1).gather(-1, y[..., None])[..., 0]
        weight = self.omega[y] * mask
        return ((ce * weight).sum(1) / weight.sum(1)).sum()

    def evaluation_cost(self, evaluations, full_batch, batch_size):
        """2 forward + 2 backward + 1 HVP per map evaluation, every pass priced at the client's
        training-part size (the validation part is a quarter of it: an upper bound)."""
        e = np.asarray(evaluations)
        return Cost(forward_passes=2 * e, backward_passes=2 * e, hvp_passes=e,
                    batch_size=self.train_sizes)

    def full_batch_sizes(self) -> np.ndarray:
        return self.train_sizes

    # ---- metrics ---------------------------------------------------------------------------------
    def _test_logits(self, theta: torch.Tensor) -> torch.Tensor:
        w = theta[self.dx:self.dx + self.dw].to(torch.float64)
        if not self.hidden:  # one matrix product (the batched one may round differently)
            return self.test_x @ w.reshape(self.dim, -1)
        return self.logits(self.test_x[None], w[None])[0]

    def evaluate(self, theta: torch.Tensor) -> tuple[float, float]:
        """(balanced test accuracy, test cross-entropy) of the raw logits z(a; w)."""
        logits = self._test_logits(theta)
        hit = (logits.argmax(1) == self.test_y).double()
        per_class = [float(hit[self.test_y == c].mean()) for c in range(self.num_classes)
                     if bool((self.test_y == c).any())]
        loss = float(torch.nn.functional.cross_entropy(logits, self.test_y))
        return float(np.mean(per_class)), loss

    def objective(self, theta: torch.Tensor) -> float:
        """The outer loss (1/M) sum_m f^m at the state's (x, w)."""
        t = theta.to(torch.float64)
        n = self.num_devices
        x = t[:self.dx].expand(n, -1)
        w = t[self.dx:self.dx + self.dw].expand(n, -1)
        return float(self.outer_loss(x, w, torch.arange(n), None)) / n

    def objective_gradient(self, theta: torch.Tensor) -> torch.Tensor:
        return torch.full((self.dx,), math.nan, dtype=torch.float64)

    def grad_norm_sq(self, theta: torch.Tensor) -> float:
        """NaN: the hypergradient needs w*(x), unknown here."""
        return math.nan

    def describe(self) -> dict:
        return {"name": self.name, "clients": self.num_devices, "d": self.d,
                "dimension_x": self.dx, "dimension_w": self.dw, "hidden_units": self.hidden,
                "class_counts": self.class_counts.tolist(),
                "train_samples": int(self.train_sizes.sum())}


# ---- the problem as a plugin (problems/base.py) -------------------------------------------------
_key = partial(default_field, LOSS_TUNING_DEFAULTS)  # a key of this problem's section

class LossTuningConfig(ProblemConfig):
    """``problem: {name: loss-tuning}``: fedmsa.md Sec. 4.2 / 5.2's federated loss-function
    tuning on a long-tailed version of the ``data`` set (its own q-partition)."""

    imbalance_ratio: float = _key("imbalance_ratio", "loss-tuning: smallest / largest class count "
                                                     "of the long tail (default {default}, "
                                                     "fedmsa.md 4.5 [C])", gt=0, le=1)
    heterogeneity_q: float = _key("heterogeneity_q", "loss-tuning: q, each client's share of its "
                                                     "own class (default {default}, fedmsa.md 4.2)",
                                                     ge=0, le=1)
    validation_fraction: float = _key("validation_fraction", "loss-tuning: each client's "
                                                             "validation share (default {default},"
                                                             " fedmsa.md 4.5 [C])", gt=0, lt=1)
    weight_decay: float = _key("weight_decay", "loss-tuning: lambda_w of the inner loss (default "
                                               "{default}, fedmsa.md 5.2)", ge=0)
    hidden_units: int = _key("hidden_units", "loss-tuning: 0 for the linear softmax model "
                                             "(default {default}, fedmsa.md 5.2), H for a "
                                             "D-H-C ReLU MLP (the authors' 200, fedmsa.md 4.5 "
                                             "[C])", ge=0, le=100_000)


def build(scenario: Scenario, device: torch.device) -> BuiltProblem:
    """fedmsa.md Sec. 4.2 / 5.2's loss-function tuning on ``scenario.data``: long tail,
    q-partition and train/validation split drawn from the stream (seed, "loss-tuning")."""
    p = scenario.problem
    data = load_dataset(scenario.data, scenario.seed)
    return BuiltProblem(LossTuning(
        data.x_train, data.y_train, data.x_test, data.y_test, data.num_classes,
        scenario.population.num_devices, keyed_rng(scenario.seed, "loss-tuning"),
        p.imbalance_ratio, p.heterogeneity_q, p.validation_fraction, p.weight_decay, device,
        p.hidden_units, keyed_rng(scenario.seed, "loss-tuning-init")))


def fit(scenario: Scenario) -> None:
    """Loss tuning builds its own model (problem.hidden_units) and its own split of ``data``."""
    key = unread_section(scenario, ("model", "partition"))
    if key is not None:
        raise ValueError(f"{key}: not read by problem 'loss-tuning' (its own model: "
                         "problem.hidden_units, on its own q-partition: "
                         f"problem.heterogeneity_q); remove the {key} section")


def check(scenario: Scenario, facts: DataFacts | None) -> None:
    """One client group per class."""
    n = scenario.population.num_devices
    classes = selected_classes(scenario, facts)
    if classes is not None and n % classes:
        raise UserError(f"problem 'loss-tuning': population.num_devices ({n}) must be a "
                        f"multiple of the {classes} classes (one client group per class)")


def memory(scenario: Scenario, limit_bytes: float) -> ProblemFacts:
    """The data; the state is the model's weights (d_w) and x [2C] per client."""
    data = data_bytes(scenario, limit_bytes)
    size, classes = data.input_size, data.shape.classes
    hidden = scenario.problem.hidden_units
    return ProblemFacts(model_size(size, hidden, classes), 4, data.held, data.load,
                        data.on_devices, data.shape.test, size, hidden + classes, classes)


def unrecorded(scenario: Scenario) -> dict[str, str]:
    """No gradient norm (the hypergradient needs the unknown w*(x)) and no per-device accuracy
    (its evaluate_devices is the contract's default)."""
    return {"grad_norm_sq": "does not record (its hypergradient needs the unknown w*(x)); "
                            "remove it and use target_accuracy or target_loss",
            "worst_device_accuracy": without_device_accuracy("target_accuracy or target_loss")}


SPEC = ProblemSpec(
    name="loss-tuning", Config=LossTuningConfig, build=build, memory=memory, fit=fit,
    check=check, unrecorded=unrecorded, reads_data=True, multi_sequence=True, bilevel=True,
    summary="fedmsa.md's federated loss-function tuning on a long-tailed dataset (fedmsa, "
            "fednest)")
