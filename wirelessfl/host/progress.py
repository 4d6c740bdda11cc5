"""Progress on stderr for the commands that run: a tqdm bar on a terminal, and in a Jupyter
notebook (a widget where ipywidgets is installed, else a text bar the notebook redraws in
place); where stderr is not a terminal (a log file, a SLURM output, a CI log) a plain
``progress: ...`` line now and then, never a carriage return, so the file reads as lines;
nothing with ``--quiet``.

A bar redraws itself in place with carriage returns, which a log file keeps as one endless
line (tqdm therefore draws nothing there); a batch job then shows no sign of life for hours.
The lines say what runs, how far it is and the wall time since the start.

A study (``wirelessfl sweep``, ``tune``, ``reproduce``) runs many runs on several workers:
``StudyProgress`` adds a line when each run starts, its runs' round lines and, once runs have
finished, an estimate of the time left (``time_left``).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TextIO

# Plain-line mode writes a line when this much wall time has passed since the last one [D]: a
# sign of life a few times a minute, a few thousand lines for a day-long job.
LINE_EVERY_S = 30.0
# ... or when the count has crossed another tenth of the total [D]: at most ten such lines,
# so a short run still shows how it advanced.
LINE_EVERY_FRACTION = 0.1


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (False for files, pipes, captured
    streams and streams without a descriptor)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (an IPython ZMQ shell), whose output area
    redraws a bar in place although its stderr is no terminal."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _bar_class(notebook: bool):
    """tqdm's widget bar in a notebook with ipywidgets, else its text bar."""
    if notebook:
        try:
            import ipywidgets  # noqa: F401
        except ImportError:
            pass
        else:
            from tqdm.notebook import tqdm as widget

            return widget
    from tqdm import tqdm

    return tqdm


def duration(seconds: float) -> str:
    """Wall time for a progress line: ``12.5 s``, ``12 min 05 s``, ``3 h 02 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


class Progress:
    """``count`` units of work out of ``total`` (rounds, runs), shown as a bar on a terminal
    or as ``progress:`` lines elsewhere (module docstring); ``quiet`` shows nothing.
    ``name`` and ``detail`` (e.g. ``failed 0``) describe the work; subclasses say more through
    ``state`` and ``outlook``."""

    BAR_FORMAT: str | None = None  # tqdm's own (with its rate and time left) unless a subclass says

    def __init__(self, total: int, unit: str, *, name: str = "", initial: int = 0,
                 quiet: bool = False, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.count, self.unit, self.name = total, initial, unit, name
        self.detail = ""
        self._clock = clock
        self._start = self._last_time = clock()
        self._last_count = initial
        notebook = self.stream is sys.stderr and in_notebook()
        self.mode = ("off" if quiet else "bar" if notebook or is_terminal(self.stream)
                     else "lines")
        self._bar = None
        if self.mode == "bar":
            self._bar = _bar_class(notebook)(total=total, initial=initial, unit=unit,
                                             file=self.stream, desc=name or None,
                                             dynamic_ncols=True, mininterval=0.5,
                                             bar_format=self.BAR_FORMAT)
        self._next = self._step_after(initial)

    def update(self, n: int = 1) -> None:
        """``n`` more units done."""
        self.count += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.mode == "lines" and (self.count >= self._next or
                                       self._clock() - self._last_time >= LINE_EVERY_S):
            self.line()

    def set_detail(self, text: str) -> None:
        """Extra words after the count (the bar's postfix), e.g. ``failed 1, remaining 4``."""
        self.detail = text
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def set_total(self, total: int) -> None:
        """A new total: work that will not be done (an algorithm stopped early) leaves it, so
        the bar ends at 100 % and the tenths stay tenths of the real work."""
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()
        self._next = self._step_after(self.count)

    def write(self, text: str) -> None:
        """A message line (a warning) that does not break the bar."""
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream)

    def line(self, state: str | None = None) -> None:
        """In plain-line mode, one ``progress: STATE, T elapsed`` line now."""
        if self.mode != "lines":
            return
        now = self._clock()
        print(f"progress: {state or self.state()}, {duration(now - self._start)} elapsed"
              f"{self.outlook()}", file=self.stream, flush=True)
        self._last_time, self._last_count = now, self.count
        self._next = self._step_after(self.count)

    def state(self) -> str:
        """What a plain line says before the elapsed time."""
        what = f"{self.name} " if self.name else ""
        more = f" ({self.detail})" if self.detail else ""
        return f"{what}{self.unit} {self.count}/{self.total}{more}"

    def outlook(self) -> str:
        """What a plain line says after the elapsed time (an estimate of the time left);
        nothing here."""
        return ""

    def close(self) -> None:
        """End: the bar is closed; in plain-line mode the last state is written if no line
        has shown it yet."""
        if self._bar is not None:
            self._bar.close()
        elif self.count != self._last_count:
            self.line()

    def abandon(self) -> None:
        """End without a last line (an error follows, which stands alone)."""
        self._last_count = self.count
        self.close()

    def _step_after(self, count: int) -> float:
        """The count at which the next tenth of ``total`` is crossed."""
        step = max(1, math.ceil(self.total * LINE_EVERY_FRACTION))
        return (count // step + 1) * step


class RunProgress(Progress):
    """Rounds of a scenario's algorithms, run one after another (``wirelessfl run``): the
    total is the rounds of the algorithms still to run, each its own ``rounds``; the state
    names the running algorithm, its round out of its own rounds and its place among the
    scenario's algorithms: ``FedAvg round 30/60 (algorithm 2/3)``.

    An algorithm can end before its last round (stopped at the target, when unhealthy,
    diverged, failed): when the next one starts (or at ``close``) the rounds it did not run
    leave the total, and a plain line says where it ended."""

    def __init__(self, algorithms: Iterable[tuple[str, int]], done: Iterable[str] = (),
                 **options):
        self.algorithms = list(algorithms)
        finished = set(done)
        self._rounds = dict(self.algorithms)
        self._place = {label: k for k, (label, _) in enumerate(self.algorithms, start=1)}
        super().__init__(sum(r for label, r in self.algorithms if label not in finished),
                         "round", **options)
        self.label: str | None = None
        self.completed = 0  # rounds of the running algorithm

    def start(self, label: str) -> None:
        """``label`` starts (the runner's ``on_algorithm``)."""
        self._end()
        self.label, self.completed = label, 0
        if self._bar is not None:
            self._bar.set_description_str(label, refresh=False)
            self._bar.set_postfix_str(self._where(), refresh=False)

    def update(self, n: int = 1) -> None:
        """``n`` more rounds of the running algorithm (the runner's ``on_round``; a resumed
        algorithm reports the rounds of its checkpoint at once)."""
        self.completed += n
        if self._bar is not None:
            self._bar.set_postfix_str(self._where(), refresh=False)
        super().update(n)

    def state(self) -> str:
        if self.label is None:
            return f"round {self.count}/{self.total}"
        return f"{self.label} {self._where()}"

    def close(self) -> None:
        self._end()
        super().close()

    def abandon(self) -> None:
        self.label = None
        super().abandon()

    def _where(self) -> str:
        return (f"round {self.completed}/{self._rounds[self.label]} (algorithm "
                f"{self._place[self.label]}/{len(self.algorithms)})")

    def _end(self) -> None:
        """The running algorithm has ended: its unrun rounds leave the total; a line says
        where it ended."""
        if self.label is None:
            return
        rounds = self._rounds[self.label]
        if self.completed < rounds:
            self.set_total(self.total - (rounds - self.completed))
        how = "finished" if self.completed >= rounds else "ended"
        self.line(f"{self.label} {how} at round {self.completed}/{rounds} (algorithm "
                  f"{self._place[self.label]}/{len(self.algorithms)})")
        self.label = None


@dataclass(frozen=True)
class Estimate:
    """The time a study phase has left: ``per_run_s`` (the mean wall time of its finished runs)
    x ``runs_left`` / ``busy`` (the workers that can still be busy)."""

    per_run_s: float
    runs_left: int
    busy: int

    @property
    def seconds(self) -> float:
        return self.per_run_s * self.runs_left / self.busy

    def __str__(self) -> str:
        return (f"about {duration(self.seconds)} left (estimate: {duration(self.per_run_s)} a "
                f"run x {counted(self.runs_left, 'run')} left / "
                f"{counted(self.busy, 'worker')})")


def counted(n: int, word: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def time_left(wall_times: Iterable[float], runs_left: int, workers: int) -> Estimate | None:
    """Estimated wall time until ``runs_left`` more runs are done on ``workers`` workers:
    the mean wall time of the finished runs (``wall_times``; NaN, a run whose worker died, is
    left out) x the runs left / the workers that can still be busy (at most one per run left).
    None before any run has finished (nothing to estimate from) and when none is left.

    An estimate, and a simple one on purpose: a reader can check it by hand. Its known errors:
    the runs in flight count as whole runs although part of each is done (so it errs high by up
    to one run while they finish), and a study whose runs differ in length (algorithms with
    other round counts, a grid over the rounds) gets the mean of those that finished so far,
    which early on are the short ones (so it errs low until the long ones finish). A model per
    algorithm would need runs of each to have finished, which is late in a study, when the
    estimate matters least."""
    walls = [w for w in wall_times if math.isfinite(w)]
    if not walls or runs_left <= 0:
        return None
    return Estimate(statistics.fmean(walls), runs_left, max(1, min(workers, runs_left)))


class StudyProgress(Progress):
    """The runs of one study phase (a sweep; a tune file's tuning or evaluation), run on
    ``workers`` workers: ``runs`` maps each run to run (its id) to the words that name it (its
    values and seed). Besides the count of runs done (the bar; in a log, a line after each
    finished run), three kinds of line, all ``--quiet`` silences:

    - ``run K/N started: WHAT`` when a run starts (K counts the starts);
    - ``run K/N (WHAT): FedAvg round 20/60 (algorithm 1/2), 12.0 s elapsed``: a running run's
      round, as often as its worker reports it (sweep/heartbeat.py throttles);
    - after each finished run, how many are done, the wall time since the phase started and,
      from the finished runs' wall times, about how long the rest will take (``time_left``).

    On a terminal (or in a notebook) the bar counts the finished runs and shows the same
    estimate; tqdm's own time left is left out, since it divides by the rate of finished runs
    and so, with N workers busy at the start, first says N times too long. The start and round
    lines are written above the bar."""

    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def __init__(self, runs: dict[str, str], workers: int, **options):
        super().__init__(len(runs), "run", **options)
        self.runs, self.workers = runs, workers
        self.failed = 0
        self._number: dict[str, int] = {}  # run id -> K, in the order the runs started
        self._done: set[str] = set()
        self._walls: list[float] = []

    def event(self, event: dict) -> None:
        """One progress event of a run (sweep/heartbeat.py), or the executor's count of
        ``workers`` (a Dask scheduler's task slots, which change as its jobs come and go)."""
        kind = event.get("event")
        if kind == "workers":
            self.workers = event["count"] or self.workers
        elif kind == "start":
            self.started(event["run_id"])
        elif kind == "round" and event["run_id"] in self._number \
                and event["run_id"] not in self._done:  # a late event of a finished run: dropped
            self.say(f"{self._which(event['run_id'])} ({self.runs[event['run_id']]}): "
                     f"{event['state']}, {duration(event['elapsed_s'])} elapsed")

    def started(self, run_id: str) -> None:
        """The run ``run_id`` started (once; a run whose start was not reported, e.g. its worker
        died first, is said to start when its result comes)."""
        if run_id in self._number or run_id not in self.runs:
            return
        self._number[run_id] = len(self._number) + 1
        self.say(f"{self._which(run_id)} started: {self.runs[run_id]}")

    def finished(self, run_id: str, wall_s: float, failed: bool) -> None:
        """The run ``run_id`` came back after ``wall_s`` seconds of its worker's wall time."""
        self.started(run_id)
        self._done.add(run_id)
        self._walls.append(wall_s)
        self.failed += failed
        self.count += 1
        if self._bar is not None:
            left = self._left()
            about = f", about {duration(left.seconds)} left (estimate)" if left else ""
            self._bar.update(1)
            self._bar.set_postfix_str(f"failed {self.failed}{about}")  # drawn now
        self.line()

    def say(self, text: str) -> None:
        """A ``progress:`` line, above the bar if there is one; nothing with ``--quiet``."""
        if self.mode != "off":
            self.write(f"progress: {self.name}: {text}" if self.name else f"progress: {text}")

    def state(self) -> str:
        return f"{self.name}: {self.count}/{self.total} runs done (failed {self.failed})"

    def outlook(self) -> str:
        left = self._left()
        return f", {left}" if left is not None else ""

    def _left(self) -> Estimate | None:
        return time_left(self._walls, self.total - self.count, self.workers)

    def _which(self, run_id: str) -> str:
        return f"run {self._number[run_id]}/{self.total}"
