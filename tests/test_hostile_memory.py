"""Hostile sizes (issue 20, "The memory check"): a population or a data file far too large for
the machine is refused from the scenario alone, before anything is loaded, built or written:
exit code 2, one ``error:`` line with the numbers, no traceback, no run folder. The commands run
in process (tests/hostile.py's ``run_in_process``); one runs again in a fresh interpreter (slow)."""

from __future__ import annotations

import gzip
import struct
import time

import pytest
import yaml

from tests.conftest import SMALL_BILEVEL, small_doc
from tests.hostile import RUNNERS, assert_refused, assert_untouched, runner_cases, snapshot

# A sanity bound only (a fresh interpreter importing torch on a loaded 2-core machine takes
# seconds); the check itself takes milliseconds (benchmarks/memory_estimate.json, "refusal").
SANITY_S = 120


def billion_doc(**changes) -> dict:
    """A billion devices on a problem without data (fedmsa.md's bilevel quadratic, one client
    per device), so that no check of a data split refuses it before the memory check."""
    doc = small_doc(problem=SMALL_BILEVEL, population={"num_devices": 1_000_000_000},
                    algorithms=[{"name": "fedmsa", "rounds": 2, "local_steps": 2}], **changes)
    for key in ("data", "model"):
        doc.pop(key)
    return doc


def write(path, doc) -> str:
    path.write_text(yaml.safe_dump(doc, sort_keys=False) if isinstance(doc, dict) else doc)
    return str(path)


@pytest.mark.parametrize(("command", "runner"),
                         runner_cases(["validate", "run"], in_a_fresh_interpreter=["run"]))
def test_a_billion_devices_is_refused_before_anything_is_built(tmp_path, command, runner):
    scenario = write(tmp_path / "billion.yaml", billion_doc())
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    start = time.perf_counter()
    proc = RUNNERS[runner](command, scenario,
                           *(["--out", str(out)] if command == "run" else []), cwd=tmp_path)
    assert time.perf_counter() - start < SANITY_S
    assert_refused(proc, "needs about", "GiB", "1,000,000,000 devices",
                   "population.num_devices")
    assert not out.exists()
    assert_untouched(tmp_path, before)


@pytest.mark.parametrize("value", ["1e9", "1.0e+9"])
def test_a_billion_written_as_a_float_is_one_error_line(tmp_path, value):
    """YAML reads ``1e9`` as a string and ``1.0e+9`` as a float: the schema refuses both (an
    integer is written in digits), one error line either way."""
    text = yaml.safe_dump(billion_doc(), sort_keys=False).replace("num_devices: 1000000000",
                                                                  f"num_devices: {value}")
    scenario = write(tmp_path / "billion.yaml", text)
    before = snapshot(tmp_path)
    out = tmp_path / "out"
    proc = RUNNERS["in-process"]("run", scenario, "--out", str(out), cwd=tmp_path)
    assert_refused(proc, "population.num_devices")
    assert not out.exists()
    assert_untouched(tmp_path, before)


def test_an_idx_bomb_is_refused_from_its_header(tmp_path):
    """A 0.4 MB gzip file of 500,000 blank 28 x 28 images (392 MB of bytes, 3.3 GiB at the
    loader's peak with its float32 copies) is refused from its header under a 1,000 MB memory
    limit, before the loader decompresses it into memory."""
    data = tmp_path / "data"
    data.mkdir()
    for name, count in (("train", 500_000), ("t10k", 1000)):
        with gzip.open(data / f"{name}-images-idx3-ubyte.gz", "wb", compresslevel=1) as fh:
            fh.write(struct.pack(">4i", 2051, count, 28, 28))
            for _ in range(count // 1000):
                fh.write(bytes(1000 * 28 * 28))
        (data / f"{name}-labels-idx1-ubyte.gz").write_bytes(
            gzip.compress(struct.pack(">2i", 2049, count) + bytes(count)))
    doc = small_doc(data={"name": "mnist", "root": str(data)}, model={"name": "logistic"},
                    engine={"memory_limit_mb": 1000})
    scenario = write(tmp_path / "bomb.yaml", doc)
    before = snapshot(tmp_path)
    proc = RUNNERS["in-process"]("run", scenario, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert_refused(proc, "needs about", "smaller data set")
    assert_untouched(tmp_path, before)


def test_the_label_histogram_of_100000_devices_is_drawn_in_proportion(tmp_path):
    """One filled outline per class (not a bar per device and class, which took minutes and
    gigabytes): 100,000 devices as 2,000 steps, each the mean of 50 consecutive devices,
    against a numpy re-computation of those means."""
    import numpy as np
    import pandas as pd

    from wirelessfl.report import plots
    from wirelessfl.results.records import RunRecord

    n, c = 100_000, 10
    counts = np.random.default_rng(0).integers(0, 9, (n, c))
    record = RunRecord(tmp_path, pd.DataFrame(), pd.DataFrame(),
                       {"partition": {"scheme": "iid", "params": {},
                                      "label_counts": counts.tolist()}})
    start = time.perf_counter()
    fig = plots.label_histogram(record)
    plots.write_png(fig, tmp_path / "h.png")
    assert time.perf_counter() - start < SANITY_S
    (ax,) = fig.axes[:1]
    assert not ax.patches and len(ax.collections) == c
    assert ax.get_ylabel() == "training samples (mean of 50 consecutive devices)"
    means = counts.reshape(n // 50, 50, c).mean(1).cumsum(1)  # stacked, per step
    for k, polygon in enumerate(ax.collections):
        y = polygon.get_paths()[0].vertices[:, 1]
        assert np.isclose(y.max(), means[:, k].max()) and np.isclose(y.min(), 0 if k == 0 else
                                                                    means[:, k - 1].min())
