"""What every hostile-input test asserts (issue 20): the command exits with code 2, stderr holds
exactly one ``error:`` line and no traceback, nothing outside the allowed folders changed, and
the files recorded before are intact.

Usage::

    before = snapshot(tmp_path)
    proc = run_cli("run", str(scenario), "--out", str(out), cwd=tmp_path)
    assert_refused(proc, "lr")                       # exit 2, one error: line naming "lr"
    assert_untouched(tmp_path, before, allowed=[out])

``run_cli`` runs the command in a subprocess (``python -m wirelessfl``) so that a crash, a hang
or a signal is seen as a user would see it; ``run_in_process`` runs the same command through
``wirelessfl.cli.main`` in this process and returns what the subprocess would (exit code,
stdout, stderr; an exception that escapes main() is its traceback on stderr and exit code 1, as
the interpreter would print it), without the seconds a fresh interpreter takes to import torch.
Most cases use it; a few per module keep a fresh interpreter (``RUNNERS``, marked slow).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

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


def run_in_process(*argv: str, cwd: Path | None = None, timeout: float = 240,
                   stdin: str | None = None, env: dict | None = None
                   ) -> subprocess.CompletedProcess:
    """``wirelessfl ARGV`` through ``cli.main`` in this process, in ``cwd``, with ``env`` added to
    the environment and ``stdin`` as its input (``timeout`` is the subprocess's only)."""
    from wirelessfl.cli import main

    args = [str(a) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    previous_env = {key: os.environ.get(key) for key in (env or {})}
    previous_cwd = os.getcwd()
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                _stdin(stdin):
            try:
                code = main(args)
            except SystemExit as stop:  # argparse's refusals, sys.exit()
                code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
                if isinstance(stop.code, str):
                    print(stop.code, file=sys.stderr)
            except Exception:  # noqa: BLE001 - what the interpreter prints for an escaped one
                traceback.print_exc(file=sys.stderr)
                code = 1
    finally:
        os.chdir(previous_cwd)
        for key, value in previous_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return subprocess.CompletedProcess(["wirelessfl", *args], code, out.getvalue(),
                                       err.getvalue())


@contextlib.contextmanager
def _stdin(text: str | None):
    if text is None:
        yield
        return
    previous = sys.stdin
    sys.stdin = io.StringIO(text)
    try:
        yield
    finally:
        sys.stdin = previous


# How a case runs: in this process (the fast tier) or in a fresh interpreter (slow).
RUNNERS = {"in-process": run_in_process, "subprocess": run_cli}


def runner_cases(cases, in_a_fresh_interpreter=()) -> list:
    """Parameters ``(case, runner name)``: every case in process, and the cases named in
    ``in_a_fresh_interpreter`` once more in a subprocess (marked slow)."""
    params = [pytest.param(case, "in-process", id=f"{case}-in-process") for case in cases]
    params += [pytest.param(case, "subprocess", id=f"{case}-subprocess", marks=pytest.mark.slow)
               for case in in_a_fresh_interpreter]
    return params


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
