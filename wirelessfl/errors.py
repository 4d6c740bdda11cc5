"""The one exception type users see: a clean message, never a traceback; and the wording of the
operating system's refusals (disk full, read-only folder, missing path) as such a message."""

from __future__ import annotations

import errno


class UserError(Exception):
    """Bad input from the user (scenario, CLI flag, missing file).

    The CLI prints ``error: <message>`` and exits with code 2. The message must say
    where the problem is (file, key path) and how to fix it.
    """


# What to do about the operating system's refusals, by errno (the rest get the generic fix).
_FIXES = {
    errno.ENOSPC: "the disk is full: free some space (or write to another disk) and run the "
                  "command again",
    errno.EDQUOT: "the disk quota is used up: free some space (or write to another disk) and run "
                  "the command again",
    errno.EFBIG: "the file size limit was reached (ulimit -f): raise it, or write less",
    errno.EROFS: "the file system is read-only: write to another folder (--out DIR)",
    errno.EACCES: "permission denied: write to a folder you may write to (--out DIR), or change "
                  "the folder's permissions",
    errno.EPERM: "not permitted: write to a folder you may write to (--out DIR), or change the "
                 "folder's permissions",
    errno.ENOENT: "no such file or folder: check the path",
    errno.ENOTDIR: "a part of the path is not a folder: check the path",
    errno.EISDIR: "a folder stands where a file is expected: move it away or choose another path",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n)",
    errno.ENFILE: "too many open files on the system: try again later",
}


def os_error_message(err: OSError, path=None) -> str:
    """``err`` as one line: the file it concerns (``path`` when given, else the error's own), what
    the system said and what to do."""
    where = path if path is not None else err.filename
    said = err.strerror or str(err) or type(err).__name__
    fix = _FIXES.get(err.errno, "check the path and the disk, then run the command again")
    return (f"{where}: " if where is not None else "") + f"{said} ({fix})"
