"""One colour per algorithm, the same in every figure of a run, of a comparison or sweep, of a
tuning study, a reproduction and a crossover: a reader follows "FedAvg is green" from one figure
to the next, and from one scenario to the next.

The rule [D], deterministic:

1. every built-in algorithm has a fixed colour, by its name (the ``name`` of the manifest's
   ``scenario.algorithms`` entries, wirelessfl/plugins.py ``ALGORITHMS``): ``FIXED``. The first
   label of that algorithm in the figure's order gets it;
2. every other label (a second label of one algorithm, two ZO-HFL variants say, or a plugin,
   which has no fixed colour) gets the first colour of ``PALETTE`` that no label of the figure
   holds yet, in the figure's order.

The figure's order is the scenario's list of algorithms (``scenario_entries``), then any label
its tables hold that the scenario does not list; a comparison's, the records' scenarios in turn.
A run's figures colour all of the run's labels at once (``run_colours``), so a figure that draws
some of them uses the same colours as the one that draws all. Up to ``len(PALETTE)`` labels
never share a colour; more repeat the palette.

Energy kinds (report/plots.py ``KIND_COLOURS``) take pastel tints that are none of these:
algorithms are lines and points, drawn in saturated or dark colours that read as thin marks;
kinds are areas (stacked bars), which read in pastel."""

from __future__ import annotations

from collections.abc import Iterable

# One colour per built-in algorithm [D]: matplotlib's tab10 without its grey (grey is the base
# station's and the target line's), then eight darker, saturated colours, grey and black for the
# references off the air (a CIEDE2000 distance of at least 14 between any two of the twenty-six;
# tests/test_report_view.py). The
# names compared together in a shipped scenario take colours far apart: seed 002's DZOFL,
# FedSGD and FedAvg blue, orange, green (as the quickstart always drew them); seed 000's ZO-HFL
# against FedAvg, FedProx and SCAFFOLD; seed 003's FGDRO variants against FedAvg; seed 004's
# drift family. Written out, so a user's matplotlibrc colour cycle changes nothing.
FIXED = {
    "dzofl": "#1f77b4",          # blue
    "fedsgd": "#ff7f0e",         # orange
    "fedavg": "#2ca02c",         # green
    "fedprox": "#d62728",        # red
    "scaffold": "#9467bd",       # purple
    "zo-hfl": "#8c564b",         # brown
    "fgdro-cvar": "#e377c2",     # pink
    "fgdro-kl": "#bcbd22",       # olive
    "fgdro-kl-adam": "#17becf",  # cyan
    "fedmsa": "#393b79",         # indigo
    "fednest": "#9e0168",        # red violet
    "gd": "#3c4d03",             # dark olive green
    "dane": "#1b9e77",           # teal green
    "dane-plus": "#e6ab02",      # mustard
    "scaffold-cv": "#a6761d",    # ochre
    "scaffnew": "#653700",       # dark brown
    "fedred": "#c27e79",         # dusty rose
    "centralized-sgd": "#7f7f7f",  # grey: a reference off the air
    "centralized-stsa": "#000000",  # black: the other reference off the air
    # seed 003's baselines, added after the rest so that the palette's first free colours
    # (labels without a fixed one) stay those of earlier reports
    "fedadam": "#ff6347",        # tomato
    "local-adam": "#005f73",     # dark cyan blue
    "dr-dsgd": "#800000",        # maroon
    "drfa": "#00008b",           # dark blue
    # the methods over the analog uplink (issue 39), after the rest for the same reason
    "1p-zofl": "#008080",        # teal
    "aircomp-fedsgd": "#808000",  # olive
    "aircomp-fedavg": "#7fff00",  # chartreuse
}
# The colours a label without a fixed one takes, first free first: the fixed colours in the
# order above (tab10's first).
PALETTE = list(dict.fromkeys(FIXED.values()))


def scenario_entries(manifest: dict) -> list[tuple[str, str | None]]:
    """(label, algorithm name) of the scenario's algorithms, in the scenario's order (an
    algorithm without a label is recorded under its name)."""
    entries = (manifest.get("scenario") or {}).get("algorithms") or []
    out = []
    for e in entries:
        if isinstance(e, dict) and (e.get("label") or e.get("name")):
            name = e.get("name")
            out.append((str(e.get("label") or name), str(name) if name else None))
    return out


def scenario_labels(manifest: dict) -> list[str]:
    """The labels of the scenario's algorithms, in the scenario's order."""
    return [label for label, _ in scenario_entries(manifest)]


def algorithm_colours(*orders: Iterable) -> dict[str, str]:
    """label -> colour (hex) for every label of ``orders``, by the module's rule. Each order
    holds labels, or (label, algorithm name) pairs where the name is known (only a known
    built-in name has a fixed colour); labels are taken in order of first appearance across
    the orders (pass the scenario's entries first, then the labels a table holds)."""
    names: dict[str, str | None] = {}
    for order in orders:
        for item in order:
            label, name = (item if isinstance(item, tuple) else (item, None))
            label = str(label)
            if names.get(label) is None:
                names[label] = None if name is None else str(name)
    colours: dict[str, str] = {}
    for label, name in names.items():  # 1. the first label of each built-in: its colour
        fixed = FIXED.get(name or "")
        if fixed is not None and fixed not in colours.values():
            colours[label] = fixed
    for label in names:  # 2. the others: the first colour no label holds yet
        if label not in colours:
            held = set(colours.values())
            free = [c for c in PALETTE if c not in held]
            colours[label] = free[0] if free else PALETTE[len(colours) % len(PALETTE)]
    return {label: colours[label] for label in names}


def run_colours(record) -> dict[str, str]:
    """The colours of a run's algorithms: the scenario's entries from its manifest, then any
    other label its rounds or devices tables hold."""
    tables = [t.algorithm for t in (record.rounds, record.devices) if "algorithm" in t]
    return algorithm_colours(scenario_entries(record.manifest), *tables)
