"""YAML for every file a user hands in (scenarios, profiles, sweep, tune and reproduction files,
``--set`` values): safe tags only, limits checked while the text is parsed, duplicate keys refused.

Why limits at parse time: PyYAML builds an alias as a shared reference, so a few hundred bytes of
nested aliases ("billion laughs") make a document of 10^9 values that costs nothing to build and
everything to walk, copy or serialise. Counting the document's expanded size on the node graph,
before any Python object is built, refuses it in milliseconds whatever happens to the document
next (a sweep copies its base scenario once per point). Depth is counted while composing, so a
5,000-deep ``[[[[...]]]]`` is refused without recursing through Python's stack.

Duplicate keys: YAML says a mapping's keys are unique; PyYAML keeps the last one silently, so
``rounds: 10`` written twice with different values runs whichever came last. Refused here, naming
the key and its line.
"""

from __future__ import annotations

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, SequenceNode

# Bounds on a document's shape: a real scenario is under 10 levels deep and a few thousand
# values (a positions list of 10,000 devices fits) [D].
MAX_DEPTH = 32
MAX_NODES = 1_000_000
# A YAML file larger than this is refused before it is read (a scenario of 100,000 device
# distances is about 2 MB) [D].
MAX_FILE_BYTES = 64 * 2**20
MERGE_TAG = "tag:yaml.org,2002:merge"


class LimitError(yaml.YAMLError):
    """A document over MAX_DEPTH or MAX_NODES (``problem``), starting at ``problem_mark``."""

    def __init__(self, problem: str, mark=None):
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class SafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that counts nesting while composing and refuses duplicate keys."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise LimitError(f"nested more than {MAX_DEPTH} levels deep; flatten it",
                                 self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: SafeConstructor refuses it itself
                    continue
                if duplicate:
                    raise ConstructorError(None, None, f"duplicate key {key!r}: each key may "
                                           "appear once in a mapping; delete one of them",
                                           key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def check_expansion(root) -> None:
    """Refuse a composed node graph whose expanded document (aliases copied out) holds more than
    MAX_NODES values or is nested more than MAX_DEPTH levels, or that contains itself. Linear in
    the number of distinct nodes: each node's expanded size is computed once."""
    size: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth) once expanded
    open_nodes: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in size:
            continue
        kids = _children(node)
        if not children_done:
            if key in open_nodes:
                raise LimitError("an alias refers to a node that contains it (an infinitely "
                                 "deep document); remove the alias", node.start_mark)
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((kid, False) for kid in kids if id(kid) not in size)
            continue
        open_nodes.discard(key)
        values = 1 + sum(size[id(kid)][0] for kid in kids)
        depth = 1 + max((size[id(kid)][1] for kid in kids), default=0)
        if values > MAX_NODES:
            raise LimitError(f"the document would hold more than {MAX_NODES:,} values once its "
                             "aliases are expanded; a scenario is far smaller", node.start_mark)
        if depth > MAX_DEPTH:
            raise LimitError(f"nested more than {MAX_DEPTH} levels deep once its aliases are "
                             "expanded; flatten it", node.start_mark)
        size[key] = (values, depth)


def _children(node) -> list:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load(text: str):
    """The one document in ``text`` (None when empty). Raises ``yaml.YAMLError`` (LimitError for a
    document over the limits) with a ``problem_mark`` where the parser knows one."""
    loader = SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def describe_error(err: yaml.YAMLError, what: str = "invalid YAML") -> str:
    """'line L, column C: <what> (<problem>)' (or without the place) for one ``error:`` line;
    never the text of the document (a profile name may point at any file)."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{where}{what} ({problem})"
