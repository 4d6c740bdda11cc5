"""A torch model used functionally through one flat parameter vector theta [d]: the form in
which every problem on a model computes, so perturbations, quantisation and aggregation are
plain tensor algebra (docs/architecture.md, `learning/`)."""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.nn.modules.batchnorm import _BatchNorm

from wirelessfl.errors import UserError
from wirelessfl.learning.stacked import to_channels_last, uses_convolutions

# [D] Normalised models (batch norm): the population statistics the global model is evaluated
# with are re-estimated from this many training samples (fewer when the devices hold fewer), in
# batches of NORMALISATION_BATCH, each batch's mean and variance averaged over the batches
# ("precise BN", Wu and Johnson, "Rethinking 'Batch' in BatchNorm", 2021, Sec. 3.1; their
# 10^3-10^4 samples estimate ImageNet's statistics within noise).
NORMALISATION_SAMPLES = 1024
NORMALISATION_BATCH = 256


def batch_norms(module: nn.Module) -> list[_BatchNorm]:
    """The module's batch-norm layers, in module order."""
    return [m for m in module.modules() if isinstance(m, _BatchNorm)]


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
        # Convolutions run in channels-last layout on a CPU (faster with mkldnn; same values),
        # in NCHW on a GPU: there ResNet-18's FedAvg work ran faster in NCHW than in
        # channels-last, bit-identical to a plain torch loop's (an H200, fp32 cuDNN,
        # benchmarks/README.md "GPU") [D].
        self.channels_last = uses_convolutions(model) and self._theta0.device.type == "cpu"
        # Passes repoint a module's parameters, so each other thread (the run's pool) works on
        # a private copy of the module: {thread id: copy}.
        self._owner = threading.get_ident()
        self._copies: dict[int, nn.Module] = {}
        # A Conv/ReLU/MaxPool chain run layer by layer (learning/conv_chain.py: same numbers),
        # attached by the problem that computes with the model (problems/classifier.py); None:
        # the module's own passes.
        self.chain = None
        # Batch norm, per device [D]: every training pass normalises with the statistics of the
        # one device's minibatch it is given (the module stays in training mode; no pass mixes
        # devices' samples), so the running statistics a device would keep change nothing the
        # simulation computes and are not kept. The global model is evaluated in eval mode with
        # population statistics re-estimated at theta (``normalisation_statistics``).
        norms = batch_norms(model)
        self.normalised = bool(norms)
        for m in norms:
            if not m.track_running_stats:
                raise UserError(
                    f"model layer {type(m).__name__} keeps no running statistics "
                    "(track_running_stats=False): its test-time output would depend on the "
                    "test batch; build it with track_running_stats=True")
        model.train()

    def module(self) -> nn.Module:
        """The module this thread may use: the model in the thread that built it, else this
        thread's own copy (made on first use)."""
        thread = threading.get_ident()
        if thread == self._owner:
            return self.model
        own = self._copies.get(thread)
        if own is None:
            own = self._copies[thread] = copy.deepcopy(self.model)
        return own

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live (the run's ``device``)."""
        return self._theta0.device

    def initial(self) -> torch.Tensor:
        """theta_0 as a flat float32 vector [d] (a fresh copy)."""
        return self._theta0.clone()

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of ``theta`` [d] shaped as the model's parameters."""
        chunks = torch.split(theta, self.numels)
        return {n: c.view(s) for n, c, s in zip(self.names, chunks, self.shapes)}

    def functional(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The model at theta, differentiable in theta; safe under torch.func transforms."""
        return functional_call(self.module(), self.unflatten(theta), (x,))

    def forward(self, theta: torch.Tensor, x: torch.Tensor,
                statistics: torch.Tensor | None = None) -> torch.Tensor:
        """As ``functional``, with convolutional models in channels-last layout (not for vmap);
        with ``statistics``, a normalised model in eval mode normalising with them."""
        if not self.channels_last and statistics is None:
            return self.functional(theta, x)
        return self.forward_at(self.layout(self.unflatten(theta)), x, statistics)

    def layout(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The parameters in the layout passes take them: channels-last for convolutional
        models (a copy of each 4-D weight), else as they are."""
        if not self.channels_last:
            return params
        return {name: to_channels_last(p) for name, p in params.items()}

    def forward_at(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                   statistics: torch.Tensor | None = None) -> torch.Tensor:
        """The model at ``params`` (as ``layout`` gives them, or leaves made from them) on x;
        with ``statistics`` as ``forward``."""
        x = to_channels_last(x) if self.channels_last else x
        module = self.module()
        with self._normalising_with(module, statistics):
            return functional_call(module, params, (x,))

    def write_gradient(self, row: torch.Tensor, gradients: list[torch.Tensor]) -> None:
        """Copy per-parameter gradients (the order of ``names``, any layout) into a flat row
        [d]: each straight into its slice, without concatenating them first."""
        for view, g in zip(self.unflatten(row).values(), gradients):
            view.copy_(g)

    @torch.no_grad()
    def predict(self, theta: torch.Tensor, x: torch.Tensor,
                statistics: torch.Tensor | None = None) -> torch.Tensor:
        """Forward pass without gradients: the module's parameters are pointed at views of theta
        (no copy), which skips functional_call's per-call overhead on the hot no-grad path.
        A normalised model normalises with the batch's statistics, or with ``statistics``
        (``normalisation_statistics``) in eval mode when they are given."""
        if self.chain is not None:
            return self.chain.forward(theta, x)
        module = self.module()
        for p, view in zip(module.parameters(), self.unflatten(theta).values()):
            p.data = to_channels_last(view) if self.channels_last else view
        x = to_channels_last(x) if self.channels_last else x
        with self._normalising_with(module, statistics):
            return module(x)

    @torch.no_grad()
    def normalisation_statistics(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The batch-norm layers' population statistics at theta [k] (each layer's running
        mean then running variance, in module order), estimated from the samples x: the model
        normalising each batch of ``NORMALISATION_BATCH`` with its own statistics (training
        mode, as the devices train), every layer's batch means and unbiased variances averaged
        over the batches (torch's cumulative average, momentum None). Computed in this thread
        in batch order: the same numbers whatever the thread count."""
        module = self.module()
        norms = batch_norms(module)
        momenta = [m.momentum for m in norms]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None
        try:
            for lo in range(0, len(x), NORMALISATION_BATCH):
                self.predict(theta, x[lo:lo + NORMALISATION_BATCH])
            return torch.cat([t for m in norms for t in (m.running_mean, m.running_var)])
        finally:
            for m, momentum in zip(norms, momenta):
                m.momentum = momentum

    @staticmethod
    @contextlib.contextmanager
    def _normalising_with(module: nn.Module, statistics: torch.Tensor | None) -> Iterator[None]:
        """Passes inside normalise with ``statistics`` (``normalisation_statistics``' vector,
        copied into the module's running statistics, the module in eval mode, back in training
        mode after); with None, with each batch's own statistics (training mode, as always)."""
        if statistics is None:
            yield
            return
        at = 0
        with torch.no_grad():
            for m in batch_norms(module):
                for buffer in (m.running_mean, m.running_var):
                    buffer.copy_(statistics[at:at + buffer.numel()])
                    at += buffer.numel()
        module.eval()
        try:
            yield
        finally:
            module.train()

    def loss(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of one minibatch (the f_i(theta, xi) of the specs)."""
        return F.cross_entropy(self.functional(theta, x), y)
