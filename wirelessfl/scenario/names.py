"""What a name or a label may hold, refused at input (the outputs escape at render time too).

Names become folder and file names (a scenario's ``runs/<name>-<time>``, a sweep's or a tune's
folder): a name of ``/abs/path`` or ``../../x`` would write outside ``runs/``, a NUL byte crashes
every path call. Labels (algorithm labels, device-class and profile names) are shown in tables,
plots, HTML and the terminal: a control character garbles the terminal, a NUL crashes.
"""

from __future__ import annotations

import re

# [D]: letters, digits and . _ + - only, starting with a letter or digit, at most 100 characters.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
MAX_LABEL_CHARS = 100  # [D]


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a folder, or None."""
    if NAME_PATTERN.fullmatch(name) and ".." not in name:
        return None
    return (f"{name[:40]!r} cannot name a folder: use letters, digits and . _ + - only (no "
            "'/', no '..', no spaces), starting with a letter or digit, at most 100 characters, "
            "e.g. 'power-sweep'")


def validated_name(name: str | None) -> str | None:
    """``name`` unchanged when it can name a folder (None and "" mean: the default, from the
    file's name); a pydantic field validator's ValueError otherwise."""
    problem = name and name_problem(name)
    if problem:
        raise ValueError(problem)
    return name


def safe_name(text: str, fallback: str = "scenario") -> str:
    """``text`` (a file's stem) turned into a valid name: other characters become '-'."""
    name = re.sub(r"[^A-Za-z0-9._+-]", "-", text).replace("..", "-").lstrip("._+-")[:100]
    return name if name_problem(name) is None else fallback


def label_problem(label: str) -> str | None:
    """Why ``label`` cannot be shown as a label, or None."""
    if not label.strip():
        return "is empty; give a visible label"
    if len(label) > MAX_LABEL_CHARS:
        return f"has {len(label)} characters; at most {MAX_LABEL_CHARS}"
    if not label.isprintable():
        bad = next(c for c in label if not c.isprintable())
        return (f"holds the control character {bad!r}; use printable characters only (no "
                "NUL, tab or newline)")
    return None


def check_text(text: str) -> str | None:
    """Why a free text (a description) cannot be kept: a NUL or another control character
    other than tab and newline; or None."""
    bad = next((c for c in text if ord(c) < 32 and c not in "\t\n\r" or c == "\x7f"), None)
    if bad is None:
        return None
    return f"holds the control character {bad!r}; remove it"
