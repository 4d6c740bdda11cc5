"""The comparison table: rounds, seconds and joules to the target (a test accuracy, a gap
f - f* for problems with a known optimum, a test loss, a squared gradient norm or the worst
device's accuracy), and the energy split."""

from __future__ import annotations

import math
import textwrap

import pandas as pd

from wirelessfl.results.health import (
    HEALTH_FIELDS,
    assess,
    failed_reason,
    manifest_health,
)

SUMMARY_COLUMNS = [
    "algorithm", "rounds_to_target", "time_to_target_s", "energy_to_target_j",
    "system_energy_to_target_j", "compute_share", "radio_share", "idle_share", "final_accuracy",
    "final_worst_device_accuracy", "final_worst_class_accuracy", "final_suboptimality",
    "gradient_evaluations_to_target",
    "rounds", "sim_time_s", "energy_j", "energy_system_j", "uplink_bits_per_device_round",
    "in_time_fraction", "late_uploads",
    *HEALTH_FIELDS,
]


def reached_mask(group: pd.DataFrame, target: float | None,
                 target_suboptimality: float | None = None,
                 target_loss: float | None = None,
                 target_grad_norm_sq: float | None = None,
                 target_worst_device_accuracy: float | None = None) -> pd.Series:
    """Rows at which every given target holds: test accuracy >= ``target``, f - f* <=
    ``target_suboptimality``, test loss <= ``target_loss``, ||grad f||^2 <=
    ``target_grad_norm_sq`` and the worst device's accuracy >= ``target_worst_device_accuracy``
    (all but the gap also a reproduction claim's own target, tune/claims.py); all False when
    none is given."""
    if target is None and target_suboptimality is None and target_loss is None \
            and target_grad_norm_sq is None and target_worst_device_accuracy is None:
        return pd.Series(False, index=group.index)
    ok = pd.Series(True, index=group.index)
    if target is not None:
        ok &= group.test_accuracy >= target
    if target_suboptimality is not None:
        ok &= group.suboptimality <= target_suboptimality
    if target_loss is not None:
        ok &= group.test_loss <= target_loss
    if target_grad_norm_sq is not None:
        ok &= group.grad_norm_sq <= target_grad_norm_sq
    if target_worst_device_accuracy is not None:
        # NaN (a problem without per-device accuracy, a diverged run's last row, a run recorded
        # before the column) never holds
        worst = group.get("worst_device_accuracy", pd.Series(math.nan, index=group.index))
        ok &= worst >= target_worst_device_accuracy
    return ok


def summarize(rounds: pd.DataFrame, target: float | None, num_devices: int,
              target_suboptimality: float | None = None, manifest: dict | None = None
              ) -> pd.DataFrame:
    """One row per algorithm. The energy split is of the devices' energy to target (of the total
    if the target was not reached); 'radio' is uplink + downlink, 'idle' the waiting devices'
    draw. The system energy adds the base station's transmit energy (NaN for runs recorded
    before it was kept).

    The health columns (``healthy``, ``health`` and the numbers behind them, results/health.py)
    read the run's ``manifest`` for each algorithm's status, parameter names and the scenario's
    ``health:`` limits; without it the default limits apply and a diverged run is recognised by
    its last row (NaN test loss). An algorithm that failed before recording a row (status
    ``failed`` in the manifest) gets a row of its own, unhealthy, its numbers NaN. A test-loss
    target, a gradient-norm target and a worst-device accuracy target (the scenario's
    ``target_loss``, ``target_grad_norm_sq``, ``target_worst_device_accuracy``) are read from
    the manifest too."""
    limits, algorithms = manifest_health(manifest)
    scenario = (manifest or {}).get("scenario", {})
    target_loss, target_grad = scenario.get("target_loss"), scenario.get("target_grad_norm_sq")
    target_worst = scenario.get("target_worst_device_accuracy")
    out = []
    for algorithm, group in rounds.groupby("algorithm", sort=False):
        group = group.sort_values("round")
        status, fields = algorithms.get(algorithm, (None, None))
        health = assess(group, status, limits, fields)
        # a diverged run ends with a row whose learning metrics are NaN: report the last
        # evaluated model's
        evaluated = group[group.test_loss.notna()] if "test_loss" in group else group
        last = group.iloc[-1]
        final = evaluated.iloc[-1] if len(evaluated) else last
        reached = group[reached_mask(group, target, target_suboptimality, target_loss,
                                     target_grad, target_worst)]
        at = reached.iloc[0] if len(reached) else None
        basis = at if at is not None else last
        radio = basis.energy_uplink_j + basis.energy_downlink_j
        total = basis.energy_j
        completed = max(int(last["round"]), 1)
        out.append({
            "algorithm": algorithm,
            "rounds_to_target": int(at["round"]) if at is not None else None,
            "time_to_target_s": float(at.sim_time_s) if at is not None else math.nan,
            "energy_to_target_j": float(at.energy_j) if at is not None else math.nan,
            "system_energy_to_target_j": (_system_energy(at) if at is not None else math.nan),
            "compute_share": basis.energy_compute_j / total if total else math.nan,
            "radio_share": radio / total if total else math.nan,
            # runs recorded before idle power was charged have no such column
            "idle_share": (basis.get("energy_idle_j", 0.0) or 0.0) / total if total else math.nan,
            "final_accuracy": float(final.test_accuracy),
            # NaN for problems without accuracy and runs recorded before the column existed
            "final_worst_device_accuracy": float(final.get("worst_device_accuracy", math.nan)),
            "final_worst_class_accuracy": float(final.get("worst_class_accuracy", math.nan)),
            "final_suboptimality": float(final.get("suboptimality", math.nan)),
            # per device on average, cumulative (runs recorded before the column: NaN)
            "gradient_evaluations_to_target": (float(at.get("gradient_evaluations", math.nan))
                                               if at is not None else math.nan),
            "rounds": int(last["round"]),
            "sim_time_s": float(last.sim_time_s),
            "energy_j": float(last.energy_j),
            "energy_system_j": _system_energy(last),
            "uplink_bits_per_device_round": float(last.bits_up) / (num_devices * completed),
            "in_time_fraction": float(last.delivered_fraction),
            # runs recorded before deadlines existed have no such column
            "late_uploads": int(last.get("late_uploads", 0) or 0),
            **health,
        })
    recorded = {row["algorithm"] for row in out}
    for algorithm, (status, _) in algorithms.items():  # failed before its first evaluation
        if status == "failed" and algorithm not in recorded:
            out.append({"algorithm": algorithm, "rounds": 0, "healthy": False,
                        "health": failed_reason("before its first evaluation")})
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def _system_energy(row: pd.Series) -> float:
    """Devices + base station [J] at ``row``; NaN for a run recorded before the base station's
    energy was kept."""
    value = row.get("energy_system_j", math.nan)
    return math.nan if value is None else float(value)


def _fmt(value, kind: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "not reached" if kind in ("int", "time", "energy") else "-"
    if kind == "bool":
        return "yes" if value else "NO"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "acc":
        return f"{value:.4f}"
    if kind == "gap":
        return f"{value:.3g}"
    if kind == "bits":
        return f"{value:,.0f}"
    return f"{value:.4g}"


def describe_target(target: float | None, target_suboptimality: float | None,
                    target_loss: float | None = None,
                    target_grad_norm_sq: float | None = None,
                    target_worst_device_accuracy: float | None = None) -> str:
    """The summary's title line for the targets in force."""
    parts = ([f"target accuracy {target:.3f}"] if target is not None else []) + \
        ([f"target f - f* <= {target_suboptimality:g}"] if target_suboptimality is not None
         else []) + ([f"target test loss <= {target_loss:g}"] if target_loss is not None else []) \
        + ([f"target ||grad f||^2 <= {target_grad_norm_sq:g}"]
           if target_grad_norm_sq is not None else []) \
        + ([f"target worst-device accuracy {target_worst_device_accuracy:.3f}"]
           if target_worst_device_accuracy is not None else [])
    return " and ".join(parts) if parts else "no target set"


def summary_cells(table: pd.DataFrame) -> list[list[str]]:
    """The summary table as text cells, header first (terminal and HTML share it); the f - f*
    columns only where some run knows f*, the worst class only where the problem has classes."""
    head = [("algorithm", "algorithm", "str"),
            ("rounds_to_target", "rounds to target", "int"),
            ("time_to_target_s", "time to target [s]", "time"),
            ("energy_to_target_j", "energy to target [J]", "energy"),
            ("system_energy_to_target_j", "system to target [J]", "energy"),
            ("compute_share", "compute", "pct"), ("radio_share", "radio", "pct"),
            ("idle_share", "idle", "pct"),
            ("final_accuracy", "final acc.", "acc"),
            ("final_worst_device_accuracy", "worst device", "acc"),
            ("final_worst_class_accuracy", "worst class", "acc"),
            ("final_suboptimality", "final f - f*", "gap"),
            ("gradient_evaluations_to_target", "grads to target", "int"),
            ("rounds", "rounds", "int"),
            ("sim_time_s", "sim time [s]", "time"), ("energy_j", "energy [J]", "energy"),
            ("energy_system_j", "system energy [J]", "energy"),
            ("uplink_bits_per_device_round", "uplink bits/dev/round", "bits"),
            ("in_time_fraction", "delivered", "pct"), ("late_uploads", "late uploads", "int"),
            ("healthy", "healthy", "bool")]
    if table.final_suboptimality.isna().all():
        head = [h for h in head if h[0] not in ("final_suboptimality",
                                                "gradient_evaluations_to_target")]
    if table.final_worst_class_accuracy.isna().all():  # no classes (or recorded before)
        head = [h for h in head if h[0] != "final_worst_class_accuracy"]
    if table.energy_system_j.isna().all():  # recorded before the base station's energy
        head = [h for h in head if h[0] not in ("system_energy_to_target_j", "energy_system_j")]
    cells = [[title for _, title, _ in head]]
    for _, row in table.iterrows():
        cells.append([str(row[c]) if k == "str" else _fmt(row[c], k) for c, _, k in head])
    return cells


def health_lines(table: pd.DataFrame, unhealthy_only: bool = True) -> list[str]:
    """One line per algorithm (per unhealthy one by default) with its health verdict: the
    reasons, each with its number, its limit and what to change."""
    return [f"{row.algorithm}: {'healthy' if row.healthy else 'unhealthy'}: {row.health}"
            for row in table.itertuples() if not (unhealthy_only and row.healthy)]


# The terminal's summary fits this many columns [D]: a 100-column terminal, a SLURM log in an
# editor; every number stays in summary.csv at full precision.
TERMINAL_WIDTH = 100

# The terminal's three tables: (summary.csv column, header, format) per column. Shorter headers
# than summary_cells' (the title lines give the rest) and three significant figures for times
# and energies keep each table under TERMINAL_WIDTH for any label up to ~20 characters.
TO_TARGET = [("rounds_to_target", "rounds", "count"), ("time_to_target_s", "time [s]", "sig"),
             ("energy_to_target_j", "energy [J]", "sig"),
             ("system_energy_to_target_j", "system [J]", "sig"),
             ("gradient_evaluations_to_target", "gradients", "count")]
SPLIT = [("compute_share", "compute", "pct"), ("radio_share", "radio", "pct"),
         ("idle_share", "idle", "pct")]
IN_ALL = [("rounds", "rounds", "count"), ("sim_time_s", "time [s]", "sig"),
          ("energy_j", "energy [J]", "sig"), ("energy_system_j", "system [J]", "sig"),
          ("uplink_bits_per_device_round", "uplink [bit]", "count"),
          ("in_time_fraction", "delivered", "pct"), ("late_uploads", "late uploads", "count")]
LEARNING = [("final_accuracy", "final acc.", "acc"),
            ("final_worst_device_accuracy", "worst device", "acc"),
            ("final_worst_class_accuracy", "worst class", "acc"),
            ("final_suboptimality", "final f - f*", "sig"), ("healthy", "healthy", "bool")]


def format_summary(table: pd.DataFrame, target: float | None,
                   target_suboptimality: float | None = None,
                   width: int = TERMINAL_WIDTH, target_loss: float | None = None,
                   target_grad_norm_sq: float | None = None,
                   target_worst_device_accuracy: float | None = None) -> str:
    """The summary for the terminal, in three tables of at most ``width`` columns (the wide
    table of summary_cells needs ~250): to the target (with the energy split), after the last
    round, at the last evaluation. Columns with nothing to say are left out (module constants'
    comment; gradients to target stay with a gradient-norm target, f* known or not); labels too
    long for ``width`` lose their middle to an ellipsis."""
    drop = _unknown_columns(table)
    if target_grad_norm_sq is not None:
        drop.discard("gradient_evaluations_to_target")
    targeted = target is not None or target_suboptimality is not None or target_loss is not None \
        or target_grad_norm_sq is not None or target_worst_device_accuracy is not None
    goal = describe_target(target, target_suboptimality, target_loss, target_grad_norm_sq,
                           target_worst_device_accuracy)
    system = "" if "energy_system_j" in drop else "system: devices + base station; "
    split = ("compute, radio, idle: shares of the devices' energy to the target (of all of it "
             "if not reached)")
    sections = [
        ([f"to {goal} ('-': not reached)", split] if targeted else
         [f"{goal}; compute, radio, idle: shares of the devices' energy"],
         (TO_TARGET if targeted else []) + SPLIT),
        ([f"after the last round ({system}uplink: bits per device per round)"], IN_ALL),
        (["at the last evaluation"], LEARNING)]
    blocks = []
    for titles, columns in sections:
        columns = [c for c in columns if c[0] not in drop]
        blocks.append((titles, [["algorithm"] + [h for _, h, _ in columns]]
                       + [[""] + [_short(getattr(row, c), k) for c, _, k in columns]
                          for row in table.itertuples()]))
    # the label column's width: what the widest table leaves of ``width``
    rest = max(sum(max(len(r[i]) for r in cells) + 2 for i in range(1, len(cells[0])))
               for _, cells in blocks)
    labels = ["algorithm", *_squeeze([str(a) for a in table.algorithm],
                                     max(width - rest, len("algorithm")))]
    return "\n\n".join("\n".join(titles) + "\n" + text_table(
        [[label] + r[1:] for label, r in zip(labels, cells)]) for titles, cells in blocks)


def _unknown_columns(table: pd.DataFrame) -> set[str]:
    """The terminal tables' columns with nothing to say: f - f* and gradients to target
    without a known optimum, system energies of runs recorded before the base station's,
    accuracies of problems without classes, late uploads when no run had one (no deadline)."""
    unknown = {c for c in ("final_suboptimality", "energy_system_j", "final_accuracy",
                           "final_worst_device_accuracy", "final_worst_class_accuracy")
               if table[c].isna().all()}
    if "final_suboptimality" in unknown:
        unknown.add("gradient_evaluations_to_target")
    if "energy_system_j" in unknown:
        unknown.add("system_energy_to_target_j")
    if not (table.late_uploads.fillna(0) > 0).any():
        unknown.add("late_uploads")
    return unknown


def _short(value, kind: str) -> str:
    """A terminal cell: counts exact below a million (then three significant figures), times
    and energies to three significant figures, shares to 0.1 %, accuracies to 1e-4; '-' for
    what is unknown or not reached."""
    if value is None or pd.isna(value):
        return "-"
    if kind == "count":
        return f"{value:,.0f}" if abs(value) < 1e6 else f"{value:.3g}"
    if kind == "sig":
        return f"{value:.3g}"
    return _fmt(value, kind)


def _squeeze(labels: list[str], width: int) -> list[str]:
    """``labels`` in at most ``width`` characters each, the middle of a longer one replaced by
    an ellipsis: half the room for its start (the algorithm's name), half for its end (often
    what tells variants apart) [D]; where that makes two labels alike, the first split (moving
    the ellipsis toward the end, then toward the start) that keeps them apart."""
    room = width - 1

    def cut(head: int) -> list[str]:
        return [label if len(label) <= width else
                label[:head] + "…" + label[len(label) - (room - head):] for label in labels]

    for head in [room // 2, *range(room // 2 + 1, room + 1), *range(room // 2 - 1, -1, -1)]:
        squeezed = cut(head)
        if len(set(squeezed)) == len(set(labels)):
            return squeezed
    return cut(room // 2)


# A column narrowed to fit a width keeps at least its longest word, down to this many
# characters [D]; longer words are cut only when the table cannot fit otherwise.
NARROWEST_COLUMN = 8


def text_table(cells: list[list[str]], width: int | None = None, left: int = 1) -> str:
    """Header row, a rule, then rows; the first ``left`` columns left-aligned (labels, prose),
    the others right (numbers). With ``width``, the widest columns are narrowed until a line
    fits ``width`` and their cells wrap at spaces onto more lines (textwrap): a table of
    sentences (the reproduction's verdicts) stays readable in a terminal however long its
    statements and reasons grow, and every word is still printed; a blank line then parts the
    rows, which would otherwise run together."""
    widths = _column_widths(cells, width)
    rows = [[textwrap.wrap(c, w) if len(c) > w else [c] for c, w in zip(row, widths)]
            for row in cells]
    wraps = any(len(part) > 1 for row in rows[1:] for part in row)
    lines = []
    for k, row in enumerate(rows):
        if k > 1 and wraps:
            lines.append("")
        for n in range(max(map(len, row))):
            parts = [part[n] if n < len(part) else "" for part in row]
            lines.append("  ".join(c.ljust(w) if i < left else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(parts, widths))))
        if k == 0:
            lines.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
    return "\n".join(lines)


def _column_widths(cells: list[list[str]], width: int | None) -> list[int]:
    """Each column's width: its longest cell; with ``width``, the widest column one character
    narrower at a time (not below its longest word while another can give) until the columns
    and their two-space gaps fit ``width``."""
    columns = range(len(cells[0]))
    widths = [max(len(r[i]) for r in cells) for i in columns]
    if width is None:
        return widths
    longest_word = [max([NARROWEST_COLUMN, *(len(w) for r in cells for w in r[i].split())])
                    for i in columns]
    room = width - 2 * (len(widths) - 1)
    while sum(widths) > room:
        give = ([i for i in columns if widths[i] > longest_word[i]]
                or [i for i in columns if widths[i] > NARROWEST_COLUMN])
        if not give:
            break
        widths[max(give, key=lambda i: widths[i])] -= 1
    return widths
