"""One colour per algorithm label, the same in every figure of a run, of a comparison or sweep,
and of a tuning study: a reader follows "FedAvg is green" from one figure to the next.

The colour is fixed by the label's place in the scenario's list of algorithms (the manifest's
``scenario.algorithms``, which every run of a sweep shares), then by first appearance for labels
the scenario does not list [D]: the order of a table's rows (which the figures used before, each
its own) differs between rounds.parquet, devices.parquet and a comparison's rows. A hash of the
label would also be stable across scenarios, but two labels of one figure could then share a
colour; the scenario's order never repeats a colour up to ``len(PALETTE)`` algorithms."""

from __future__ import annotations

from collections.abc import Iterable

import matplotlib

# matplotlib's tab10, then the ten lighter shades of tab20 [D]: fixed here, so a user's
# matplotlibrc colour cycle does not change the colours between machines.
PALETTE = ([matplotlib.colors.to_hex(c) for c in matplotlib.colormaps["tab10"].colors]
           + [matplotlib.colors.to_hex(c) for c in matplotlib.colormaps["tab20"].colors[1::2]])


def scenario_labels(manifest: dict) -> list[str]:
    """The labels of the scenario's algorithms, in the scenario's order (an algorithm without a
    label is recorded under its name)."""
    entries = (manifest.get("scenario") or {}).get("algorithms") or []
    return [str(e.get("label") or e.get("name")) for e in entries
            if isinstance(e, dict) and (e.get("label") or e.get("name"))]


def algorithm_colours(*orders: Iterable) -> dict[str, str]:
    """label -> colour (hex) for every label of ``orders``, taken in order of first appearance
    across them (pass the scenario's labels first, then the labels a table holds); labels
    beyond ``len(PALETTE)`` repeat the palette."""
    labels = dict.fromkeys(str(label) for order in orders for label in order)
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}


def run_colours(record) -> dict[str, str]:
    """The colours of a run's algorithms: the scenario's order from its manifest, then any other
    label its rounds or devices tables hold."""
    tables = [t.algorithm for t in (record.rounds, record.devices) if "algorithm" in t]
    return algorithm_colours(scenario_labels(record.manifest), *tables)
