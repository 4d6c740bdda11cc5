"""Lanes: runs of one algorithm that differ only in parameters that never change what crosses
the air or when (its ``lockstep_parameters``: step sizes), driven through one simulated world.

Why: a DZOFL iteration spends most of its time on what such runs share (the radio simulation,
the participants, the minibatch draws, Phi_k and the quantiser's noise), so a tuning grid of 24
step sizes on one seed pays for it once instead of 24 times (pipeline/lockstep.py builds the
group and records each lane as its own run).

An algorithm that supports lockstep writes its round once, as ``lanes_round(lanes, k)``: the
lead's calls for what is shared, and per lane, inside ``lanes.each``, what a run alone does on
its own theta, in the same order, so each lane gets the bits of its run alone. Its ``round`` is
``lanes_round(Alone(self), k)``: one code path for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from wirelessfl.learning.quantize import FULL_PRECISION_BITS, quantize_scalars

if TYPE_CHECKING:
    from wirelessfl.algorithms.base import Algorithm
    from wirelessfl.contract.payload import Cost, Payload


class Lanes(Protocol):
    """What ``lanes_round`` asks of its lanes: the lead (whose network, draws and stale-device
    bookkeeping every lane shares), the lanes still running, and per-lane work."""

    lead: Algorithm
    live: list[Algorithm]

    def each(self, work: Callable[[Algorithm], None]) -> None:
        """``work(lane)`` for every live lane; a lane whose work ends its run (diverged, ...)
        leaves the group, the others go on."""

    def collect(self, cost: Cost, payload: Payload):
        """The lead's ``collect``, reported to every live lane's health log."""

    def broadcast(self, payload: Payload):
        """The lead's ``broadcast``."""


class Alone:
    """One run as its own lane: every exception propagates as from ``round``."""

    def __init__(self, algorithm: Algorithm):
        self.lead = algorithm
        self.live = [algorithm]

    def each(self, work: Callable[[Algorithm], None]) -> None:
        work(self.lead)

    def collect(self, cost: Cost, payload: Payload):
        return (yield from self.lead.collect(cost, payload))

    def broadcast(self, payload: Payload):
        return (yield from self.lead.broadcast(payload))


def quantize_each(lanes: Lanes, values: dict[int, torch.Tensor], scale: float | None,
                  noise: torch.Tensor, direction: str = "up") -> dict[int, torch.Tensor]:
    """``Algorithm.quantize_scalars`` of each live lane's ``values`` (by ``id(lane)``: [m]
    scalars, all sent), in one quantiser call: both formats are elementwise operations exact
    in float64 (learning/quantize.py), so each lane's values are its own call's bits, with the
    same NaN/inf check and health counts. ``noise``: the uniforms [m] (or [1]) every lane's
    call would draw."""
    live = [lane for lane in lanes.live if id(lane) in values]
    block = torch.stack([values[id(lane)] for lane in live]) if live else None
    if block is not None and not bool(torch.isfinite(block.sum())):
        def check(lane) -> None:  # a non-finite lane leaves the group (alone: raises)
            if id(lane) in values:
                lane.ctx.check_finite(values[id(lane)], direction, lane.round_index)

        lanes.each(check)
        return quantize_each(lanes, values, scale, noise, direction)
    if block is None:
        return {}
    bits = lanes.lead.bits
    q, clipped = quantize_scalars(block, bits, scale, noise)
    if bits < FULL_PRECISION_BITS:
        counts = clipped.sum(1).tolist()
        for lane, count in zip(live, counts, strict=True):
            lane.ctx.health.quantized(direction, block.shape[1], int(count))
    return {id(lane): q[i] for i, lane in enumerate(live)}
