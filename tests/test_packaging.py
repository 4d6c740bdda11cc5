"""A non-editable install must find the catalogs: they ship inside the wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_contains_the_catalogs(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(tmp_path)], check=True,
                   capture_output=True)
    (wheel,) = tmp_path.glob("wirelessfl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for kind in ("channels", "energy", "scenarios", "reproductions"):
        shipped = {p.name for p in (ROOT / kind).glob("*.yaml")}
        assert shipped, kind
        for name in shipped:
            assert f"wirelessfl/_catalog/{kind}/{name}" in names
    assert "wirelessfl/cli.py" in names
    for module in ("sweep/spec.py", "sweep/worker.py", "results/compare.py", "report/html.py",
                   "tune/study.py", "tune/reproduce.py", "host/threads.py", "results/health.py"):
        assert f"wirelessfl/{module}" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "wirelessfl = wirelessfl.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
