"""Will a run fit in memory? An estimate made from the scenario alone, before any large array
exists, and a clear refusal.

``estimate_memory(scenario)`` reads only the scenario and cheap facts: the dataset's size from
the catalog (built-in sets), the synthetic section, the IDX files' 16-byte headers or one
streaming pass over a LIBSVM file (stopped as soon as it is too large), the problem's dimensions,
and the model's parameter and activation counts from its architecture (the module is built, the
data is not). What the problem holds is its own ``ProblemSpec.memory`` (problems/); this module
sizes the data every problem on a dataset shares (``data_bytes``). It returns what a whole ``wirelessfl run`` adds to the interpreter and its imports,
report figures included, as named parts (docs/reliability.md, "Memory"):

* ``fixed``: first use of the parquet writer, the figures' canvas and fonts, and of a torch
  model's batched passes (constants);
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
  them back for the figures, whichever is larger.

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

import bz2
import gzip
import math
import os
import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from wirelessfl.algorithms.participation import participant_count
from wirelessfl.contract.memory import (
    ACTIVATION_COPIES,
    BYTES_PER_FLOAT,
    MIB,
    RoundShape,
    forward_pass_bytes,
)
from wirelessfl.errors import UserError
from wirelessfl.learning.partition import fewest_samples
from wirelessfl.plugins import algorithm_class
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
# First use of pyarrow's parquet writer and of matplotlib's Agg canvas and fonts.
FIXED_BYTES = 60 * MIB
# First use of a torch model's batched passes (autograd, the thread pool's module copies).
MODEL_FIXED_BYTES = 30 * MIB
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
# Per sample of a classifier's training set beyond its inputs: labels twice (or the labels once
# and DeviceData's index), the minibatch owner sizes and the objective's sample weights, the
# shard indices (int64 / float64 each).
SAMPLE_BYTES = 40
# The round temporaries' bytes per value (the quantiser's work, the copies of per-device rows,
# autograd's copies of activations) are the algorithms' own, in contract/memory.py.

# Built-in datasets: (samples, input shape, classes), before the train/test split.
BUILTIN_SETS = {"digits": (1797, (64,), 10), "digits28": (1797, (1, 28, 28), 10),
                "breast_cancer": (569, (30,), 2)}
IDX_FILES = ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte")


@dataclass(frozen=True)
class ProblemFacts:
    """What the estimate needs to know of the learning problem, found without building it."""

    d: int  # parameters
    itemsize: int  # bytes per value in the compute precision
    data_bytes: int  # the problem's arrays as the run holds them
    load_bytes: int  # the loader's peak (the data as read, before selection and subsampling)
    train_samples: int = 0  # on devices (0: a problem without data)
    test_samples: int = 0
    input_size: int = 0  # values per sample
    activations_per_sample: int = 0
    num_classes: int = 0  # 0: no per-device accuracy or label counts


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


# ---- the problem's facts -----------------------------------------------------------------------
@dataclass(frozen=True)
class DataShape:
    """A dataset's size as the run will hold it, and as it is loaded (before label selection
    and subsampling): ``loaded_values`` input values at ``load_bytes`` bytes each at the
    loader's peak."""

    train: int
    test: int
    input_shape: tuple[int, ...]
    classes: int
    loaded_values: int = 0
    load_bytes: int = 0


# Bytes per input value at a loader's peak: IDX uint8 + float32 + the scaled float32;
# LIBSVM float64 dense + float32 (plus the sparse matrix, about as large again at worst);
# make_classification's float64 draws, their float32 copy and the standardised split.
LOAD_BYTES = {"idx": 9, "libsvm": 24, "synthetic": 24, "builtin": 24}


def dataset_shape(data, limit_bytes: float = math.inf) -> DataShape:
    """The size of ``data`` (a DataConfig) without loading it: the catalog's sizes, the
    synthetic section, the IDX headers, or a streaming count of a LIBSVM file's lines and
    largest feature index (stopped once the dense float32 array would exceed ``limit_bytes``).
    Unreadable files count as empty: the loader reports them."""
    from wirelessfl.learning.datasets import BUILTIN_DATASETS

    name = data.name
    test = None
    if name not in BUILTIN_DATASETS:
        samples, shape, classes, test = _plugin_shape(data)
        kind = "builtin"
    elif name in BUILTIN_SETS:
        samples, shape, classes = BUILTIN_SETS[name]
        kind = "builtin"
    elif name == "synthetic":
        cfg = data.synthetic
        samples, shape, classes = cfg.num_samples, (cfg.num_features,), cfg.num_classes
        kind = "synthetic"
    elif name == "libsvm":
        samples, features, test = _libsvm_shape(data, limit_bytes)
        shape, classes, kind = (features,), 2, "libsvm"
    else:  # mnist, fashionmnist: the IDX headers give (count, rows, cols)
        counts = [_idx_dims(data.root, f) for f in IDX_FILES]
        samples, test = counts[0][0], counts[1][0]
        shape, classes, kind = (1, *counts[0][1:]), 10, "idx"
    loaded = (samples + (test or 0)) * math.prod(shape)
    if test is None:  # one set, split: the stratified test share
        test = math.ceil(data.test_fraction * samples)
        samples -= test
    if data.classes is not None and name != "libsvm":  # a share of the labels is kept
        keep = len(data.classes) / classes
        samples, test = math.ceil(keep * samples), math.ceil(keep * test)
    if data.classes is not None:
        classes = len(data.classes)
    elif data.positive_classes is not None:
        classes = 2
    samples = min(samples, data.max_train_samples or samples)
    test = min(test, data.max_test_samples or test)
    return DataShape(samples, test, shape, classes, loaded, LOAD_BYTES[kind])


def _plugin_shape(data) -> tuple[int, tuple[int, ...], int, int | None]:
    """(training samples, input shape, classes, test samples or None) of a dataset plugin: its
    declared facts, or, where it declares too few, the arrays it returns (seed 0)."""
    from wirelessfl.learning.datasets import plugin_dataset, plugin_facts

    facts = plugin_facts(data)
    if {"input_shape", "classes", "train_samples"} <= set(facts):
        return (facts["train_samples"], facts["input_shape"], facts["classes"],
                facts.get("test_samples"))
    x_train, _, x_test, _, classes = plugin_dataset(data, 0)
    return len(x_train), tuple(x_train.shape[1:]), classes, None if x_test is None else len(x_test)


def _idx_dims(root: str | None, base: str) -> tuple[int, int, int]:
    """(count, rows, cols) from an IDX image file's header (plain or .gz: 16 bytes are
    decompressed), or zeros when it cannot be read."""
    if root is None:
        return 0, 0, 0
    folder = Path(root).expanduser()
    for path, opener in ((folder / base, open), (folder / f"{base}.gz", gzip.open)):
        if path.is_file():
            try:
                with opener(path, "rb") as fh:
                    head = fh.read(16)
            except (OSError, EOFError, zlib.error):
                return 0, 0, 0
            if len(head) == 16:
                _, *dims = struct.unpack(">4i", head)
                return tuple(max(0, v) for v in dims)
    return 0, 0, 0


_FEATURE = re.compile(rb"(\d+):")
# Feature indices a LIBSVM reader accepts (int32); a larger one is the loader's error to report.
LIBSVM_INDEX_LIMIT = 2**31 - 1


def _largest_index(block: bytes) -> int:
    """1 + the largest valid feature index in ``block`` (0 without any)."""
    found = [i for i in map(int, _FEATURE.findall(block)) if i < LIBSVM_INDEX_LIMIT]
    return max(found) + 1 if found else 0


def _libsvm_shape(data, limit_bytes: float) -> tuple[int, int, int | None]:
    """(training lines, features, test lines or None) of a LIBSVM file pair, by one streaming
    pass (plain, .gz or .bz2); stops once lines x features x 4 B exceeds ``limit_bytes``."""
    if data.root is None:
        return 0, 0, None
    folder = Path(data.root).expanduser()
    lines, features = [], 0
    for name in filter(None, (data.file, data.test_file)):
        count = 0
        for path, opener in ((folder / name, open), (folder / f"{name}.gz", gzip.open),
                             (folder / f"{name}.bz2", bz2.open)):
            if not path.is_file():
                continue
            try:
                with opener(path, "rb") as fh:
                    tail = b""
                    while block := fh.read(16 * MIB):
                        block = tail + block
                        cut = block.rfind(b"\n") + 1
                        block, tail = block[:cut], block[cut:]
                        count += block.count(b"\n")
                        features = max(features, _largest_index(block))
                        if (sum(lines) + count) * features * BYTES_PER_FLOAT > limit_bytes:
                            return sum(lines) + count, features, None
                    count += bool(tail.strip())
                    features = max(features, _largest_index(tail))
            except (OSError, EOFError, ValueError, zlib.error):
                pass
            break
        lines.append(count)
    return lines[0], features, (lines[1] if len(lines) > 1 else None)


def problem_facts(scenario, limit_bytes: float = math.inf) -> ProblemFacts:
    """The problem's size, from the scenario alone: the registered problem's ``memory`` hook
    (problems/base.py), which builds nothing and loads no dataset."""
    from wirelessfl.plugins import problem_spec

    return problem_spec(scenario.problem.name).memory(scenario, limit_bytes)


@dataclass(frozen=True)
class DataBytes:
    """A problem on data, sized from the scenario: ``shape`` (``dataset_shape``), values per
    sample, the dataset in device order and as loaded plus the test set and per-sample
    bookkeeping (``held``), the loader's peak (``load``), training samples on devices."""

    shape: DataShape
    input_size: int
    held: int
    load: int
    on_devices: int


def drawn_samples(scenario, on_devices: int) -> int | None:
    """Entries of the devices' index sets when they draw with replacement (learning/
    partition.py: ``samples_per_device`` given, or the population outgrows the ``on_devices``
    training samples), else None (the split holds each sample once). client-dirichlet draws
    its own sizes: N x their mean, max(min_samples, median e^(sigma^2 / 2)) [D]; label-skew
    is taken to outgrow the data when N x classes_per_device exceeds it (the split's own test
    is per class) [D]."""
    config, n = scenario.partition, scenario.population.num_devices
    params = config.params()
    fewest = fewest_samples(config.scheme, params)
    if config.scheme == "client-dirichlet":
        if n * fewest <= on_devices:
            return None
        mean = config.size_median * math.exp(config.size_sigma ** 2 / 2)
        return math.ceil(n * max(fewest, mean))
    if config.samples_per_device is None and n * fewest <= on_devices:
        return None
    return n * (config.samples_per_device or fewest)


def data_bytes(scenario, limit_bytes: float = math.inf) -> DataBytes:
    """What every problem on ``scenario.data`` holds of it (the problems' memory hooks add their
    own arrays): the inputs as loaded and as the devices read them (in device order, or the
    training set once when the entries drawn with replacement, ``drawn_samples``, outnumber it:
    DeviceData's index), the test set, bookkeeping per entry."""
    shape = dataset_shape(scenario.data, limit_bytes)
    input_size = math.prod(shape.input_shape)
    on_devices = round(shape.train * (1 - scenario.data.server_fraction))
    entries = drawn_samples(scenario, on_devices) or shape.train
    rows = min(entries, shape.train)
    held = BYTES_PER_FLOAT * input_size * (shape.train + rows + shape.test) \
        + SAMPLE_BYTES * entries
    return DataBytes(shape, input_size, held, shape.load_bytes * shape.loaded_values, on_devices)


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


def forward_bytes(facts: ProblemFacts, chunk: int, batch: int) -> int:
    """A forward minibatch pass of ``chunk`` devices at a shared model: inputs and activations,
    no autograd copies."""
    return forward_pass_bytes(chunk, batch, facts.input_size, facts.activations_per_sample)


def one_off_compute(cls, params, facts: ProblemFacts, n: int, max_chunk_mb: float) -> int:
    """Bytes of a one-off forward pass before round 0 (``one_off_forward_devices``): the
    chunk's pass, plus each asked device's minibatch indices and the uniforms they are drawn
    from (int64 and float64 a sample)."""
    devices = cls.one_off_forward_devices(n, params)
    if not devices or not facts.train_samples:
        return 0
    chunk = chunk_devices(facts, devices, params.batch_size, max_chunk_mb)
    return forward_bytes(facts, chunk, params.batch_size) + devices * params.batch_size * 16


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
            + total_rows * ROUND_ROW_BYTES)
    end = max(written, read)
    params, copies, state, compute, chunked = worst
    est = MemoryEstimate(worst=params.display_name, state_arrays=copies, num_devices=n, d=d,
                         itemsize=size, chunked=chunked)
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

