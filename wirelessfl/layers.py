"""The package's layers, bottom to top, and the rule that keeps them: a module imports only from
its own layer or a lower one (docs/architecture.md says why each layer sits where it does).

Every import statement counts, wherever it is written: at module level, inside a function (an
import placed there to dodge a cycle is still a dependency) and under ``TYPE_CHECKING`` (a type
is a dependency of the reader). Names resolved from text at run time (the registry's built-ins,
``plugins.py``) are not imports: that is how a lower layer names a higher one's parts without
depending on them. ``tests/test_layers.py`` runs ``violations()`` on the package, and a plugin
author or a reviewer can run ``python -m wirelessfl.layers`` on a working tree.

Layers are folders (or top-level modules) of ``wirelessfl/``; two folders in one layer are
siblings that may not import each other (``algorithms`` and ``engine`` meet only in the
contract).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "wirelessfl"

# Bottom to top. A tuple holds siblings: same height, no imports between them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "host", "_compat", "progress"),  # progress: the stub of host/progress.py
    ("plugins",),
    ("learning",),
    ("contract",),
    ("channel",),
    ("energy",),
    ("results",),
    ("algorithms", "engine"),
    ("scenario",),
    ("problems",),
    ("pipeline",),
    ("sweep",),
    ("tune",),
    ("report",),
    ("api", "cli", "testing", "layers", "__init__", "__main__"),
)

# Siblings in one layer that may import each other (a layer of leaf modules, not folders).
OPEN_LAYERS = {("errors", "host", "_compat", "progress"),
               ("api", "cli", "testing", "layers", "__init__", "__main__")}


@dataclass(frozen=True)
class Import:
    """One import statement of a package module: the importing module (dotted), the imported
    one, the file and line where it is written."""

    source: str
    target: str
    file: Path
    line: int


def part_of(module: str) -> str:
    """The layer member a dotted module belongs to: its folder under the package (``engine`` for
    ``wirelessfl.engine.network``) or, for a top-level module, its name (``cli``); the package
    itself is ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def height(part: str) -> int:
    """The index of ``part``'s layer in LAYERS (KeyError for a folder no layer names)."""
    for index, members in enumerate(LAYERS):
        if part in members:
            return index
    raise KeyError(part)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_imports(root: Path) -> list[Import]:
    """Every import of a ``wirelessfl`` module by a module under ``root`` (the package folder),
    statements anywhere in a file included; ``from wirelessfl.x import y`` where ``y`` is a
    submodule counts as importing ``wirelessfl.x.y``."""
    files = sorted(root.rglob("*.py"))
    modules = {module_name(p, root) for p in files}
    found: list[Import] = []
    for path in files:
        source = module_name(path, root)
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem
                           for a in node.names]
            else:
                continue
            found += [Import(source, t, path, node.lineno) for t in targets
                      if t == PACKAGE or t.startswith(PACKAGE + ".")]
    return found


def violations(root: Path | None = None) -> list[str]:
    """One line per import of a higher layer or of a sibling, and per folder no layer names."""
    root = root or Path(__file__).resolve().parent
    out = []
    for imp in package_imports(root):
        a, b = part_of(imp.source), part_of(imp.target)
        if a == b:
            continue
        where = f"{imp.file.relative_to(root.parent)}:{imp.line}: {imp.source} imports {imp.target}"
        try:
            ha, hb = height(a), height(b)
        except KeyError as err:
            out.append(f"{where}: '{err.args[0]}' is in no layer of wirelessfl/layers.py LAYERS")
            continue
        if hb > ha:
            out.append(f"{where}: '{b}' is a higher layer than '{a}'")
        elif hb == ha and LAYERS[ha] not in OPEN_LAYERS:
            out.append(f"{where}: '{a}' and '{b}' are siblings and may not import each other")
    return out


def folder_cycles(root: Path | None = None) -> list[list[str]]:
    """Cycles in the graph of folders (and top-level modules) that import each other, every
    import statement counted: strongly connected components of more than one member."""
    root = root or Path(__file__).resolve().parent
    graph: dict[str, set[str]] = {}
    for imp in package_imports(root):
        a, b = part_of(imp.source), part_of(imp.target)
        graph.setdefault(a, set())
        if a != b:
            graph[a].add(b)
            graph.setdefault(b, set())
    return [sorted(c) for c in _components(graph) if len(c) > 1]


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    counter = 0
    for start, targets in graph.items():
        if start in index:
            continue
        work = [(start, iter(sorted(targets)))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                out.append(component)
    return out


def markdown_table() -> str:
    """The layer table docs/architecture.md shows (between its ``layers`` markers)."""
    lines = ["| layer (bottom to top) | folders / modules |", "|---|---|"]
    for index, members in enumerate(LAYERS, 1):
        names = ", ".join(f"`{m}`" for m in members)
        if len(members) > 1 and members not in OPEN_LAYERS:
            names += " (siblings)"
        lines.append(f"| {index} | {names} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m wirelessfl.layers [PACKAGE_FOLDER]``: print every violation; exit 1 if any."""
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0]).resolve() if argv else None
    lines = violations(root) + [f"folder cycle: {' <-> '.join(c)}" for c in folder_cycles(root)]
    for line in lines:
        print(line)
    if not lines:
        print("layers: every import goes down or stays in its folder; no folder cycle")
    return 1 if lines else 0


if __name__ == "__main__":
    raise SystemExit(main())
