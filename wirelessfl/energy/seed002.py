"""Seed 002's Section III arithmetic (bits uploaded, seconds), from the simulator's own accounting.

Bits come from ``Payload`` (what an algorithm declares it sends) and seconds from the link's
slot-based ``airtime_s``, so these are the numbers a run charges, not a second implementation.
The paper's example (spec dzofl.md, section 3; seed 002, Sec. III), with d = 4e5 parameters,
M = 16 bits, T' = 100 standard-FL rounds and T = 10,000 DZOFL iterations:

* standard FL uploads M d T' = 64e7 bits per device; one upload of M d = 64e5 bits takes
  640 ms at 10 Mbit/s (64 s over 100 rounds);
* DZOFL uploads one M-bit scalar per iteration, one 5G slot of 0.125 ms, 1.25 s over 10,000
  iterations; with about 16e6 operations per iteration on a 4 GHz CPU doing one per cycle
  (4 ms), the whole run takes 10,000 x (4 ms + 0.125 ms) = 41.25 s: compute bounds DZOFL.

The paper prints 16e3 DZOFL bits per device ("40,000 times fewer"), but M T = 16 x 10,000 is
16e4, 4,000 times fewer than 64e7; 16e3 is M T for T = 1,000. The functions return M T;
``tests/test_energy_seed002.py`` records the discrepancy.
"""

from __future__ import annotations

from wirelessfl.channel.link import airtime_s
from wirelessfl.contract.payload import Payload

# seed 002, Sec. III (spec dzofl.md, section 3): the worked example's inputs.
SECTION_III = {
    "params": 400_000,  # d
    "bits": 16,  # M
    "standard_rounds": 100,  # T'
    "dzofl_iterations": 10_000,  # T
    "rate_bps": 10e6,  # uplink rate of the time example [bit/s]
    "slot_s": 0.125e-3,  # one 5G slot [s] (NR numerology mu = 3)
    "operations_per_iteration": 16e6,  # about one forward pass of the paper's model
    "cpu_frequency_hz": 4e9,  # 4 GHz, one operation per cycle
}


def standard_fl_upload_bits(params: int, bits: int, rounds: int) -> int:
    """Bits one device uploads in standard FL: its d-value model update every round, M d T'."""
    return Payload(values=params, bits_per_value=bits).bits * rounds


def dzofl_upload_bits(bits: int, iterations: int) -> int:
    """Bits one device uploads in DZOFL: one M-bit scalar per iteration, M T."""
    return Payload.scalar(bits).bits * iterations


def upload_time_s(packet_bits: int, rate_bps: float, slot_s: float) -> float:
    """Airtime of one packet [s]: whole slots, ceil(bits / (R slot)) x slot (``airtime_s``)."""
    return float(airtime_s(packet_bits, rate_bps, slot_s))


def compute_time_s(operations: float, frequency_hz: float,
                   operations_per_cycle: float = 1.0) -> float:
    """Time to run ``operations`` on a CPU at ``frequency_hz`` [s]."""
    return operations / (frequency_hz * operations_per_cycle)


def standard_fl_times_s(params: int, bits: int, rounds: int, rate_bps: float,
                        slot_s: float) -> dict[str, float]:
    """``per_round`` and ``total`` upload time of standard FL for one device [s]."""
    per_round = upload_time_s(Payload(values=params, bits_per_value=bits).bits, rate_bps, slot_s)
    return {"per_round": per_round, "total": per_round * rounds}


def dzofl_times_s(bits: int, iterations: int, rate_bps: float, slot_s: float,
                  operations_per_iteration: float, frequency_hz: float,
                  operations_per_cycle: float = 1.0) -> dict[str, float]:
    """DZOFL's ``upload``, ``compute`` and ``total`` time for one device [s]: every iteration
    computes, then uploads its scalar, so total = T x (compute + upload per iteration)."""
    upload = upload_time_s(Payload.scalar(bits).bits, rate_bps, slot_s)
    compute = compute_time_s(operations_per_iteration, frequency_hz, operations_per_cycle)
    return {"upload": iterations * upload, "compute": iterations * compute,
            "total": iterations * (compute + upload)}


def section_iii_example(**changes) -> dict[str, float]:
    """The whole worked example, from ``SECTION_III`` with any input replaced by ``changes``."""
    unknown = sorted(set(changes) - set(SECTION_III))
    if unknown:
        raise ValueError(f"unknown input {unknown[0]!r}; known: {', '.join(SECTION_III)}")
    p = {**SECTION_III, **changes}
    standard = standard_fl_times_s(p["params"], p["bits"], p["standard_rounds"], p["rate_bps"],
                                   p["slot_s"])
    dzofl = dzofl_times_s(p["bits"], p["dzofl_iterations"], p["rate_bps"], p["slot_s"],
                          p["operations_per_iteration"], p["cpu_frequency_hz"])
    bits_standard = standard_fl_upload_bits(p["params"], p["bits"], p["standard_rounds"])
    bits_dzofl = dzofl_upload_bits(p["bits"], p["dzofl_iterations"])
    return {
        "standard_fl_bits": bits_standard,
        "dzofl_bits": bits_dzofl,
        "bits_ratio": bits_standard / bits_dzofl,
        "standard_fl_upload_per_round_s": standard["per_round"],
        "standard_fl_upload_total_s": standard["total"],
        "dzofl_upload_s": dzofl["upload"],
        "dzofl_compute_s": dzofl["compute"],
        "dzofl_total_s": dzofl["total"],
    }
