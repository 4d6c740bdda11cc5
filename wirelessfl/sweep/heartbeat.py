"""What a run of a study tells the study's process while it runs: that it started, and now and
then the round it is at (issue 35).

A study's runs execute elsewhere (a worker process, a Dask worker) and used to be silent until
their result came back: a run of an hour looked exactly like a hung one. Each run now reports
through ``report`` (a callable taking one event dict: over the worker's pipe, as a Dask worker
event, or straight to the printer when the run executes in the study's own process); the study's
process prints the events (host/progress.py ``StudyProgress``). Events are plain dicts of text
and numbers, so every channel can carry them; they only observe the run, so the run's numbers do
not depend on them.

Round events are throttled here, in the run, so a fast run neither floods the channel nor the
terminal.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from wirelessfl.host.progress import LINE_EVERY_S, RunProgress

# [D] The study as a whole prints about one round line this often: each run reports its round
# at most every ROUND_LINES_EVERY_S x the workers seconds (``every_s``), so N runs side by side
# add up to about one line per ROUND_LINES_EVERY_S whatever N is ...
ROUND_LINES_EVERY_S = 5.0
# ... but the gap between two round lines of one run is never longer than this (host/progress.py's
# plain-line interval), so that with many workers each run still shows a sign of life twice a
# minute (as long as its rounds end that often).
LONGEST_GAP_S = LINE_EVERY_S

Report = Callable[[dict], None]


def settings(workers: int, quiet: bool) -> dict | None:
    """What a study puts in each task's ``progress`` (None: the run reports nothing, as with
    ``--quiet``): ``every_s``, the least wall time between two round events of one run."""
    if quiet:
        return None
    return {"every_s": min(LONGEST_GAP_S, ROUND_LINES_EVERY_S * max(1, workers))}


class Heartbeat:
    """The events of one run: ``start`` at once, then ``round`` events from the runner's
    ``on_algorithm`` / ``on_round`` callbacks, at most one per ``every_s`` of wall time (the
    first one ``every_s`` after the start). The round's words are ``wirelessfl run``'s
    (``FedAvg round 20/60 (algorithm 1/2)``, host/progress.py ``RunProgress``, used here only
    to count, never to print).

    A report that fails (the study's process is gone and its pipe with it) ends the events;
    the run goes on: progress never decides a run's fate (SIGTERM's KeyboardInterrupt still
    stops it)."""

    def __init__(self, task: dict, report: Report | None,
                 clock: Callable[[], float] = time.monotonic):
        options = task.get("progress")
        self._report = report if options is not None else None
        self.every_s = options["every_s"] if options is not None else 0.0
        self.run_id = task["run_id"]
        self._clock = clock
        self._start = self._last = clock()
        self._rounds: RunProgress | None = None

    def started(self) -> None:
        """The run has started here (this host and process)."""
        self._send({"event": "start", "run_id": self.run_id, "host": socket.gethostname(),
                    "pid": os.getpid()})

    def callbacks(self, algorithms: list[tuple[str, int]]) -> dict:
        """``on_algorithm`` and ``on_round`` for ``run_scenario``, for a scenario running
        ``algorithms`` (label, rounds); none when nothing is reported."""
        if self._report is None:
            return {}
        self._rounds = RunProgress(algorithms, quiet=True)
        return {"on_algorithm": self._rounds.start, "on_round": self._round}

    def _round(self, n: int = 1) -> None:
        self._rounds.update(n)
        now = self._clock()
        if now - self._last >= self.every_s:
            self._last = now
            self._send({"event": "round", "run_id": self.run_id,
                        "state": self._rounds.state(), "elapsed_s": now - self._start})

    def _send(self, event: dict) -> None:
        if self._report is None:
            return
        try:
            self._report(event)
        except Exception:  # noqa: BLE001 - e.g. the pipe is closed: nobody listens any more
            self._report = None
