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
from wirelessfl.tune.claims import Claim, judge
from wirelessfl.tune.objectives import OBJECTIVES, score
from wirelessfl.tune.spec import Tune, load_tune
from wirelessfl.tune.study import TuneResult, run_tune

KIND = "reproductions"


class ReproductionFile(BaseModel):
    """The keys of a reproduction file (docs/tuning.md, "Reproductions")."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = None
    title: str = Field(description="one line: what is reproduced")
    paper: str = Field(description="the paper (authors, year, title)")
    description: str | None = None
    tune: str = Field(description="the tune file (a catalog name or a path beside this file)")
    claims: list[Claim] = Field(min_length=1)

    # The name becomes the folder reproduced/<name>: no '/', no '..' (scenario/names.py).
    _safe_name = field_validator("name")(validated_name)

    @model_validator(mode="after")
    def _ids_unique(self):
        ids = [c.id for c in self.claims]
        if len(set(ids)) != len(ids):
            raise ValueError("two claims share an id")
        return self


@dataclass
class Reproduction:
    path: Path
    name: str
    spec: ReproductionFile
    tune: Tune
    document: dict = field(repr=False)


@dataclass
class ReproductionResult:
    out: Path
    tuning: TuneResult
    verdicts: list[dict]
    runs: pd.DataFrame  # every evaluation run: method, seed, health, the claims' metrics


def shipped() -> dict[str, Path]:
    """The reproductions that ship (name -> file)."""
    return catalog.entries(KIND)


def load_reproduction(name_or_path: str) -> Reproduction:
    """Read and validate a reproduction file and its tune file; every claim must name methods
    the tune file tunes (claims are judged on tuned settings only)."""
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
        raise UserError("; ".join(format_validation_error(err, str(path)).splitlines())) from None
    tune_path = catalog.find("scenarios", spec.tune, f"{path}: tune", path.parent)
    tune = load_tune(str(tune_path))
    for i, claim in enumerate(spec.claims):
        for method in claim.methods:
            if method not in tune.grids:
                raise UserError(f"{path}: claims[{i}] ({claim.id}): '{method}' is not tuned by "
                                f"{tune_path.name} (tuned: {', '.join(tune.grids)}); claims are "
                                "judged on tuned settings only")
        objective = OBJECTIVES.get(claim.metric)
        if objective is not None and objective.to_target and not tune.objective.to_target:
            raise UserError(f"{path}: claims[{i}] ({claim.id}): '{claim.metric}' needs a "
                            "target, which the tune file's scenario does not set")
    return Reproduction(path, spec.name or safe_name(path.stem, "reproduction"), spec, tune, doc)


def _metric(claim: Claim, outcome: dict) -> float:
    """The claim's metric for one evaluation run; NaN for a run that failed (no rounds)."""
    if outcome.get("rounds") is None:
        return math.nan
    objective = OBJECTIVES.get(claim.metric)
    if objective is not None:
        return score(objective, outcome["rounds"], *outcome["targets"])["value"]
    summary = outcome.get("summary")
    return float(summary[claim.metric]) if summary is not None else math.nan


def run_reproduction(repro: Reproduction, out: Path, executor: str, workers: int,
                     address: str | None = None, quiet: bool = False,
                     **sweep_options) -> ReproductionResult:
    """Tune and evaluate every method (``out/tune``), then judge each claim."""
    out = Path(out)
    result = run_tune(repro.tune, out / "tune", executor, workers, address, quiet,
                      **sweep_options)
    rows = []
    for setting, seed, outcome in result.evaluated:
        if not setting["tuned"]:
            continue
        row = {"method": setting["algorithm"], "seed": seed, "healthy": outcome["healthy"],
               "health": outcome["health"], "run": outcome.get("run", "")}
        for claim in repro.spec.claims:
            row[claim.metric] = _metric(claim, outcome)
        rows.append(row)
    runs = pd.DataFrame(rows)
    verdicts = []
    for claim in repro.spec.claims:
        by_method = {}
        for method, group in runs.groupby("method", sort=False):
            by_method[method] = [{"value": v, "reached": math.isfinite(v), "healthy": h}
                                 for v, h in zip(group[claim.metric], group.healthy)]
        verdicts.append(judge(claim, by_method))
    outcome = ReproductionResult(out, result, verdicts, runs)
    write_csv(out / "claims.csv", claims_frame(verdicts))
    write_csv(out / "runs.csv", runs)
    write_json(out / "reproduce.json", {
        "name": repro.name, "title": repro.spec.title, "paper": repro.spec.paper,
        "file": str(repro.path), "reproduction": repro.document, "verdicts": verdicts,
        "choices": result.choices, "warnings": result.warnings,
        "versions": package_versions(),
        "updated_at": datetime.now(UTC).isoformat(timespec="seconds")})
    return outcome


def claims_frame(verdicts: list[dict]) -> pd.DataFrame:
    """One row per claim and compared method (the machine-readable verdict table)."""
    rows = []
    for v in verdicts:
        for method, m in v["measured"].items():
            rows.append({"claim": v["claim"], "verdict": v["verdict"], "reason": v["reason"],
                         "metric": v["metric"], "method": method, "mean": m["mean"],
                         "ci95": m["ci95"] if math.isfinite(m["ci95"]) else math.nan,
                         "seeds_scored": m["scored"], "seeds": m["seeds"],
                         "seeds_healthy": m["healthy"]})
    return pd.DataFrame(rows)


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
        cells.append([v["verdict"], v["claim"], v["statement"] + where,
                      f"{v['metric']}: " + "; ".join(parts), why])
    return cells


def verdict_text(verdicts: list[dict], width: int = TERMINAL_WIDTH) -> str:
    """The verdict table for the terminal: every column is text, wrapped to fit ``width``
    (the paper's statements alone run to 200 characters)."""
    cells = verdict_cells(verdicts)
    return text_table(cells, width=width, left=len(cells[0]))
