"""Named parts found by name: algorithms, models, datasets, problems, fading and compute models.

A scenario names its parts (``algorithms: [{name: fedavg}]``, ``model: {name: mlp}``). Each kind
has one ``Registry`` here, and a name resolves, in this order, to

1. a built-in part (declared below as ``module:attribute`` text, imported on first use, so that
   this module imports nothing of the package and no registry sits in an import cycle);
2. a part registered in this process (``Registry.register``, the Python API's
   ``wirelessfl.register_algorithm`` and friends);
3. an entry point of the group ``wirelessfl.<kind>`` in any installed distribution (a user's own
   package declares ``[project.entry-points."wirelessfl.algorithms"] myalgo = "mypkg.algo:MyAlgo"``);
4. a ``module:attribute`` reference written in the scenario itself (``name: mypkg.algo:MyAlgo``),
   imported from ``sys.path`` with the current folder on it, as ``python -m`` would; only where
   references are allowed (below).

What a name resolves to is checked for its kind (an algorithm must be an ``Algorithm`` subclass,
...) before it is used, and every failure (not installed, import error, wrong kind) is one
``UserError`` naming the key and the fix.

A reference is refused unless the user allowed references (``--allow-references``, the
environment variable ``WIRELESSFL_ALLOW_REFERENCES=1``, or ``allow_references()`` from Python):
importing a module runs its top-level code, and a name in a data file (a scenario, a sweep,
tune or reproduction file, a run folder's manifest) must not choose code to run. The refusal is
decided from the text of the name alone, before anything is imported, and before the cache of
resolved names is asked (a reference resolved while references were allowed is refused again
once they are not). Built-in parts, parts registered in-process and entry points of installed distributions stay on:
the user chose that code by installing or registering it, not a file.

Sweep and tuning workers (local processes, Dask workers) resolve names the same way; parts
registered in-process are re-imported there by module (``Registry.modules``), which is why such a
part must live in an importable module, not in ``__main__``. Whether references are allowed
travels with each task (``worker_plugins``), so a worker follows the command that sent it, not
its own environment.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
from collections.abc import Callable, Collection
from importlib import metadata
from pathlib import Path
from typing import Any, Self, get_args

from wirelessfl.errors import UserError

# module.sub:attr.sub, identifiers only (no paths, no calls).
_REFERENCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
                        r":[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def is_reference(name: str) -> bool:
    """True when ``name`` is a ``module:attribute`` reference rather than a registered name."""
    return isinstance(name, str) and bool(_REFERENCE.match(name))


# The environment variable that allows references in a process (and in the processes it
# starts that read it): 1 (or true, yes, on) allows, 0 (false, no, off) or unset refuses.
ALLOW_REFERENCES_ENV = "WIRELESSFL_ALLOW_REFERENCES"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
# Set by ``allow_references`` (the CLI's --allow-references, the Python API, a sweep worker from
# its task); None: the environment variable decides.
_allowed: bool | None = None


def references_allowed() -> bool:
    """Whether a ``module:attribute`` reference may be imported in this process now: what
    ``allow_references`` set last, else the environment variable ``WIRELESSFL_ALLOW_REFERENCES``
    (an unreadable value is a ``UserError``: a typo must not allow, nor silently refuse)."""
    if _allowed is not None:
        return _allowed
    value = os.environ.get(ALLOW_REFERENCES_ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise UserError(f"{ALLOW_REFERENCES_ENV}={value[:20]!r}: expected 1 (allow module:attribute "
                    "references) or 0 (refuse them)")


class _ReferenceSetting:
    """What ``allow_references`` returns: the setting is already in force; as a context manager
    it puts the previous one back on exit."""

    def __init__(self, before: bool | None):
        self._before = before

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        global _allowed
        _allowed = self._before


def allow_references(allowed: bool = True) -> _ReferenceSetting:
    """Allow (or, with ``allowed=False``, refuse) ``module:attribute`` references in the names
    scenarios give, for this process from now on, whatever the environment variable says; or,
    as ``with allow_references(): ...``, for that block only. The Python API's way to say what
    ``--allow-references`` says: only for files whose references you trust, since resolving one
    imports the module it names and so runs its code."""
    global _allowed
    setting = _ReferenceSetting(_allowed)
    _allowed = bool(allowed)
    return setting


def refuse_reference(name: str, where: str) -> None:
    """A ``UserError`` at ``where`` unless references are allowed: raised on the name's text,
    before anything is imported."""
    if not references_allowed():
        raise UserError(f"{where}: {name!r} is a module:attribute reference, which would import "
                        "and run that module's code; allow references with --allow-references "
                        f"(or {ALLOW_REFERENCES_ENV}=1, or wirelessfl.allow_references() in "
                        "Python), or install the part as an entry point or register it "
                        "(docs/plugins.md)")


def import_reference(reference: str, where: str) -> Any:
    """The object ``module:attribute`` names, imported with the current folder on ``sys.path``;
    a ``UserError`` at ``where`` when it cannot be."""
    if not is_reference(reference):
        raise UserError(f"{where}: {reference!r} is not a 'module:attribute' reference; write "
                        "e.g. 'mypackage.algorithms:MyAlgorithm'")
    module_name, attribute = reference.split(":", 1)
    cwd = str(Path.cwd())
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # after everything installed: a local file never shadows a package
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        missing = getattr(err, "name", None)
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise UserError(f"{where}: cannot import module '{module_name}' of {reference!r}; "
                            "install the package that holds it (pip install -e .) or run from "
                            "the folder that holds it") from None
        raise UserError(f"{where}: importing '{module_name}' of {reference!r} failed: "
                        f"{type(err).__name__}: {err}") from None
    except Exception as err:  # noqa: BLE001 - a user module's own failure, reported as such
        raise UserError(f"{where}: importing '{module_name}' of {reference!r} failed: "
                        f"{type(err).__name__}: {str(err)[:200]}") from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{where}: module '{module_name}' has no attribute '{attribute}' "
                            f"(of {reference!r}); check the name")
        obj = getattr(obj, part)
    return obj


def drop_empty_options(self: Any, handler: Any) -> Any:
    """A wrap serializer for a section with a plugin ``options`` dict: dumped only when given,
    so a built-in's section (and with it a resolved scenario, its fingerprint and the sweeps
    that compare it) reads exactly as before plugins existed. Used as
    ``_dump = model_serializer(mode="wrap")(drop_empty_options)``."""
    data = handler(self)
    if isinstance(data, dict) and not data.get("options"):
        data.pop("options", None)
    return data


class Registry:
    """The parts of one kind, by name (see the module docstring for the order of look-up).

    ``check(obj) -> str | None`` says what is wrong with an object offered as this kind (None:
    fine); ``name_of(obj)`` the name a registered object goes by when none is given."""

    def __init__(self, kind: str, builtins: dict[str, str],
                 check: Callable[[Any], str | None] = lambda obj: None,
                 name_of: Callable[[Any], str | None] = lambda obj: getattr(obj, "name", None),
                 noun: str | None = None):
        self.kind = kind
        self.noun = noun or kind.removesuffix("s")  # one part, in messages
        self.group = f"wirelessfl.{kind}"
        self._builtins = dict(builtins)
        self._check = check
        self._name_of = name_of
        self._loaded: dict[str, Any] = {}  # every name resolved so far, built-ins included
        self._registered: dict[str, Any] = {}  # registered in this process
        self._entry_points: dict[str, metadata.EntryPoint] | None = None

    # -- what there is -------------------------------------------------------------------
    def builtin_names(self) -> list[str]:
        return list(self._builtins)

    def load_builtins(self) -> dict[str, Any]:
        """Every built-in part, imported: name -> object (tests walk them all)."""
        return {name: self.get(name) for name in self._builtins}

    def loaded(self) -> dict[str, Any]:
        """Every built-in part and every other part resolved so far in this process (what can be
        asked without importing a plugin): name -> object, built-ins first."""
        return {**self.load_builtins(), **self._loaded}

    def entry_points(self) -> dict[str, metadata.EntryPoint]:
        """The installed distributions' entry points of this kind (read once per process)."""
        if self._entry_points is None:
            found = {}
            for ep in metadata.entry_points(group=self.group):
                if ep.name not in self._builtins:  # a plugin never shadows a built-in
                    found.setdefault(ep.name, ep)
            self._entry_points = found
        return self._entry_points

    def rescan(self) -> None:
        """Read the installed distributions' entry points again (a package installed, or a
        folder put on ``sys.path``, after the first look-up) and forget what they resolved to."""
        found = set(self.entry_points())
        self._entry_points = None
        for name in found:
            self._loaded.pop(name, None)

    def names(self) -> list[str]:
        """Every name this kind answers to: built-ins, registered, entry points (in that order)."""
        out = list(self._builtins)
        out += [n for n in self._registered if n not in out]
        out += [n for n in self.entry_points() if n not in out]
        return out

    def origin(self, name: str) -> str:
        """Where ``name`` comes from, for ``wirelessfl list``."""
        if name in self._builtins:
            return "built-in"
        if name in self._registered:
            obj = self._registered[name]
            return f"registered ({getattr(obj, '__module__', '?')})"
        ep = self.entry_points().get(name)
        if ep is not None:
            dist = getattr(ep, "dist", None)
            return f"plugin {dist.name if dist else ''} ({ep.value})".replace("  ", " ")
        return f"reference {name}" if is_reference(name) else "unknown"

    # -- registering ---------------------------------------------------------------------
    def register(self, obj: Any, name: str | None = None) -> Any:
        """Add ``obj`` under ``name`` (default: its own ``name``); usable as a decorator.
        A built-in name cannot be taken."""
        name = name or self._name_of(obj)
        if not isinstance(name, str) or not name:
            raise UserError(f"register: a {self.noun} needs a name (give name=...)")
        if name in self._builtins:
            raise UserError(f"register: '{name}' is a built-in {self.noun}; choose another "
                            "name")
        problem = self._check(obj)
        if problem:
            raise UserError(f"register: {name!r} {problem}")
        self._registered[name] = obj
        self._loaded[name] = obj
        return obj

    def unregister(self, name: str) -> None:
        """Forget a part registered in this process (tests, notebooks re-running a cell)."""
        self._registered.pop(name, None)
        self._loaded.pop(name, None)

    def modules(self) -> list[str]:
        """The modules of the parts registered in this process: what a worker imports so that it
        knows them too (their import registers them again)."""
        return sorted({obj.__module__ for obj in self._registered.values()
                       if getattr(obj, "__module__", "__main__") != "__main__"})

    # -- looking up ----------------------------------------------------------------------
    def get(self, name: str, where: str | None = None) -> Any:
        """The part called ``name``; a ``UserError`` at ``where`` (with a did-you-mean) if none,
        and for a reference where references are not allowed (``refuse_reference``)."""
        where = where or f"{self.noun}.name"
        if is_reference(name) and not self._is_listed(name):
            refuse_reference(name, where)  # before the cache: an earlier allowance does not last
        if name in self._loaded:
            return self._loaded[name]
        if name in self._builtins:
            obj = import_reference(self._builtins[name], where)
        elif name in self.entry_points():
            ep = self.entry_points()[name]
            try:
                obj = ep.load()
            except Exception as err:  # noqa: BLE001 - the plugin's own failure, reported
                raise UserError(f"{where}: the plugin '{name}' ({ep.value}) failed to load: "
                                f"{type(err).__name__}: {str(err)[:200]}") from None
        elif is_reference(name):
            obj = import_reference(name, where)
        else:
            known = self.names()
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise UserError(f"{where}: unknown {self.noun} '{name}'; {hint}choose one of: "
                            f"{', '.join(known)} (or a 'module:attribute' reference)")
        problem = self._check(obj)
        if problem:
            raise UserError(f"{where}: {name!r} {problem}")
        self._loaded[name] = obj
        return obj

    def _is_listed(self, name: str) -> bool:
        """True for a name the user chose by installing or registering (a built-in, a part
        registered in-process, an entry point), rather than by writing it in a file."""
        return (name in self._builtins or name in self._registered
                or name in self.entry_points())

    def __contains__(self, name: str) -> bool:
        try:
            self.get(name)
        except UserError:
            return False
        return True


def plugin_or_builtin(registry: Registry, name: str, builtins: Collection[str],
                      where: str) -> Any:
    """None for one of ``builtins`` (a kind whose built-ins are a config's own, not parts of
    ``registry``: datasets, fading), else the plugin ``name`` resolves to; an unknown name is
    one ``UserError`` listing the built-ins and the plugins both."""
    if name in builtins:
        return None
    if is_reference(name) or name in registry.names():
        return registry.get(name, where)
    known = [*builtins, *registry.names()]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise UserError(f"{where}: unknown {registry.noun} '{name}'; {hint}choose one of: "
                    f"{', '.join(known)} (or a 'module:attribute' reference)")


def name_validator(registry: Registry, builtins: Collection[str], where: str):
    """A pydantic field validator ``(cls, name) -> name`` of a config's part name: a built-in
    or a part ``registry`` resolves (``plugin_or_builtin``); wrap it in ``field_validator``."""
    def known(cls, name: str) -> str:
        as_value_error(lambda: plugin_or_builtin(registry, name, builtins, where), where)
        return name

    return known


def options_field(part: str) -> Any:
    """The ``options`` field of a config section naming a part: the plugin's keyword arguments.
    [D] plugins only: a built-in keeps its own keys, so a typo there still fails."""
    from pydantic import Field

    return Field(default_factory=dict, description=f"keyword arguments of a {part} plugin "
                                                    "(docs/plugins.md); not read by built-ins")


def as_value_error(call: Callable[[], Any], where: str) -> Any:
    """``call()``, a ``UserError`` turned into the ``ValueError`` a pydantic validator raises
    (its text without the ``where: `` pydantic puts back as the key path)."""
    try:
        return call()
    except UserError as err:
        raise ValueError(str(err).removeprefix(f"{where}: ")) from None


def _resolve(reference: str) -> Any:
    """The object a ``module:attribute`` reference to the package names, imported when a check
    first runs: how the kind checks reach the base classes they check against without an import
    of the layers above this module (wirelessfl/layers.py)."""
    module_name, attribute = reference.split(":", 1)
    return getattr(importlib.import_module(module_name), attribute)


def _algorithm_check(obj: Any) -> str | None:
    algorithm = _resolve("wirelessfl.algorithms.base:Algorithm")
    if not (isinstance(obj, type) and issubclass(obj, algorithm)):
        return "is not an algorithm: it must be a subclass of wirelessfl.Algorithm"
    if not isinstance(getattr(obj, "name", None), str):
        return "has no 'name' (a class attribute: the name scenarios use)"
    return None


_ALGORITHMS = "wirelessfl.algorithms."
ALGORITHMS = Registry("algorithms", {
    "dzofl": _ALGORITHMS + "dzofl:DZOFL",
    "fedsgd": _ALGORITHMS + "fedavg:FedSGD",
    "fedavg": _ALGORITHMS + "fedavg:FedAvg",
    "fedprox": _ALGORITHMS + "fedavg:FedProx",
    "scaffold": _ALGORITHMS + "fedavg:Scaffold",
    "fedadam": _ALGORITHMS + "fedavg:FedAdam",
    "zo-hfl": _ALGORITHMS + "zo_hfl:ZOHFL",
    "fedmsa": _ALGORITHMS + "fedmsa:FedMSA",
    "centralized-sgd": _ALGORITHMS + "centralized:CentralizedSGD",
    "centralized-stsa": _ALGORITHMS + "centralized:CentralizedSTSA",
    "fednest": _ALGORITHMS + "fednest:FedNest",
    "fgdro-cvar": _ALGORITHMS + "fgdro:FGDROCVaR",
    "fgdro-kl": _ALGORITHMS + "fgdro:FGDROKL",
    "fgdro-kl-adam": _ALGORITHMS + "fgdro:FGDROKLAdam",
    "drfa": _ALGORITHMS + "drfa:DRFA",
    "1p-zofl": _ALGORITHMS + "over_the_air:ZOFL",
    "aircomp-fedsgd": _ALGORITHMS + "over_the_air:AirCompFedSGD",
    "aircomp-fedavg": _ALGORITHMS + "over_the_air:AirCompFedAvg",
    "local-adam": _ALGORITHMS + "fgdro:LocalAdam",
    "dr-dsgd": _ALGORITHMS + "fgdro:DRDSGD",
    "gd": _ALGORITHMS + "drift:GD",
    "dane": _ALGORITHMS + "drift:Dane",
    "dane-plus": _ALGORITHMS + "drift:DanePlus",
    "scaffold-cv": _ALGORITHMS + "drift:ScaffoldCv",
    "fedred": _ALGORITHMS + "drift:FedRed",
    "scaffnew": _ALGORITHMS + "drift:Scaffnew",
}, check=_algorithm_check)


def algorithm_class(name: str, where: str = "algorithms[].name"):
    """The ``Algorithm`` subclass a scenario's ``algorithms[].name`` names."""
    return ALGORITHMS.get(name, where)


def _model_check(obj: Any) -> str | None:
    if not callable(obj):
        return ("is not a model: it must be a callable (input_shape, num_classes, **options) "
                "-> torch.nn.Module")
    return None


_MODELS = "wirelessfl.learning.models:"
# A model: a callable (input_shape, num_classes, **options) -> torch.nn.Module, called under a
# seeded torch generator (learning/models.py build_model) so its initial weights are fixed.
MODELS = Registry("models", {
    "seed002-cnn": _MODELS + "seed002_cnn",
    "mlp": _MODELS + "mlp",
    "logistic": _MODELS + "logistic",
    "resnet18-cifar": _MODELS + "resnet18_cifar",
}, check=_model_check)


def _dataset_check(obj: Any) -> str | None:
    if not callable(obj):
        return ("is not a dataset: it must be a callable (seed, **options) -> (x_train, y_train, "
                "x_test, y_test)")
    facts = getattr(obj, "facts", None)
    if facts is not None and not callable(facts):
        return "has a 'facts' that is not callable: give a function (**options) -> dict"
    return None


# A dataset plugin: a callable (seed, **options) -> (x_train, y_train, x_test, y_test), with an
# optional ``facts(**options) -> {input_shape, classes, samples}`` (learning/datasets.py). The
# built-in sets are not parts of this registry: DataConfig names them (and their own keys:
# root, file, synthetic), so only plugins are found here.
DATASETS = Registry("datasets", {}, check=_dataset_check)


def _fading_check(obj: Any) -> str | None:
    if not (isinstance(obj, type) and callable(getattr(obj, "power", None))):
        return ("is not a fading model: it must be a class whose instances (built with the "
                "scenario's fading.options) have power(n, rng) -> |h|^2 draws of unit mean")
    return None


# A fading plugin: a class, ``cls(**options).power(n, rng)`` -> [n] unit-mean |h|^2, optionally
# ``cdf(x)`` (channel/fading.py). The built-in models are FadingConfig's own (rayleigh, rician,
# nakagami, none), so only plugins are found here.
FADING = Registry("fading", {}, check=_fading_check, noun="fading model")


def _compute_check(obj: Any) -> str | None:
    """A compute model is a profile energy/compute.py can price, which it does by the
    profile's ``model`` tag: an ``EnergyProfile`` subclass with its own ``pass_costs``, or one
    whose ``model`` field admits only tags that module prices itself (``COMPUTE_MODELS``: the
    built-ins' ``Literal`` tags). The same check for every part, built-ins included."""
    profile = _resolve("wirelessfl.energy.profile:EnergyProfile")
    if isinstance(obj, type) and issubclass(obj, profile):
        if callable(getattr(obj, "pass_costs", None)):
            return None
        tags = set(get_args(obj.model_fields["model"].annotation))
        if tags and tags <= set(_resolve("wirelessfl.energy.profile:COMPUTE_MODELS")):
            return None
    return ("is not a compute model: it must be a subclass of wirelessfl.energy."
            "EnergyProfile with a method pass_costs(model, batch, bits) -> (forward J, "
            "backward J, forward s, backward s)")


_ENERGY = "wirelessfl.energy.profile:"
# A compute-energy model: an EnergyProfile subclass (its own fields) with ``pass_costs``
# (energy/compute.py); a scenario's ``energy: {model: NAME}`` picks it.
COMPUTE = Registry("compute", {
    "seed002-accelerator": _ENERGY + "Seed002AcceleratorProfile",
    "cmos": _ENERGY + "CmosProfile",
    "per-operation": _ENERGY + "PerOperationProfile",
}, check=_compute_check, noun="compute model")


def _problem_check(obj: Any) -> str | None:
    return _resolve("wirelessfl.problems.base:problem_check")(obj)


# Learning problems (problems/base.py ProblemSpec: the section's Config, the builder, the checks
# and the memory hook). The order is the order messages list them in.
_PROBLEMS = "wirelessfl.problems."
PROBLEMS = Registry("problems", {
    "classification": _PROBLEMS + "classification:SPEC",
    "quadratic": _PROBLEMS + "quadratic:SPEC",
    "logistic": _PROBLEMS + "logistic:SPEC",
    "bilevel-quadratic": _PROBLEMS + "bilevel:SPEC",
    "risk-averse-mco": _PROBLEMS + "mco:SPEC",
    "loss-tuning": _PROBLEMS + "loss_tuning:SPEC",
}, check=_problem_check)


def problem_spec(name: str, where: str = "problem.name"):
    """The ``ProblemSpec`` a scenario's ``problem.name`` names."""
    return PROBLEMS.get(name, where)


def problems_with(capability: str) -> list[str]:
    """The built-in problems that have ``capability`` (``bilevel``, ``multi_sequence``,
    ``reads_data``): what a message offers as the alternatives."""
    return [name for name, spec in PROBLEMS.load_builtins().items()
            if getattr(spec, capability)]


def registries() -> dict[str, Registry]:
    """Every kind's registry, by kind (what ``wirelessfl list`` and workers walk)."""
    return {r.kind: r for r in _ALL}


_ALL: list[Registry] = [ALGORITHMS]


def add_registry(registry: Registry) -> Registry:
    """Make a kind's registry known to ``registries()`` (each kind's home module calls it)."""
    if registry.kind not in {r.kind for r in _ALL}:
        _ALL.append(registry)
    return registry


for _registry in (MODELS, DATASETS, FADING, COMPUTE, PROBLEMS):
    add_registry(_registry)


def import_worker_modules(modules: list[str], path: list[str] = ()) -> None:
    """In a sweep or tuning worker: put the parent's plugin folders (``worker_plugins``'s
    ``path``) on ``sys.path``, after what is installed, then import the modules whose parts the
    parent registered in-process (code the parent's user ran, not a file's), so that the worker
    resolves the same names, references included (where the task allows them: sweep/worker.py),
    whatever its own current folder (a Dask worker's is not the user's)."""
    for folder in path:
        if folder not in sys.path:
            sys.path.append(folder)
    for module in modules:
        import_reference(f"{module}:__name__", f"plugin module {module}")


def worker_plugins() -> dict:
    """What a sweep task carries so that its worker resolves the parent's names: the modules of
    parts registered in-process, the folders to import from (the current one, where
    ``import_reference`` looks, and each registered module's: a notebook may have put it on
    ``sys.path`` by hand), and whether references are allowed here (``references``)."""
    modules = registered_modules()
    path = [str(Path.cwd())]
    for name in modules:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file:
            depth = name.count(".") + (Path(file).name == "__init__.py")
            folder = str(Path(file).resolve().parents[depth])
            path += [folder] if folder not in path else []
    return {"modules": modules, "path": path, "references": references_allowed()}


def is_plugin_class(cls: type) -> bool:
    """True when ``cls`` is a part some registry has resolved in this process (engine/
    state_tree.py lets a checkpoint hold its instances' state)."""
    return any(obj is cls for r in _ALL for obj in r._loaded.values())


def registered_modules() -> list[str]:
    """The modules of every part registered in this process, across kinds."""
    return sorted({m for r in _ALL for m in r.modules()})
