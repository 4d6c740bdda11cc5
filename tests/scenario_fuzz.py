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
        "health", "max_clipped_share", "loss_must_fall", "energy_accounting", "circuit_power_w"]


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
def documents(draw):
    """A valid scenario document with 1-5 random mutations (or, rarely, not a mapping)."""
    if draw(st.integers(0, 30)) == 0:
        return draw(values)
    doc = copy.deepcopy(BASE)
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
def yaml_bytes(draw):
    """Raw scenario file contents: a mutated document's YAML, with byte corruptions, or a template
    with anchors, merge keys, tags and unsafe Python tags."""
    choice = draw(st.integers(0, 3))
    if choice == 0:
        text = draw(st.sampled_from(TEMPLATES))
        return (yaml.safe_dump(BASE) + text if draw(st.booleans()) else text).encode()
    try:
        data = yaml.safe_dump(draw(documents()), allow_unicode=True).encode()
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
