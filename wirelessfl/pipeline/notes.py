"""What a researcher should know about a run before reading its numbers, from the built world
alone (nothing simulated): the lines ``wirelessfl run`` prints beside its tables.

* ``small_share_warning``: devices that hold no more training samples than an algorithm's
  ``batch_size`` (1,000 devices on digits hold one or two each): their minibatch is all of
  their data, the same set at every step (learning/minibatch.py, full local batches), so
  "minibatch SGD" there is full local gradient descent. A ``warning:`` line before the run
  (pipeline/runner.py).
* ``silent_analog_warning``: an interior radius (cell-interior scheduling of the analog
  uplink, channel/analog.py) that holds no device: the analog methods would never move. A
  ``warning:`` line before the run.
* ``same_slots_note``: an algorithm whose packets take the same whole slots on air at every
  bit width from lo to hi around its own (DZOFL's 16-bit scalar and an 8-bit one both fit one
  NR slot at the seed-002 cell's 4 Mbit/s): changing its bits changes neither its airtime nor
  its radio energy, which a reader comparing 8 and 16 bits would otherwise take for a result.
  A ``note:`` line after the tables (cli.py).
"""

from __future__ import annotations

import numpy as np

from wirelessfl.algorithms.base import AlgorithmParams
from wirelessfl.channel.link import airtime_s, capacity_bps
from wirelessfl.energy.compute import check_bits
from wirelessfl.errors import UserError
from wirelessfl.plugins import algorithm_class

# The bit widths an algorithm may send (AlgorithmParams.bits: 1 to 32).
BIT_WIDTHS = range(1, 33)


def small_share_warning(world) -> str | None:
    """One line naming the algorithms whose ``batch_size`` is at least the training samples
    some device holds, with how many devices and the smallest share; None when every device
    holds more (or the problem has no per-device samples). An algorithm on exact local
    gradients (``full_batch``) draws no minibatch and is left out."""
    shards = getattr(world, "shards", None)
    if shards is None or not len(shards):
        return None
    sizes = np.asarray(shards.sizes)
    short: dict[int, list[str]] = {}
    for params in world.scenario.algorithms:
        if getattr(params, "full_batch", False):
            continue
        b = int(params.batch_size)
        if (sizes <= b).any():
            short.setdefault(b, []).append(params.display_name)
    if not short:
        return None
    count = int((sizes <= max(short)).sum())  # short of the largest batch
    who = "; ".join(f"{', '.join(names)} (batch_size {size})" for size, names in short.items())
    low, middle = int(sizes.min()), int(np.median(sizes))
    return (f"{count:,} of {len(sizes):,} devices hold no more training samples than the "
            f"minibatch of {who}: smallest share {low:,}, median {middle:,}. On those devices "
            "a minibatch is the device's whole data, the same samples at every step (full "
            "local batches, docs/algorithms.md): their steps are full local gradient steps, "
            "not stochastic ones; for minibatches, give the devices more samples than "
            "batch_size (fewer devices) or lower batch_size")


def silent_analog_warning(world) -> str | None:
    """One line when the scenario's analog methods (``air = "superposition"``) have no device
    to hear: ``uplink.analog.interior_radius_m`` closer than every device (none transmits, the
    methods never move); None otherwise."""
    names = [p.display_name for p in world.scenario.algorithms
             if algorithm_class(p.name).air == "superposition"]
    radius = world.scenario.channel.uplink.analog_settings.interior_radius_m
    if not names or radius is None:
        return None
    nearest = float(np.min(world.cell.distances_m))
    if nearest <= radius:
        return None
    return (f"channel.uplink.analog.interior_radius_m = {radius:g} m schedules none of the "
            f"{world.num_devices:,} devices (the nearest lies at {nearest:.4g} m): no device "
            f"transmits on the analog uplink, so {', '.join(names)} never move; raise "
            f"interior_radius_m above {nearest:.4g} m, or remove it")


def _slots(world, params: AlgorithmParams, bits: int, up_rate: np.ndarray,
           down_rate: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Whole slots of one uplink packet per device and one downlink packet at each device's
    rate when ``params``' algorithm sends ``bits``-bit values; None when it cannot say."""
    cls = algorithm_class(params.name)
    channel = world.scenario.channel
    if cls.uploads_per_round == 0:  # off the air (a centralized reference): nothing to say
        return None
    if cls.air == "superposition":  # analog uploads: airtime in channel uses, not bits
        return None
    try:
        up, down = cls.declared_payloads(world.evaluator.d, bits,
                                         participants=world.num_devices,
                                         **cls.declaration_keywords(params, world.evaluator))
    except Exception:  # noqa: BLE001 - a plugin's declaration: no note rather than no run
        return None
    slot = channel.slot_s  # the engine's airtime (channel/link.py), counted in slots
    return (np.rint(airtime_s(up.bits + channel.uplink.header_bits, up_rate, slot) / slot),
            np.rint(airtime_s(down.bits + channel.downlink.header_bits, down_rate, slot) / slot))


def _allowed(world, bits: int) -> bool:
    """Every device's energy profile prices ``bits``-bit passes (energy/compute.py)."""
    try:
        for profile in world.class_profiles:
            check_bits(profile, bits)
    except UserError:
        return False
    return True


def same_slots_note(world) -> str | None:
    """One line naming the algorithms whose uplink and downlink packets take, on every device,
    the same number of slots at each bit width from lo to hi (lo < hi, around the width they
    send), with that range and those slots; None when there is none. Only where rates do not
    depend on the fading (uplink modes fixed, pinned and mcs; the downlink's rates come from
    the mean SNR): in adaptive mode a deep fade stretches a packet over more slots, by an
    amount that grows with its bits."""
    channel = world.scenario.channel
    if channel.uplink.mode == "adaptive" or world.evaluator is None:
        return None
    up_rate = world.uplink().rate_at(np.ones(world.num_devices))
    down = channel.downlink
    # a broadcast goes at its worst receiver's rate, a unicast at each receiver's: both are
    # some device's mean-SNR rate
    down_rate = down.efficiency * capacity_bps(world.cell.downlink_mean_snr, down.bandwidth_hz)
    said = []
    same = {w for w in BIT_WIDTHS if _allowed(world, w)}  # the profiles' widths, once a run
    for params in world.scenario.algorithms:
        own = int(params.bits)
        at_own = _slots(world, params, own, up_rate, down_rate)
        if at_own is None:
            continue
        lo = hi = own
        for step, edge in ((-1, "lo"), (1, "hi")):
            width = own + step
            while width in same:
                slots = _slots(world, params, width, up_rate, down_rate)
                if slots is None or not all(np.array_equal(a, b) for a, b in zip(slots, at_own)):
                    break
                lo, hi = (width, hi) if edge == "lo" else (lo, width)
                width += step
        if lo < hi:
            up_slots, down_slots = (_range(s) for s in at_own)
            said.append(f"{params.display_name} ({own} bits; the same slots, {up_slots} up "
                        f"and {down_slots} down per packet, at any width from {lo} to {hi})")
    if not said:
        return None
    return ("the bit width changes nothing on air for " + ", ".join(said)
            + f" ({channel.slot_s * 1e3:g} ms slots): airtime and radio energy are the same "
            "at those widths; only the compute energy (priced at M bits) and the "
            "quantisation error change")


def _range(slots: np.ndarray) -> str:
    """'3' when every device needs 3 slots, '2-4' when they differ."""
    low, high = int(slots.min()), int(slots.max())
    return f"{low}" if low == high else f"{low}-{high}"
