"""A torch model used functionally through one flat parameter vector theta [d]: the form in
which every problem on a model computes, so perturbations, quantisation and aggregation are
plain tensor algebra (docs/architecture.md, `learning/`)."""

from __future__ import annotations

import copy
import threading

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from wirelessfl.learning.stacked import to_channels_last, uses_convolutions


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
        # Passes repoint a module's parameters, so each other thread (the run's pool) works on
        # a private copy of the module: {thread id: copy}.
        self._owner = threading.get_ident()
        self._copies: dict[int, nn.Module] = {}
        # A Conv/ReLU/MaxPool chain run layer by layer (learning/conv_chain.py: same numbers),
        # attached by the problem that computes with the model (problems/classifier.py); None:
        # the module's own passes.
        self.chain = None

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

    def forward(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """As ``functional``, with convolutional models in channels-last layout (not for vmap)."""
        if not self.channels_last:
            return self.functional(theta, x)
        params = {name: to_channels_last(p) for name, p in self.unflatten(theta).items()}
        return functional_call(self.module(), params, (to_channels_last(x),))

    @torch.no_grad()
    def predict(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Forward pass without gradients: the module's parameters are pointed at views of theta
        (no copy), which skips functional_call's per-call overhead on the hot no-grad path."""
        if self.chain is not None:
            return self.chain.forward(theta, x)
        module = self.module()
        for p, view in zip(module.parameters(), self.unflatten(theta).values()):
            p.data = to_channels_last(view) if self.channels_last else view
        return module(to_channels_last(x) if self.channels_last else x)

    def loss(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of one minibatch (the f_i(theta, xi) of the specs)."""
        return F.cross_entropy(self.functional(theta, x), y)
