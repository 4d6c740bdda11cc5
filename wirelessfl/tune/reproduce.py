"""``wirelessfl reproduce NAME``: a paper's experiment from files shipped in the repository.

A reproduction file (``reproductions/NAME.yaml``) names a tune file (the scenario, every compared
method's search space, tuning and evaluation seeds) and lists the paper's claims
(tune/claims.py). The study is tuned and evaluated like ``wirelessfl tune``; each claim is then
judged from the tuned settings' evaluation runs, with 95 % confidence intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from wirelessfl.errors import UserError
from wirelessfl.results.records import package_versions, write_csv, write_json
from wirelessfl.results.summary import TERMINAL_WIDTH, text_table
from wirelessfl.scenario import catalog
from wirelessfl.scenario.loader import format_validation_error, refuse_other_kind
from wirelessfl.scenario.names import safe_name, validated_name
from wirelessfl.scenario.schema import unrecorded_target
from wirelessfl.tune.claims import (
    PER_ROUND_COST,
    Claim,
    decided_by_round_cost,
    judge,
    judge_across,
)
from wirelessfl.tune.objectives import OBJECTIVES, score
from wirelessfl.tune.spec import Tune, load_tune
from wirelessfl.tune.study import TuneResult, run_tune

KIND = "reproductions"
# The folder of the one study of a single-regime reproduction (a regime's: tune-<name>).
TUNE_FOLDER = "tune"


class Regime(BaseModel):
    """One setting of the paper's experiment the claims are judged in (its own tune file): the
    paper's task, say, and a harder one where the answer may change."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(description="a short name (the study's folder is tune-<name>)")
    title: str = Field(description="one line: what this regime is")
    tune: str = Field(description="its tune file (a catalog name or a path beside this file)")
    note: str = Field("", description="what the regime can and cannot show")

    _safe_name = field_validator("name")(validated_name)


class ReproductionFile(BaseModel):
    """The keys of a reproduction file (docs/tuning.md, "Reproductions")."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = None
    title: str = Field(description="one line: what is reproduced")
    paper: str = Field(description="the paper (authors, year, title)")
    description: str | None = None
    tune: str | None = Field(None, description="the tune file (a catalog name or a path beside "
                                               "this file); or 'regimes'")
    regimes: list[Regime] | None = Field(
        None, min_length=1, description="several settings, each with its own tune file; every "
                                        "claim is judged in each")
    note: str = Field("", description="what this reproduction can and cannot show")
    claims: list[Claim] = Field(min_length=1)

    # The name becomes the folder reproduced/<name>: no '/', no '..' (scenario/names.py).
    _safe_name = field_validator("name")(validated_name)

    @model_validator(mode="after")
    def _ids_unique(self):
        ids = [c.id for c in self.claims]
        if len(set(ids)) != len(ids):
            raise ValueError("two claims share an id")
        if (self.tune is None) == (self.regimes is None):
            raise ValueError("give either 'tune' (one study) or 'regimes' (several)")
        names = [r.name for r in self.regimes or []]
        if len(set(names)) != len(names):
            raise ValueError("two regimes share a name")
        for claim in self.claims:
            unknown = sorted(set(claim.regimes or claim.across or []) - set(names))
            if unknown:
                raise ValueError(f"claim '{claim.id}' names regimes {', '.join(unknown)}, which "
                                 f"are not listed under 'regimes' ({', '.join(names) or 'none'})")
        return self


@dataclass
class Reproduction:
    path: Path
    name: str
    spec: ReproductionFile
    tunes: dict[str, Tune]  # regime name -> its study ("" for a single-regime reproduction)
    document: dict = field(repr=False)

    @property
    def tune(self) -> Tune:
        """The first regime's study (the only one of a single-regime reproduction)."""
        return next(iter(self.tunes.values()))

    def folder(self, regime: str) -> str:
        """The study folder of ``regime`` inside the reproduction's folder."""
        return TUNE_FOLDER if regime == "" else f"{TUNE_FOLDER}-{regime}"

    def regime(self, name: str) -> Regime | None:
        return next((r for r in self.spec.regimes or [] if r.name == name), None)


@dataclass
class ReproductionResult:
    out: Path
    tunings: dict[str, TuneResult]  # regime -> its study
    verdicts: list[dict]  # one per claim and regime ("regime" key)
    runs: pd.DataFrame  # every evaluation run: regime, method, seed, health, the claims' metrics

    @property
    def tuning(self) -> TuneResult:
        return next(iter(self.tunings.values()))


def shipped() -> dict[str, Path]:
    """The reproductions that ship (name -> file)."""
    return catalog.entries(KIND)


def load_reproduction(name_or_path: str) -> Reproduction:
    """Read and validate a reproduction file and its tune file(s); every claim must name methods
    each tune file tunes (claims are judged on tuned settings only)."""
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        path = catalog.find(KIND, name_or_path, "reproduce")
    else:
        known = shipped()
        if name_or_path not in known:
            raise UserError(f"reproduce: unknown reproduction '{name_or_path}'; shipped: "
                            f"{', '.join(known) or 'none'} (wirelessfl reproduce --list)")
        path = known[name_or_path]
    doc = catalog.read_yaml(path, "reproduction file")
    refuse_other_kind(path, doc, name_or_path, "reproduction")
    if not isinstance(doc, dict):
        raise UserError(f"{path}: a reproduction file must be a mapping (title, paper, tune, "
                        "claims)")
    try:
        spec = ReproductionFile.model_validate(doc)
    except ValidationError as err:
        raise UserError("; ".join(format_validation_error(
            err, str(path), model=ReproductionFile, raw=doc).splitlines())) from None
    files = {"": spec.tune} if spec.tune is not None else {r.name: r.tune for r in spec.regimes}
    tunes = {}
    for regime, file in files.items():
        where = f"{path}: tune" if regime == "" else f"{path}: regime {regime}: tune"
        tune_path = catalog.find("scenarios", file, where, path.parent)
        tune = tunes[regime] = load_tune(str(tune_path))
        # the base problem's name when it leaves worst_device_accuracy NaN, else '' (asked
        # once per tune file, when a claim reads that column)
        worst_nan = None
        for i, claim in enumerate(spec.claims):
            if regime and not claim.judged_in(regime):
                continue  # its methods are tuned where it is judged
            for method in claim.methods:
                if method not in tune.grids:
                    raise UserError(f"{path}: claims[{i}] ({claim.id}): '{method}' is not tuned "
                                    f"by {tune_path.name} (tuned: {', '.join(tune.grids)}); "
                                    "claims are judged on tuned settings only")
            objective = OBJECTIVES.get(claim.metric)
            if objective is not None and objective.to_target and not tune.objective.to_target \
                    and claim.target is None:  # a claim's own target is read from full runs
                raise UserError(f"{path}: claims[{i}] ({claim.id}): '{claim.metric}' needs a "
                                "target, which the tune file's scenario does not set; give "
                                "the claim one (target: {accuracy: ...}, ...)")
            if claim.target is not None and claim.target.worst_device_accuracy is not None:
                if worst_nan is None:
                    base = tune.base_scenario()
                    worst_nan = (base.problem.name if unrecorded_target(
                        base, "target_worst_device_accuracy") else "")
                if worst_nan:
                    raise UserError(f"{path}: claims[{i}] ({claim.id}): target "
                                    f"worst_device_accuracy needs the worst_device_accuracy "
                                    f"column, which problem '{worst_nan}' does not "
                                    "record; read the claim at another target (accuracy, loss, "
                                    "grad_norm_sq)")
    return Reproduction(path, spec.name or safe_name(path.stem, "reproduction"), spec, tunes,
                        doc)


def _metric(claim: Claim, outcome: dict) -> tuple[float, bool]:
    """The claim's metric for one evaluation run (NaN for a run that failed: no rounds), and
    whether a to-target metric's target held at the run's first evaluation. A claim with its
    own target is read at that target from the same rounds."""
    if outcome.get("rounds") is None:
        return math.nan, False
    objective = OBJECTIVES.get(claim.metric)
    if objective is not None:
        if claim.target is not None:
            targets = claim.target.bounds
        else:
            targets = outcome["targets"]
        got = score(objective, outcome["rounds"], *targets)
        return got["value"], bool(got.get("first", False))
    summary = outcome.get("summary")
    return (float(summary[claim.metric]) if summary is not None else math.nan), False


def run_reproduction(repro: Reproduction, out: Path, executor: str, workers: int,
                     address: str | None = None, quiet: bool = False,
                     **sweep_options) -> ReproductionResult:
    """Tune and evaluate every method in each regime (``out/tune`` or ``out/tune-<regime>``),
    then judge each claim in each regime."""
    out = Path(out)
    tunings, rows = {}, []
    for regime, tune in repro.tunes.items():
        result = tunings[regime] = run_tune(tune, out / repro.folder(regime), executor, workers,
                                            address, quiet, **sweep_options)
        for setting, seed, outcome in result.evaluated:
            if not setting["tuned"]:
                continue
            row = {"regime": regime, "method": setting["algorithm"], "seed": seed,
                   "healthy": outcome["healthy"], "health": outcome["health"],
                   "run": outcome.get("run", "")}
            for claim in repro.spec.claims:
                if claim.judged_in(regime):
                    row[claim.column], row[f"{claim.column} first"] = _metric(claim, outcome)
            rows.append(row)
    runs = pd.DataFrame(rows)
    verdicts = [{"regime": regime, **verdict}
                for regime in repro.tunes for verdict in judge_regime(repro, runs, regime)]
    verdicts += [{"regime": claim.across[1], **judge_across(
        claim, _method_runs(runs, claim, claim.across[0]),
        _method_runs(runs, claim, claim.across[1]))}
        for claim in repro.spec.claims if claim.across is not None]
    outcome = ReproductionResult(out, tunings, verdicts, runs)
    write_csv(out / "claims.csv", claims_frame(verdicts))
    write_csv(out / "runs.csv", runs)
    write_json(out / "reproduce.json", {
        "name": repro.name, "title": repro.spec.title, "paper": repro.spec.paper,
        "file": str(repro.path), "reproduction": repro.document, "verdicts": verdicts,
        "choices": {r: t.choices for r, t in tunings.items()} if len(tunings) > 1
        else outcome.tuning.choices,
        "warnings": [w for t in tunings.values() for w in t.warnings],
        "versions": package_versions(),
        "updated_at": datetime.now(UTC).isoformat(timespec="seconds")})
    return outcome


def judge_regime(repro: Reproduction, runs: pd.DataFrame, regime: str) -> list[dict]:
    """Every claim's verdict from one regime's evaluation runs (a runs.csv table), the methods'
    runs paired by seed."""
    return [judge(claim, _method_runs(runs, claim, regime)) for claim in repro.spec.claims
            if claim.judged_in(regime) and claim.across is None]


def _method_runs(runs: pd.DataFrame, claim: Claim, regime: str) -> dict[str, list[dict]]:
    """Method -> its evaluation runs in ``regime`` as ``judge`` takes them (claim's column)."""
    mine = runs[runs.regime == regime] if len(runs) else runs
    return {method: [{"value": v, "reached": math.isfinite(v), "healthy": bool(h),
                      "seed": int(s), "first": bool(f)}
                     for v, h, s, f in zip(group[claim.column], group.healthy, group.seed,
                                           group[f"{claim.column} first"])]
            for method, group in mine.groupby("method", sort=False)}


def claims_frame(verdicts: list[dict]) -> pd.DataFrame:
    """One row per claim and compared method (the machine-readable verdict table)."""
    rows = []
    for v in verdicts:
        for method, m in v["measured"].items():
            rows.append({"regime": v.get("regime", ""), "claim": v["claim"],
                         "target": v.get("target") or "", "verdict": v["verdict"],
                         "reason": v["reason"], "note": v.get("note", ""),
                         "metric": v["metric"], "method": method, "mean": m["mean"],
                         "ci95": m["ci95"] if math.isfinite(m["ci95"]) else math.nan,
                         "seeds_scored": m["scored"], "seeds": m["seeds"],
                         "seeds_healthy": m["healthy"], **_paired_columns(v.get("paired"))})
    return pd.DataFrame(rows)


def _paired_columns(paired: dict | None) -> dict:
    """The paired estimate's columns of claims.csv (NaN for claims without one)."""
    paired = paired or {}
    return {"paired_estimate": paired.get("estimate", math.nan),
            "paired_low": paired.get("low", math.nan), "paired_high": paired.get("high", math.nan),
            "paired_seeds": paired.get("seeds", math.nan),
            "paired_seeds_past": paired.get("seeds_past", math.nan)}


def paired_text(v: dict) -> str:
    """The paired estimate in words: 'paired ratio 5.48 (95 % CI 1.77 to 17), 3 of 3 seeds'."""
    paired = v.get("paired")
    if not paired:
        return ""
    kind = "difference" if "within" in paired else "ratio"
    interval = (f" (95 % CI {paired['low']:.3g} to {paired['high']:.3g})"
                if math.isfinite(paired["low"]) else "")
    past = paired["within"] if kind == "difference" else paired["times"]
    bound = f"-{past:g}" if kind == "difference" else f"{past:g}"
    return (f"paired {kind} {paired['estimate']:.3g}{interval}, {paired['seeds_past']} of "
            f"{paired['seeds']} seeds past {bound}")


def verdict_cells(verdicts: list[dict]) -> list[list[str]]:
    """The verdict first (what a reader looks for), then the claim, the paper's statement, our
    numbers (mean ± 95 % half-width) and why. Keys of a verdict (tune/claims.py's ``judge``)
    other than those shown are left alone; an optional ``note`` follows the reason."""
    cells = [["verdict", "claim", "the paper says",
              "measured (mean ± 95 % CI over evaluation seeds)", "why"]]
    for v in verdicts:
        parts = []
        for method, m in v["measured"].items():
            if m["scored"]:
                half = f" ± {m['ci95']:.3g}" if math.isfinite(m["ci95"]) else ""
                parts.append(f"{method} {m['mean']:.4g}{half} ({m['scored']}/{m['seeds']})")
            else:
                parts.append(f"{method} - (0/{m['seeds']})")
        where = f" ({v['where']})" if v.get("where") else ""
        why = "; ".join(str(t) for t in (v["reason"], v.get("note")) if t)
        verdict = v["verdict"]
        if decided_by_round_cost(v):
            verdict = f"{verdict} ({PER_ROUND_COST})"
        metric = v["metric"] + (f" at {v['target']}" if v.get("target") else "")
        measured = "; ".join(parts) + (f"; {paired_text(v)}" if v.get("paired") else "")
        cells.append([verdict, v["claim"], v["statement"] + where, f"{metric}: {measured}",
                      why])
    return cells


def verdict_text(verdicts: list[dict], width: int = TERMINAL_WIDTH) -> str:
    """The verdict table for the terminal: every column is text, wrapped to fit ``width``
    (the paper's statements alone run to 200 characters)."""
    cells = verdict_cells(verdicts)
    return text_table(cells, width=width, left=len(cells[0]))
