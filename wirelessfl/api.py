"""The Python API: what a notebook or a script uses instead of the command line (docs/api.md).

Load a scenario (a catalog name, a YAML file or a dict, with overrides), run it into memory or
into a run folder, and get a ``Result``: the tables as pandas DataFrames, the summary, the
manifest and the figures; load a saved run as a ``Result``, and a sweep, a tuning study or a
reproduction as one tidy DataFrame. Everything delegates to the code the command line runs
(scenario/loader.py, pipeline/runner.py, results/, report/plots.py), so that the API and the CLI
give the same numbers and the same one-line ``UserError`` messages.

The top-level names (``wirelessfl.run`` ...) are the stable ones; this module's other names are
not. Heavy modules (torch, the engine) are imported inside the functions that need them.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from wirelessfl.errors import UserError
from wirelessfl.results.records import RunRecord

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from wirelessfl.scenario.schema import Scenario

# The source named in error messages about a scenario given as a dict, and the name of one that
# gives none [D].
DICT_SOURCE = "<dict>"
DEFAULT_NAME = "scenario"
# What a sweep's tidy table puts before the rounds' columns (after the swept keys).
RUN_COLUMNS = ("seed", "run", "folder")


def load_scenario(source, overrides=(), **values) -> Scenario:
    """A validated, resolved ``Scenario`` from ``source``: a catalog name (``"quickstart"``), a
    path to a YAML file, a dict (the YAML document as Python data) or a ``Scenario``.

    ``overrides``: ``"key.path=value"`` text as ``--set`` takes it (one string or several), or a
    mapping ``{"key.path": value}`` of Python values; ``values``: more of them as keywords, with
    ``__`` for the dots (``seed=3``, ``channel__uplink__tx_power_dbm=10``), applied last. Bad
    input raises ``UserError`` with the message the CLI prints after ``error:``."""
    from wirelessfl.scenario.loader import (
        apply_override,
        check_shape,
        override_path,
        read_scenario_document,
        resolved_document,
        scenario_from_document,
        set_key,
    )
    from wirelessfl.scenario.schema import Scenario

    assignments = _assignments(overrides, values)
    if isinstance(source, Scenario):
        if not assignments:
            return source
        doc, where, base_dir = resolved_document(source), f"scenario '{source.name}'", None
    elif isinstance(source, Mapping):
        doc, where, base_dir = dict(source), DICT_SOURCE, None
        if not doc.get("name"):  # as a file's stem names a file's scenario
            doc["name"] = DEFAULT_NAME
    elif isinstance(source, str | os.PathLike):
        path, doc = read_scenario_document(os.fspath(source))
        where, base_dir = str(path), path.parent
    else:
        raise UserError(f"load_scenario: expected a scenario name, a path, a dict or a Scenario, "
                        f"got {type(source).__name__}")
    sets = []  # what errors name a bad value by, as the CLI names a bad --set
    if assignments and isinstance(doc, dict):  # a non-mapping is refused below, as by the CLI
        check_shape(doc, where)  # before the copy, which would recurse as deep as the doc
        doc = copy.deepcopy(doc)
        for key, value in assignments:
            if value is _TEXT:
                sets.append((override_path(apply_override(doc, key)), f"--set {key}"))
            else:
                path = set_key(doc, str(key), value, origin="overrides: ")
                sets.append((override_path(path), f"overrides: {key}={value!r}"))
    return scenario_from_document(doc, where, (), base_dir, tuple(sets))


_TEXT = object()  # marks an override given as "key.path=value" text


def _folder(value, what: str) -> Path:
    """``value`` as a folder path, or a ``UserError`` naming ``what`` (an argument given as a
    number, bytes, None, empty text or text with a NUL byte: pathlib would raise TypeError or
    ValueError, and an empty path would be the current folder)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise UserError(f"{what}: expected a folder path (text or a pathlib.Path), got "
                        f"{type(value).__name__}")
    if not value.strip() or "\0" in value:
        raise UserError(f"{what}: {value!r} is not a folder path; give the folder's name, e.g. "
                        "'runs/my-run'")
    return Path(value)


def _flag(value, what: str) -> bool:
    """``value`` as True/False, or a ``UserError`` naming ``what``."""
    if not isinstance(value, bool):
        raise UserError(f"{what}: expected True or False, got {value!r}")
    return value


def _assignments(overrides, values: dict) -> list[tuple[str, Any]]:
    """(key, value) in the order given; text overrides as (text, _TEXT)."""
    if isinstance(overrides, str):
        overrides = [overrides]
    if isinstance(overrides, Mapping):
        found = list(overrides.items())
    elif isinstance(overrides, Iterable):
        found = []
        for item in overrides:
            if not isinstance(item, str):
                raise UserError(f"overrides: {item!r} is not 'key.path=value' text; give text "
                                "such as 'population.num_devices=20', or a mapping "
                                "{'population.num_devices': 20}")
            found.append((item, _TEXT))
    else:
        raise UserError(f"overrides: expected 'key.path=value' text, a list of them or a "
                        f"mapping, got {type(overrides).__name__}")
    return found + [(key.replace("__", "."), value) for key, value in values.items()]


def run(scenario_or_source, out=None, *, overrides=(), progress: bool = False,
        threads: int | None = None, figures: bool = True) -> Result:
    """Simulate a scenario (anything ``load_scenario`` takes, with ``overrides``) and return its
    ``Result``.

    ``out=None``: in memory, nothing written (``Result.save`` writes it later). ``out=FOLDER``:
    the run folder ``wirelessfl run --out FOLDER`` writes (tables, manifest, summary.csv, and
    with ``figures`` the PNGs), refused when it already holds a run. Either way the numbers are
    those of ``wirelessfl run`` for the same scenario and seed. ``progress``: the CLI's
    progress on stderr (a bar on a terminal, a plain line now and then elsewhere). ``threads``:
    host threads, as ``--threads`` (the results do not depend on it). Warnings are printed to stderr, as the CLI prints them, and kept in
    ``Result.warnings``."""
    from wirelessfl.pipeline.runner import run_to_record

    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool)
                                or threads < 1):
        raise UserError(f"threads: must be a positive number of threads, got {threads!r}")
    out = _folder(out, "out") if out is not None else None
    progress, figures = _flag(progress, "progress"), _flag(figures, "figures")
    scenario = load_scenario(scenario_or_source, overrides)
    warnings: list[str] = []

    def warn(text: str) -> None:
        warnings.append(text)
        print(text, file=sys.stderr)

    from wirelessfl.host.progress import RunProgress

    # The CLI's progress: a bar on a terminal, plain lines in a log or a notebook's stderr.
    bar = RunProgress([(p.display_name, p.rounds) for p in scenario.algorithms],
                      quiet=not progress)
    try:
        _, table, record = run_to_record(
            scenario, out, warn=warn, threads=threads,
            on_round=bar.update, on_algorithm=bar.start)
    except BaseException:
        bar.abandon()
        raise
    bar.close()
    result = Result(record, scenario=scenario, summary=table, warnings=warnings)
    if out is not None and figures:
        from wirelessfl.report.plots import draw_report

        draw_report(record)
    return result


def _show_figures_in_notebooks() -> None:
    """In a running IPython kernel, show a returned ``Figure`` as a PNG: the display pyplot's
    inline backend registers when pyplot is imported, registered here because the report draws
    on Figure objects without pyplot (it never touches the notebook's backend or pyplot's
    figures, so the user's own ``plt`` plots keep showing). Outside IPython: nothing."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return
    from IPython.core.pylabtools import print_figure
    from matplotlib.figure import Figure

    formatter = shell.display_formatter.formatters["image/png"]
    try:
        formatter.lookup_by_type(Figure)
    except KeyError:
        formatter.for_type(Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight"))


class Result(RunRecord):
    """One run: ``rounds`` and ``devices`` (the run folder's tables as DataFrames), ``manifest``
    (dict), ``summary`` (the table ``wirelessfl run`` prints and writes to summary.csv),
    ``scenario``, ``status``, ``path`` (the run folder; None for a run kept in memory) and the
    figures. A ``RunRecord``, so every report and comparison function takes it."""

    def __init__(self, record: RunRecord, scenario: Scenario | None = None,
                 summary: pd.DataFrame | None = None, warnings: Iterable[str] = ()):
        super().__init__(record.path, record.rounds, record.devices, record.manifest)
        self._scenario = scenario
        self._summary = summary
        self.warnings = list(warnings)

    def __repr__(self) -> str:
        labels = ", ".join(self.manifest.get("algorithms", {}))
        where = f"'{self.path}'" if self.path is not None else "in memory"
        return (f"Result({self.name!r}, seed {self.seed}, status {self.status!r}, algorithms: "
                f"{labels}; {len(self.rounds)} round rows; {where})")

    @property
    def name(self) -> str:
        return self.manifest.get("scenario", {}).get("name", "")

    @property
    def seed(self) -> int:
        return self.manifest["seed"]

    @property
    def status(self) -> str:
        """``complete``, ``partial`` (an algorithm diverged or failed), ``interrupted`` or
        ``failed`` (docs/results.md)."""
        return self.manifest["status"]

    @property
    def summary(self) -> pd.DataFrame:
        """One row per algorithm: to target, final values, health (results/summary.py); for a
        loaded run computed from its tables as ``wirelessfl report`` does."""
        if self._summary is None:
            from wirelessfl.results.summary import summarize

            n = self.manifest.get("scenario", {}).get("population", {}).get("num_devices", 1)
            self._summary = summarize(self.rounds, self.target_accuracy, n,
                                      self.target_suboptimality, manifest=self.manifest)
        return self._summary

    @property
    def scenario(self) -> Scenario:
        """The resolved scenario; for a loaded run validated again from its manifest (as
        ``wirelessfl run --resume`` does), which needs the algorithms' plugins installed."""
        if self._scenario is None:
            from wirelessfl.scenario.loader import scenario_from_document

            where = f"{self.path / 'manifest.json'}" if self.path is not None else "manifest"
            self._scenario = scenario_from_document(self.manifest["scenario"], where)
        return self._scenario

    @property
    def notes(self) -> list[str]:
        """What the run's setting tells beside its numbers (the CLI prints them as ``note:``
        lines), e.g. that a bit width changes nothing on air."""
        return list(self.manifest.get("notes", []))

    def figure(self, name: str) -> Figure | None:
        """The figure ``name`` (a PNG's stem in a run folder: ``accuracy_vs_energy`` ...; see
        ``figure_names()``), or None when this run has nothing to draw in it."""
        from wirelessfl.report.plots import FIGURES

        if name not in FIGURES:
            raise UserError(f"figure: unknown figure '{name}'; choose one of: "
                            f"{', '.join(FIGURES)}")
        _show_figures_in_notebooks()
        return FIGURES[name](self)

    def figures(self) -> dict[str, Figure]:
        """Every figure this run has something to draw in, by name, in the report's order."""
        from wirelessfl.report.plots import FIGURES

        _show_figures_in_notebooks()
        drawn = {name: draw(self) for name, draw in FIGURES.items()}
        return {name: fig for name, fig in drawn.items() if fig is not None}

    @staticmethod
    def figure_names() -> list[str]:
        from wirelessfl.report.plots import FIGURES

        return list(FIGURES)

    def save(self, folder, figures: bool = True) -> Path:
        """Write this run as a run folder (rounds.parquet, devices.parquet, manifest.json,
        summary.csv and, with ``figures``, the PNGs), which ``wirelessfl report`` and
        ``load_run`` read; a folder that already holds a run is refused. Returns the folder."""
        from wirelessfl.results.records import (
            atomic_write,
            claim_run_folder,
            write_csv,
            write_json,
        )

        out, lock = claim_run_folder(_folder(folder, "save"))
        figures = _flag(figures, "figures")
        with lock:
            for name, frame in (("rounds.parquet", self.rounds),
                                ("devices.parquet", self.devices)):
                atomic_write(out / name, lambda tmp, f=frame: f.to_parquet(tmp, index=False))
            write_json(out / "manifest.json", self.manifest)
            write_csv(out / "summary.csv", self.summary)
        if figures:
            from wirelessfl.report.plots import draw_report

            draw_report(self, out)
        return out


def load_run(folder) -> Result:
    """A run folder (``wirelessfl run``'s, a sweep's ``runs/<run>``, ``Result.save``'s) as a
    ``Result``, checked as ``wirelessfl report`` checks it (results/records.read_run)."""
    from wirelessfl.results.records import read_run

    return Result(read_run(_folder(folder, "load_run")))


def load_sweep(folder) -> pd.DataFrame:
    """A sweep folder (``wirelessfl sweep``'s) as one tidy table: one row per finished run per
    evaluated round (the rows of each run's rounds.parquet), with the swept keys (columns named
    by their key path; lists and mappings as JSON text), ``seed``, ``run`` (the run's id) and
    ``folder`` (its run folder) in front. A swept key that is also a rounds column (a tuning
    phase's ``algorithm``: the label of the run's one algorithm) is that column. Runs that
    failed or have not run yet have no rows (runs.csv lists them)."""
    from wirelessfl.results.compare import SWEEP_MANIFEST, finished_sweep_runs, table_value
    from wirelessfl.results.records import ROUND_COLUMNS, read_run

    folder = _folder(folder, "load_sweep")
    if not (folder / SWEEP_MANIFEST).is_file():
        raise UserError(f"{folder}: not a sweep folder (no {SWEEP_MANIFEST}); pass the folder "
                        "'wirelessfl sweep' wrote (see its --out)")
    manifest, runs = finished_sweep_runs(folder)
    keys = manifest.get("keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise UserError(f"{folder / SWEEP_MANIFEST}: 'keys' is not a list of key paths; re-run "
                        "the sweep to rewrite it")
    frames = []
    for entry in runs:
        record = read_run(folder / entry["folder"])
        frame = record.rounds.reset_index(drop=True)
        front = {k: table_value(entry[k]) if k in entry else None  # a point without it
                 for k in keys if k not in frame.columns}
        front.update(seed=record.manifest["seed"], run=str(entry.get("run", "")),
                     folder=str(folder / entry["folder"]))
        for position, (column, value) in enumerate(front.items()):
            frame.insert(position, column, [value] * len(frame))
        frames.append(frame)
    if not frames:
        columns = [k for k in keys if k not in ROUND_COLUMNS] + [*RUN_COLUMNS, *ROUND_COLUMNS]
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True)


def load_tuning(folder) -> pd.DataFrame:
    """A tuning study's folder (``wirelessfl tune``'s) as one tidy table: ``load_sweep`` of its
    two phases, ``tuning`` (every configuration on the tuning seeds; the tuned parameters as
    columns) and ``evaluation`` (the chosen and untuned settings on fresh seeds), with a
    ``phase`` column in front. The study's own tables are tuning.csv and evaluation.csv
    beside them."""
    from wirelessfl.tune.study import EVALUATION, MANIFEST, TUNING

    folder = _folder(folder, "load_tuning")
    if not (folder / MANIFEST).is_file():
        raise UserError(f"{folder}: not a tuning study's folder (no {MANIFEST}); pass the folder "
                        "'wirelessfl tune' wrote (see its --out), or the 'tune' folder of a "
                        "reproduction")
    phases = [phase for phase in (TUNING, EVALUATION) if (folder / phase).is_dir()]
    if not phases:  # a recorded summary (docs/data ships these): the tables, not the runs
        tables = sorted(p.name for p in folder.glob("*.csv"))
        held = f"only the study's tables ({', '.join(tables)})" if tables else "no runs"
        raise UserError(f"{folder}: holds {held}, not its runs ({TUNING}/, {EVALUATION}/), which "
                        "load_tuning reads; read a table with pandas.read_csv, or run "
                        "'wirelessfl tune' (or 'reproduce') to have the runs")
    frames = []
    for phase in phases:
        frame = load_sweep(folder / phase)
        frame.insert(0, "phase", [phase] * len(frame))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


# The manifest of a reproduction's folder (tune/reproduce.py writes it).
REPRODUCTION_MANIFEST = "reproduce.json"


def load_reproduction(folder) -> pd.DataFrame:
    """A reproduction's folder (``wirelessfl reproduce``'s) as ``load_tuning`` of its tuning
    study (``tune/``), or of each regime's (``tune-<regime>/``) with a ``regime`` column in
    front; the verdicts are claims.csv beside it."""
    folder = _folder(folder, "load_reproduction")
    if not (folder / REPRODUCTION_MANIFEST).is_file():
        raise UserError(f"{folder}: not a reproduction's folder (no {REPRODUCTION_MANIFEST}); "
                        "pass the folder 'wirelessfl reproduce' wrote (reproduced/NAME)")
    regimes = sorted(p for p in folder.glob("tune-*") if (p / "tune.json").is_file())
    if regimes:
        frames = []
        for study in regimes:
            frame = load_tuning(study)
            frame.insert(0, "regime", [study.name.removeprefix("tune-")] * len(frame))
            frames.append(frame)
        return pd.concat(frames, ignore_index=True)
    if not (folder / "tune").is_dir():  # a recorded summary (docs/data): tables, no runs
        tables = sorted(p.name for p in folder.glob("*.csv"))
        held = f"only the reproduction's tables ({', '.join(tables)})" if tables else "no runs"
        raise UserError(f"{folder}: holds {held}, not its runs (tune/), which "
                        "load_reproduction reads; read a table with pandas.read_csv (the "
                        "verdicts are claims.csv), or run 'wirelessfl reproduce' to have the runs")
    return load_tuning(folder / "tune")
