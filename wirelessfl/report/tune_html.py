"""One self-contained HTML file for a tuning study (or a reproduction): the verdict, the choices with their warnings,
the evaluation table, every configuration tried, and the figures (report/html.py's page)."""

from __future__ import annotations

from pathlib import Path

from wirelessfl.report.compare_plots import draw_comparison
from wirelessfl.report.html import _figure, _page, _table, _text, _yaml_block
from wirelessfl.results.compare import compare_dirs
from wirelessfl.results.records import write_file
from wirelessfl.tune.reproduce import verdict_cells
from wirelessfl.tune.tables import choice_cells, evaluation_cells, tuning_cells


def tune_html(tune, result, out: Path, figures: list[Path]) -> Path:
    """Write ``out`` for ``result`` (a wirelessfl.tune.study.TuneResult) of ``tune``, showing
    ``figures`` (tune_plots.py's ``draw_tuning``); the comparison figures of the evaluation runs
    are drawn into the study folder first."""
    meta = (f"objective {tune.spec.objective}, tuning seeds {tune.spec.tuning_seeds}, "
            f"evaluation seeds {tune.spec.evaluation_seeds}, {result.out}")
    return write_file(out, _page(f"Tuning {tune.name}", meta,
                                 tune_sections(tune, result, figures)))


def reproduce_html(repro, outcome, out: Path, figures: dict[str, list[Path]]) -> Path:
    """The reproduction's page: per regime the verdict per claim, then every evaluation run's
    health, then each regime's tuning study (``figures``: regime -> its tuning figures, as for
    ``tune_html``)."""
    runs = outcome.runs
    several = len(repro.tunes) > 1
    health = [["regime", "method", "seed", "healthy", "health"][not several:]] + [
        [str(r.regime), str(r.method), str(r.seed), "yes" if r.healthy else "no",
         str(r.health)][not several:] for r in runs.itertuples()]
    sections = [f"<p>{_text(repro.spec.paper)}</p>",
                f"<p>{_text(repro.spec.description or '')}</p>",
                *([f"<p>{_text(repro.spec.note)}</p>"] if repro.spec.note else [])]
    for regime in repro.tunes:
        described = repro.regime(regime)
        title = f"Claims and verdicts: {described.title}" if described else None
        sections += claims_section([v for v in outcome.verdicts if v["regime"] == regime],
                                   title, described.note if described else "")
    sections += ["<h2>Health of every evaluation run</h2>",
                 _table(health, message_col=3 + several)]
    for regime, tune in repro.tunes.items():
        if several:
            sections.append(f"<h2>The study of regime {_text(regime)}</h2>")
        sections += tune_sections(tune, outcome.tunings[regime], figures.get(regime, []))
    meta = f"{repro.name}, {outcome.out}"
    return write_file(out, _page(f"Reproduction: {repro.spec.title}", meta, sections))


def claims_section(verdicts: list[dict], title: str | None = None, note: str = "") -> list[str]:
    """The reproduction's verdict per claim (tune/reproduce.py's ``verdict_cells``): a prose
    table, so that it fits the page however long the paper's statements and the reasons are."""
    return [f"<h2>{_text(title or 'Claims and verdicts')}</h2>",
            *([f"<p>{_text(note)}</p>"] if note else []),
            ("<p>A comparison is judged on the per-seed paired ratio of the tuned settings (the "
             "methods share the evaluation seeds): holds / does not hold when its 95 % interval "
             "is wholly past the claimed factor, one way or the other; inconclusive when it "
             "contains it, written 'not reproduced (inconclusive)' when the paired estimate "
             "goes against the paper, or when a compared run was unhealthy. 'Decided by "
             "per-round cost alone': the loser reached the target at its first evaluation, so "
             "the verdict says nothing about convergence.</p>"),
            _table(verdict_cells(verdicts), prose=True)]


def tune_sections(tune, result, figures: list[Path]) -> list[str]:
    """The HTML sections of a tuning study (shared by the tune and reproduce reports);
    ``figures``: the tuning figures ``draw_tuning`` wrote for ``result``."""
    title = tune.objective.title
    evaluation_dir = result.out / "evaluation"
    comparison = draw_comparison(compare_dirs([evaluation_dir]), result.out)
    warnings = "".join(f"<li>{_text(w)}</li>" for w in result.warnings)
    sections = [
        "<h2>Verdict</h2>", f"<p><strong>{_text(result.verdict)}</strong></p>",
        ("<p>Only tuned settings that were healthy (and reached the target) on every "
         "evaluation seed compete; a winner is named only when its 95 % interval does not "
         "overlap the runner-up's.</p>"),
        "<h2>Chosen settings</h2>", _table(choice_cells(result.tuning, result.choices, title)),
        f"<ul>{warnings}</ul>" if warnings else "<p>No warnings.</p>",
        "<h2>Evaluation on fresh seeds</h2>",
        ("<p>Mean ± half-width of the 95 % confidence interval (Student t) over the "
         "evaluation seeds; to-target columns over the seeds that reached the target. "
         "'(untuned)' rows run the scenario's own setting.</p>"),
        _table(evaluation_cells(result.evaluation, title)),
        "<h2>Figures</h2>",
        *(_figure(p, f"{p.stem.removeprefix('tune_')}: {title} of every configuration against "
                     "each tuned parameter; star = chosen") for p in figures),
        *(_figure(p, p.stem.replace("_", " ") + " (evaluation runs)") for p in comparison),
        "<h2>Every configuration tried</h2>",
    ]
    for label, spaces in tune.spaces.items():
        sections += [f"<h3>{_text(label)}</h3>",
                     _table(tuning_cells(result.tuning, label, list(spaces), title),
                            message_col=len(spaces) + 4)]
    return [*sections, _yaml_block("the tune file", tune.document, open_=True)]
