"""The catalogs of named channel profiles, energy profiles and scenarios (YAML files).

In a source checkout they are the top-level folders ``channels/``, ``energy/`` and ``scenarios/``;
in an installed wheel they ship as ``wirelessfl/_catalog/<kind>/``. A name may also be a path to a
YAML file of the user's own, relative to the scenario that names it.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path

import yaml

from wirelessfl.errors import UserError
from wirelessfl.scenario import safe_yaml

KINDS = ("channels", "energy", "scenarios", "reproductions")
_PACKAGE = Path(__file__).resolve().parents[1]


def catalog_dirs(kind: str) -> list[Path]:
    """Folders searched for ``kind``: the installed copy, then a source checkout's top level."""
    candidates = [_PACKAGE / "_catalog" / kind, _PACKAGE.parent / kind]
    return [d for d in candidates if d.is_dir()]


def entries(kind: str) -> dict[str, Path]:
    """Name -> file of every YAML entry of ``kind`` (the first folder wins on a clash)."""
    found: dict[str, Path] = {}
    for folder in catalog_dirs(kind):
        for path in sorted(folder.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


# Parsed files kept by (path, modification time, size): a study resolves one scenario per run
# (hundreds), each naming the same channel and energy profiles, and parsing them again each
# time was 3.5 s of a quickstart-tune. A changed file is read again. [D] size of the cache.
_PARSED: dict[tuple[str, int, int], object] = {}
_PARSED_MOST = 64


def read_yaml(path: Path, what: str) -> object:
    """Parse a YAML file safely (no arbitrary objects, duplicate keys refused, depth and size
    bounded while parsing: ``safe_yaml``), with one clean error line on bad syntax that names the
    file and the line, never quoting the file's text. A file parsed before and unchanged since
    is not parsed again (a copy of what it gave is returned)."""
    try:
        stat = path.stat()
    except OSError as err:
        raise UserError(f"{path}: cannot read the {what} ({err.strerror})") from None
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _PARSED:
        if len(_PARSED) >= _PARSED_MOST:
            _PARSED.clear()
        _PARSED[key] = _parse_yaml(path, what)
    return copy.deepcopy(_PARSED[key])


def _parse_yaml(path: Path, what: str) -> object:
    try:
        size = path.stat().st_size
        if size > safe_yaml.MAX_FILE_BYTES:
            raise UserError(f"{path}: {size:,} bytes, more than a {what} may hold "
                            f"({safe_yaml.MAX_FILE_BYTES // 2**20} MiB); is it the right file?")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text (byte {err.start}); save the {what} as UTF-8"
                        ) from None
    except OSError as err:
        raise UserError(f"{path}: cannot read the {what} ({err.strerror})") from None
    if "\0" in text:
        raise UserError(f"{path}: holds a NUL byte; a {what} is plain text")
    try:
        return safe_yaml.load(text)
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to parse; a {what} is a few levels deep"
                        ) from None
    except safe_yaml.LimitError as err:
        raise UserError(f"{path}: {safe_yaml.describe_error(err, f'refused {what}')}") from None
    except yaml.YAMLError as err:
        raise UserError(f"{path}: {safe_yaml.describe_error(err)}; fix it there") from None


def find(kind: str, name: str, where: str, base_dir: Path | None = None) -> Path:
    """The file for ``name`` in catalog ``kind`` (or a path to a YAML file), or a clean error."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if path.is_file():
            return path
        raise UserError(f"{where}: file '{name}' not found (looked at {path})")
    known = entries(kind)
    if name in known:
        return known[name]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    listing = ", ".join(known) or "none found"
    raise UserError(f"{where}: unknown {kind.rstrip('s')} profile '{name}'; {hint}"
                    f"available: {listing} (see 'wirelessfl list')")


def load_mapping(kind: str, name: str, where: str, base_dir: Path | None = None) -> dict:
    """A catalog entry as a dict (its ``name`` set to the entry's name if absent)."""
    path = find(kind, name, where, base_dir)
    what = f"{kind.rstrip('s')} profile"
    try:
        doc = read_yaml(path, what)
    except UserError as err:
        raise UserError(f"{where}: {err}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{where}: {path}: {'an' if what[0] in 'aeiou' else 'a'} {what} must "
                        "be a mapping of fields")
    doc.setdefault("name", path.stem)
    return doc
