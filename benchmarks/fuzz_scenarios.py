"""Fuzz the scenario loader and `wirelessfl validate` with generated input (issue 11).

Generates --examples documents of each family of ``tests/scenario_fuzz.py`` (mutated scenario
documents fed to the loader; raw YAML bytes with corruptions, anchors, aliases, tags, unsafe
Python tags and non-UTF-8 bytes, written to a file and fed to ``wirelessfl validate``), and counts
what each ended in: valid, rejected cleanly (one ``error:`` message naming the file, exit code 2)
or crashed (anything else: a traceback, another exit code, an unsafe tag executed).

    python benchmarks/fuzz_scenarios.py [--examples 5000] [--out benchmarks/fuzz_scenarios.json]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.scenario_fuzz import UNSAFE_MARKER, classify, documents, yaml_bytes
from wirelessfl.cli import main as cli_main


def validate_file(data: bytes, folder: Path) -> str:
    """'valid' or 'rejected' from `wirelessfl validate` on a file holding ``data``."""
    path = folder / "fuzz.yaml"
    path.write_bytes(data)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(["validate", str(path)])
    text = err.getvalue()
    if code == 0:
        return "valid"
    if code == 2 and text.startswith("error: ") and str(path) in text \
            and "Traceback" not in text:
        return "rejected"
    raise AssertionError(f"exit code {code}, stderr {text[:300]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=5000, help="per family")
    parser.add_argument("--out", default="benchmarks/fuzz_scenarios.json")
    args = parser.parse_args()
    counts = {"documents": collections.Counter(), "yaml_files": collections.Counter()}
    crashes: dict[str, str] = {}
    folder = Path(tempfile.mkdtemp())

    def record(family: str, run) -> None:
        try:
            counts[family][run()] += 1
        except Exception as exc:  # noqa: BLE001 - a crash is what we are counting
            counts[family]["crashed"] += 1
            crashes.setdefault(f"{type(exc).__name__}: {str(exc)[:120]}",
                               traceback.format_exc()[-2000:])

    config = settings(max_examples=args.examples, database=None, deadline=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))

    @config
    @given(documents())
    def fuzz_documents(doc):
        record("documents", lambda: classify(doc)[0])

    @config
    @given(yaml_bytes())
    def fuzz_files(data):
        record("yaml_files", lambda: validate_file(data, folder))

    start = time.perf_counter()
    fuzz_documents()
    fuzz_files()
    unsafe = [str(p) for p in (Path.cwd() / UNSAFE_MARKER, folder / UNSAFE_MARKER) if p.exists()]
    total = {k: sum(c[k] for c in counts.values()) for k in ("valid", "rejected", "crashed")}
    report = {"tried": sum(total.values()), **total, "unsafe_tags_executed": len(unsafe),
              "by_family": {f: dict(c) for f, c in counts.items()},
              "crash_samples": crashes, "seconds": round(time.perf_counter() - start, 1)}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"tried {report['tried']:,}: valid {total['valid']:,}, rejected cleanly "
          f"{total['rejected']:,}, crashed {total['crashed']:,}, unsafe tags executed "
          f"{len(unsafe)} ({report['seconds']} s)")
    for family, c in counts.items():
        print(f"  {family}: {dict(c)}")
    for key in crashes:
        print(f"CRASH {key}")
    sys.exit(1 if total["crashed"] or unsafe else 0)


if __name__ == "__main__":
    main()
