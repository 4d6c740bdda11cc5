"""A run's object graph as data (JSON-able nodes plus numpy arrays) and that data put back.

Why this exists: a checkpoint must hold data only. Nothing read from the file may decide which
code runs or which objects exist, so a resumed run builds its objects fresh from the scenario,
exactly as a run starts, and only their *state* comes from the file (state-dict style): the
walk below pairs every node of the saved tree with the fresh object at the same attribute path.

What a node can be:

* a leaf: None, bool, int, float (non-finite ones tagged), str; a numpy array or scalar (numeric
  and bool dtypes only); a torch tensor (plain ``torch.Tensor``, no autograd history); a numpy
  ``Generator`` (its bit generator's ``state``, a dict of integers);
* a container: a list, tuple or dict of nodes (dict keys: scalars or tuples of them);
* an object: an instance of one of wirelessfl's own classes with a ``__dict__``, recursed into
  by attribute name. Restoring never creates one: the fresh graph must hold an object of the
  same class at the same path, and its attributes are set in place;
* ``code``: a module-level function an object holds (a pricing rule the constructor picked):
  behaviour, not state; the fresh run's own is kept, after checking it has the same name
  (lambdas and nested functions, which could hide state, are refused);
* ``derived``: an attribute an object's class names in ``derived_state``, a cache rebuilt from
  the scenario when first needed: neither saved nor restored;
* ``kept``: an object the run is given rather than one it evolves (the SimPy environment, the
  learning problem, the callbacks, what the World shares between algorithms, pydantic
  configuration); restoring keeps the fresh run's own;
* ``ref``: an object, array, tensor, list or dict reached a second time (the ledger is the run
  context's and the network's), stored once and restored as the same object again; the fresh
  graph must alias the same objects.

Structure that changes while a run goes on is handled by one rule: an attribute may appear or
change its value during a run when the value is data (a leaf or a container of leaves: FedRed's
local models appear in round 0, the rows list grows); an object may not appear, since restoring
it would mean constructing it from the file. ``capture`` checks the graph against the
``skeleton`` recorded when the run started and refuses, when saving, an object that was not
there (or an array whose shape or dtype changed), naming its path, so a checkpoint that could
not be restored is never written. Anything else (functions, other libraries' objects, object
arrays, tensors with autograd history, storage shared between two different arrays) is refused
at save time the same way.
"""

from __future__ import annotations

import math
import types
from collections.abc import Iterable

import numpy as np
import simpy
import torch
from pydantic import BaseModel

from wirelessfl.plugins import is_plugin_class

# Deeper nesting than any run's graph reaches; a file claiming more is refused, not recursed.
MAX_DEPTH = 64
# The only numpy dtype kinds a checkpoint holds: bool, signed, unsigned, float, complex.
ARRAY_KINDS = "biufc"
# Lists of more floats than this are stored as one float64 array (the rows' device accuracies).
FLOAT_LIST_MIN = 16
TORCH_DTYPES = {str(t).removeprefix("torch."): t for t in (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)}
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_MISSING = object()
_byte_bounds = getattr(np.lib, "array_utils", np).byte_bounds  # numpy 2 moved it


class StateError(Exception):
    """The graph holds something that is not data (saving), or the saved tree does not fit the
    fresh graph (restoring); the message names the attribute path."""


def class_name(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


# Classes and functions that moved since checkpoints were written: the name a checkpoint holds
# -> the name it has now, so that a run interrupted before a move resumes after it (a name is
# data here, compared with the fresh run's, never imported). Issue 33 split the run context's
# recorder into engine/recorder.py.
RENAMED = {
    "wirelessfl.engine.context.HealthCounter": "wirelessfl.engine.recorder.HealthCounter",
}


def current_name(name: object) -> object:
    """``name`` as the code names it now (``RENAMED``); anything else unchanged."""
    return RENAMED.get(name, name) if isinstance(name, str) else name


def _own_object(value) -> bool:
    """An instance whose state is its ``__dict__`` of one of wirelessfl's own classes, of a
    subclass of one (a plugin algorithm), or of a plugin class the scenario names (a fading
    model): a fresh run builds each of them from the scenario as it does the built-ins."""
    cls = type(value)
    ours = any(c.__module__.startswith("wirelessfl.") for c in cls.__mro__) \
        or is_plugin_class(cls)
    return ours and hasattr(value, "__dict__") and not isinstance(value, type)


def _function_name(function) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def _derived(value) -> frozenset[str]:
    """The attributes an object names in its class's ``derived_state``: caches rebuilt from the
    scenario when first needed (the network's analog uplink), neither saved nor restored, so a
    checkpoint written before one existed still resumes and one created during a run is no new
    state."""
    return frozenset(getattr(type(value), "derived_state", ()))


def _external(value, kept: set[int]) -> bool:
    return id(value) in kept or isinstance(value, (BaseModel, simpy.Environment))


def kept_ids(*objects, shared: Iterable = ()) -> set[int]:
    """The ids of ``objects`` and of what ``shared`` holds (one level into lists and tuples):
    the objects a run is given, not ones it evolves. Scalars and None are never kept."""
    out: set[int] = set()

    def add(value):
        if value is not None and type(value) not in (bool, int, float, str):
            out.add(id(value))

    for value in objects:
        add(value)
    for value in shared:
        add(value)
        if isinstance(value, (list, tuple)):
            for item in value:
                add(item)
    return out


def _signature(value) -> tuple:
    """What must stay the same between the graph a run starts with and a saved tree."""
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), tuple(value.shape))
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape))
    if isinstance(value, np.random.Generator):
        return ("rng", type(value.bit_generator).__name__)
    return ("object", class_name(value))


class _Capture:
    """One walk of a graph: the tree of nodes, the arrays it refers to by key, and the
    signature of every object, generator, array and tensor by path."""

    def __init__(self, kept: set[int], store: bool):
        self.kept = kept
        self.store = store  # False: signatures only (the skeleton), no array is touched
        self.seen: dict[int, tuple[str, object]] = {}  # id -> (first path, the object: alive)
        self.arrays: dict[str, np.ndarray] = {}
        self.signatures: dict[str, tuple] = {}
        self.memory: list[tuple[int, int, str]] = []  # byte ranges of arrays and tensors

    def array(self, value: np.ndarray, path: str) -> str:
        if value.dtype.kind not in ARRAY_KINDS:
            raise StateError(f"{path}: an array of dtype {value.dtype} is not data a checkpoint "
                             "can hold (numbers and booleans only)")
        key = f"a{len(self.arrays)}"
        self.arrays[key] = value if self.store else np.empty(0)
        return key

    def remember_memory(self, start: int, size: int, path: str) -> None:
        if size:
            self.memory.append((start, start + size, path))

    def node(self, value, path: str, depth: int = 0):
        if depth > MAX_DEPTH:
            raise StateError(f"{path}: nested deeper than {MAX_DEPTH} levels")
        t = type(value)
        if value is None or t in (bool, int, str):
            return value
        if t is float:
            return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
        if _external(value, self.kept):
            return {"$": "kept"}
        if t is tuple:
            return {"$": "tuple", "items": [self.node(v, f"{path}[{i}]", depth + 1)
                                            for i, v in enumerate(value)]}
        first = self.seen.get(id(value))
        if first is not None:
            if t is np.random.Generator or _own_object(value):
                self.signatures[path] = ("ref", first[0])
            return {"$": "ref", "path": first[0]}
        self.seen[id(value)] = (path, value)
        if t is list:
            if len(value) >= FLOAT_LIST_MIN and all(type(v) is float for v in value):
                return {"$": "floats", "key": self.array(np.asarray(value, np.float64), path)}
            return {"$": "list", "items": [self.node(v, f"{path}[{i}]", depth + 1)
                                           for i, v in enumerate(value)]}
        if t is dict:
            return {"$": "dict", "items": [[self.key(k, path), self.node(v, f"{path}[{k!r}]",
                                                                        depth + 1)]
                                           for k, v in value.items()]}
        if isinstance(value, np.generic):
            return {"$": "npscalar", "key": self.array(np.asarray(value), path)}
        if t is np.ndarray:
            self.signatures[path] = _signature(value)
            if value.size:
                low, high = _byte_bounds(value)
                self.remember_memory(low, high - low, path)
            return {"$": "array", "key": self.array(value, path)}
        if t is torch.Tensor:
            return self.tensor(value, path)
        if t is np.random.Generator:
            self.signatures[path] = _signature(value)
            return {"$": "rng", "bit_generator": type(value.bit_generator).__name__,
                    "state": self.node(value.bit_generator.state, _join(path, "state"), depth + 1)}
        if t is types.FunctionType:
            if value.__closure__ or "<" in value.__qualname__:
                raise StateError(f"{path}: the nested function {_function_name(value)} may hold "
                                 "state a checkpoint cannot see; use a module-level function")
            return {"$": "code", "name": _function_name(value)}
        if _own_object(value):
            self.signatures[path] = _signature(value)
            derived = _derived(value)
            return {"$": "object", "class": class_name(value),
                    "attrs": {name: self.node(v, _join(path, name), depth + 1)
                              for name, v in vars(value).items() if name not in derived}}
        raise StateError(f"{path}: a {class_name(value)} is not data a checkpoint can hold "
                         "(arrays, tensors, numbers, strings, lists and dicts of them, random "
                         "generators and wirelessfl's own objects)")

    def tensor(self, value: torch.Tensor, path: str) -> dict:
        name = str(value.dtype).removeprefix("torch.")
        if name not in TORCH_DTYPES:
            raise StateError(f"{path}: a tensor of dtype {value.dtype} is not data a "
                             "checkpoint can hold")
        if value.grad_fn is not None or value.is_sparse:
            raise StateError(f"{path}: a tensor with autograd history (or sparse) is not data "
                             "a checkpoint can hold; store it detached")
        self.signatures[path] = _signature(value)
        storage = value.untyped_storage()
        self.remember_memory(storage.data_ptr(), storage.nbytes(), path)
        data = None
        if self.store:
            data = value.detach().cpu()
            data = (data.view(torch.int16) if value.dtype == torch.bfloat16 else data).numpy()
        key = self.array(data if data is not None else np.empty(0), path)
        return {"$": "tensor", "key": key, "dtype": name, "cpu": value.device.type == "cpu",
                "requires_grad": bool(value.requires_grad)}

    def key(self, key, path: str):
        if key is None or type(key) in (bool, int, str):
            return key
        if type(key) is float:
            return self.node(key, path)
        if type(key) is tuple:
            return {"$": "tuple", "items": [self.key(k, path) for k in key]}
        raise StateError(f"{path}: a dict key of type {type(key).__name__} is not data a "
                         "checkpoint can hold")

    def check_shared_memory(self) -> None:
        """Two different arrays or tensors over the same memory would come back as two copies
        (a change to one would no longer show in the other): refused."""
        self.memory.sort()
        for (_, end, path), (start, _, other) in zip(self.memory, self.memory[1:]):
            if start < end:
                raise StateError(f"{other}: shares memory with {path}, which a checkpoint "
                                 "cannot keep; store a copy (or the same object) instead")


def skeleton(root, kept: set[int]) -> dict[str, tuple]:
    """The signatures of ``root``'s graph by path (objects, generators, arrays, tensors, and
    which paths alias which): taken when a run starts, checked by every ``capture``."""
    walk = _Capture(kept, store=False)
    walk.node(root, "")
    return walk.signatures


def capture(root, kept: set[int], start: dict[str, tuple] | None = None
            ) -> tuple[dict, dict[str, np.ndarray]]:
    """(tree, arrays): ``root``'s state as JSON-able nodes and the arrays they name by key.

    ``start``: the ``skeleton`` of the graph when the run started; an object or generator that
    was not there (or not the same class), an alias that changed, or an array or tensor whose
    dtype or shape changed raises ``StateError``: such a tree could not be restored."""
    walk = _Capture(kept, store=True)
    tree = walk.node(root, "")
    walk.check_shared_memory()
    if start is not None:
        for path, signature in walk.signatures.items():
            before = start.get(path)
            movable = signature[0] in ("array", "tensor") and before is None
            if before != signature and not movable:
                raise StateError(_changed(path or "the algorithm", before, signature))
    return tree, walk.arrays


def _changed(path: str, before, now) -> str:
    if before is None:
        what = f"a reference to {now[1]}" if now[0] == "ref" else f"a {now[-1]}"
        return (f"{path}: {what} created during the run (it was not there when the run "
                "started); a checkpoint restores state into the objects a run starts with and "
                "creates none: create it when the run starts")
    return (f"{path}: was {' '.join(map(str, before))} when the run started, is "
            f"{' '.join(map(str, now))} now; a checkpoint can only restore a graph of the same "
            "shape")


class ArraySource:
    """Where ``restore`` reads the arrays a tree names: ``read(key, like)`` returns the array,
    checking its declared dtype and shape against ``like`` (the fresh graph's array at that
    path, or None) before any memory is allocated."""

    def read(self, key: str, like: tuple | None) -> np.ndarray:
        raise NotImplementedError


class _Restore:
    def __init__(self, arrays: ArraySource, kept: set[int], device: torch.device):
        self.arrays = arrays
        self.kept = kept
        self.device = device
        self.done: dict[str, object] = {}  # path -> the restored value (refs point here)
        self.fresh: dict[str, object] = {}  # path -> the fresh object there (alias checks)

    def value(self, fresh, node, path: str, depth: int = 0):
        if depth > MAX_DEPTH:
            raise StateError(f"{path}: nested deeper than {MAX_DEPTH} levels")
        if fresh is not _MISSING and _external(fresh, self.kept):
            return fresh  # what the run is given (a callback, the problem) is never replaced
        if node is None or type(node) in (bool, int, float, str):
            _same_kind(fresh, node, path)
            return node
        if type(node) is not dict or not isinstance(node.get("$"), str):
            raise StateError(f"{path}: not a state node")
        handler = getattr(self, "_" + node["$"], None) if node["$"].isalpha() else None
        if handler is None:
            raise StateError(f"{path}: unknown node kind {node['$']!r}")
        value = handler(fresh, node, path, depth)
        _same_kind(fresh, value, path)
        if node["$"] not in ("kept", "float", "tuple", "ref", "npscalar"):
            self.done[path] = value
            self.fresh[path] = fresh
        return value

    def _kept(self, fresh, node, path, depth):
        if fresh is _MISSING:
            raise StateError(f"{path}: the checkpoint keeps the run's own object here; the "
                             "fresh run has none")
        return fresh  # None: a callback this run is not given

    def _float(self, fresh, node, path, depth):
        if node.get("v") not in NONFINITE:
            raise StateError(f"{path}: not a float")
        return NONFINITE[node["v"]]

    def _ref(self, fresh, node, path, depth):
        target = node.get("path")
        if target not in self.done:
            raise StateError(f"{path}: refers to {target!r}, which comes later or not at all")
        value = self.done[target]
        shared = isinstance(value, np.random.Generator) or _own_object(value)
        if shared and fresh is not self.fresh[target]:
            raise StateError(f"{path}: the fresh run does not share this object with {target}")
        return value

    def _items(self, fresh, node, path, depth, kind):
        items = node.get("items")
        if type(items) is not list:
            raise StateError(f"{path}: a {kind} without items")
        olds = fresh if type(fresh) in (list, tuple) else ()
        return [self.value(olds[i] if i < len(olds) else _MISSING, item, f"{path}[{i}]",
                           depth + 1) for i, item in enumerate(items)]

    def _tuple(self, fresh, node, path, depth):
        return tuple(self._items(fresh, node, path, depth, "tuple"))

    def _list(self, fresh, node, path, depth):
        return self._items(fresh, node, path, depth, "list")

    def _floats(self, fresh, node, path, depth):
        values = self.arrays.read(node.get("key"), None)
        if values.dtype != np.float64 or values.ndim != 1:
            raise StateError(f"{path}: a float list stored as {values.dtype} {values.shape}")
        return values.tolist()

    def _dict(self, fresh, node, path, depth):
        items = node.get("items")
        if type(items) is not list:
            raise StateError(f"{path}: a dict without items")
        olds = fresh if type(fresh) is dict else {}
        out = {}
        for pair in items:
            if type(pair) is not list or len(pair) != 2:
                raise StateError(f"{path}: a dict item is not a [key, value] pair")
            key = self.value(_MISSING, pair[0], _join(path, "key"), depth + 1)
            try:
                hash(key)
            except TypeError:
                raise StateError(f"{path}: a dict key of type {type(key).__name__}") from None
            out[key] = self.value(olds.get(key, _MISSING), pair[1], f"{path}[{key!r}]",
                                  depth + 1)
        return out

    def _npscalar(self, fresh, node, path, depth):
        value = self.arrays.read(node.get("key"), None)
        if value.ndim != 0:
            raise StateError(f"{path}: a numpy scalar stored with shape {value.shape}")
        return value[()]

    def _array(self, fresh, node, path, depth):
        like = _signature(fresh)[1:] if type(fresh) is np.ndarray else None
        return self.arrays.read(node.get("key"), like)

    def _tensor(self, fresh, node, path, depth):
        name = node.get("dtype")
        if name not in TORCH_DTYPES:
            raise StateError(f"{path}: unknown tensor dtype {name!r}")
        dtype = TORCH_DTYPES[name]
        stored = torch.int16 if dtype == torch.bfloat16 else dtype
        numpy_dtype = str(torch.empty(0, dtype=stored).numpy().dtype)
        like = None
        if type(fresh) is torch.Tensor:
            if fresh.dtype != dtype:
                raise StateError(f"{path}: a {name} tensor where the run has {fresh.dtype}")
            like = (numpy_dtype, tuple(fresh.shape))
        data = self.arrays.read(node.get("key"), like)
        if str(data.dtype) != numpy_dtype:
            raise StateError(f"{path}: a {name} tensor stored as {data.dtype}")
        tensor = torch.from_numpy(data)
        if dtype == torch.bfloat16:
            tensor = tensor.view(torch.bfloat16)
        device = fresh.device if type(fresh) is torch.Tensor else (
            torch.device("cpu") if node.get("cpu") is True else self.device)
        tensor = tensor.to(device)
        if node.get("requires_grad") is True:
            tensor.requires_grad_(True)
        return tensor

    def _code(self, fresh, node, path, depth):
        if type(fresh) is not types.FunctionType \
                or _function_name(fresh) != current_name(node.get("name")):
            raise StateError(f"{path}: the checkpoint names the function {node.get('name')!r} "
                             "where the fresh run has another")
        return fresh

    def _rng(self, fresh, node, path, depth):
        if type(fresh) is not np.random.Generator \
                or type(fresh.bit_generator).__name__ != node.get("bit_generator"):
            raise StateError(f"{path}: the fresh run has no {node.get('bit_generator')} random "
                             "generator here")
        state = self.value(_MISSING, node.get("state"), _join(path, "state"), depth + 1)
        try:
            fresh.bit_generator.state = state
        except (TypeError, ValueError, KeyError, OverflowError) as err:
            raise StateError(f"{path}: not a valid generator state ({err})") from None
        return fresh

    def _object(self, fresh, node, path, depth):
        attrs = node.get("attrs")
        if fresh is _MISSING or not _own_object(fresh) \
                or class_name(fresh) != current_name(node.get("class")):
            found = "nothing" if fresh is _MISSING else f"a {class_name(fresh)}"
            raise StateError(f"{path}: the checkpoint holds a {node.get('class')} where the "
                             f"fresh run has {found}")
        if type(attrs) is not dict:
            raise StateError(f"{path}: an object without attributes")
        missing = sorted(set(vars(fresh)) - set(attrs) - _derived(fresh))
        if missing:
            raise StateError(f"{path or 'the algorithm'}: the checkpoint lacks "
                             f"{', '.join(missing)}")
        self.fresh[path] = fresh  # before the attributes: they may refer back to it
        self.done[path] = fresh
        restored = {}
        for name, child in attrs.items():
            if not name.isidentifier() or name.startswith("__") or (
                    name not in vars(fresh) and not _data(getattr(type(fresh), name, None))):
                raise StateError(f"{path or 'the algorithm'}: {name!r} is not an attribute a "
                                 "checkpoint can set")
            restored[name] = self.value(vars(fresh).get(name, _MISSING), child,
                                        _join(path, name), depth + 1)
        vars(fresh).update(restored)
        return fresh


def _scalar_kind(value) -> str | None:
    if isinstance(value, (bool, np.bool_)):
        return "a boolean"
    if isinstance(value, (int, float, np.number)):
        return "a number"
    return "a string" if isinstance(value, str) else None


def _same_kind(fresh, value, path: str) -> None:
    """Where the fresh run holds a number, a boolean or a string, a restored scalar must be one
    too (int, float and numpy scalars are all numbers: a run may turn one into another)."""
    before, now = _scalar_kind(fresh), _scalar_kind(value)
    if before and now and before != now:
        raise StateError(f"{path}: {now} where the run holds {before}")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _data(value) -> bool:
    """A class attribute an instance attribute may shadow: a default value, not behaviour."""
    return value is None or type(value) in (bool, int, float, str)


def restore(root, tree, arrays: ArraySource, kept: set[int], device: torch.device) -> None:
    """Put the state ``tree`` (from ``capture``) into the freshly built graph ``root``, in
    place; ``device``: where tensors without a fresh counterpart go (unless saved from the
    CPU). Raises ``StateError`` when the tree does not fit ``root``."""
    _Restore(arrays, kept, device).value(root, tree, "")

