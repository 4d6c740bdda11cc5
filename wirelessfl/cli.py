"""The command line: run, sweep, tune, compare, validate, report, list, profile, energy, link.

Bad input ends in one ``error: ...`` line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
from datetime import datetime
from pathlib import Path

from wirelessfl import __version__
from wirelessfl.errors import UserError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130

# Input shape and classes used by `wirelessfl profile` for each zoo model (the datasets they
# are meant for: seed-002 CNN on 28x28 binary images, MLP/logistic on 8x8 digits).
PROFILE_DEFAULTS = {"seed002-cnn": ((1, 28, 28), 2), "mlp": ((64,), 10), "logistic": ((64,), 10),
                    "resnet18-cifar": ((3, 32, 32), 10)}


def _check_threads(value: int | None) -> None:
    if value is not None and value < 1:
        raise UserError(f"--threads: must be a positive number of threads, got {value}")


def _check_executor(args) -> None:
    """--workers, --address and --threads of the commands that run many runs (sweep, tune,
    reproduce)."""
    if args.workers is not None and args.workers <= 0:
        raise UserError(f"--workers: must be a positive number of worker processes, "
                        f"got {args.workers}")
    if args.address and args.executor != "dask":
        raise UserError("--address is for --executor dask; the local executor runs on this "
                        "machine")
    _check_threads(args.threads)


def _interruptible(run, study, out: Path, args):
    """``run(study, out, ...)`` with the executor options every study command shares
    (``--executor``, ``--workers``, ``--address``, ``--quiet``, ``--threads``), or None after
    Ctrl-C / SIGTERM with the line saying the finished runs in ``out`` are kept (sweep, tune,
    reproduce: the same command again finishes the rest). SIGTERM (``scancel``, ``kill``) is
    Ctrl-C here: the workers are stopped and reaped, what finished is recorded, exit 130."""
    from wirelessfl.pipeline.runner import sigterm_as_interrupt
    from wirelessfl.sweep.executors import default_workers

    try:
        with sigterm_as_interrupt():
            return run(study, out, args.executor, args.workers or default_workers(),
                       args.address, args.quiet, threads=args.threads,
                       lockstep=not args.no_lockstep)
    except KeyboardInterrupt:
        print(f"interrupted: finished runs are kept in {out}; run the same command again to "
              "finish the rest", file=sys.stderr)
        return None


def _cmd_run(args) -> int:
    from wirelessfl.host.progress import RunProgress
    from wirelessfl.pipeline.runner import run_scenario
    from wirelessfl.report.plots import draw_report
    from wirelessfl.results.records import FINISHED, read_run
    from wirelessfl.results.summary import format_summary, health_lines
    from wirelessfl.scenario.loader import load_scenario, scenario_from_document

    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise UserError(f"--checkpoint-every must be a positive number of rounds, got "
                        f"{args.checkpoint_every}")
    _check_threads(args.threads)
    done: set[str] = set()
    if args.resume:
        if args.scenario or args.set or args.out:
            raise UserError("--resume RUN_DIR takes the scenario, overrides and folder from the "
                            "run's manifest; give no SCENARIO, --set or --out with it")
        from wirelessfl.pipeline.fingerprint import check_manifest_fingerprint

        out = Path(args.resume)
        record = read_run(out)
        # The manifest as written must be the one the run started with before any name in it
        # is resolved: a manifest edited to name other code is refused unread.
        check_manifest_fingerprint(out, record.manifest)
        scenario = scenario_from_document(record.manifest.get("scenario"),
                                          str(out / "manifest.json"))
        done = {k for k, v in record.manifest.get("algorithms", {}).items()
                if v.get("status") in FINISHED}
        stale_html = (out / "report.html").is_file()  # written of the unfinished run
    elif not args.scenario:
        raise UserError("give a SCENARIO to run (e.g. quickstart), or --resume RUN_DIR")
    else:
        stale_html = False
        scenario = load_scenario(args.scenario, args.set or [])
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path(args.out) if args.out else Path("runs") / f"{scenario.name}-{stamp}"
    progress = RunProgress([(p.display_name, p.rounds) for p in scenario.algorithms], done,
                           quiet=args.quiet)
    def announce(world) -> None:
        """What is about to run, once the pipeline has built the world."""
        d = world.evaluator.d
        what = (f"model {scenario.model.name} (d = {d:,}), dataset {scenario.data.name}"
                if world.flat is not None else f"problem {scenario.problem.name} (d = {d:,})")
        resumed = (f"; resuming: {len(done)} of {len(scenario.algorithms)} algorithms already "
                   "recorded" if args.resume else "")
        print(f"{scenario.name}: {world.num_devices} devices, {what}; results -> {out}"
              f"{resumed}", file=sys.stderr)

    try:
        _, table = run_scenario(scenario, out, on_world=announce, on_round=progress.update,
                                on_algorithm=progress.start, warn=progress.write,
                                resume=bool(args.resume), checkpoint_every=args.checkpoint_every,
                                threads=args.threads)
    except KeyboardInterrupt as stop:
        progress.close()
        print(_interrupted_run(out, stop), file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException:
        progress.abandon()  # the error line (cli.main) stands alone
        raise
    progress.close()
    print(format_summary(table, scenario.target_accuracy, scenario.target_suboptimality,
                         target_loss=scenario.target_loss,
                         target_grad_norm_sq=scenario.target_grad_norm_sq,
                         target_worst_device_accuracy=scenario.target_worst_device_accuracy))
    for line in health_lines(table):
        print(f"warning: {line}", file=sys.stderr)
    for note in json.loads((out / "manifest.json").read_text()).get("notes", []):
        print(f"note: {note}", file=sys.stderr)
    if len(scenario.algorithms) > 1:
        print("note: each algorithm ran at the scenario's own setting (untuned); name a winner "
              "only from tuned runs: wirelessfl tune (docs/tuning.md)", file=sys.stderr)
    figures = [] if args.no_report else draw_report(read_run(out))
    for path in figures:
        print(f"wrote {path}", file=sys.stderr)
    if stale_html:
        _renew_html(out, table, figures, args.no_report)
    return 0


def _interrupted_run(out: Path, stop: KeyboardInterrupt) -> str:
    """The line for a run that Ctrl-C or SIGTERM stopped, as its folder now reads, so that it
    never names a manifest that is not there: the status the manifest holds (the runner writes
    'interrupted' once the folder exists; a resumed folder stopped before its first write keeps
    its status) and the --resume that finishes the run, or, stopped before the folder's first
    write, that nothing was recorded."""
    why = f"{stop}; " if str(stop) else ""
    try:
        status = json.loads((out / "manifest.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        status = None
    if not isinstance(status, str):
        return (f"interrupted: {why}nothing was recorded in {out} yet; start the run again with "
                "the same command")
    return (f"interrupted: {why}the rounds recorded so far are in {out} (manifest status "
            f"'{status}'); finish the run with: wirelessfl run --resume {out}")


def _renew_html(out: Path, table, figures: list[Path], no_report: bool) -> None:
    """A run folder's report.html (``wirelessfl report --html``) written before ``--resume``
    finished the run describes the interrupted run: it is written again (or, with --no-report,
    which draws no figures, removed) so that no page in the folder says "interrupted" of a run
    that completed."""
    from wirelessfl.report.html import run_html
    from wirelessfl.results.records import read_run
    from wirelessfl.results.summary import summary_cells

    page = out / "report.html"
    if no_report:
        page.unlink(missing_ok=True)
        print(f"removed {page}, which described the interrupted run; write it again with: "
              f"wirelessfl report {out} --html", file=sys.stderr)
        return
    print(f"wrote {run_html(read_run(out), summary_cells(table), figures, page, table)}",
          file=sys.stderr)


def _cmd_sweep(args) -> int:
    from wirelessfl.sweep.spec import load_sweep
    from wirelessfl.sweep.study import run_sweep

    _check_executor(args)
    sweep = load_sweep(args.sweep)
    out = Path(args.out) if args.out else Path("sweeps") / sweep.name
    counts = _interruptible(run_sweep, sweep, out, args)
    if counts is None:
        return EXIT_INTERRUPTED
    print(f"{counts.finished} of {counts.total} runs finished ({counts.skipped} skipped as "
          f"already finished, {counts.ran} run now, {counts.failed} failed); results in {out}")
    if counts.failed:
        print(f"{counts.failed} runs failed: their errors are in {out / 'runs.csv'}; run the "
              "same command again to retry them", file=sys.stderr)
        return 1
    if not args.no_compare:
        from wirelessfl.results.compare import compare_dirs, format_comparison

        print(format_comparison(compare_dirs([out])))
        print(f"figures and report: wirelessfl report {out} --html", file=sys.stderr)
    return 0


def _cmd_tune(args) -> int:
    from wirelessfl.results.summary import text_table
    from wirelessfl.tune.spec import load_tune
    from wirelessfl.tune.study import run_tune
    from wirelessfl.tune.tables import choice_cells, evaluation_cells

    _check_executor(args)
    tune = load_tune(args.tune)
    out = Path(args.out) if args.out else Path("tunes") / tune.name
    result = _interruptible(run_tune, tune, out, args)
    if result is None:
        return EXIT_INTERRUPTED
    from wirelessfl.report.tune_plots import draw_tuning

    figures = draw_tuning(tune, result.tuning, result.out)
    title = tune.objective.title
    print(f"{tune.name}: objective {tune.spec.objective}, tuning seeds {tune.spec.tuning_seeds}, "
          f"evaluation seeds {tune.spec.evaluation_seeds}")
    print("chosen on the tuning seeds:\n" + text_table(choice_cells(result.tuning,
                                                                    result.choices, title)))
    print("on the evaluation seeds (mean ± 95 % CI half-width; to-target means over the seeds "
          "that reached it):\n" + text_table(evaluation_cells(result.evaluation, title)))
    print(f"verdict: {result.verdict}")
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    from wirelessfl.report.tune_html import tune_html

    print(f"wrote {tune_html(tune, result, out / 'report.html', figures)}", file=sys.stderr)
    failed = sum(c.failed for c in result.counts.values())
    if failed:
        print(f"{failed} runs failed (ranked as unhealthy); their errors are in "
              f"{out}/*/runs.csv; run the same command again to retry them", file=sys.stderr)
        return 1
    return 0


def _cmd_reproduce(args) -> int:
    from wirelessfl.tune.reproduce import (
        load_reproduction,
        run_reproduction,
        shipped,
        verdict_text,
    )

    if args.list:
        from wirelessfl.scenario import catalog

        for name, path in shipped().items():  # one unreadable file does not hide the others
            try:
                doc = catalog.read_yaml(path, "reproduction file")
            except UserError as err:
                print(f"{name:<16} (cannot be read: {err})")
                continue
            print(f"{name:<16} {doc.get('title', '') if isinstance(doc, dict) else ''}")
        return 0
    if not args.name:
        raise UserError("reproduce: give a reproduction's name (wirelessfl reproduce --list)")
    _check_executor(args)
    repro = load_reproduction(args.name)
    out = Path(args.out) if args.out else Path("reproduced") / repro.name
    outcome = _interruptible(run_reproduction, repro, out, args)
    if outcome is None:
        return EXIT_INTERRUPTED
    from wirelessfl.report.tune_html import reproduce_html, tune_html
    from wirelessfl.report.tune_plots import draw_tuning

    print(f"{repro.spec.title}\n{repro.spec.paper}")
    figures = {}
    for regime, tune in repro.tunes.items():
        result = outcome.tunings[regime]
        figures[regime] = draw_tuning(tune, result.tuning, result.out)
        tune_html(tune, result, result.out / "report.html", figures[regime])
        described = repro.regime(regime)
        if described is not None:
            print(f"\nregime {regime}: {described.title}")
        print(verdict_text([v for v in outcome.verdicts if v["regime"] == regime]))
        for warning in result.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    print(f"wrote {reproduce_html(repro, outcome, out / 'report.html', figures)}",
          file=sys.stderr)
    failed = sum(c.failed for t in outcome.tunings.values() for c in t.counts.values())
    if failed:
        print(f"{failed} runs failed; run the same command again to retry them",
              file=sys.stderr)
        return 1
    return 0


def _cmd_crossover(args) -> int:
    import math

    from wirelessfl.report.crossover_plots import draw_crossover
    from wirelessfl.results.summary import text_table
    from wirelessfl.tune.crossover import boundary_table, range_note, run_crossover, summary_lines

    out = Path(args.out) if args.out else Path(args.study) / "crossover"
    result = run_crossover(Path(args.study), out, args.method, args.throughput, args.rate,
                           args.points)
    figure = draw_crossover(result, out / "crossover.png")
    note = range_note(result)
    if note:
        print(f"note: {note}", file=sys.stderr)
    print("\n".join(summary_lines(result)))
    table = boundary_table(result)
    step = max(1, (len(result.rate) - 1) // 4)  # five rates across the range
    shown = table[table.uplink_rate_bps.isin(result.rate[::step])]
    rows = [["rate [bit/s]", "against", "time: equal at [MAC/s]", "seeds: from - to", "time",
             "device energy", "system energy"]]
    for row in shown.itertuples():
        theta, low, high = (row.time_boundary_macs_per_s, row.time_boundary_low_macs_per_s,
                            row.time_boundary_high_macs_per_s)
        pairs = row.seed_pairs
        rows.append([f"{row.uplink_rate_bps:.4g}", row.baseline,
                     f"{theta:.4g}" if math.isfinite(theta) else "-",
                     f"{low:.4g} - {high:.4g}" if not math.isnan(low) else "-", row.time,
                     (f"{'less' if row.energy_wins else 'more'} "
                      f"({row.energy_wins_seeds}/{pairs} seeds less)"),
                     (f"{'less' if row.system_energy_wins else 'more'} "
                      f"({row.system_energy_wins_seeds}/{pairs} seeds less)")])
    print(text_table(rows))
    print(f"wrote {out}/crossover_grid.csv, crossover_boundary.csv, crossover.json and {figure}",
          file=sys.stderr)
    return 0


def _cmd_validate(args) -> int:
    """Everything ``run`` (or ``sweep``, ``tune``, ``reproduce``) checks before it starts, with
    nothing run: the file, recognised by its shape, then every run's scenario through
    pipeline/preflight.py (``check_runnable`` and the memory estimate); plausibility warnings as
    ``warning:`` lines on stderr."""
    from wirelessfl.pipeline.preflight import check_runnable, check_runs
    from wirelessfl.scenario import catalog
    from wirelessfl.scenario.loader import file_kind, load_scenario

    path = _validated_file(args.scenario)
    doc = catalog.read_yaml(path, "scenario")
    kind = file_kind(doc)
    if kind in ("tune", "sweep", "reproduction") and args.set:
        where = "its tune file's 'set'" if kind == "reproduction" else "its 'set'"
        raise UserError(f"--set: {args.scenario} is a {kind} file; put overrides in {where}")
    if kind in ("tune", "reproduction"):
        from wirelessfl.tune.study import check_study

        if kind == "tune":
            from wirelessfl.tune.spec import load_tune

            studies = {"": load_tune(str(path))}
            head = f"{args.scenario}: valid tune file"
        else:
            from wirelessfl.tune.reproduce import load_reproduction

            repro = load_reproduction(str(path))
            studies = repro.tunes
            head = f"{args.scenario}: valid reproduction ({len(repro.spec.claims)} claims)"
        for regime, tune in studies.items():  # every regime's runs are checked
            warnings, tuning, evaluations = check_study(tune)
            _print_warnings(warnings)
            what = ((f" regime {regime}:" if regime else "") + f" with tune file "
                    f"{tune.path.name}" if kind == "reproduction" else "")
            print(f"{head}{_with_warnings(len(warnings))}{what} over '{tune.spec.scenario}' "
                  f"(objective {tune.spec.objective}; {tuning} tuning runs: "
                  + ", ".join(f"{label} {len(grid)} configurations" for label, grid in
                              tune.grids.items())
                  + f", x {len(tune.spec.tuning_seeds)} seeds; then {evaluations} evaluation "
                    "runs)")
        return 0
    if kind == "sweep":
        from wirelessfl.sweep.spec import load_sweep

        sweep = load_sweep(str(path))
        warnings = check_runs([(f"point {p.run_id}", p.scenario) for p in sweep.points],
                              str(sweep.path))
        _print_warnings(warnings)
        print(f"{args.scenario}: valid sweep{_with_warnings(len(warnings))} over "
              f"'{sweep.spec.scenario}' ({len(sweep.points)} "
              f"runs: {len(sweep.points) // len(sweep.spec.seeds)} points x "
              f"{len(sweep.spec.seeds)} seeds; keys: {', '.join(sweep.keys)})")
        return 0
    scenario = load_scenario(args.scenario, args.set or [])
    from wirelessfl.pipeline.memory import check_memory_from_scenario

    try:
        warnings = check_runnable(scenario)
        check_memory_from_scenario(scenario)  # what run checks next, before loading anything
    except UserError as err:
        given = "".join(f" --set {s}" for s in args.set or [])
        raise UserError(f"{path}{' with' + given if given else ''}: {err}") from None
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    names = ", ".join(p.display_name for p in scenario.algorithms)
    classes = scenario.population.classes
    energy = (f"energy '{scenario.energy.name}'" if classes is None else "device classes "
              + ", ".join(f"'{name}' {c.fraction:g}" for name, c in classes.items()))
    print(f"{args.scenario}: valid{_with_warnings(len(warnings))} "
          f"({scenario.population.num_devices} devices, channel '{scenario.channel.name}', "
          f"{energy}, algorithms: {names})")
    return 0


def _with_warnings(count: int) -> str:
    """', with N warnings' after 'valid' when there were any: a plain 'valid' under warning
    lines reads as if they did not matter (they are printed above, on stderr)."""
    return f", with {count} warning{'s' if count != 1 else ''}" if count else ""


def _validated_file(name: str):
    """The file ``validate`` reads: a path, a scenarios catalog name, or else a shipped
    reproduction's name (e.g. seed002)."""
    from wirelessfl.scenario import catalog

    try:
        return catalog.find("scenarios", name, "scenario")
    except UserError:
        shipped = catalog.entries("reproductions")
        if name in shipped:
            return shipped[name]
        raise


def _print_warnings(lines: list[str]) -> None:
    for line in lines:
        print(f"warning: {line}", file=sys.stderr)


def _cmd_report(args) -> int:
    from wirelessfl.report.plots import draw_report
    from wirelessfl.results.records import read_run
    from wirelessfl.results.summary import format_summary, health_lines, summarize, summary_cells

    folder = Path(args.run_dir)
    if (folder / "sweep.json").is_file():  # a sweep folder: the comparison over its runs
        return _compare([folder], Path(args.out) if args.out else folder, args.html)
    record = read_run(folder)
    n = record.manifest.get("scenario", {}).get("population", {}).get("num_devices", 1)
    targets = record.target_accuracy, record.target_suboptimality
    table = summarize(record.rounds, targets[0], n, targets[1], manifest=record.manifest)
    unfinished = _unfinished(record, folder)
    if unfinished:
        print(f"warning: {unfinished}", file=sys.stderr)
    print(format_summary(table, *targets, target_grad_norm_sq=record.target_grad_norm_sq,
                         target_worst_device_accuracy=record.target_worst_device_accuracy))
    print("health:\n" + "\n".join(f"  {line}" for line in health_lines(table, False)))
    figures = draw_report(record, args.out)
    for path in figures:
        print(f"wrote {path}")
    if args.html:
        from wirelessfl.report.html import run_html

        out = Path(args.out or folder) / "report.html"
        print(f"wrote {run_html(record, summary_cells(table), figures, out, table)}")
    return 0


def _unfinished(record, folder: Path) -> str | None:
    """The line saying that the run in ``folder`` did not finish, where it stopped and how to
    finish it (its tables and figures show only the rounds recorded so far); None for a run
    that finished (complete, or partial: an algorithm diverged or failed and the rest ran)."""
    from wirelessfl.results.records import FINISHED

    manifest = record.manifest
    status = manifest.get("status")
    if status in ("complete", "partial"):
        return None
    entries = manifest.get("algorithms", {})
    planned = [a.get("label") or a.get("name") for a in manifest["scenario"].get("algorithms", [])]
    stopped = next((label for label, entry in entries.items()
                    if entry.get("status") not in FINISHED), None)
    if stopped is None:  # killed: the running algorithm has no entry yet
        stopped = next((label for label in planned if label not in entries), None)
    finish = f"finish it with: wirelessfl run --resume {folder}"
    if stopped is None:
        return f"{folder}: the run did not finish (status '{status}'); {finish}"
    rounds = record.rounds["round"][record.rounds["algorithm"] == stopped]
    total = next((a.get("rounds") for a in manifest["scenario"].get("algorithms", [])
                  if (a.get("label") or a.get("name")) == stopped), None)
    of = f"of {total}; " if isinstance(total, int) else ""
    where = (f"after round {int(rounds.max())} of {stopped} ({of}the summary and figures show "
             "the rounds recorded so far)" if rounds.notna().any()
             else f"before {stopped} recorded a round")
    how = {"interrupted": "was interrupted", "failed": "failed (out of memory)"}.get(
        status, "did not finish (killed, or still running)")
    return f"{folder}: the run {how} {where}; {finish}"


def _compare(dirs: list[Path], out: Path, html: bool) -> int:
    """Print the comparison table of the runs in ``dirs``; write comparison.csv, the figures
    and (with ``html``) report.html into ``out``."""
    from wirelessfl.report.compare_plots import draw_comparison
    from wirelessfl.results.compare import compare_dirs, format_comparison
    from wirelessfl.results.records import output_folder, write_csv

    sweeps = [d for d in dirs if (d / "sweep.json").is_file()]
    if html and (len(dirs) != 1 or not sweeps):  # refused before anything is written
        raise UserError("--html: give one sweep folder (or use 'wirelessfl report RUN_DIR "
                        "--html' for one run)")
    comp = compare_dirs(dirs)
    for warning in comp.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(format_comparison(comp))
    write_csv(output_folder(out) / "comparison.csv", comp.table)
    print(f"wrote {out / 'comparison.csv'}")
    figures = draw_comparison(comp, out)
    for path in figures:
        print(f"wrote {path}")
    if html:
        from wirelessfl.report.html import sweep_html

        print(f"wrote {sweep_html(sweeps[0], comp, figures, out / 'report.html')}")
    return 0


def _cmd_compare(args) -> int:
    dirs = [Path(d) for d in args.dirs]
    out = Path(args.out) if args.out else (dirs[0] if len(dirs) == 1 else Path("comparison"))
    return _compare(dirs, out, args.html)


def _cmd_list(args) -> int:
    from wirelessfl.scenario import catalog

    for kind, rows in _plugin_rows():
        print(f"{kind}:")
        for name, text, origin in rows:
            print(f"  {name:<24} {text}{'  [' + origin + ']' if origin != 'built-in' else ''}")
    for kind in catalog.KINDS:
        print(f"{kind}:")
        for name, path in catalog.entries(kind).items():
            doc = catalog.read_yaml(path, kind)
            desc = doc.get("description", "") if isinstance(doc, dict) else ""
            print(f"  {name:<24} {str(desc).strip().splitlines()[0] if desc else ''}")
    return 0


def _plugin_rows() -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(kind, [(name, one line, origin)]) for every kind of part (plugins.py): the built-ins,
    then parts registered in this process and installed plugins; a plugin that fails to load is
    listed with its error, so one broken package does not hide the others."""
    from wirelessfl.channel.fading import BUILTIN_FADING
    from wirelessfl.learning.datasets import BUILTIN_DATASETS
    from wirelessfl.plugins import registries

    config_builtins = {"datasets": BUILTIN_DATASETS, "fading": BUILTIN_FADING}
    out = []
    for kind, registry in registries().items():
        rows = [(name, text, "built-in") for name, text in config_builtins.get(kind, {}).items()]
        for name in registry.names():
            try:
                obj = registry.get(name)
            except UserError as err:
                rows.append((name, f"fails to load: {err}", registry.origin(name)))
                continue
            doc = getattr(obj, "summary", None) or (obj.__doc__ or "").strip()
            rows.append((name, str(doc).splitlines()[0][:70] if doc else "",
                         registry.origin(name)))
        out.append((kind, rows))
    return out


def _load_energy_profile(name: str):
    from pydantic import ValidationError

    from wirelessfl.energy import EnergyProfile
    from wirelessfl.scenario import catalog
    from wirelessfl.scenario.loader import format_validation_error

    doc = catalog.load_mapping("energy", name, "--energy")
    try:
        return EnergyProfile.model_validate(doc)
    except ValidationError as err:
        raise UserError(format_validation_error(err, f"energy profile '{name}'")) from None


def _cmd_profile(args) -> int:
    import dataclasses

    from wirelessfl.energy import ComputeModel, profile_model
    from wirelessfl.learning.models import build_model
    from wirelessfl.plugins import MODELS

    MODELS.get(args.model, "profile: model")
    shape, classes = PROFILE_DEFAULTS.get(args.model, (None, None))
    if args.input_shape:
        shape = _parse_shape(args.input_shape)
    classes = args.classes or classes
    if shape is None or classes is None:
        raise UserError(f"profile: the plugin model '{args.model}' has no default input; give "
                        "--input-shape (e.g. 1,28,28) and --classes")
    profile = _load_energy_profile(args.energy)
    model = build_model(args.model, shape, classes, hidden=tuple(args.hidden))
    prof = profile_model(model, shape)
    bits = args.bits or 16
    cm = ComputeModel(profile, prof, bits)
    result = {"d": prof.params, "macs": prof.macs(args.batch),
              "activations": prof.activations(args.batch), "input_size": prof.input_size,
              "energy_forward_j": cm.forward_energy_j(args.batch),
              "energy_backward_j": cm.backward_energy_j(args.batch),
              "time_forward_s": cm.forward_time_s(args.batch),
              "time_backward_s": cm.backward_time_s(args.batch)}
    if args.json:
        # Per-layer counts are per sample (see wirelessfl/energy/profiler.py).
        result["layers"] = [dataclasses.asdict(layer) for layer in prof.layers]
        print(json.dumps(result))
        return 0
    print(f"{args.model} on input {shape}, batch {args.batch}, {bits}-bit forward, "
          f"energy profile '{profile.name}' (model {profile.model}):")
    for key, value in result.items():
        print(f"  {key:<18} {value:,}" if isinstance(value, int) else f"  {key:<18} {value:.6g}")
    if args.per_layer:
        print("per layer, one sample:")
        width = max([len(layer.name) for layer in prof.layers] + [5])
        print(f"  {'layer':<{width}}  {'type':<20} {'MACs':>15} {'params':>12} {'activations':>12}")
        for layer in prof.layers:
            print(f"  {layer.name or '(model)':<{width}}  {layer.type:<20} {layer.macs:>15,} "
                  f"{layer.params:>12,} {layer.activations:>12,}")
        print(f"  {'total':<{width}}  {'':<20} {prof.macs_per_sample:>15,} "
              f"{sum(layer.params for layer in prof.layers):>12,} "
              f"{prof.activations_per_sample:>12,}")
    return 0


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) <= 0:
        raise UserError(f"--input-shape {text!r}: give positive integers separated by commas, "
                        "e.g. 1,28,28")
    return shape


def _cmd_energy(args) -> int:
    from wirelessfl.energy import backward_energy_j, forward_energy_j

    profile = _load_energy_profile(args.profile)
    for flag in ("macs", "activations", "params", "input_size"):
        if getattr(args, flag) < 0:
            raise UserError(f"--{flag.replace('_', '-')}: must be non-negative, "
                            f"got {getattr(args, flag)}")
    bits = args.bits or 16
    counts = {"macs": args.macs, "activations": args.activations, "params": args.params}
    result = {"energy_forward_j": forward_energy_j(profile, input_size=args.input_size, bits=bits,
                                                   **counts),
              "energy_backward_j": backward_energy_j(profile, **counts)}
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:<18} {value:.6g}")
    return 0


def _cmd_link(args) -> int:
    from pydantic import ValidationError

    from wirelessfl.channel import Cell, ChannelConfig
    from wirelessfl.channel.analysis import MC_SAMPLES, budget_method, link_budget
    from wirelessfl.scenario import catalog
    from wirelessfl.scenario.loader import apply_override, check_values, format_validation_error

    if not args.distance > 0:
        raise UserError(f"--distance: must be a positive distance in metres, got {args.distance}")
    if args.bits < 0:
        raise UserError(f"--bits: must be a non-negative number of payload bits, got {args.bits}")
    doc = copy.deepcopy(catalog.load_mapping("channels", args.profile, "link"))
    source = f"channel profile '{args.profile}'"
    # The profile's keys (uplink.tx_power_dbm), or as a scenario's --set names them
    # (channel.uplink.tx_power_dbm), so one --set serves run, validate and link [D].
    sets = tuple((apply_override(doc, assignment.removeprefix("channel.")), f"--set {assignment}")
                 for assignment in args.set or [])
    try:
        config = ChannelConfig.model_validate(doc)
    except ValidationError as err:
        message = format_validation_error(err, source, model=ChannelConfig, raw=doc, sets=sets)
        raise UserError(message.replace("\n", "; ")) from None
    check_values(doc, config, source, sets=sets)
    low, high = config.min_distance_m, config.cell_radius_m
    if not low <= args.distance <= high:  # a budget no device of a scenario on it gets
        fix = (f"cell_radius_m={args.distance:g}" if args.distance > high
               else f"min_distance_m={args.distance:g}")
        print(f"warning: --distance {args.distance:g} m is outside the cell of {source} "
              f"(devices are placed from min_distance_m {low:g} m to cell_radius_m {high:g} m), "
              f"so no device of a scenario on it is there; to include it, --set {fix}",
              file=sys.stderr)
    los = None if args.los is None else args.los == "los"
    result = link_budget(config, args.distance, args.bits, los=los)
    if args.json:
        print(json.dumps(result))
        return 0
    method = budget_method(config)
    how = method if method != "monte-carlo" else f"Monte-Carlo over {MC_SAMPLES} packets"
    if config.path_loss.is_3gpp:
        state = Cell.median([args.distance], config, los).los[0]
        how += ", LOS" if state else ", NLOS"
    print(f"channel '{config.name or args.profile}', one device at {args.distance:g} m sending "
          f"{args.bits} bits ({how}, median path loss):")
    for key, value in result.items():
        print(f"  {key:<22} {value}" if isinstance(value, str) else f"  {key:<22} {value:.6g}")
    return 0


def _add_executor_options(parser: argparse.ArgumentParser) -> None:
    """--executor, --address, --workers, --threads, --quiet and --no-lockstep of the commands
    that run many runs (sweep, tune, reproduce); checked by _check_executor."""
    parser.add_argument("--executor", choices=["local", "dask"], default="local",
                        help="local worker processes (default) or Dask distributed")
    parser.add_argument("--address", help="Dask scheduler, e.g. tcp://10.0.0.5:8786 (default "
                                          "with --executor dask: a LocalCluster on this machine)")
    parser.add_argument("--workers", type=int,
                        help="worker processes (local executor, or the LocalCluster's; default: "
                             "the number of cores)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="host threads per run (default: the CPUs not busy with other work, "
                             "divided among the workers); the results do not depend on it")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress (neither the bar nor, in logs, the progress lines)")
    parser.add_argument("--no-lockstep", action="store_true",
                        help="run every point alone, also those that differ only in step sizes "
                             "(by default run together in one simulated world, docs/sweeps.md); "
                             "the results are the same, only slower")


def _add_reference_option(parser: argparse.ArgumentParser) -> None:
    """--allow-references of the commands that read a file naming parts (plugins.py): without
    it a name written as module:attribute is refused, since importing it runs its code."""
    parser.add_argument("--allow-references", action="store_true",
                        help="allow module:attribute names (e.g. my_algorithm:FedAvgM) in the "
                             "files read: each is imported, which runs its code, so give it only "
                             "for files you trust; also WIRELESSFL_ALLOW_REFERENCES=1 "
                             "(docs/plugins.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wirelessfl",
        description="Federated learning over a simulated wireless cell: every round timed in "
                    "seconds and costed in joules.")
    parser.add_argument("--version", action="version", version=f"wirelessfl {__version__}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a scenario and write its results folder")
    run.add_argument("scenario", nargs="?",
                     help="scenario file, or a name from the catalog (e.g. quickstart)")
    run.add_argument("--out", help="results folder (default: runs/<scenario>-<time>)")
    run.add_argument("--set", action="append", metavar="KEY.PATH=VALUE",
                     help="override a scenario key, e.g. --set channel.uplink.tx_power_dbm=10")
    run.add_argument("--quiet", action="store_true",
                     help="no progress (neither the bar nor, in logs, the progress lines)")
    run.add_argument("--threads", type=int, metavar="N",
                     help="host threads (default: the CPUs not busy with other work); the "
                          "results do not depend on it")
    run.add_argument("--no-report", action="store_true", help="do not draw the PNG figures")
    run.add_argument("--checkpoint-every", type=int, metavar="N",
                     help="save the running algorithm's full state every N rounds (atomically, "
                          "RUN_DIR/checkpoint.npz, data only), so --resume continues from there")
    run.add_argument("--resume", metavar="RUN_DIR",
                     help="finish an interrupted or killed run: keeps the algorithms it recorded, "
                          "continues the one that was running from its last checkpoint (or its "
                          "start) and runs the others; results identical to an uninterrupted run")
    _add_reference_option(run)
    run.set_defaults(func=_cmd_run)

    sw = sub.add_parser("sweep", help="run a sweep file (a grid over scenario keys x seeds) "
                                      "locally or on a Dask cluster; resumable")
    sw.add_argument("sweep", help="sweep file, or a name from the catalog (e.g. sweep-power)")
    sw.add_argument("--out", help="sweep folder (default: sweeps/<sweep name>); re-running "
                                  "into the same folder skips finished runs")
    _add_executor_options(sw)
    sw.add_argument("--no-compare", action="store_true",
                    help="do not print the comparison table at the end")
    _add_reference_option(sw)
    sw.set_defaults(func=_cmd_sweep)

    tn = sub.add_parser("tune", help="tune every algorithm of a scenario (grid search on tuning "
                                     "seeds), then compare the chosen settings on fresh seeds")
    tn.add_argument("tune", help="tune file, or a name from the catalog (e.g. quickstart-tune)")
    tn.add_argument("--out", help="study folder (default: tunes/<name>); re-running into the "
                                  "same folder skips finished runs")
    _add_executor_options(tn)
    _add_reference_option(tn)
    tn.set_defaults(func=_cmd_tune)

    rp = sub.add_parser("reproduce", help="run a paper's experiment shipped in reproductions/ "
                                          "(tuned methods, fresh seeds) and judge its claims")
    rp.add_argument("name", nargs="?", help="a shipped reproduction (see --list) or a file")
    rp.add_argument("--list", action="store_true", help="list the shipped reproductions")
    rp.add_argument("--out", help="folder (default: reproduced/<name>); re-running skips "
                                  "finished runs")
    _add_executor_options(rp)
    _add_reference_option(rp)
    rp.set_defaults(func=_cmd_reproduce)

    cx = sub.add_parser("crossover", help="where a method (DZOFL) beats the other tuned "
                        "methods in time and energy to the target, over device throughput x "
                        "uplink rate, from a tune or reproduce folder")
    cx.add_argument("study", help="folder written by 'wirelessfl tune' (or 'reproduce')")
    cx.add_argument("--out", help="output folder (default: STUDY/crossover)")
    cx.add_argument("--method", default="DZOFL", help="the method's label (default: DZOFL)")
    cx.add_argument("--throughput", type=float, nargs=2, metavar=("LO", "HI"),
                    help="device throughput range [MAC/s] (default: the scenario's / 100 to x 100)")
    cx.add_argument("--rate", type=float, nargs=2, metavar=("LO", "HI"),
                    help="uplink rate range [bit/s], within what the MCS table carries on the "
                         "uplink band (default: the scenario's / 100 to x 100, clipped to it)")
    cx.add_argument("--points", type=int, default=41, help="grid points per axis (default: 41)")
    cx.set_defaults(func=_cmd_crossover)

    val = sub.add_parser("validate", help="check a scenario file without running it")
    val.add_argument("scenario")
    val.add_argument("--set", action="append", metavar="KEY.PATH=VALUE")
    _add_reference_option(val)
    val.set_defaults(func=_cmd_validate)

    rep = sub.add_parser("report", help="summary table and figures from a saved run or sweep")
    rep.add_argument("run_dir", help="a run folder, or a sweep folder (then: the comparison)")
    rep.add_argument("--out", help="folder for the figures (default: the run folder)")
    rep.add_argument("--html", action="store_true",
                     help="also write report.html: one self-contained file (scenario, tables, "
                          "figures) readable offline")
    rep.set_defaults(func=_cmd_report)

    cmp = sub.add_parser("compare", help="mean and 95 %% CI over seeds per configuration, "
                                         "across sweep and run folders, with figures")
    cmp.add_argument("dirs", nargs="+", metavar="DIR", help="sweep folders or run folders")
    cmp.add_argument("--out", help="folder for comparison.csv and the figures (default: the "
                                   "one DIR given, else ./comparison)")
    cmp.add_argument("--html", action="store_true", help="also write report.html (one sweep)")
    cmp.set_defaults(func=_cmd_compare)

    lst = sub.add_parser("list", help="algorithms, models, datasets, fading and compute models "
                                        "(plugins too), channel and energy profiles, scenarios")
    lst.set_defaults(func=_cmd_list)

    prof = sub.add_parser("profile", help="count a model's parameters, MACs and activations, "
                                          "and price a pass on an energy profile")
    prof.add_argument("model")
    prof.add_argument("--energy", default="seed002-accelerator", help="energy profile")
    prof.add_argument("--batch", type=int, default=1)
    prof.add_argument("--bits", type=int, help="forward precision M (default 16)")
    prof.add_argument("--input-shape", help="per-sample shape, e.g. 1,28,28")
    prof.add_argument("--classes", type=int, help="number of outputs")
    prof.add_argument("--hidden", type=int, nargs="*", default=[64], help="MLP hidden widths")
    prof.add_argument("--per-layer", action="store_true",
                      help="also print MACs, parameters and activations of every layer")
    prof.add_argument("--json", action="store_true", help="one JSON object (with the layers)")
    _add_reference_option(prof)
    prof.set_defaults(func=_cmd_profile)

    en = sub.add_parser("energy", help="seed-002 energy model (eqs. 5-10) for counts you give")
    en.add_argument("profile")
    en.add_argument("--macs", type=float, required=True, help="N_c, MACs of the pass")
    en.add_argument("--activations", type=float, required=True, help="O_c, activations")
    en.add_argument("--params", type=float, required=True, help="d, parameters")
    en.add_argument("--input-size", type=float, required=True, help="x_in, input values read")
    en.add_argument("--bits", type=int, help="forward precision M (default 16)")
    en.add_argument("--json", action="store_true")
    _add_reference_option(en)
    en.set_defaults(func=_cmd_energy)

    ln = sub.add_parser("link", help="link budget of one device: SNR, delivery, airtime, energy")
    ln.add_argument("profile", help="channel profile name (see 'wirelessfl list') or YAML file")
    ln.add_argument("--distance", type=float, required=True, help="ground distance to the base "
                                                                  "station [m]")
    ln.add_argument("--bits", type=int, required=True, help="payload bits of the packet")
    ln.add_argument("--set", action="append", metavar="KEY.PATH=VALUE",
                    help="override a key of the profile, e.g. --set uplink.tx_power_dbm=10 "
                         "(or channel.uplink.tx_power_dbm=10, as run and validate name it)")
    ln.add_argument("--los", choices=["los", "nlos"],
                    help="3GPP profiles: LOS state (default: the more likely one at --distance)")
    ln.add_argument("--json", action="store_true")
    _add_reference_option(ln)
    ln.set_defaults(func=_cmd_link)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. Every expected failure ends here as one ``error:`` line and exit code 2:
    a UserError (bad input, a damaged run folder), and as a last resort the operating system's
    refusals (disk full, read-only folder, missing path), memory and recursion exhausted. Output
    piped into a reader that stopped (``| head``) ends quietly. Anything else is a bug and keeps
    its traceback."""
    try:
        code = _dispatch(argv)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:
        return _reader_gone()


def _dispatch(argv: list[str] | None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, extra = parser.parse_known_args(argv)
    if extra:  # what parse_args refuses; a --set written as two words is said so
        split = _split_set(argv)
        if split is not None:
            return _error(split)
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "batch", 1) is not None and getattr(args, "batch", 1) <= 0:
        print("error: --batch must be a positive integer", file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        with _reference_setting(args):
            return args.func(args)
    except UserError as err:
        return _error(str(err))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        raise
    except OSError as err:
        from wirelessfl.errors import os_error_message

        return _error(os_error_message(err))
    except MemoryError:
        return _error("out of memory: lower population.num_devices, use a smaller model, or "
                      "lower engine.max_chunk_mb (docs/reliability.md, 'Memory'); a run keeps "
                      "what it recorded: finish it with 'wirelessfl run --resume RUN_DIR'")
    except RecursionError:
        return _error("the input is nested too deeply to process (Python's recursion limit): "
                      "flatten the file or value given")


def _reference_setting(args) -> contextlib.AbstractContextManager:
    """References allowed for the command with --allow-references (put back after it, for a
    caller of ``main`` in the same process); otherwise the environment variable decides."""
    if not getattr(args, "allow_references", False):
        return contextlib.nullcontext()
    from wirelessfl.plugins import allow_references

    return allow_references()


def _split_set(argv: list[str]) -> str | None:
    """The message for a ``--set`` written as several words (``--set KEY VALUE``, ``--set KEY=
    VALUE``, ``--set KEY = VALUE``), where argparse would only call the rest an unrecognized
    argument; or None."""
    for i, word in enumerate(argv):
        if word == "--set" and i + 2 < len(argv):
            key, words = argv[i + 1], argv[i + 2:i + 4]
        elif word.startswith("--set=") and i + 1 < len(argv):
            key, words = word.removeprefix("--set="), argv[i + 1:i + 3]
        else:
            continue
        value = words[0]
        if not key or key.startswith("-") or not _a_value(value) \
                or not "".join(words).isprintable() or not key.isprintable():
            continue
        if "=" not in key and value == "=" and len(words) > 1:
            given, fixed = f"{key} = {words[1]}", f"{key}={words[1]}"
        elif "=" not in key:
            given, fixed = f"{key} {value}", f"{key}={value.removeprefix('=')}"
        elif key.endswith("=") and key.count("=") == 1:
            given, fixed = f"{key} {value}", f"{key}{value}"
        else:
            continue
        return (f"--set {given}: a --set is one word, KEY.PATH=VALUE with no spaces around "
                f"'='; write --set {fixed} (quote it if the value holds spaces)")
    return None


def _a_value(word: str) -> bool:
    """``word`` reads as a value, not as an option (a negative number is a value)."""
    return not word.startswith("-") or word[1:2].isdigit() or word[1:2] == "."


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USER_ERROR


def _reader_gone() -> int:
    """The reader of our output closed the pipe (``wirelessfl list | head -1``): stop quietly.
    As Python's documentation advises (signal module, "Note on SIGPIPE"), stdout and stderr are
    pointed at /dev/null so the interpreter's last flush does not fail again; the exit code is
    what a command killed by SIGPIPE reports (128 + 13)."""
    import os
    import signal

    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):  # a stream without a descriptor (captured by a test)
            pass
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
