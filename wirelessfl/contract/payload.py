"""What crosses the air (Payload) and what a device computes (Cost): the algorithm <-> engine contract.

An algorithm declares sizes and work explicitly; the engine's radio and energy models turn them
into seconds and joules, so every algorithm is costed by the same code (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A vector quantised with a per-vector scale carries that scale as one float32 header.
VECTOR_SCALE_HEADER_BITS = 32
# A Hessian-vector product by double backward (Pearlmutter 1994's R-operator, as torch computes
# d<grad g, v>/d(w, x) on the retained graph) is priced as one more forward pass (the tangent
# carried through the forward graph) plus one more backward pass (the reverse sweep over it), on
# the same batch: about the cost of one more gradient. docs/energy.md, "Hessian-vector products".
HVP_FORWARD_PASSES = 1
HVP_BACKWARD_PASSES = 1


@dataclass(frozen=True)
class Payload:
    """One packet per device: ``values`` numbers of ``bits_per_value`` bits plus ``header_bits``."""

    values: int
    bits_per_value: int
    header_bits: int = 0
    label: str = ""

    @property
    def bits(self) -> int:
        """Packet size [bit] before the link layer's own header."""
        return self.values * self.bits_per_value + self.header_bits

    @classmethod
    def scalar(cls, bits_per_value: int, count: int = 1, label: str = "scalar") -> Payload:
        """``count`` quantised scalars (DZOFL's upload and broadcast)."""
        return cls(values=count, bits_per_value=bits_per_value, label=label)

    @classmethod
    def analog(cls, count: int, label: str = "analog values") -> Payload:
        """``count`` real values sent as analog symbols (one channel use each, superposed on the
        air; channel/analog.py): no bits, so a ledger's bit counts leave them out."""
        return cls(values=count, bits_per_value=0, label=label)

    @classmethod
    def vectors(cls, length: int, bits_per_value: int, count: int = 1, label: str = "vector") -> Payload:
        """``count`` vectors of ``length`` values; below 32 bits each carries its scale header."""
        header = VECTOR_SCALE_HEADER_BITS * count if bits_per_value < 32 else 0
        return cls(values=length * count, bits_per_value=bits_per_value, header_bits=header, label=label)


@dataclass(frozen=True)
class Cost:
    """Local work of one device step: passes over a minibatch of ``batch_size`` samples.

    ``forward_passes``, ``backward_passes`` and ``hvp_passes`` (Hessian-vector products by double
    backward, each also giving the mixed Jacobian-vector product) are scalars (same for every
    device) or arrays of length N (per-device counts, e.g. heterogeneous local steps);
    ``batch_size`` is one sample count or N of them (full local gradients:
    ``Problem.full_batch_sizes()``).

    ``paper_forward_passes``: the forward passes seed 002's accounting counts for this work, where
    it differs from the passes made (None: the same). The paper charges DZOFL E_FP once per
    iteration (Sec. III-C, "E_FP x T"; its Sec. III-B times one forward computation per
    iteration) although an iteration makes two queries; gradient methods E_FP + E_BP per
    iteration, which is the passes made. Priced under ``energy_accounting: paper`` only.
    """

    forward_passes: int | np.ndarray = 0
    backward_passes: int | np.ndarray = 0
    batch_size: int | np.ndarray = 1
    hvp_passes: int | np.ndarray = 0
    paper_forward_passes: int | np.ndarray | None = None

    def per_device(self, num_devices: int) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward pass counts (gradient evaluations) as float arrays of length N."""
        fwd = np.broadcast_to(np.asarray(self.forward_passes, dtype=float), (num_devices,))
        bwd = np.broadcast_to(np.asarray(self.backward_passes, dtype=float), (num_devices,))
        return fwd, bwd

    def hvp_per_device(self, num_devices: int) -> np.ndarray:
        """Hessian-vector products as a float array of length N."""
        return np.broadcast_to(np.asarray(self.hvp_passes, dtype=float), (num_devices,))

    def priced_passes(self, num_devices: int, accounting: str = "physical"
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward passes the energy and time models price, [N] each: the passes
        plus each Hessian-vector product as HVP_FORWARD_PASSES forward + HVP_BACKWARD_PASSES
        backward. ``accounting`` ``paper``: ``paper_forward_passes`` forward passes where given."""
        fwd, bwd = self.per_device(num_devices)
        if accounting == "paper" and self.paper_forward_passes is not None:
            fwd = np.broadcast_to(np.asarray(self.paper_forward_passes, dtype=float),
                                  (num_devices,))
        hvp = self.hvp_per_device(num_devices)
        return fwd + HVP_FORWARD_PASSES * hvp, bwd + HVP_BACKWARD_PASSES * hvp
