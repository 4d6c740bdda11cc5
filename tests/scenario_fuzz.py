"""Generated scenario input for the fuzz test and ``benchmarks/fuzz_scenarios.py``.

Two families of input: (a) documents made by mutating a valid scenario (keys deleted, values
replaced by other types, out-of-range or huge numbers, unknown keys, deep nesting, whole sections
replaced) and fed to ``scenario_from_document``; (b) raw bytes (a valid scenario's YAML with
corruptions, YAML anchors, aliases, merge keys and tags, including unsafe Python tags, and
non-UTF-8 bytes) written to a file and fed to ``load_scenario``. ``classify`` says what the
loader made of one input: ``valid``, ``rejected`` (one clean UserError naming the source), or
raises whatever else escaped (a crash)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import yaml
from hypothesis import strategies as st

from tests.conftest import small_doc
from wirelessfl.errors import UserError
from wirelessfl.scenario.loader import load_scenario, scenario_from_document

# The small test scenario with more sections to mutate (a Dirichlet split, an MLP, an engine).
BASE = small_doc(name="fuzz", partition={"scheme": "dirichlet", "alpha": 0.5},
                 model={"name": "mlp", "hidden": [16]}, engine={"mode": "vectorized"},
                 algorithms=[{"name": "dzofl", "rounds": 10, "eval_every": 5, "alpha0": 2.0},
                             {"name": "fedavg", "rounds": 3, "local_steps": 2, "lr": 0.1,
                              "label": "FA"}])

# A file that would run a command if the loader executed Python tags (it must not).
UNSAFE_MARKER = "wirelessfl-fuzz-unsafe-tag-executed"

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-10**6, max_value=10**6),
    st.sampled_from([0, -1, 10**19, 10**400, -10**400, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["seed002-cell", "quickstart", "dzofl", "fedavg", "1e-3", "4e9", "nan",
                     "inf", "~", "yes", "", " ", "null", "../../etc/passwd", "x" * 300,
                     "dane-plus", "fedred", "quadratic", "logistic", "libsvm", "mnist"]),
)


def _nested(depth: int):
    """A structure nested ``depth`` levels deep."""
    value: object = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


values = st.one_of(
    scalars,
    st.lists(scalars, max_size=4),
    st.dictionaries(st.text(max_size=6), scalars, max_size=3),
    st.integers(min_value=50, max_value=3000).map(_nested),
)

KEYS = ["name", "seed", "channel", "energy", "population", "data", "partition", "model", "problem",
        "quantization_bits", "target_accuracy", "target_suboptimality", "engine", "algorithms",
        "rounds", "lr", "num_devices", "alpha", "scheme", "label", "bits", "uplink", "profile",
        "tx_power_dbm", "classes", "battery_j", "hidden", "dimension", "p", "eta", "unknown_key",
        "health", "max_clipped_share", "loss_must_fall", "energy_accounting", "circuit_power_w",
        # sweep and tune files
        "grid", "points", "seeds", "set", "scenario", "search", "objective", "tuning_seeds",
        "evaluation_seeds", "log", "lin", "num", "description"]


def _paths(node, prefix=()):
    """Every (path, value) in a document, down to 6 levels (not into the deep nests)."""
    yield prefix, node
    if len(prefix) >= 6:
        return
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _paths(child, prefix + (i,))


def _parent(doc, path):
    node = doc
    for part in path[:-1]:
        node = node[part]
    return node


@st.composite
def documents(draw, base=BASE):
    """A valid document (``base``, by default the scenario) with 1-5 random mutations (or,
    rarely, not a mapping)."""
    if draw(st.integers(0, 30)) == 0:
        return draw(values)
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 5))):
        paths = [p for p, _ in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _parent(doc, path), path[-1]
        action = draw(st.sampled_from(["delete", "replace", "replace", "add", "widen"]))
        if action == "delete":
            del parent[key]
        elif action == "replace":
            parent[key] = draw(values)
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(KEYS + [draw(st.text(max_size=8))]))] = draw(values)
        elif action == "widen":  # a scalar section becomes a mapping or a list of itself
            parent[key] = draw(st.sampled_from([{"profile": parent[key]}, [parent[key]]]))
    return doc


TEMPLATES = [
    "base: &b {rounds: 3, name: fedavg}\nalgorithms: [*b, *b]\n",
    "a: &a [*a]\n",
    "x: &x {y: 1}\n<<: *x\nalgorithms: [{<<: *x, name: dzofl}]\n",
    "algorithms: !!python/object/apply:os.system ['touch " + UNSAFE_MARKER + "']\n",
    "!!python/object/new:pathlib.Path ['" + UNSAFE_MARKER + "']\n",
    "seed: !!binary aGVsbG8=\n",
    "seed: !!timestamp 2001-12-14t21:59:43.10-05:00\n",
    "? [complex, key]\n: value\n",
    "name: 'unterminated\n",
    "\t- tab\n",
    "%YAML 1.1\n---\nname: a\n---\nname: b\n",
    ("lol: &l1 [a, a, a, a, a, a, a, a, a]\nl2: &l2 [*l1, *l1, *l1, *l1, *l1, *l1, *l1]\n"
     "l3: &l3 [*l2, *l2, *l2, *l2, *l2, *l2, *l2]\nalgorithms: [*l3]\n"),
    "[" * 5000 + "]" * 5000 + "\n",
]


@st.composite
def yaml_bytes(draw, base=BASE, templates=TEMPLATES):
    """Raw file contents: a mutated ``base`` document's YAML, with byte corruptions, or a
    template with anchors, merge keys, tags and unsafe Python tags."""
    choice = draw(st.integers(0, 3))
    if choice == 0:
        text = draw(st.sampled_from(templates))
        return (yaml.safe_dump(base) + text if draw(st.booleans()) else text).encode()
    try:
        data = yaml.safe_dump(draw(documents(base)), allow_unicode=True).encode()
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError):
        data = b"name: x\n"
    if choice >= 2:  # corrupt some bytes: non-UTF-8, control characters, YAML punctuation
        data = bytearray(data)
        for _ in range(draw(st.integers(1, 6))):
            if not data:
                break
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.sampled_from([0xFF, 0xC3, 0x00, 0x09, ord(":"), ord("["),
                                            ord("&"), ord("*"), ord("!"), ord("\n")]))
        data = bytes(data)
    return data


def classify(item, folder: Path | None = None) -> tuple[str, str]:
    """('valid' | 'rejected', message) for a document (dict or other) or raw bytes (written to
    ``folder``/fuzz.yaml and loaded as a file). A rejection's message must name the source;
    anything other than a UserError propagates (a crash)."""
    if isinstance(item, bytes):
        path = Path(folder) / "fuzz.yaml"
        path.write_bytes(item)
        source, load = str(path), (lambda: load_scenario(str(path)))
    else:
        source, load = "fuzz.yaml", (lambda: scenario_from_document(item, "fuzz.yaml"))
    try:
        scenario = load()
    except UserError as err:
        message = str(err)
        if source not in message:
            raise AssertionError(f"rejection does not name the file: {message!r}") from None
        return "rejected", message
    assert scenario.algorithms and all(math.isfinite(p.rounds) for p in scenario.algorithms)
    return "valid", ""


# ------------------------------------------------------------ commands, as a user runs them

class Hang(BaseException):
    """A command ran past its time limit (a BaseException, so no `except Exception` eats it)."""


class Crash(AssertionError):
    """A command ended in anything but success or one clean `error:` line."""


def cli_outcome(argv: list[str], timeout_s: float = 60.0, names: str | None = None) -> str:
    """'valid' (exit 0), 'rejected' (exit 2, exactly one stderr line starting ``error: ``, naming
    ``names`` if given, no traceback) or 'hang' (past ``timeout_s``) for ``wirelessfl ARGV`` run
    in this process; raises Crash otherwise (an escaped exception propagates as itself)."""
    import contextlib
    import io
    import signal

    from wirelessfl.cli import main

    def expire(signum, frame):
        raise Hang(f"{argv[0]} ran past {timeout_s} s")

    err, previous = io.StringIO(), signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse
                code = exc.code
    except Hang:
        return "hang"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    text = err.getvalue()
    if code == 0:
        return "valid"
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    if code == 2 and len(errors) == 1 and "Traceback" not in text \
            and (names is None or names in errors[0]):
        return "rejected"
    raise Crash(f"exit code {code}, stderr {text[-600:]!r}")


# ------------------------------------------------------------ sweep and tune files

SCENARIO_FILE = "small.yaml"  # BASE, written beside the generated sweep and tune files
SWEEP_SMALL = {"name": "fz-sweep", "scenario": SCENARIO_FILE,
               "set": {"target_accuracy": 0.6, "algorithms.FA.rounds": 2},
               "grid": {"channel.uplink.tx_power_dbm": [0, 23]}, "seeds": [0, 1]}
SWEEP_POINTS = {"scenario": SCENARIO_FILE, "seeds": [0],
                "points": [{"quantization_bits": 16, "algorithms.dzofl.rounds": 10},
                           {"quantization_bits": 8, "algorithms.FA.lr": 0.5}]}
# The shipped sweep (a catalog scenario, 30 runs) and docs/sweeps.md's `points` form of it.
SWEEP_POWER = yaml.safe_load((Path(__file__).resolve().parents[1] / "scenarios"
                              / "sweep-power.yaml").read_text())
SWEEP_POWER_POINTS = {**{k: v for k, v in SWEEP_POWER.items() if k != "grid"},
                      "points": [{"quantization_bits": 16, "algorithms.DZOFL.rounds": 1500},
                                 {"quantization_bits": 8, "algorithms.DZOFL.rounds": 3000}]}
# [D] the small bases three times as often as the shipped ones (a shipped one takes ~0.5 s).
SWEEP_BASES = [SWEEP_SMALL, SWEEP_POINTS] * 3 + [SWEEP_POWER, SWEEP_POWER_POINTS]
SWEEP_TEMPLATES = [
    (f"scenario: {SCENARIO_FILE}\nv: &v [0, 23]\ngrid: {{channel.uplink.tx_power_dbm: *v, "
    "quantization_bits: [8, 16]}\nseeds: *v\n"),
    f"scenario: {SCENARIO_FILE}\ngrid: &g {{quantization_bits: [8]}}\npoints: [*g]\n",
    f"scenario: {SCENARIO_FILE}\ngrid: {{population.num_devices: &a [*a]}}\n",
    (f"scenario: &s {SCENARIO_FILE}\nset: {{name: *s}}\ngrid: {{quantization_bits: [8]}}\n"
    "seeds: [0, 0]\n"),
    f"scenario: {SCENARIO_FILE}\nx: &x {{seeds: [1]}}\n<<: *x\ngrid: {{seed: [1, 2]}}\n",
    (f"scenario: {SCENARIO_FILE}\ngrid: {{quantization_bits: !!python/object/apply:os.system "
    f"['touch {UNSAFE_MARKER}']}}\n"),
    "scenario: sweep-power\ngrid: {quantization_bits: [8]}\n",  # a sweep as the base
    f"scenario: {SCENARIO_FILE}\ngrid: {{}}\n",
    f"scenario: {SCENARIO_FILE}\ngrid: {{quantization_bits: []}}\n",
    "scenario: ../../../../etc/passwd\ngrid: {quantization_bits: [8]}\n",
]
# Nested aliases in a sweep file: 9^6 values from 200 bytes (the issue's 429-byte file took 11 GB
# before it was refused). Only the benchmark runs these, under a memory limit.
SWEEP_BOMBS = [
    (f"scenario: {SCENARIO_FILE}\na: &a [1,2,3,4,5,6,7,8,9]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "grid: {quantization_bits: *f}\n"),
    (f"scenario: {SCENARIO_FILE}\na: &a [8,9,10,11,12,13,14,15,16]\n"
    "grid: {quantization_bits: *a, seed: *a, population.num_devices: *a, "
    "channel.uplink.tx_power_dbm: *a, target_accuracy: *a, algorithms.FA.rounds: *a}\n"),
]
TUNE_SMALL = {"name": "fz-tune", "scenario": SCENARIO_FILE, "objective": "energy_to_target",
              "tuning_seeds": [100], "evaluation_seeds": [0, 1],
              "search": {"FA": {"lr": {"log": [0.05, 0.2], "num": 2}, "local_steps": [1, 2]},
                         "dzofl": {"alpha0": [1.0, 2.0]}}}
TUNE_TEMPLATES = [
    (f"scenario: {SCENARIO_FILE}\ntuning_seeds: &s [1]\nevaluation_seeds: *s\n"
    "search: {FA: {lr: &v {log: [0.1, 0.2], num: 2}, local_steps: [1]}, dzofl: {alpha0: *v}}\n"),
    f"scenario: {SCENARIO_FILE}\nsearch: {{FA: {{lr: {{log: [0.0, 1.0], num: 3}}}}}}\n",
    f"scenario: {SCENARIO_FILE}\nsearch: {{FA: {{lr: {{log: [1.0, .inf], num: 1000000000}}}}}}\n",
    f"scenario: {SCENARIO_FILE}\nsearch: {{FA: {{lr: {{lin: [1, 2], num: -3}}}}}}\n",
    f"scenario: {SCENARIO_FILE}\nsearch: {{FA: &a {{lr: *a}}}}\n",
    f"scenario: {SCENARIO_FILE}\nsearch: {{nobody: {{lr: [1]}}}}\n",
]


def write_scenario_beside(folder: Path) -> None:
    """The base scenario the sweep and tune files name (``SCENARIO_FILE`` in ``folder``)."""
    (Path(folder) / SCENARIO_FILE).write_text(yaml.safe_dump(BASE))


def sweep_bytes(bombs: bool = False):
    """A sweep file: a mutated sweep (small ones, the shipped one, docs/sweeps.md's `points`
    form) or a template with aliases, merge keys, tags, empty grids, repeated seeds (and, with
    ``bombs``, the nested-alias and product bombs)."""
    templates = SWEEP_TEMPLATES + (SWEEP_BOMBS if bombs else [])
    return st.sampled_from(SWEEP_BASES).flatmap(lambda base: yaml_bytes(base, templates))


def tune_bytes():
    """A tune file: a mutated small tune file or a template (aliases, bad ranges)."""
    return yaml_bytes(TUNE_SMALL, TUNE_TEMPLATES)


# ------------------------------------------------------------ --set values

SET_KEYS = ["seed", "name", "population.num_devices", "channel.uplink.tx_power_dbm",
            "algorithms.FA.lr", "algorithms.0.rounds", "algorithms.dzofl.alpha0", "model.hidden",
            "model.hidden.0", "data.name", "partition.alpha", "engine.max_chunk_mb", "channel",
            "energy", "algorithms", "quantization_bits", "target_accuracy", "algorithms.FA.label",
            "algorithms.99.lr", "algorithms.-1.lr", "algorithms.nobody.lr", "channel.fading.model",
            "channel.uplink.bandwidth_hz", "population.classes.big", "energy.battery_j",
            "algorithms.dzofl.rounds", "algorithms.FA.local_steps", "name.x", "seed.0", ""]
SEGMENTS = st.sampled_from(["algorithms", "channel", "uplink", "0", "1", "-1", "99",
                            "99999999999999999999", "FA", "dzofl", "lr", "rounds", "", " ", "..",
                            "\x00", "$x^2$", "<b>", "é", "population", "classes", "profile"])
SET_VALUES = [".inf", "-.inf", ".nan", "1e300", "-1e300", "1e999", "nan", "inf", "-inf",
              "1e-400", "9" * 400, "true", "null", "~", "[]", "{}", "''", "&a [*a]", "*a",
              f"!!python/object/apply:os.system ['touch {UNSAFE_MARKER}']", "[1, 2", "{a: 1",
              "'unterminated", "a: b: c", "- x\n- y", "\x00", "a\x00b", "\t", "%YAML 1.1",
              "!!binary aGVsbG8=", "<<: *x", "0x10", "0o17", "1_000", "2001-12-14", "1e9", "-1",
              "0", "2147483648", "18446744073709551616", "$\\frac{1}{0}$", "../../x", "/abs/x",
              "[&a [1], *a, *a]", "{seed: 1}", "dzofl", "seed002-cell", "1.5", "1e-3"]


@st.composite
def set_assignments(draw):
    """1-3 ``--set`` assignments: known, unknown and malformed key paths (NUL bytes, huge list
    indices), values of the wrong type, huge and non-finite numbers, YAML syntax errors,
    aliases, tags and nests up to 5,000 deep; sometimes no ``=`` at all."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.one_of(st.sampled_from(SET_KEYS), st.text(max_size=12),
                             st.lists(SEGMENTS, min_size=1, max_size=5).map(".".join)))
        depth = draw(st.sampled_from([3, 100, 999, 1001, 5000]))
        value = draw(st.one_of(
            st.sampled_from(SET_VALUES), st.text(max_size=16),
            st.just("[" * depth + "]" * depth), st.just("{k: " * depth + "1" + "}" * depth),
            values.map(_flow_yaml)))
        out.append(draw(st.sampled_from([f"{key}={value}", f"{key}={value}", key, f"={value}"])))
    return out


def _flow_yaml(value) -> str:
    """``value`` as one line of flow-style YAML (what a user would type after ``=``)."""
    try:
        return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip()
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError):
        return "[[[["


# ------------------------------------------------------------ damaged run folders

VICTIM = "victim.txt"  # outside every run folder; symlinks planted in a folder point here
# A tiny run (about a second): a finished first algorithm, then B, long enough to be killed in.
TINY_RUN = small_doc(name="fz-run", population={"num_devices": 4},
                     algorithms=[{"name": "fedavg", "rounds": 2, "eval_every": 1,
                                  "local_steps": 1, "label": "A"},
                                 {"name": "dzofl", "rounds": 60, "eval_every": 10, "label": "B"}])
# Files a command may write into a run folder: a symlink there must not be written through.
OUTPUT_NAMES = ["accuracy_vs_energy.png", "label_histogram.png", "report.html", "summary.csv",
                ".lock", "comparison.csv"]
DAMAGE = ["truncate", "garble", "delete", "empty", "directory", "symlink_victim",
          "symlink_dangling", "symlink_loop", "symlink_outside", "json", "table", "table"]
COMMANDS = ["report", "report --html", "compare", "resume"]


def _has_checkpoint(folder: Path) -> bool:
    """A finished checkpoint file (whatever the format calls it; not a temp file) in ``folder``."""
    return any("checkpoint" in p.name and not p.name.startswith(".") and "tmp" not in p.name
               for p in folder.iterdir()) if folder.is_dir() else False


def make_run_folders(session: Path) -> dict[str, Path]:
    """The real run folders every damaged folder starts from, made once per fuzz session:
    ``complete`` (seed 3), ``other`` (seed 4; what ``compare`` gets beside the damaged one) and
    ``killed`` (SIGKILLed after B's first checkpoint: status running, B unfinished)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    session = Path(session)
    session.mkdir(parents=True, exist_ok=True)
    (session / VICTIM).write_text("victim\n")
    bases = {}
    for label, seed in (("complete", 3), ("other", 4)):
        path = session / f"{label}.yaml"
        path.write_text(yaml.safe_dump({**TINY_RUN, "seed": seed}))
        bases[label] = session / label
        assert cli_outcome(["run", str(path), "--out", str(bases[label]), "--quiet",
                            "--no-report"], timeout_s=300) == "valid"
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    rounds = TINY_RUN["algorithms"][1]["rounds"]
    for attempt in range(4):  # B ends before the kill on a very fast machine: make it longer
        doc = copy.deepcopy(TINY_RUN)
        doc["algorithms"][1]["rounds"] = rounds * 4**attempt
        path, out = session / "killed.yaml", session / f"killed-{attempt}"
        path.write_text(yaml.safe_dump(doc))
        proc = subprocess.Popen([sys.executable, "-m", "wirelessfl", "run", str(path), "--out",
                                 str(out), "--quiet", "--no-report", "--checkpoint-every", "10"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 300
        while proc.poll() is None and not _has_checkpoint(out) and time.monotonic() < end:
            time.sleep(0.005)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.returncode == -signal.SIGKILL and _has_checkpoint(out):
            bases["killed"] = out
            break
    return bases


def _fingerprint(paths) -> dict:
    """Content of every file under ``paths`` (the session's files a command must not touch)."""
    state = {}
    for root in paths:
        for path in sorted(Path(root).rglob("*")) if Path(root).is_dir() else [Path(root)]:
            if path.is_file() and not path.is_symlink():
                state[str(path)] = path.read_bytes()
    return state


def _damage_json(data, path: Path) -> str:
    """Invalid JSON, or the file's JSON (a manifest) mutated: keys deleted, wrong types, huge
    numbers, non-finite values, deep nests."""
    import json

    choice = data.draw(st.integers(0, 2))
    if choice == 0:
        text = data.draw(st.sampled_from(["{", "[]", "null", "1e999", '{"status": "complete"',
                                          "[" * 100_000 + "]" * 100_000, "\x00", "{}",
                                          '{"status": "running", "algorithms": 5}']))
        path.write_text(text)
        return f"json {text[:30]!r}"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        doc = {"status": "complete"}
    mutated = data.draw(documents(doc)) if isinstance(doc, dict) and doc else data.draw(values)
    try:
        text = json.dumps(mutated, default=str)
    except (RecursionError, ValueError, OverflowError):
        text = "[" * 5000 + "]" * 5000
    path.write_text(text)
    return f"json mutated ({len(text)} chars)"


def _damage_table(data, path: Path) -> str:
    """A parquet table with a column made NaN, inf, huge, a string (mathtext, markup, NUL),
    dropped, or the rows emptied or repeated; other files garbled as text."""
    import numpy as np
    import pandas as pd

    try:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception:  # noqa: BLE001 - already damaged: garble instead
        return _damage_bytes(data, path, "garble")
    if frame.empty or not len(frame.columns):
        return "table (empty, left)"
    column = data.draw(st.sampled_from(list(frame.columns)))
    action = data.draw(st.sampled_from(["nan", "inf", "huge", "string", "drop", "empty",
                                        "repeat", "negative"]))
    value = {"nan": np.nan, "inf": np.inf, "huge": 1e308, "negative": -1,
             "string": data.draw(st.sampled_from(["$x^$", "<script>", "a\x00b", "", "é" * 50]))}
    if action in value:
        frame[column] = value[action]
    elif action == "drop":
        frame = frame.drop(columns=[column])
    elif action == "empty":
        frame = frame.iloc[:0]
    else:
        frame = pd.concat([frame, frame])
    try:
        if path.suffix == ".parquet":
            frame.to_parquet(path)
        else:
            frame.to_csv(path, index=False)
    except Exception:  # noqa: BLE001 - a combination pandas cannot write: garble instead
        return _damage_bytes(data, path, "garble")
    return f"table {column}: {action}"


def _damage_bytes(data, path: Path, action: str) -> str:
    raw = path.read_bytes() if path.is_file() else b""
    if action == "truncate":
        keep = int(len(raw) * data.draw(st.floats(0.0, 1.0)))
        path.write_bytes(raw[:keep])
        return f"truncate to {keep} of {len(raw)} bytes"
    if action == "empty" or not raw:
        path.write_bytes(b"")
        return "empty"
    raw = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    path.write_bytes(bytes(raw))
    return "garble"


def damage_run_folder(data, folder: Path, session: Path) -> list[str]:
    """1-3 kinds of damage to the run folder ``folder`` (a copy), drawn from ``data``:
    truncated, garbled, emptied or deleted files, a file replaced by a folder, symlinks (to the
    session's victim file, dangling, to themselves, to a folder outside), a manifest with
    invalid or mutated JSON, tables with bad columns. Returns what was done, for the record."""
    import shutil

    done = []
    files = sorted(p.name for p in folder.iterdir())
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from(files + OUTPUT_NAMES))
        action = data.draw(st.sampled_from(DAMAGE))
        path = folder / name
        if action.startswith("symlink") or action in ("delete", "directory"):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
            target = {"symlink_victim": session / VICTIM, "symlink_dangling": folder / "nowhere",
                      "symlink_loop": path, "symlink_outside": session}.get(action)
            if target is not None:
                path.symlink_to(target)
            elif action == "directory":
                path.mkdir()
                (path / "x").write_text("x")
            done.append(f"{name}: {action}")
            continue
        if path.is_symlink() or path.is_dir():
            done.append(f"{name}: {action} (skipped: not a file)")
            continue
        if action == "json":
            done.append(f"{name}: {_damage_json(data, path)}")
        elif action == "table" and path.suffix in (".parquet", ".csv") and path.exists():
            done.append(f"{name}: {_damage_table(data, path)}")
        else:
            done.append(f"{name}: {_damage_bytes(data, path, action)}")
    return done


def damaged_run_outcome(data, bases: dict[str, Path], work: Path, session: Path,
                        log: list[str], timeout_s: float = 120.0) -> str:
    """Copy a base run folder into ``work``, damage it, run report, compare or run --resume on
    it in process; the outcome, with what was done appended to ``log``. A command that writes
    through a planted symlink or changes anything in ``session`` (the bases, the victim file;
    put back afterwards) is a Crash."""
    import shutil

    base = data.draw(st.sampled_from(sorted(k for k in bases if k != "other")))
    folder = work / "run"
    shutil.copytree(bases[base], folder, symlinks=True)
    log.append(f"base {base}")
    log.extend(damage_run_folder(data, folder, session))
    command = data.draw(st.sampled_from(COMMANDS))
    argv = {"report": ["report", str(folder)], "report --html": ["report", str(folder), "--html"],
            "compare": ["compare", str(folder), str(bases["other"]), "--out", str(work / "cmp")],
            "resume": ["run", "--resume", str(folder), "--quiet", "--no-report"]}[command]
    log.append(command)
    before = _fingerprint([session])
    try:
        outcome = cli_outcome(argv, timeout_s)
    finally:
        after = _fingerprint([session])
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        for path in changed:  # put the session back for the next input
            if path in before:
                Path(path).write_bytes(before[path])
            else:
                Path(path).unlink()
    if changed:
        raise Crash(f"{command} changed files outside the run folder: {changed[:3]}")
    return outcome
