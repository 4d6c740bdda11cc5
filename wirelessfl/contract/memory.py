"""What a round of learning holds in memory, as each algorithm states it: the sizes both the
algorithms (``Algorithm.round_memory``) and the pre-run memory estimate (pipeline/memory.py) read.

An algorithm sizes its largest round temporaries from a ``RoundShape`` (the problem's d and
precision, the minibatch, the devices whose work the round holds and how many the evaluator
takes at once, the bit width) with the constants below. The per-value byte counts were measured
on CPython 3.11 / numpy 2 / torch 2 and calibrated [D] against the measured peak RSS of every
algorithm family at two population sizes (benchmarks/memory_estimate.py, recorded in
benchmarks/memory_estimate.json).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20
BYTES_PER_FLOAT = 4

# Per value of a [rows, d] block quantised at fewer than 32 bits (quantize_rows' lean path,
# rows inside their own scales): the float32 input and output and five float64 work arrays at
# its peak (the input's float64 copy, position, floor, uniforms, result; measured with
# benchmarks/memory_estimate.py). Blocks below glibc's mmap threshold (32 MiB as
# host/allocator.py sets it) come from the heap, where freed space is reused less tightly:
# HEAP_FACTOR times as much (78 B a quantised value).
QUANTIZE_VALUE_BYTES = 48
HEAP_FACTOR = 104 / 64
MMAP_THRESHOLD_BYTES = 32 * MIB
# Per value of a [rows, d] block of per-device models, gradients or updates in a round
# (the block itself, the gradient and the update), in the compute precision's itemsize.
ROW_VALUE_COPIES = 3
# FGDRO's chunk: w, m and q of the chunk's devices, their gradients, updates and uploads (it
# quantises runs of consecutive devices, each small).
FGDRO_ROW_COPIES = 11
# Autograd copies of each activation (the evaluator's own chunk rule, problems/classifier.py).
ACTIVATION_COPIES = 3


def on_heap(nbytes: float, block_bytes: int) -> int:
    """``nbytes`` of temporaries made of blocks of ``block_bytes`` each: as they are when the
    blocks are mmapped (at or above glibc's threshold), and HEAP_FACTOR times that when they come
    from the heap, whose freed space is reused less tightly."""
    return int(nbytes if block_bytes >= MMAP_THRESHOLD_BYTES else nbytes * HEAP_FACTOR)


def forward_pass_bytes(chunk: int, batch: int, input_size: int,
                       activations_per_sample: int) -> int:
    """A forward minibatch pass of ``chunk`` devices at a shared model: inputs and activations,
    no autograd copies."""
    return chunk * BYTES_PER_FLOAT * batch * (input_size + activations_per_sample)


@dataclass(frozen=True)
class RoundShape:
    """One algorithm's round as the memory estimate sizes it (a problem without data has
    ``input_size`` and ``activations_per_sample`` 0)."""

    d: int  # parameters
    itemsize: int  # bytes per value in the problem's compute precision
    batch: int  # samples per minibatch (the algorithm's batch_size)
    input_size: int  # values per sample
    activations_per_sample: int
    devices: int  # devices whose work the round holds (round(beta N) for participant-only ones)
    chunk: int  # devices the evaluator computes at once (its chunk rule)
    bits: int  # M, bits per transmitted value

    @property
    def minibatch_bytes(self) -> int:
        """One device's minibatch in a pass with gradients: its inputs and ACTIVATION_COPIES
        copies of each activation."""
        return BYTES_PER_FLOAT * self.batch * (
            self.input_size + ACTIVATION_COPIES * self.activations_per_sample)

    def forward_bytes(self) -> int:
        """A forward minibatch pass of one chunk at a shared model (``forward_pass_bytes``)."""
        return forward_pass_bytes(self.chunk, self.batch, self.input_size,
                                  self.activations_per_sample)

    def quantized_bytes(self, rows: int) -> int:
        """The quantiser's work on ``rows`` uploads [rows, d] at once: QUANTIZE_VALUE_BYTES a
        value below 32 bits (``on_heap`` by the float64 block's size), else two values of the
        compute precision."""
        per_value = 2 * self.itemsize
        if self.bits < 32:
            per_value = on_heap(QUANTIZE_VALUE_BYTES, rows * self.d * 8)
        return rows * self.d * per_value
