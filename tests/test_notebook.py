"""What a notebook user sees: ``result.figure(...)`` shows as an image, and the user's own
pyplot figures still show after it (the report draws on Figure objects and never switches the
notebook's backend; report/plots.py). The notebook runs in a real Jupyter kernel (nbclient)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["population.num_devices=6", "algorithms.0.rounds=4", "algorithms.0.eval_every=2",
         "algorithms.1.rounds=2", "algorithms.1.eval_every=1", "algorithms.2.rounds=2",
         "algorithms.2.eval_every=1", "data.max_train_samples=300", "data.max_test_samples=100"]


def _images(cell) -> int:
    return sum("image/png" in out.get("data", {}) for out in cell.get("outputs", []))


@pytest.mark.slow
def test_a_result_figure_and_a_plain_plot_after_it_both_show(tmp_path):
    cells = [
        ("import wirelessfl\n"
         f"result = wirelessfl.run('quickstart', overrides={SMALL!r}, progress=True)\n"
         "result.figure('accuracy_vs_energy')"),
        "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\nplt.show()",
        "import matplotlib\nmatplotlib.get_backend()",
    ]
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("MPLBACKEND", None)
    client = nbclient.NotebookClient(book, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.km = client.create_kernel_manager()
    client.km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f",
                            "{connection_file}"]
    old = dict(os.environ)
    os.environ.update(env)
    try:
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    first, second, backend = book.cells
    assert _images(first) == 1, first["outputs"]
    assert _images(second) == 1, second["outputs"]
    shown = backend["outputs"][0]["data"]["text/plain"]
    assert "inline" in shown, shown
    # progress as a bar the notebook redraws, not a log's plain lines
    streams = "".join(o.get("text", "") for o in first["outputs"] if o["output_type"] == "stream")
    assert "progress:" not in streams
    assert "\r" in streams or any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                                  for o in first["outputs"])
