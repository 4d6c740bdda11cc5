"""A tuning study's tables as text cells, header first: the terminal and the HTML report share
them (results/summary.py's text_table draws them)."""

from __future__ import annotations

import json
import math

import pandas as pd

from wirelessfl.tune.study import STANDARD


def _num(value, digits: str = ".4g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:{digits}}"


def _pm(mean, half) -> str:
    text = _num(mean)
    return text if text == "-" or not math.isfinite(half) else f"{text} ± {_num(half, '.3g')}"


def _params(values: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, int | float) and not isinstance(v, bool)
                     else f"{k}={v}" for k, v in values.items())


def choice_cells(table: pd.DataFrame, choices: dict[str, dict], title: str) -> list[list[str]]:
    """Per tuned algorithm: the chosen parameters and what they scored on the tuning seeds."""
    cells = [["algorithm", "chosen parameters", f"{title} (tuning seeds)", "reached target",
              "healthy", "configurations tried"]]
    for label, values in choices.items():
        rows = table[table.algorithm == label]
        best = rows[rows.chosen].iloc[0]
        cells.append([label, _params(values), _pm(best.value_mean, best.value_ci95),
                      f"{best.reached}/{best.seeds}", f"{best.healthy}/{best.seeds}",
                      str(len(rows))])
    return cells


def tuning_cells(table: pd.DataFrame, label: str, params: list[str],
                 title: str) -> list[list[str]]:
    """Every configuration of one algorithm, best first."""
    rows = table[table.algorithm == label].sort_values("rank")
    cells = [["rank", *params, title, "reached", "healthy", "health"]]
    for r in rows.itertuples():
        cells.append([str(r.rank), *(_num(getattr(r, p), "g") if isinstance(getattr(r, p),
                                                                             int | float)
                                     else str(getattr(r, p)) for p in params),
                      _pm(r.value_mean, r.value_ci95), f"{r.reached}/{r.seeds}",
                      f"{r.healthy}/{r.seeds}", r.health])
    return cells


def evaluation_cells(evaluation: pd.DataFrame, title: str) -> list[list[str]]:
    """Tuned and untuned settings on the evaluation seeds: mean ± 95 % CI half-width (the
    standard columns less the one the objective already is)."""
    standard = [(c, head) for c, head in STANDARD if head != title]
    cells = [["algorithm", "parameters", title, "reached", "healthy",
              *(head for _, head in standard)]]
    for r in evaluation.itertuples():
        cells.append([r.algorithm, _params(json.loads(r.parameters)),
                      _pm(r.objective_mean, r.objective_ci95), f"{r.reached}/{r.seeds}",
                      f"{r.healthy}/{r.seeds}",
                      *(_pm(getattr(r, c), getattr(r, f"{c}_ci95")) for c, _ in standard)])
    return cells
