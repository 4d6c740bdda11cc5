"""What every hostile-input test asserts (issue 20): the command exits with code 2, stderr holds
exactly one ``error:`` line and no traceback, nothing outside the allowed folders changed, and
the files recorded before are intact.

Usage::

    before = snapshot(tmp_path)
    proc = run_cli("run", str(scenario), "--out", str(out), cwd=tmp_path)
    assert_refused(proc, "lr")                       # exit 2, one error: line naming "lr"
    assert_untouched(tmp_path, before, allowed=[out])

The command runs in a subprocess (``python -m wirelessfl``) so that a crash, a hang or a signal
is seen as a user would see it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

EXIT_USER_ERROR = 2


def run_cli(*argv: str, cwd: Path | None = None, timeout: float = 240, stdin: str | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """``wirelessfl ARGV`` in a fresh interpreter (one thread, this checkout first on the path)."""
    root = str(Path(__file__).resolve().parents[1])
    full_env = {**os.environ, "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
                **(env or {})}
    return subprocess.run([sys.executable, "-m", "wirelessfl", *map(str, argv)], check=False,
                          cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          input=stdin, env=full_env)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def assert_refused(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit code 2, exactly one ``error:`` line on stderr, no traceback; the line contains every
    one of ``fragments`` (case-insensitive). Returns the line."""
    detail = f"exit {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, detail
    assert proc.returncode == EXIT_USER_ERROR, detail
    lines = error_lines(proc)
    assert len(lines) == 1, detail
    for fragment in fragments:
        assert fragment.lower() in lines[0].lower(), detail
    return lines[0]


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file and link under ``root``: its content hash (or link target) and mode."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                state[rel] = ("link:" + os.readlink(path), 0)
            elif path.is_file():
                state[rel] = (hashlib.sha256(path.read_bytes()).hexdigest(),
                              path.stat().st_mode & 0o777)
            elif path.is_dir():
                state[rel] = ("dir", 0)
    return state


def assert_untouched(root: Path, before: dict, allowed: list[Path] = ()) -> None:
    """Nothing under ``root`` changed, appeared or vanished, except under the ``allowed``
    folders (the command's own output folder)."""
    allowed_rel = [str(Path(a).resolve().relative_to(Path(root).resolve())) for a in allowed]

    def outside(rel: str) -> bool:
        return not any(rel == a or rel.startswith(a + os.sep) for a in allowed_rel)

    after = snapshot(root)
    changed = sorted(rel for rel in set(before) | set(after)
                     if outside(rel) and before.get(rel) != after.get(rel))
    assert not changed, f"changed outside the output folder: {changed}"
