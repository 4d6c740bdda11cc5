"""Will a run fit in memory? An estimate made from the scenario alone, before any large array
exists, and a clear refusal.

``estimate_memory(scenario)`` reads only the scenario and cheap facts: the dataset's size from
the catalog (built-in sets), the synthetic section, the IDX files' 16-byte headers or one
streaming pass over a LIBSVM file (stopped as soon as it is too large), the problem's dimensions,
and the model's parameter and activation counts from its architecture (counted on torch's meta
device: neither the model's storage nor the data is allocated). What the problem holds is its
own ``ProblemSpec.memory`` (problems/; the data every problem on a dataset shares is sized by
problems/data_size.py ``data_bytes``). It returns what a whole ``wirelessfl run`` adds to the
interpreter and its imports, report figures included, as named parts (docs/reliability.md,
"Memory"):

* ``fixed``: first use of the parquet writer and of a torch model's batched passes
  (constants);
* ``data``: the problem's arrays as the run holds them (a classifier's inputs as loaded and in
  device order, where a sample drawn by several devices is held once per device (a population
  that outgrows the data, learning/partition.py), the test set, per-sample bookkeeping; a
  synthetic problem's per-client matrices), or the loader's own peak when that is the largest
  moment;
* ``population``: per-device arrays every algorithm shares (positions, classes, the index
  sets' sizes, label counts as the manifest holds them: every device's up to
  ``FULL_OUTPUT_DEVICES``, a sample's beyond);
* ``state``: the largest algorithm's [N, d] arrays (``Algorithm.peak_device_arrays``) in the
  problem's compute precision;
* ``compute``: that algorithm's largest round temporaries, as the algorithm states them
  (``Algorithm.round_memory`` of the round's ``RoundShape``, contract/memory.py): one chunk of
  the batched learning compute (the evaluator's own chunk rule under ``engine.max_chunk_mb``)
  and the float64 work of the unbiased quantiser on the rows it quantises at once (a chunk, or
  all N rows for the drift-corrected family, FedMSA and FedNest);
* ``records``: each algorithm's ledger and network arrays, and what is recorded until the run
  ends (its devices.parquet rows as a table: every device's up to ``FULL_OUTPUT_DEVICES``, at
  most ``DEVICE_ROWS_MAX`` beyond; each device's accuracy at each evaluation as Python
  floats); at the end, the tables joined and the JSON written, or the report's reading of
  them back with the figures it draws (``report_figures``, ``FIGURE_BYTES`` each), whichever
  is larger.

The peak is the largest of three moments: loading the data (nothing else held yet), the worst
algorithm's round (data + population + state + compute + the records so far) and the end (data
+ population + the records being written or read back). The per-object sizes below were
measured on CPython 3.11; the fixed parts and the round temporaries' bytes per value are
calibrated [D] against the measured peak RSS of every algorithm family at two population sizes
(benchmarks/memory_estimate.py, recorded in benchmarks/memory_estimate.json).

The estimate is compared with the memory the machine has available now (``/proc/meminfo``'s
MemAvailable; 80 % of it may be planned) or with ``engine.memory_limit_mb``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from wirelessfl.algorithms.participation import participant_count
from wirelessfl.contract.memory import (
    ACTIVATION_COPIES,
    BYTES_PER_FLOAT,
    MIB,
    RoundShape,
    forward_pass_bytes,
)
from wirelessfl.contract.problem import ProblemFacts
from wirelessfl.errors import UserError
from wirelessfl.plugins import algorithm_class, problem_spec
from wirelessfl.results.records import (
    ACCURACY_SAMPLE_DEVICES,
    DEVICE_ROWS_MAX,
    FULL_OUTPUT_DEVICES,
    LABEL_SAMPLE_DEVICES,
)

# Share of the available memory a run may plan to use: the rest is the allocator's slack and
# what the estimate leaves out.
HEADROOM = 0.8

# ---- sizes [B] of what a run holds, measured on CPython 3.11 / numpy 2 / torch 2 [D] ----------
# First use of pyarrow's parquet writer and what any run holds besides its parts: a run of
# fedmsa.md's quadratic without its report (N = 2,000) measured 34 MB over its imports, 24 of
# them its parts.
FIXED_BYTES = 10 * MIB
# First use of a torch model's batched passes (autograd, the thread pool's module copies, the
# allocator's arenas): runs on an MLP without their report measured 84 to 94 MB beyond their
# parts (DZOFL and FGDRO-CVaR, N = 2,000, d = 1,002).
MODEL_FIXED_BYTES = 84 * MIB
# Each report figure while the report is drawn (matplotlib's Agg canvas, fonts and artists):
# DZOFL's 7 figures added 35 MB to a run whose round was small (N = 2,000, d = 1,002). The
# report is drawn after the rounds, so it counts at the end moment only.
FIGURE_BYTES = 5 * MIB
# One devices.parquet row as the table the writer keeps (20 numbers and two pointers to shared
# strings, 8 B each), as the tables joined while written (22 x 8 B) and read back (plus two
# string cells).
DEVICE_ROW_BYTES = 22 * 8
DEVICE_COLUMN_BYTES = 22 * 8
DEVICE_READ_BYTES = 22 * 8 + 2 * 60
# One device's accuracy in a rounds row: a Python float in a list (32 B) and its list slot.
ACCURACY_VALUE_BYTES = 40
# One rounds row without the device accuracies (a dict of 40 entries).
ROUND_ROW_BYTES = 4096
# The manifest's label counts: a list of C ints per device (64 + 8 C B) and, while the manifest
# is written (json.dumps with indent builds one str chunk per number), about this per count.
COUNT_LIST_BYTES = 64
JSON_COUNT_BYTES = 90
# Per device, arrays every run keeps whatever the algorithm: cell geometry and mean SNRs,
# device classes, the index sets' sizes and offsets, label mixes. 600 B when the shards were a
# list of numpy arrays; their replacement by two arrays (learning/partition.py DeviceSamples)
# measured 153 B a device less after the world is built (RSS growth from 200,000 to 1,000,000
# devices on the same 1.4 million samples: 212 B a device before, 59 B after) [D].
DEVICE_STATIC_BYTES = 450
# Per device while an algorithm runs: its ledger (176 B) and the network's per-phase arrays
# (plan, fading, airtime, outcome: about 40 float64 [N] arrays).
DEVICE_RUN_BYTES = 512
# The round temporaries' bytes per value (the quantiser's work, the copies of per-device rows,
# autograd's copies of activations) are the algorithms' own, in contract/memory.py.


@dataclass
class MemoryEstimate:
    """Estimated bytes a run adds to the interpreter and its imports, by part (module
    docstring); ``worst`` names the algorithm at the round-time peak."""

    parts: dict[str, int] = field(default_factory=dict)
    worst: str = ""
    state_arrays: int = 0  # the worst algorithm's peak_device_arrays
    num_devices: int = 0
    d: int = 0
    itemsize: int = 4
    # the worst algorithm's round temporaries shrink with engine.max_chunk_mb (False: they span
    # all N devices, the drift-corrected family's quantised uploads)
    chunked: bool = True
    # of the records, the rounds rows (every algorithm's evaluations, each a rounds.parquet row
    # with its devices' accuracies), and the algorithm that records the most of them
    rounds_bytes: int = 0
    most_rows: str = ""
    most_rows_index: int = 0
    # each moment's bytes beside the fixed part: "load" (the loader's peak), "round" (data,
    # population and the worst algorithm's round), "end" (data, population and the tables
    # written or read back with the report's figures); ``parts`` splits the largest
    moments: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return int(sum(self.parts.values()))


def available_bytes() -> int | None:
    """Memory available to a new allocation now [B], or None where the system does not say."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def problem_facts(scenario, limit_bytes: float = math.inf) -> ProblemFacts:
    """The problem's size, from the scenario alone: the registered problem's ``memory`` hook
    (problems/base.py), which builds nothing and loads no dataset."""
    return problem_spec(scenario.problem.name).memory(scenario, limit_bytes)


def kept_per_device(n: int, limit: int) -> int:
    """Devices whose per-device output a run keeps: all up to FULL_OUTPUT_DEVICES, at most
    ``limit`` beyond (results/records.py)."""
    return n if n <= FULL_OUTPUT_DEVICES else min(n, limit)


# ---- the estimate ------------------------------------------------------------------------------
def evaluations(params) -> int:
    """Rounds rows an algorithm records: round 0, every eval_every-th round and the last."""
    return 1 + params.rounds // params.eval_every + bool(params.rounds % params.eval_every)


def chunk_devices(facts: ProblemFacts, n: int, batch: int, max_chunk_mb: float) -> int:
    """Devices in one chunk of per-device models (BatchedEvaluator.chunk_size's rule; a problem
    without data computes all devices at once)."""
    if not facts.train_samples:
        return n
    per = BYTES_PER_FLOAT * (batch * (facts.input_size + ACTIVATION_COPIES
                                      * facts.activations_per_sample) + 4 * facts.d)
    return max(1, min(n, int(max_chunk_mb * MIB // per)))


def one_off_compute(cls, params, facts: ProblemFacts, n: int, max_chunk_mb: float) -> int:
    """Bytes of a one-off forward pass before round 0 (``one_off_forward_devices``): the
    chunk's pass, plus each asked device's minibatch indices and the uniforms they are drawn
    from (int64 and float64 a sample)."""
    devices = cls.one_off_forward_devices(n, params)
    if not devices or not facts.train_samples:
        return 0
    chunk = chunk_devices(facts, devices, params.batch_size, max_chunk_mb)
    return (forward_pass_bytes(chunk, params.batch_size, facts.input_size,
                               facts.activations_per_sample)
            + devices * params.batch_size * 16)


def round_shape(params, facts: ProblemFacts, n: int, chunk: int, bits: int) -> RoundShape:
    """The round of an algorithm with ``params`` as its ``round_memory`` sizes it: ``n`` devices
    whose work the round holds, ``chunk`` of them at once, ``bits`` per value."""
    return RoundShape(d=facts.d, itemsize=facts.itemsize, batch=params.batch_size,
                      input_size=facts.input_size,
                      activations_per_sample=facts.activations_per_sample, devices=n,
                      chunk=chunk, bits=bits)


def round_compute(cls, params, facts: ProblemFacts, n: int, chunk: int, bits: int
                  ) -> tuple[int, bool]:
    """(bytes, chunked) of one algorithm's largest round temporaries beyond its state: what the
    evaluator holds for one chunk of devices and what the quantiser works on at once; chunked
    is False where they span all N devices (they do not shrink with engine.max_chunk_mb). The
    algorithm's own rule (``Algorithm.round_memory``), so no algorithm is named here."""
    return cls.round_memory(params, round_shape(params, facts, n, chunk, bits))


def report_figures(facts: ProblemFacts) -> int:
    """The most figures a run's report draws (README's table, report/plots.py ``FIGURES``): the
    three energy figures and the optimisation progress of any run, the accuracy curves and the
    per-device accuracy of a classifier, the label histogram of a problem with data, and the
    network's lifetime where a device has a battery (counted always: an upper bound)."""
    classifier = 3 if facts.num_classes else 0
    return 3 + 1 + classifier + (1 if facts.train_samples else 0) + 1


def estimate_memory(scenario, facts: ProblemFacts | None = None) -> MemoryEstimate:
    """The estimate of a whole ``wirelessfl run`` of ``scenario`` by part (module docstring)."""
    facts = facts or problem_facts(scenario)
    n, d, size = scenario.population.num_devices, facts.d, facts.itemsize
    classes = facts.num_classes
    fixed = FIXED_BYTES + (MODEL_FIXED_BYTES if facts.train_samples else 0)
    listed = kept_per_device(n, LABEL_SAMPLE_DEVICES)  # devices whose counts the manifest lists
    counts = (listed * (COUNT_LIST_BYTES + 8 * classes) + n * 2 * 8 * classes) if classes else 0
    population = n * DEVICE_STATIC_BYTES + counts
    rows_kept = kept_per_device(n, DEVICE_ROWS_MAX)  # devices.parquet rows of an algorithm
    listed_accuracy = kept_per_device(n, ACCURACY_SAMPLE_DEVICES)  # a rounds row's list
    accuracy = listed_accuracy * ACCURACY_VALUE_BYTES if classes else 0
    round_peak, worst, records = 0, None, 0
    for params in scenario.algorithms:
        cls = algorithm_class(params.name)
        rows = evaluations(params)
        # devices whose work a round holds: the asked ones for participant-only methods
        workers = participant_count(params.participation, n) if cls.computes_participants_only else n
        chunk = chunk_devices(facts, workers, params.batch_size, scenario.engine.max_chunk_mb)
        bits = params.bits if params.bits is not None else scenario.quantization_bits
        compute, chunked = round_compute(cls, params, facts, workers, chunk, bits)
        compute = max(compute, one_off_compute(cls, params, facts, n,
                                               scenario.engine.max_chunk_mb))
        rows_held = cls.state_rows(n, params)
        if not scenario.population.per_device_streams:
            rows_held += cls.shared_stream_rows(n, params)
        state = rows_held * d * size
        during = (n * DEVICE_RUN_BYTES + state + compute + records
                  + rows * (accuracy + ROUND_ROW_BYTES))
        if during > round_peak:
            round_peak = during
            worst = (params, cls.peak_device_arrays, state, compute, chunked)
        records += rows * (accuracy + ROUND_ROW_BYTES) + rows_kept * DEVICE_ROW_BYTES
    algorithms = len(scenario.algorithms)
    total_rows = sum(evaluations(p) for p in scenario.algorithms)
    accuracy_column = total_rows * listed_accuracy * 8 * bool(classes)  # rounds.parquet's lists
    written = (records + algorithms * rows_kept * DEVICE_COLUMN_BYTES + accuracy_column
               + listed * classes * JSON_COUNT_BYTES)
    read = (algorithms * rows_kept * DEVICE_READ_BYTES + accuracy_column + counts
            + total_rows * ROUND_ROW_BYTES + report_figures(facts) * FIGURE_BYTES)
    end = max(written, read)
    params, copies, state, compute, chunked = worst
    most = max(range(algorithms), key=lambda i: evaluations(scenario.algorithms[i]))
    est = MemoryEstimate(worst=params.display_name, state_arrays=copies, num_devices=n, d=d,
                         itemsize=size, chunked=chunked,
                         rounds_bytes=total_rows * (accuracy + ROUND_ROW_BYTES),
                         most_rows=scenario.algorithms[most].display_name, most_rows_index=most)
    est.moments = {"load": facts.load_bytes,
                   "round": facts.data_bytes + population + round_peak,
                   "end": facts.data_bytes + population + end}
    if facts.load_bytes > facts.data_bytes + population + max(round_peak, end):
        # loading the data is the peak: nothing else is held yet
        est.parts = {"fixed": fixed, "data": facts.load_bytes, "population": 0, "state": 0,
                     "compute": 0, "records": 0}
    elif round_peak >= end:
        est.parts = {"fixed": fixed, "data": facts.data_bytes, "population": population,
                     "state": state, "compute": compute, "records": round_peak - state - compute}
    else:
        est.parts = {"fixed": fixed, "data": facts.data_bytes, "population": population,
                     "state": 0, "compute": 0, "records": end}
    return est


def memory_budget(scenario) -> tuple[float | None, str]:
    """(bytes a run may plan to use, what that is) from engine.memory_limit_mb or 80 % of the
    memory available now; (None, '') where the system does not say."""
    if scenario.engine.memory_limit_mb is not None:
        return scenario.engine.memory_limit_mb * MIB, "is the engine.memory_limit_mb"
    limit = available_bytes()
    return (None, "") if limit is None else (HEADROOM * limit, "is available")


def check_memory_from_scenario(scenario) -> MemoryEstimate:
    """Refuse (UserError) a scenario whose run will not fit, with the numbers and what to
    change; before anything is loaded or built (``wirelessfl run``, ``validate``). Returns the
    estimate."""
    budget, what = memory_budget(scenario)
    facts = problem_facts(scenario, budget if budget is not None else math.inf)
    est = estimate_memory(scenario, facts)
    if budget is None or est.total <= budget:
        return est
    gib = 2**30
    parts = ", ".join(f"{name} {value / gib:.2f}" for name, value in est.parts.items() if value)
    state = est.parts["state"]
    largest = max(est.parts, key=est.parts.get)
    if largest == "fixed":
        hint = ("a larger engine.memory_limit_mb or machine (any run takes this much for its "
                "writers, figures and passes)")
    elif largest == "data":
        hint = ("a smaller data set (fewer samples in its files; data.max_train_samples caps "
                "what is kept, not what is loaded) or a larger machine")
    elif largest == "compute" and est.chunked:
        hint = (f"a smaller chunk (--set engine.max_chunk_mb="
                f"{max(16, int(budget / MIB / 8))}), fewer devices or a smaller model")
    elif largest in ("state", "compute"):
        hint = (f"fewer devices (population.num_devices), a smaller model, or run "
                f"'{est.worst}' on a larger machine")
    elif largest == "records" and 2 * est.rounds_bytes >= est.parts["records"]:
        # mostly rounds rows: an algorithm evaluated a great many times, not many devices
        i, params = est.most_rows_index, scenario.algorithms[est.most_rows_index]
        hint = (f"fewer rounds or a larger eval_every for '{est.most_rows}' (algorithms.{i}: "
                f"rounds {params.rounds:,}, eval_every {params.eval_every:,}, "
                f"{evaluations(params):,} evaluations recorded, each a rounds.parquet row)")
    else:  # per-device arrays and records
        hint = "fewer devices (population.num_devices) or a larger machine"
    # the vectors the state holds (state_rows: N per array for dense state, fewer for state
    # held only for the devices that have some)
    vectors = round(state / (est.d * est.itemsize)) if state else 0
    detail = (f"{est.worst}: {vectors:,} per-device vectors ({est.num_devices:,} devices) x "
              f"{est.d:,} parameters x {est.itemsize} B = {state / gib:.2f} GiB; "
              if state else "")
    raise UserError(
        f"{scenario.name}: this run needs about {est.total / gib:.2f} GiB ({detail}by part, GiB: "
        f"{parts}; engine.max_chunk_mb = {scenario.engine.max_chunk_mb:g} MiB), but "
        f"{budget / gib:.2f} GiB {what}; use {hint}")

