"""A tuning study's tables as text cells, header first: the terminal and the HTML report share
them (results/summary.py's text_table draws them)."""

from __future__ import annotations

import json
import math

import pandas as pd

from wirelessfl.tune.spec import TIE
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


def _tied_together(values: dict, best: pd.Series) -> dict:
    """A choice's parameters (``values``, tied keys expanded) with each tied key of the tuning
    table (a column 'beta1=beta2' that ``best``, the chosen row, has a value in) written once:
    {'beta1=beta2': 0.1} for {'beta1': 0.1, 'beta2': 0.1}."""
    ties = {}
    for column, value in best.items():
        names = str(column).split(TIE)
        if len(names) < 2 or not all(n in values for n in names) \
                or not all(values[n] == values[names[0]] for n in names):
            continue
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue  # another algorithm's key
        ties.update(dict.fromkeys(names, column))
    shown = {}
    for name, value in values.items():
        shown.setdefault(ties.get(name, name), value)
    return shown


def choice_cells(table: pd.DataFrame, choices: dict[str, dict], title: str) -> list[list[str]]:
    """Per tuned algorithm: the chosen parameters (a tied key once, 'beta1=beta2=0.1') and what
    they scored on the tuning seeds."""
    cells = [["algorithm", "chosen parameters", f"{title} (tuning seeds)", "reached target",
              "healthy", "configurations tried"]]
    for label, values in choices.items():
        rows = table[table.algorithm == label]
        best = rows[rows.chosen].iloc[0]
        cells.append([label, _params(_tied_together(values, best)),
                      _pm(best.value_mean, best.value_ci95),
                      f"{best.reached}/{best.seeds}", f"{best.healthy}/{best.seeds}",
                      str(len(rows))])
    return cells


def tuning_cells(table: pd.DataFrame, label: str, params: list[str],
                 title: str) -> list[list[str]]:
    """Every configuration of one algorithm, best first; ``params`` are its search keys (a
    tied key 'beta1=beta2' is one column of ``table``, read by name: not an identifier)."""
    rows = table[table.algorithm == label].sort_values("rank")
    cells = [["rank", *params, title, "reached", "healthy", "health"]]
    for r in rows.to_dict("records"):
        cells.append([str(r["rank"]),
                      *(_num(r[p], "g") if isinstance(r[p], int | float) else str(r[p])
                        for p in params),
                      _pm(r["value_mean"], r["value_ci95"]), f"{r['reached']}/{r['seeds']}",
                      f"{r['healthy']}/{r['seeds']}", r["health"]])
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
