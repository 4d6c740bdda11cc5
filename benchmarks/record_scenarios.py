"""Run the cheap shipped scenarios and keep small result files for the docs.

    python benchmarks/record_scenarios.py              # every run below, one after another
    python benchmarks/record_scenarios.py --only quickstart
    python benchmarks/record_scenarios.py --list
    python benchmarks/record_scenarios.py --only quickstart-tune   # the tuning study (minutes)

Each run is ``wirelessfl run SCENARIO --set ...`` in a child process with OMP_NUM_THREADS=1, into
a temporary folder. Kept under ``docs/data/<key>/``: the run's ``summary.csv`` and ``facts.json``
(the manifest's facts the text needs, per-algorithm values read from rounds.parquet and
devices.parquet, the host time of the run and the versions). No parquet file is kept: every kept
file is a few KB. ``benchmarks/render_docs.py`` builds the tables of docs/results.md from these.

seed002-digits28 is recorded through its reproduction (``--only seed002-quick``:
``wirelessfl reproduce seed002-quick`` then ``wirelessfl crossover`` on its study, every method
tuned), and seed 002 on FashionMNIST through ``--only seed002-fashionmnist`` (hours: run
``wirelessfl reproduce seed002 --out DIR`` in the background and collect it with ``--study DIR
--host-s SECONDS``);
``profile-seed002-cnn`` keeps ``wirelessfl profile``'s JSON of its model, which is computed from the
model and the energy profile, not measured.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data"

LAM_1E6 = ["algorithms.2.lam=1e6", "algorithms.3.lam=1e6"]
CENTRALIZED = ["population.num_devices=1"] + [
    f"algorithms.{i}.{key}" for i in (0, 1)
    for key in ("rounds=1000", "local_steps=1", "rho=1.0")]


def _runs() -> dict[str, dict]:
    """key -> {scenario, sets, extract}: the runs this script records, in order."""
    runs: dict[str, dict] = {
        "quickstart": {"scenario": "quickstart", "sets": [], "extract": []},
        "seed000-table1-digits": {"scenario": "seed000-table1-digits", "sets": [],
                                  "extract": []},
        "seed003-toy": {"scenario": "seed003-toy", "sets": [], "extract": ["devices_k"]},
    }
    for seed in (0, 1, 2):
        for lam, sets in (("", []), ("-lam1e6", LAM_1E6)):
            runs[f"seed003-digits-label-shift-seed{seed}{lam}"] = {
                "scenario": "seed003-digits-label-shift",
                "sets": [f"seed={seed}"] + sets, "extract": ["trace"]}
    runs.update({
        "seed004-quadratic": {"scenario": "seed004-quadratic", "sets": [], "extract": []},
        "seed004-logistic": {"scenario": "seed004-logistic", "sets": [], "extract": []},
        "seed001-quadratic": {"scenario": "seed001-quadratic", "sets": [], "extract": []},
        "seed001-mco": {"scenario": "seed001-mco", "sets": [], "extract": ["mco"]},
        "seed001-mco-centralized": {"scenario": "seed001-mco", "sets": CENTRALIZED,
                                    "extract": ["mco"]},
        "heterogeneous-devices": {"scenario": "heterogeneous-devices", "sets": [],
                                  "extract": ["classes"]},
    })
    return runs


RUNS = _runs()
PROFILES = {"profile-seed002-cnn": ["seed002-cnn", "--energy", "seed002-accelerator",
                                    "--batch", "10", "--json"]}

LAST_ROUND_COLUMNS = ("round", "test_accuracy", "test_loss", "suboptimality",
                      "mean_device_accuracy", "worst_device_accuracy",
                      "worst_k_device_accuracy", "energy_j", "sim_time_s", "exchanges",
                      "hessian_vector_products", "gradient_evaluations", "alive_devices")


def _clean(value):
    """JSON-safe: NaN -> None, numpy scalars -> Python."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _algorithm_facts(rounds, manifest: dict) -> dict:
    facts = {}
    for label, info in manifest["algorithms"].items():
        rows = rounds[rounds["algorithm"] == label]
        entry = {"status": info.get("status"), "message": info.get("message", "")}
        if "saturated" in info:
            entry["saturated"] = info["saturated"]
        if len(rows):
            last = rows.iloc[-1]
            entry["last"] = {c: _clean(last[c]) for c in LAST_ROUND_COLUMNS if c in rows}
        facts[label] = entry
    return facts


def _trace(rounds) -> dict:
    """Per algorithm, the evaluated rounds' energy and worst-device accuracy (a few rows each)."""
    cols = ("round", "energy_j", "worst_device_accuracy")
    return {label: [{c: _clean(row[c]) for c in cols} for _, row in rows.iterrows()]
            for label, rows in rounds.groupby("algorithm", sort=False)}


def _mco(rounds) -> dict:
    """Relative error (`suboptimality`) and objective (`test_loss`) at a few rounds."""
    marks = (0, 40, 50, 200, 1000)
    out = {}
    for label, rows in rounds.groupby("algorithm", sort=False):
        at = rows.set_index("round")
        out[label] = {str(r): {"relative_error": _clean(at.loc[r, "suboptimality"]),
                               "objective": _clean(at.loc[r, "test_loss"])}
                      for r in marks if r in at.index}
    return out


def _classes(devices, rounds) -> dict:
    """Per algorithm and device class: mean energies and times, battery facts."""
    out = {}
    for label, rows in devices.groupby("algorithm", sort=False):
        end = float(rounds[rounds["algorithm"] == label]["sim_time_s"].max())
        last = rounds[rounds["algorithm"] == label].iloc[-1]
        per = {"alive_at_end": int(last["alive_devices"]),
               "transmissions_per_packet": _clean(rows["transmissions"].sum()
                                                  / rows["packets_sent"].sum()),
               "classes": {}}
        for cls, grp in rows.groupby("device_class", sort=False):
            alive = grp["depleted_at_s"].fillna(end)
            depleted = grp[grp["depleted_at_s"].notna()]
            kept = grp[grp["depleted_at_s"].isna()]
            per["classes"][cls] = {
                "devices": len(grp),
                **{f"mean_{c}": _clean(grp[c].mean()) for c in (
                    "energy_j", "energy_idle_j", "energy_uplink_j", "energy_downlink_j",
                    "energy_compute_j", "idle_s", "compute_s")},
                "min_energy_j": _clean(grp["energy_j"].min()),
                "max_energy_j": _clean(grp["energy_j"].max()),
                "mean_time_alive_s": _clean(alive.mean()),
                "depleted": len(depleted),
                "depleted_first_s": _clean(depleted["depleted_at_s"].min()),
                "depleted_last_s": _clean(depleted["depleted_at_s"].max()),
                "depleted_mean_distance_m": _clean(depleted["distance_m"].mean()),
                "kept_mean_distance_m": _clean(kept["distance_m"].mean()),
            }
        out[label] = per
    return {"per_algorithm": out, "sim_end_s": {
        label: _clean(rows["sim_time_s"].max())
        for label, rows in rounds.groupby("algorithm", sort=False)}}


def _devices_k(manifest: dict) -> dict:
    return {"worst_fraction": manifest["scenario"].get("worst_fraction")}


def record(key: str, spec: dict) -> dict:
    import pandas as pd

    out_dir = DATA / key
    with tempfile.TemporaryDirectory(prefix="wfl-record-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "wirelessfl", "run", spec["scenario"], "--out",
               str(run_dir), "--quiet", "--no-report"]
        for item in spec["sets"]:
            cmd += ["--set", item]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL)
        host_s = time.perf_counter() - start
        manifest = json.loads((run_dir / "manifest.json").read_text())
        rounds = pd.read_parquet(run_dir / "rounds.parquet")
        facts = {
            "scenario": spec["scenario"],
            "sets": spec["sets"],
            "command": "wirelessfl run " + spec["scenario"] + "".join(
                f" --set {s}" for s in spec["sets"]),
            "recorded": datetime.date.today().isoformat(),
            "host_s": round(host_s, 1),
            "omp_num_threads": 1,
            "cpus": os.cpu_count(),
            "seed": manifest["seed"],
            "status": manifest["status"],
            "versions": {k: manifest["versions"].get(k) for k in ("wirelessfl", "torch")},
            "model": {k: manifest.get("model", {}).get(k) for k in ("d",)},
            "problem": {k: _clean(v) for k, v in (manifest.get("problem") or {}).items()
                        if not isinstance(v, (list, dict))},
            "target_accuracy": manifest["scenario"].get("target_accuracy"),
            "target_suboptimality": manifest["scenario"].get("target_suboptimality"),
            "algorithms": _algorithm_facts(rounds, manifest),
        }
        if "trace" in spec["extract"]:
            facts["trace"] = _trace(rounds)
        if "mco" in spec["extract"]:
            facts["mco"] = _mco(rounds)
        if "classes" in spec["extract"]:
            devices = pd.read_parquet(run_dir / "devices.parquet")
            facts["classes"] = _classes(devices, rounds)
        if "devices_k" in spec["extract"]:
            facts.update(_devices_k(manifest))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        shutil.copyfile(run_dir / "summary.csv", out_dir / "summary.csv")
    (out_dir / "facts.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


def record_profile(key: str, args: list[str]) -> None:
    cmd = [sys.executable, "-m", "wirelessfl", "profile", *args]
    text = subprocess.run(cmd, check=True, env=_env(), cwd=ROOT, capture_output=True,
                          text=True).stdout
    profile = json.loads(text)
    profile.pop("layers", None)
    profile["command"] = "wirelessfl profile " + " ".join(args)
    out_dir = DATA / key
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "profile.json").write_text(json.dumps(profile, indent=1) + "\n")


# Tuning studies (wirelessfl tune) whose tables the docs quote: key -> tune file.
TUNES = {"quickstart-tune": "quickstart-tune"}
TUNE_FILES = ("tune.json", "tuning.csv", "evaluation.csv", "report.html")


def record_tune(key: str, name: str) -> dict:
    """Run ``wirelessfl tune NAME`` (2 local workers) and keep its small tables."""
    out_dir = DATA / key
    with tempfile.TemporaryDirectory(prefix="wfl-record-") as tmp:
        study = Path(tmp) / "study"
        cmd = [sys.executable, "-m", "wirelessfl", "tune", name, "--out", str(study),
               "--quiet", "--workers", "2"]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        host_s = time.perf_counter() - start
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        for file in TUNE_FILES:
            keep_file(study / file, out_dir / file)
    return _study_facts(out_dir, host_s, {"command": f"wirelessfl tune {name} --workers 2"})


# A figure embedded in a recorded report.html (``data:image/png;base64,...``).
EMBEDDED_PNG = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=]+)")


def keep_file(source: Path, target: Path) -> None:
    """Copy one file of a study into the docs' record; a report.html with its embedded figures
    re-encoded as 128-colour PNGs [D]: the plots are flat colours, so they look the same at
    about a third of the bytes, and a reproduction of twelve studies (84 figures) stays under
    the repository's 2 MB a file. The octree quantiser keeps each algorithm's colour distinct
    (median cut merged them below 256 colours). The study's own report.html is left as
    ``reproduce`` wrote it."""
    if source.name != "report.html":
        shutil.copyfile(source, target)
        return

    def palette(match: re.Match) -> str:
        image = Image.open(io.BytesIO(base64.b64decode(match.group(1))))
        out = io.BytesIO()
        image.convert("RGB").quantize(128, method=Image.Quantize.FASTOCTREE).save(
            out, "PNG", optimize=True)
        return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")

    target.write_text(EMBEDDED_PNG.sub(palette, source.read_text()))


def _study_facts(out_dir: Path, host_s: float, commands: dict, studies: list[Path] = (),
                 **more) -> dict:
    """Write and return ``facts.json`` of a recorded study: the commands, the date, the host
    time, the versions and whether any run failed, from the tune.json of each of ``studies``
    (default: the one kept in ``out_dir``), and ``more``."""
    manifests = [json.loads((s / "tune.json").read_text()) for s in studies or [out_dir]]
    failed = any(r["failed"] for m in manifests for r in m["runs"].values())
    facts = {**commands, "recorded": datetime.date.today().isoformat(),
             "host_s": round(host_s, 1), "cpus": os.cpu_count(),
             "versions": manifests[0]["versions"],
             "status": "failed runs" if failed else "complete", **more}
    (out_dir / "facts.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


# Reproductions (wirelessfl reproduce) whose verdicts the docs quote: key -> reproduction name.
REPRODUCTIONS = {"seed002-quick": "seed002-quick", "seed002-fashionmnist": "seed002",
                 "seed000": "seed000", "seed000-fig2": "seed000-fig2", "seed001": "seed001",
                 "seed000-fmnist": "seed000-fmnist", "seed000-fig2-fmnist": "seed000-fig2-fmnist",
                 "seed003": "seed003", "seed003-digits": "seed003-digits",
                 "seed003-fmnist": "seed003-fmnist",
                 "seed004": "seed004", "over-the-air": "over-the-air"}
# Those whose studies compare DZOFL with standard FL, where `wirelessfl crossover` applies.
CROSSOVER = {"seed002-quick", "seed002-fashionmnist"}
# report.html is kept so that a reader can open the study as `reproduce` showed it (issue 34);
# it embeds its figures.
REPRODUCTION_FILES = ("claims.csv", "runs.csv", "reproduce.json", "report.html")
STUDY_FILES = ("tune.json", "tuning.csv", "evaluation.csv")
CROSSOVER_FILES = ("crossover.json", "crossover_boundary.csv")
IMG = ROOT / "docs" / "img"


def crossover_figure(key: str, regime: str) -> Path:
    """Where the crossover figure of a recorded reproduction's study (one per regime) is kept
    with the docs' images."""
    return IMG / f"{key.replace('-', '_')}{'_' + regime.replace('-', '_') if regime else ''}" \
        "_crossover.png"


def record_reproduction(key: str, name: str, study: Path | None = None,
                        host_s: float | None = None) -> dict:
    """Run ``wirelessfl reproduce NAME`` (2 local workers) and ``wirelessfl crossover`` on each
    regime's study; keep the verdicts, each study's tuning and evaluation tables and its
    crossover's table (a regime's in a folder named after it). With ``study``, a folder the
    same command already filled (a long study run in the background): the command finishes it
    (finished runs are skipped), and ``host_s`` is the time that run took."""
    out_dir = DATA / key
    with tempfile.TemporaryDirectory(prefix="wfl-record-") as tmp:
        folder = Path(study) if study is not None else Path(tmp) / "study"
        reproduce = [sys.executable, "-m", "wirelessfl", "reproduce", name, "--out", str(folder),
                     "--quiet", "--workers", "2"]
        start = time.perf_counter()
        subprocess.run(reproduce, check=True, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        if host_s is None:
            host_s = time.perf_counter() - start
        studies = sorted(folder.glob("tune-*")) or [folder / "tune"]
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        for file in REPRODUCTION_FILES:
            keep_file(folder / file, out_dir / file)
        for tune in studies:
            regime = tune.name.removeprefix("tune").removeprefix("-")
            kept = out_dir / regime
            kept.mkdir(exist_ok=True)
            for file in STUDY_FILES:
                shutil.copyfile(tune / file, kept / file)
            if key not in CROSSOVER:
                continue
            crossover = [sys.executable, "-m", "wirelessfl", "crossover", str(tune), "--out",
                         str(tune / "crossover")]
            subprocess.run(crossover, check=True, env=_env(), cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for file in CROSSOVER_FILES:
                shutil.copyfile(tune / "crossover" / file, kept / file)
            shutil.copyfile(tune / "crossover" / "crossover.png", crossover_figure(key, regime))
        # read while a temporary study folder still exists
        commands = {"command": f"wirelessfl reproduce {name} --workers 2"}
        if key in CROSSOVER:
            commands["crossover_command"] = " ; ".join(
                f"wirelessfl crossover reproduced/{name}/{t.name}" for t in studies)
        return _study_facts(out_dir, host_s, commands,
            studies, samples_per_device={
                t.name.removeprefix("tune").removeprefix("-"): _device_samples(t)
                for t in studies})


def _device_samples(study: Path) -> dict:
    """The fewest and most training samples a device held in a study's evaluation runs (from
    each run manifest's partition label counts)."""
    counts = []
    for manifest in sorted((study / "evaluation" / "runs").glob("*/manifest.json")):
        labels = json.loads(manifest.read_text()).get("partition", {}).get("label_counts")
        if labels:
            counts += [sum(device) for device in labels]
    return {"fewest": min(counts), "most": max(counts)} if counts else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="a run key or a scenario name (all its runs); repeatable")
    parser.add_argument("--list", action="store_true", help="print the run keys and exit")
    parser.add_argument("--study", type=Path, help="with one reproduction's key in --only: the "
                        "folder its reproduce command already filled (run in the background)")
    parser.add_argument("--host-s", type=float, help="with --study: the seconds that run took")
    args = parser.parse_args(argv)
    keys = list(RUNS) + list(PROFILES) + list(TUNES) + list(REPRODUCTIONS)
    if args.list:
        for key in keys:
            spec = RUNS.get(key)
            print(key, "" if spec is None else spec["scenario"] + " " + " ".join(spec["sets"]))
        return 0
    if args.only:
        wanted = set(args.only)
        unknown = wanted - set(keys) - {s["scenario"] for s in RUNS.values()}
        if unknown:
            parser.error(f"unknown run(s): {', '.join(sorted(unknown))} (see --list)")
        keys = [k for k in keys if k in wanted or RUNS.get(k, {}).get("scenario") in wanted]
    total = time.perf_counter()
    for key in keys:
        if key in REPRODUCTIONS:
            facts = record_reproduction(key, REPRODUCTIONS[key], args.study, args.host_s)
            print(f"{key}: {facts['status']}, {facts['host_s']:.1f} s", flush=True)
            continue
        if key in TUNES:
            facts = record_tune(key, TUNES[key])
            print(f"{key}: {facts['status']}, {facts['host_s']:.1f} s", flush=True)
            continue
        if key in PROFILES:
            record_profile(key, PROFILES[key])
            print(f"{key}: profile recorded", flush=True)
            continue
        facts = record(key, RUNS[key])
        print(f"{key}: {facts['status']}, {facts['host_s']:.1f} s", flush=True)
    print(f"total {time.perf_counter() - total:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
