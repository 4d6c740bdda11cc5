"""From a YAML file (plus ``--set`` overrides) to a validated Scenario, or one clean error.

Steps: parse safely -> apply overrides -> resolve the channel and energy profiles from the catalogs
(inline fields override the profile's, deeply), and the energy profile of each device class
(``population.classes``) -> validate each algorithm against its own typed parameters -> validate
the whole. Every error names the file and the key path, or the ``--set`` that gave the value
(``_where``); an unknown key names the valid key it was most likely meant to be (keys.py).
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from wirelessfl.errors import UserError
from wirelessfl.plugins import algorithm_class, is_reference, problem_spec
from wirelessfl.scenario import catalog, names, safe_yaml
from wirelessfl.scenario.keys import keys_at, suggest_key
from wirelessfl.scenario.problem_section import ProblemConfig
from wirelessfl.scenario.schema import Scenario

PROFILE_SECTIONS = {"channel": "channels", "energy": "energy"}
# Bounds on a document's shape (safe_yaml checks them while parsing; check_shape again on
# documents built in Python and after overrides).
MAX_DEPTH = safe_yaml.MAX_DEPTH
MAX_NODES = safe_yaml.MAX_NODES


def check_shape(doc: object, source: str) -> None:
    """Refuse documents nested deeper than MAX_DEPTH (also self-referencing YAML aliases, which
    are infinitely deep) or with more than MAX_NODES values, iteratively, so no walk recurses
    past Python's limit; and any key or text holding a NUL or another control character (it
    would crash a path call or garble the terminal)."""
    stack, seen = [(doc, ())], 0
    while stack:
        node, path = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise UserError(f"{source}: the document holds more than {MAX_NODES:,} values "
                            "(YAML aliases repeated?); a scenario is far smaller")
        if len(path) > MAX_DEPTH:
            raise UserError(f"{source}: {format_path(path[:4])}...: nested more than {MAX_DEPTH} "
                            "levels deep (or an alias that contains itself); flatten it")
        if isinstance(node, dict):
            for key in node:
                problem = names.check_text(key) if isinstance(key, str) else None
                if problem:
                    raise UserError(f"{source}: {format_path(path)}: a key {problem}")
            stack.extend((v, path + (str(k),)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, path + (i,)) for i, v in enumerate(node))
        elif isinstance(node, str) and (problem := names.check_text(node)):
            raise UserError(f"{source}: {format_path(path)}: the text {problem}")


# The largest finite float32: parameters reach float32 tensors (theta, learning rates, powers),
# where a larger value becomes inf and the run silently produces garbage.
FLOAT32_MAX = 3.4028234663852886e38
INT64_MAX = 2**63 - 1


def check_values(raw: object, value: object, source: str, prefix: tuple = (),
                 sets: Sets = ()) -> None:
    """What pydantic's lax types let through, refused with the key path: a YAML boolean taken as
    a number (``num_devices: true`` is 1), a float or exponent string taken as an integer
    (``num_devices: 1e9``), a float beyond float32's range (``lr: 1e300``), an integer beyond
    int64's. ``raw`` is the document as written, ``value`` what it validated into (a model, or
    lists, dicts and scalars of them); walked together, iteratively. ``sets``: the ``--set``
    overrides applied (``_where``)."""
    stack = [(raw, value, tuple(prefix))]
    while stack:
        raw, value, path = stack.pop()
        if isinstance(value, BaseModel):
            fields = type(value).model_fields
            items = raw.items() if isinstance(raw, dict) else ()
            given = {k: v for k, v in items if k in fields}
            stack.extend((given.get(k, _ABSENT), getattr(value, k, None), path + (k,))
                         for k in fields)
        elif isinstance(value, dict):
            items = raw if isinstance(raw, dict) else {}
            stack.extend((items.get(k, _ABSENT), v, path + (str(k),)) for k, v in value.items())
        elif isinstance(value, list | tuple):
            items = raw if isinstance(raw, list) and len(raw) == len(value) else [_ABSENT] * len(value)
            stack.extend((r, v, path + (i,)) for i, (r, v) in enumerate(zip(items, value)))
        elif isinstance(value, bool) or raw is _ABSENT and not isinstance(value, float):
            continue
        elif isinstance(raw, bool):
            raise UserError(f"{_where(source, path, sets)}: expects a number, got the YAML "
                            f"boolean {str(raw).lower()}; write a number")
        elif isinstance(value, int) and not isinstance(raw, int) and raw is not _ABSENT:
            hint = f"write {value}" if abs(value) <= INT64_MAX else "write an integer"
            raise UserError(f"{_where(source, path, sets)}: expects an integer, got {raw!r}; "
                            f"{hint} (digits only: YAML reads 1e9 as text)")
        elif isinstance(value, int) and abs(value) > INT64_MAX:
            raise UserError(f"{_where(source, path, sets)}: an integer of {len(str(abs(value)))} "
                            f"digits is beyond the largest a run can hold ({INT64_MAX})")
        elif isinstance(value, float) and abs(value) > FLOAT32_MAX:
            raise UserError(f"{_where(source, path, sets)}: {value:g} is beyond float32's range "
                            f"(|x| <= {FLOAT32_MAX:.3g}), which the run computes in; give a "
                            "value of a sensible size")


_ABSENT = object()


def format_path(loc) -> str:
    """('algorithms', 0, 'rounds') -> 'algorithms[0].rounds'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


# The overrides applied to a document: (the key path each one wrote, as the validated document
# has it (``override_path``), e.g. ('algorithms', 0, 'rounds') for algorithms.DZOFL.rounds; the
# override as errors name it, e.g. '--set algorithms.DZOFL.rounds=0').
Sets = tuple[tuple[tuple, str], ...]


def _where(source: str, loc: tuple, sets: Sets = ()) -> str:
    """Where a problem at the key path ``loc`` is reported: the ``--set`` that wrote the value
    there (its path is ``loc`` or above it, or below it: a section's own check), else the file;
    then the key path, as the validated document has it (``algorithms.DZOFL.rounds`` is
    ``algorithms[0].rounds``). A bad value given on the command line is the command line's
    mistake, not the file's [D]."""
    loc = tuple(loc)
    for path, given in reversed(sets):  # the last override of a key is the one that holds
        if loc[:len(path)] == path or (loc and path[:len(loc)] == loc):
            return f"{_shown_set(given)}: {format_path(loc)}"
    if not loc and sets:  # a check of the whole scenario: the file and the values it got
        return f"{source} with {', '.join(_shown_set(g) for _, g in sets)}: {format_path(loc)}"
    return f"{source}: {format_path(loc)}"


def _shown_set(given: str) -> str:
    """A --set as a message quotes it: printable, at most 86 characters."""
    shown = given if given.isprintable() else repr(given)
    return shown if len(shown) <= 86 else shown[:83] + "..."


def format_validation_error(err: ValidationError, source: str, prefix: tuple = (),
                            origins: list[tuple[tuple, Path, dict]] = (),
                            model: type[BaseModel] | None = None, raw: object = None,
                            sets: Sets = ()) -> str:
    """One line per problem: 'source: key.path: what is wrong (got X)'. ``origins``: (key path,
    profile file, the scenario's inline fields) of each section read from a profile file; a
    problem with a value from such a file names that file and the key in it, and never quotes
    the value (a profile name may point at any file on the machine). ``model`` and ``raw``: the
    class validated and the document given to it, so an unknown key gets the valid key it was
    most likely meant to be. ``sets``: the ``--set`` overrides applied (``_where``)."""
    lines = []
    for e in err.errors():
        own = tuple(p for p in e["loc"] if p not in ("function-after",))
        loc = tuple(prefix) + own
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = _unknown_key(own, model, raw)
        elif e["type"] == "missing":
            msg = "required key is missing; add it"
        got = e.get("input")
        if e["type"] in ("int_parsing", "int_from_float"):
            msg += f"; write {_integer_hint(got)}"
        where, foreign = _where(source, loc, sets), _foreign_file(loc, origins)
        if foreign is not None:
            where = f"{source}: {format_path(foreign[0])}: profile file {foreign[1]}: " \
                    f"{_key_in_file(foreign[2])}"
        elif e["type"] not in ("extra_forbidden", "missing") and not isinstance(got, dict | list) \
                and not (isinstance(got, str) and repr(got) in msg):  # a quoted name, said once
            shown = repr(got)
            msg += f" (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
        lines.append(f"{where}: {msg}")
    return "\n".join(lines[:5]) + (f"\n... and {len(lines) - 5} more" if len(lines) > 5 else "")


# What a key of a profile file may look like to be named in a message: a field name [D].
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _key_in_file(path: tuple) -> str:
    """The key path inside a profile file, as a message names it: only when every part looks
    like a field name. A profile name may point at any file on the machine (``--set
    energy=/etc/shadow``), whose lines YAML reads as keys: those are never quoted."""
    if all(isinstance(p, int) or _FIELD_NAME.match(str(p)) for p in path):
        return format_path(path)
    return "a key that is not a field name (not shown: is this file a profile?)"


def _unknown_key(loc: tuple, model: type[BaseModel] | None, raw: object) -> str:
    """The message of the unknown key at ``loc`` (relative to ``model``): the valid key it was
    most likely meant to be, when one is close (keys.py), else how to fix it."""
    key = loc[-1] if loc else None
    if model is not None and isinstance(key, str):
        close = suggest_key(key, keys_at(model, loc[:-1], raw, _section_classes))
        if close is not None:
            return f"unknown key; did you mean '{close}'?"
    return "unknown key; remove it or check its spelling"


def _section_classes(cls: type[BaseModel], raw: object) -> list[type[BaseModel]]:
    """The classes a mapping typed as ``cls`` validates as, picked by its content: a problem
    section by its ``name`` (the problem's own Config), a section with compute-model subclasses
    (energy profiles) by its ``model``; else ``cls``."""
    if not isinstance(raw, dict):
        return [cls]
    if issubclass(cls, ProblemConfig):
        name = raw.get("name", "classification")
        try:
            return [problem_spec(name).Config] if isinstance(name, str) else [cls]
        except UserError:
            return [cls]
    field = cls.model_fields.get("model")
    tag = raw.get("model", field.default if field is not None else None)
    chosen = [sub for sub in cls.__subclasses__() if isinstance(tag, str)
              and "model" in sub.model_fields and sub.model_fields["model"].default == tag]
    return chosen or [cls]


def _foreign_file(loc: tuple, origins) -> tuple[tuple, Path, tuple] | None:
    """(section path, profile file, path inside the file) when the value at ``loc`` came from a
    profile file rather than from the scenario's own inline fields; else None."""
    for section, path, inline in origins:
        if loc[:len(section)] != section:
            continue
        rest, node = loc[len(section):], inline
        for part in rest:
            if not isinstance(node, dict) or part not in node:
                return section, path, rest
            node = node[part]
        return None
    return None


def _integer_hint(got) -> str:
    """'1000000000' for an integer written as '1e9' (YAML 1.1 reads it as text), else a generic
    hint."""
    try:
        number = float(got)
    except (TypeError, ValueError, OverflowError):
        return "a whole number in digits, e.g. 100"
    if math.isfinite(number) and number.is_integer() and abs(number) <= INT64_MAX:
        return f"{int(number)} (digits only: YAML reads 1e9 as text)"
    return "a whole number in digits, e.g. 100"


def apply_override(doc: dict, assignment: str) -> tuple:
    """Apply ``key.path=value`` to a raw scenario document in place; the value is parsed as YAML
    (``1e-3``, ``true``, ``[1, 2]``). See :func:`set_key` for how the path is followed; returns
    the key path written. The key ends at the first ``=`` outside parentheses, so an algorithm
    label such as "FedMSA (K=10)" can be named: ``algorithms.FedMSA (K=10).alpha=0.5``."""
    key, sep, text = _split_assignment(assignment)
    if not sep or not key.strip():
        raise UserError(f"--set {assignment!r}: expected key.path=value, e.g. "
                        "--set channel.uplink.tx_power_dbm=10")
    return set_key(doc, key.strip(), _parse_value(text, f"--set {key.strip()}"))


def _split_assignment(assignment: str) -> tuple[str, str, str]:
    """(key, "=", value) at the first "=" outside parentheses ("", "", assignment's text as
    the key when there is none), as ``str.partition``."""
    depth = 0
    for i, char in enumerate(assignment):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif char == "=" and depth == 0:
            return assignment[:i], "=", assignment[i + 1:]
    return assignment, "", ""


_BRACKETS = re.compile(r"\[([^\[\].]+)\]")


def set_key(doc: dict, key: str, value, origin: str = "--set ") -> tuple:
    """Set the dotted ``key`` of a raw scenario document to ``value`` in place; returns the key
    path written, lists by position (what validation errors name).

    Segments index mappings by key and lists by position or by an entry's name/label
    (``algorithms.dzofl.rounds``; the bracket spelling ``algorithms[0].rounds`` many tools use
    means the same). A profile named by a string (``channel: seed002-cell``) is opened up to
    ``{profile: ...}``. Errors start with ``origin`` and the path so far.
    """
    key = _BRACKETS.sub(r".\1", key)
    parts = key.split(".")
    node, path = doc, ()
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            index = _list_index(node, part, f"{origin}{where}")
            path += (index % len(node),)
            if last:
                node[index] = value
                return path
            node = node[index]
            continue
        if not isinstance(node, dict):
            raise UserError(f"{origin}{key}: '{'.'.join(parts[:depth])}' is not a mapping")
        path += (part,)
        if last:
            node[part] = value
            return path
        child = node.get(part)
        if isinstance(child, str) and part in PROFILE_SECTIONS:
            child = node[part] = {"profile": child}
        elif _is_fraction(child) and depth >= 2 and parts[depth - 1] == "classes":
            child = node[part] = {"fraction": child}  # population.classes.NAME opens up too
        elif child is None:
            child = node[part] = {}
        node = child


def _parse_value(text: str, where: str = "--set"):
    """YAML scalar parsing, plus exponent floats that YAML 1.1 leaves as strings ('1e-3'). Text
    that is not valid YAML stays a string; a value over the document limits (a 5,000-deep
    ``[[[...]]]``, an alias bomb) is refused like a file's."""
    if "\0" in text:
        raise UserError(f"{where}: the value holds a NUL byte; give plain text")
    try:
        value = safe_yaml.load(text)
    except RecursionError:
        raise UserError(f"{where}: the value is nested too deeply to parse; at most "
                        f"{MAX_DEPTH} levels") from None
    except safe_yaml.LimitError as err:
        raise UserError(f"{where}: {safe_yaml.describe_error(err, 'refused value')}") from None
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _list_index(items: list, part: str, where: str) -> int:
    if part.lstrip("-").isdigit():
        index = int(part)
        if -len(items) <= index < len(items):
            return index
        raise UserError(f"{where}: index {index} is out of range ({len(items)} entries)")
    for i, item in enumerate(items):
        if isinstance(item, dict) and part in (item.get("label"), item.get("name")):
            return i
    raise UserError(f"{where}: no entry named '{part}'")


def _resolve_profile(doc: dict, section: str, source: str, base_dir: Path | None,
                     sets: Sets = ()) -> tuple[tuple, Path, dict] | None:
    """Replace ``doc[section]`` by its profile with the inline fields applied; returns the
    section's origin for error messages (``format_validation_error``), None when inline only."""
    raw = doc.get(section)
    kind = PROFILE_SECTIONS[section]
    if raw is None:
        raise UserError(f"{source}: {section}: required key is missing; name a profile, e.g. "
                        f"'{section}: {'seed002-cell' if section == 'channel' else 'seed002-accelerator'}'"
                        f" (see 'wirelessfl list')")
    if isinstance(raw, str):
        raw = {"profile": raw}
    if not isinstance(raw, dict):
        raise UserError(f"{_where(source, (section,), sets)}: expected a profile name or a "
                        f"mapping, got {type(raw).__name__}")
    inline = dict(raw)
    name = inline.pop("profile", None)
    if name is None:
        doc[section] = inline
        return None
    if not isinstance(name, str):
        raise UserError(f"{_where(source, (section, 'profile'), sets)}: expected a profile "
                        f"name, got {name!r}")
    where = _where(source, (section, "profile"), sets)
    base = catalog.load_mapping(kind, name, where, base_dir)
    doc[section] = _deep_merge(base, inline)
    return (section,), catalog.find(kind, name, where, base_dir), inline


def _is_fraction(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _resolve_classes(doc: dict, source: str, base_dir: Path | None, sets: Sets = ()
                     ) -> list[tuple[tuple, Path, dict]]:
    """``population.classes``: each entry ``NAME: fraction`` or ``NAME: {fraction, profile?,
    <fields>}`` becomes ``{fraction, energy: <profile NAME (or profile:) from the catalog with
    the fields applied>}``; an entry that already has ``energy`` (a resolved scenario) stays.
    Returns the origins of the profiles read (``format_validation_error``)."""
    population = doc.get("population")
    classes = population.get("classes") if isinstance(population, dict) else None
    if not isinstance(classes, dict):
        return []
    resolved, origins = {}, []
    for name, entry in classes.items():
        where = _where(source, ("population", "classes", name), sets)
        if _is_fraction(entry):
            entry = {"fraction": entry}
        if not isinstance(entry, dict):
            raise UserError(f"{where}: expected a fraction (e.g. 0.3) or a mapping "
                            f"{{fraction: 0.3, <energy profile fields>}}, got {entry!r}")
        if "energy" in entry:
            resolved[name] = entry
            continue
        inline = dict(entry)
        fraction = inline.pop("fraction", None)
        profile = inline.pop("profile", name)
        if not isinstance(profile, str):
            raise UserError(f"{where}.profile: expected an energy profile name, got {profile!r}")
        base = catalog.load_mapping("energy", profile, where, base_dir)
        resolved[name] = {"energy": _deep_merge(base, inline)}
        origins.append((("population", "classes", name, "energy"),
                        catalog.find("energy", profile, where, base_dir), inline))
        if fraction is not None:
            resolved[name]["fraction"] = fraction
    population["classes"] = resolved
    return origins


def _deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _validate_algorithms(doc: dict, source: str, sets: Sets = ()) -> list:
    raw = doc.get("algorithms")
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{source}: algorithms: give a list of at least one algorithm, e.g. "
                        "'algorithms: [{name: dzofl}]' (see 'wirelessfl list')")
    bits = doc.get("quantization_bits", 16)
    params = []
    for i, entry in enumerate(raw):
        where = f"{source}: algorithms[{i}]"
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise UserError(f"{_where(source, ('algorithms', i, 'name'), sets)}: each algorithm "
                            "needs a 'name' (see 'wirelessfl list')")
        cls = algorithm_class(entry["name"], where=_where(source, ("algorithms", i, "name"), sets))
        try:
            p = cls.Params.model_validate(entry)
        except ValidationError as err:
            raise UserError(format_validation_error(err, source, ("algorithms", i),
                                                    model=cls.Params, raw=entry,
                                                    sets=sets)) from None
        check_values(entry, p, source, ("algorithms", i), sets)
        if p.label is None and is_reference(p.name):
            # A reference names code, not a method: tables, plots and folders show the class's
            # own ``name`` (what an entry point would usually be called) instead.
            p.label = cls.name
        problem = names.label_problem(p.display_name)
        if problem:
            raise UserError(f"{where}.label: {p.display_name[:40]!r} {problem}")
        if p.bits is None and isinstance(bits, int):
            p.bits = bits
        problem = p.bits_problem()
        if problem:
            raise UserError(f"{where}.{problem}")
        params.append(p)
    return params


def scenario_from_document(doc: object, source: str, overrides: list[str] = (),
                           base_dir: Path | None = None, sets: Sets = ()) -> Scenario:
    """Validate a parsed YAML document (after ``overrides``, ``--set`` text) into a resolved
    Scenario. ``sets``: overrides the caller applied to ``doc`` already (the Python API's), so
    that errors name them as they name ``overrides``."""
    if not isinstance(doc, dict):
        raise UserError(f"{source}: a scenario must be a mapping of keys (channel, energy, "
                        f"algorithms, ...), got {type(doc).__name__}")
    check_shape(doc, source)
    doc = copy.deepcopy(doc)
    sets = tuple(sets) + tuple((override_path(apply_override(doc, assignment)),
                                f"--set {assignment}") for assignment in overrides)
    if overrides:
        check_shape(doc, source)
    origins = [_resolve_profile(doc, section, source, base_dir, sets)
               for section in PROFILE_SECTIONS]
    origins = [o for o in origins if o is not None] + _resolve_classes(doc, source, base_dir,
                                                                       sets)
    doc["algorithms"] = _validate_algorithms(doc, source, sets)
    try:
        scenario = Scenario.model_validate(doc)
    except ValidationError as err:
        raise UserError(format_validation_error(err, source, origins=origins, model=Scenario,
                                                raw=doc, sets=sets)) from None
    check_values(doc, scenario, source, sets=sets)
    _check_labels(scenario, source)
    if not scenario.name:
        scenario.name = names.safe_name(Path(source).stem)
    return scenario


def override_path(path: tuple) -> tuple:
    """The key path an override wrote, as the validated document has it: a device class's
    profile fields move under its ``energy`` (``_resolve_classes``), a class's ``profile`` names
    the whole class."""
    if path[:2] == ("population", "classes") and len(path) > 3:
        if path[3] == "profile":
            return path[:3]
        if path[3] not in ("fraction", "energy"):
            return path[:3] + ("energy",) + path[3:]
    return path


def _check_labels(scenario: Scenario, source: str) -> None:
    """Names shown as labels (profiles, device classes) are printable and of bounded length."""
    shown = [("channel.name", scenario.channel.name), ("energy.name", scenario.energy.name)]
    for name, entry in (scenario.population.classes or {}).items():
        shown += [(f"population.classes.{name[:40]}", name),
                  (f"population.classes.{name[:40]}.energy.name", entry.energy.name)]
    for where, label in shown:
        problem = names.label_problem(label) if label else None
        if problem:
            raise UserError(f"{source}: {where}: {label[:40]!r} {problem}")


def is_sweep_document(doc: object) -> bool:
    """A sweep file names a base scenario and a grid or points; a scenario does neither."""
    return isinstance(doc, dict) and isinstance(doc.get("scenario"), str) and (
        "grid" in doc or "points" in doc)


def is_tune_document(doc: object) -> bool:
    """A tune file names a base scenario, an objective and a search space (docs/tuning.md)."""
    return isinstance(doc, dict) and isinstance(doc.get("scenario"), str) and "search" in doc


def is_reproduction_document(doc: object) -> bool:
    """A reproduction file names a tune file (or regimes, each with one) and lists claims
    (docs/tuning.md, "Reproductions"); it names no scenario."""
    return (isinstance(doc, dict) and (isinstance(doc.get("tune"), str)
                                       or isinstance(doc.get("regimes"), list))
            and "claims" in doc and "scenario" not in doc)


def file_kind(doc: object) -> str | None:
    """What a parsed file is, by its shape: 'tune', 'sweep', 'reproduction', 'scenario' (no base
    scenario named, algorithms listed), or None where the shape says nothing sure (a damaged
    file is then reported by the loader that was asked, key by key)."""
    if is_tune_document(doc):
        return "tune"
    if is_sweep_document(doc):
        return "sweep"
    if is_reproduction_document(doc):
        return "reproduction"
    if isinstance(doc, dict) and "algorithms" in doc and "scenario" not in doc \
            and "tune" not in doc:
        return "scenario"
    return None


# kind -> (what the file is, the command that reads it)
_KINDS = {"scenario": ("a scenario", "run"),
          "sweep": ("a sweep file (a grid over the scenario '{scenario}')", "sweep"),
          "tune": ("a tune file (a search over the scenario '{scenario}')", "tune"),
          "reproduction": ("a reproduction file (claims judged on the tune file '{tune}')",
                           "reproduce")}


# The keys that make a file naming a base 'scenario' a sweep or a tune file (is_sweep_document,
# is_tune_document).
_STUDY_KEYS = {"grid": "sweep", "points": "sweep", "search": "tune", "objective": "tune"}


def refuse_other_kind(path: Path, doc: object, given: str, wanted: str) -> None:
    """Refuse, in one line naming the command that reads it, a file of another kind than
    ``wanted`` ('scenario', 'sweep', 'tune' or 'reproduction') given as ``given``. A file that
    names a base scenario but lacks what makes it a sweep or a tune file (a misspelt 'grids')
    is refused as that, with the key it most likely meant, not as a scenario missing its
    channel."""
    kind = file_kind(doc)
    if kind is None and wanted == "scenario" and isinstance(doc, dict) \
            and isinstance(doc.get("scenario"), str):
        meant = [f"'{k}' (did you mean '{m}'?)" for k in doc if isinstance(k, str)
                 and (m := suggest_key(k, _STUDY_KEYS)) and k != m]
        raise UserError(f"{path}: names a base 'scenario', as a sweep or tune file does, but has "
                        "neither a sweep's 'grid' or 'points' "
                        "nor a tune file's 'search'" + (f"; {', '.join(meant)}" if meant else
                                                        "; add them (docs/sweeps.md, "
                                                        "docs/tuning.md)"))
    if kind is None or kind == wanted:
        return
    what, command = _KINDS[kind]
    tune = doc.get("tune") or ", ".join(str(r.get("tune")) for r in doc.get("regimes") or []
                                        if isinstance(r, dict))
    what = what.format(scenario=doc.get("scenario"), tune=tune)
    raise UserError(f"{path}: this is {what}, not {_KINDS[wanted][0].split(' (')[0]}; run it "
                    f"with 'wirelessfl {command} {given}'")


def load_scenario(name_or_path: str, overrides: list[str] = ()) -> Scenario:
    """Load a scenario file, or a scenario from the catalog by name (e.g. 'quickstart')."""
    path, doc = read_scenario_document(name_or_path)
    return scenario_from_document(doc, str(path), overrides, path.parent)


def read_scenario_document(name_or_path: str) -> tuple[Path, object]:
    """The file of a scenario (a catalog name or a path) and its parsed document, unvalidated;
    a sweep, tune or reproduction file is refused with the command that runs it."""
    path = catalog.find("scenarios", name_or_path, "scenario")
    doc = catalog.read_yaml(path, "scenario")
    refuse_other_kind(path, doc, name_or_path, "scenario")
    return path, doc


def resolved_document(scenario: Scenario) -> dict:
    """The fully resolved scenario as plain data (what the manifest records)."""
    return scenario.model_dump(mode="json")
