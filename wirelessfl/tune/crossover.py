"""Where DZOFL wins: time and energy to the target of each tuned method, re-costed over a grid
of device compute throughput (Theta) and uplink rate (r), and the boundary where DZOFL stops
beating each baseline (docs/tuning.md, "Where DZOFL wins: wirelessfl crossover").

Each tuned evaluation run is cut at its first row that meets the target (``reached_mask``) and
split into what that cost, from its own recorded cumulative quantities:

* compute wall time C [s] at the recorded throughput Theta0: what the run's sim_time_s leaves after
  the upload phases' airtime and the downlink (a phase waits for its slowest device), checked
  against the devices' compute recovered from their compute energy (``model.per_pass``);
* upload phases P (``exchanges``) and transmissions X, each of b payload bits (bits_up / X);
* the downlink's wall time D (the base station's airtime) and every other energy as recorded.

Re-costed at (Theta, r):  time = C Theta0 / Theta + P a(r) + D,  device energy = E_compute +
X w a(r) + E_down + E_idle,  system energy = that + E_bs + s (time - D),  with a(r) =
ceil((b + h) / (r slot)), E_bs the base station's energy on air and s its sleep draw (0 unless
the run's ``base_station`` model is EARTH, which draws it whenever it is off air)
slot the airtime of one packet (``channel.link.airtime_s``) and w the devices' transmit draw.
Before anything is re-costed, the split is checked to give back the run's own sim_time_s,
energy_j and energy_system_j at (Theta0, r0); a run it does not fit is refused.

[D] Rounds to the target do not move with Theta (compute time does not touch learning) and are
held fixed in r: a lower fixed rate would also change how many packets survive outage, which the
re-costing ignores. [D] Compute energy does not move with Theta (true of the seed-002
accelerator model, where throughput sets time only). [D] Idle energy is held as recorded (0 in
seed 002). [D] A method's cost is the mean over its evaluation seeds of the re-costed per-seed
costs (all linear in Theta0/Theta and a(r), so the mean keeps the form); a method that missed the
target on any evaluation seed is "not reached" everywhere, as in the study's verdict.

The spread over the evaluation seeds: each seed's runs are re-costed alone and, paired by seed
(the same seed gives every method the same data split, cell and draws), give that seed's
boundary. [D] The band drawn around the seed-mean boundary is the min-max of the per-seed
boundaries: the throughputs at which the seeds disagree about who is faster (below it every seed
gives one verdict, above it every seed the other). Why not a percentile band or a confidence
interval of the ratio: a study evaluates on a few seeds (5 in seed 002), where the 2.5/97.5 %
points are interpolations between the two extreme seeds and a CI of a ratio of five-sample means
leans on a normality it cannot check; min-max states what the runs say, and, the seed mean's
time difference being the mean of the seeds' differences, it always contains the mean boundary
(and is that boundary when the seeds agree). A seed on which the method is faster at every
throughput, at none, or on the other side opens the band to 0 or infinity; where the means do
not cross but some seeds do, the band is there without a line. Energy does not depend on the
throughput, so its spread is a count per rate: on how many seed pairs the method spends less
energy there. Seeds are paired when every method ran the same ones; otherwise every combination
is a pair (the mean is then still contained).

The rate axis stays within what the cell carries: the configured uplink band times the lowest
and highest spectral efficiency of the MCS table (``channel.mcs.carried_rate_range_bps``, 3GPP
TS 38.214 Table 5.2.2.1-2). A ``--rate`` range beyond it is refused; the default range (the
scenario's rate / 100 to x 100) is clipped to it, with a note.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from wirelessfl.channel.cell import dbm_to_w
from wirelessfl.channel.config import UplinkConfig
from wirelessfl.channel.link import airtime_s
from wirelessfl.channel.mcs import carried_rate_range_bps
from wirelessfl.errors import UserError
from wirelessfl.results.records import read_run, write_csv, write_json
from wirelessfl.results.summary import reached_mask
from wirelessfl.tune.spec import UNTUNED_SUFFIX

METRICS = (("time", "time to target [s]"), ("energy", "device energy to target [J]"),
           ("system", "system energy to target [J]"))
# relative tolerance of the check that the split gives the recorded totals back
FIT_RTOL = 1e-9
# [D] Grid points per axis at most. The figure's panels are about 550 pixels wide (5 in at
# 110 dpi, report/crossover_plots.py), so more points add nothing to it, while the grid grows as
# points^2: measured with three methods, 41 points take 12 s and 430 MB (mostly imports), 501
# about +4 s and +100 MB, 1,001 +11 s and +400 MB with a 270 MB grid CSV, and 3,000 took 165 s
# and 2.9 GB (issue 34).
MAX_POINTS = 501
# What a grid cell costs with three methods, measured [D]: memory (3,000 points, 2.9 GB) and
# the grid CSV's bytes (1,001 points, 270 MB); for the refusal's estimate.
CELL_BYTES, CELL_CSV_BYTES = 320, 270
# [D] Decades an axis may span at most: the plausible throughputs (1e3 to 1e17 MAC/s) and
# uplink rates (1e2 to 1e12 bit/s) of pipeline/preflight.py PLAUSIBLE fit with room; 600
# decades (1e-300 to 1e300) overflowed matplotlib's log ticker.
MAX_DECADES = 16
# [D] Relative slack on the carried rate range: a --rate edge typed from the printed range (six
# significant digits) is within it.
CARRIED_RTOL = 1e-6


@dataclass(frozen=True)
class Cost:
    """One method's cost to its target, linear in Theta0/Theta and in one packet's airtime."""

    label: str
    compute_s: float  # C: compute wall time at theta0 [s]
    phases: float  # P: upload phases (each as long as one packet's airtime)
    transmissions: float  # X: packets sent, all devices
    payload_bits: float  # b: payload bits per packet
    downlink_s: float  # D: downlink wall time [s]
    energy_fixed_j: float  # compute + downlink + idle energy of the devices [J]
    energy_bs_j: float  # base station [J]
    tx_draw_w: float  # w: a device's draw while sending [W]
    header_bits: float  # h
    slot_s: float
    theta0: float  # recorded throughput [MAC/s]
    rate0: float  # recorded uplink rate [bit/s]
    bandwidth_hz: float  # a device's uplink band [Hz]: with the MCS table, the rates carried
    rounds: float  # rounds to the target (mean over seeds)
    seeds: int = 1
    bs_sleep_w: float = 0.0  # the base station's draw off air [W] (EARTH's sleep power)

    def airtime(self, rate) -> np.ndarray:
        """One packet's airtime [s] at uplink ``rate`` [bit/s]."""
        return airtime_s(self.payload_bits + self.header_bits, rate, self.slot_s)

    def time_s(self, theta, rate) -> np.ndarray:
        """Time to the target [s] at throughput ``theta`` [MAC/s] and uplink ``rate``."""
        return (self.compute_s * self.theta0 / np.asarray(theta, float)
                + self.phases * self.airtime(rate) + self.downlink_s)

    def energy_j(self, theta, rate) -> np.ndarray:
        """The devices' energy to the target [J] (does not depend on ``theta``)."""
        shape = np.broadcast(np.asarray(theta), np.asarray(rate)).shape
        up = self.transmissions * self.tx_draw_w * self.airtime(rate)
        return np.broadcast_to(self.energy_fixed_j + up, shape).astype(float)

    def system_j(self, theta, rate) -> np.ndarray:
        """Devices + base station [J]: its energy on air, and its sleep draw for the time it is
        off air (the time to the target less the downlink's airtime D)."""
        asleep = self.bs_sleep_w * (self.time_s(theta, rate) - self.downlink_s)
        return self.energy_j(theta, rate) + self.energy_bs_j + asleep

    def metric(self, name: str, theta, rate) -> np.ndarray:
        return {"time": self.time_s, "energy": self.energy_j, "system": self.system_j}[name](
            theta, rate)


def _scalar(value, what: str, positive: bool = False) -> float:
    """One number for the whole population (a per-device list must hold one value)."""
    if isinstance(value, list | tuple) and value:
        if len({json.dumps(v) for v in value}) != 1:
            raise UserError(f"{what} differs between devices; the crossover needs one device "
                            "model for the whole population")
        value = value[0]
    return _number(value, what, positive)


def _number(value, what: str, positive: bool = False) -> float:
    """``value`` as a finite float (``positive``: > 0), or one UserError saying the run folder
    holds something else (a manifest edited or damaged by hand)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (positive and value <= 0):
        shown = json.dumps(value)[:40] if _jsonable(value) else type(value).__name__
        raise UserError(f"{what} is {shown}, not a {'positive' if positive else 'finite'} "
                        "number; the run folder is damaged: restore it from a copy, or run the "
                        "scenario again")
    return float(value)


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _section(mapping: dict, key: str, file: str, path: str = "") -> dict:
    """``mapping[key]`` as a mapping ({} when absent), or one UserError naming the ``file`` and
    the key's ``path``."""
    value = mapping.get(key) if isinstance(mapping, dict) else None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{file}: {path}{'.' if path else ''}{key} is not an object; the run "
                        "folder is damaged: restore it from a copy, or run the scenario again")
    return value


def _setting(manifest: dict, where: Path) -> dict:
    """Theta0, r0 and the channel facts the re-costing needs, each checked to be a number;
    refuses settings it cannot re-cost."""
    file = str(where / "manifest.json")
    scenario = _section(manifest, "scenario", file)
    energy = _section(scenario, "energy", file, "scenario")
    channel = _section(scenario, "channel", file, "scenario")
    up = _section(channel, "uplink", file, "scenario.channel")
    theta0 = energy.get("throughput_macs_per_s")
    if not theta0:
        raise UserError(f"{where}: the energy profile ({energy.get('model')}) has no "
                        "throughput_macs_per_s; the crossover varies a seed-002-accelerator "
                        "device's throughput")
    if up.get("mode") not in ("fixed", "pinned"):
        raise UserError(f"{where}: uplink mode '{up.get('mode')}' has no one rate to vary; the "
                        "crossover needs channel.uplink.mode fixed or pinned (rate_bps)")
    problems = []
    if _section(up, "arq", file, "scenario.channel.uplink").get("max_attempts", 1) != 1:
        problems.append("uplink.arq.max_attempts > 1")
    if _section(up, "spectrum", file, "scenario.channel.uplink").get("mode",
                                                                     "dedicated") != "dedicated":
        problems.append("a shared uplink spectrum")
    if up.get("deadline_s") is not None:
        problems.append("an upload deadline")
    if problems:
        raise UserError(f"{where}: cannot re-cost a run with {', '.join(problems)}: a phase's "
                        "length is then not one packet's airtime")

    def number(section: dict, key: str, path: str, default=None, positive: bool = False):
        return _number(section.get(key, default), f"{file}: scenario.{path}.{key}", positive)

    draw = (dbm_to_w(number(up, "tx_power_dbm", "channel.uplink"))
            / number(energy, "pa_efficiency", "energy", 1.0, positive=True)
            + number(energy, "tx_circuit_power_w", "energy", 0.0)
            + number(up, "circuit_power_w", "channel.uplink", 0.0))
    return {"theta0": number(energy, "throughput_macs_per_s", "energy", positive=True),
            "rate0": number(up, "rate_bps", "channel.uplink", positive=True),
            "bandwidth_hz": number(up, "bandwidth_hz", "channel.uplink",
                                   UplinkConfig.model_fields["bandwidth_hz"].default, True),
            "slot_s": number(channel, "slot_s", "channel", positive=True),
            "header_bits": number(up, "header_bits", "channel.uplink", 0),
            "tx_draw_w": _number(draw, f"{file}: the devices' transmit draw"),
            # runs recorded before the base station's power models drew nothing off air
            "bs_sleep_w": _number((manifest.get("base_station") or {}).get("sleep_w", 0.0),
                                  f"{file}: base_station.sleep_w")}


def row_cost(row: pd.Series, label: str, per_pass: dict, setting: dict, where: str) -> Cost:
    """The split of one cumulative rounds.parquet ``row``, checked against its own totals.

    The compute wall time C is what the recorded sim_time_s leaves after the upload phases'
    airtime and the downlink: a phase lasts as long as its slowest device computes plus one
    packet's airtime, so C sums each phase's largest compute time (devices with fewer samples
    than the batch compute less, learning/minibatch.py). It is checked to lie between the mean
    and the sum of the devices' compute times recovered from their compute energy."""
    device_s = 0.0  # device-seconds of compute, from each pass's energy and time
    for kind in ("forward", "backward"):
        spent = float(row[f"energy_compute_{kind}_j"])
        if spent:
            e = _scalar(per_pass.get(f"energy_{kind}_j"),
                        f"{where}: manifest model.per_pass.{label}.energy_{kind}_j", True)
            t = _scalar(per_pass.get(f"time_{kind}_s"),
                        f"{where}: manifest model.per_pass.{label}.time_{kind}_s")
            device_s += spent / e * t
    sent, phases = float(row.transmissions), float(row.exchanges)
    bits = float(row.bits_up) / sent if sent else 0.0
    # the base station's energy on air: what it drew asleep follows the time (``system_j``)
    energy_bs = float(row.energy_bs_j) - setting["bs_sleep_w"] * (
        float(row.sim_time_s) - float(row.bs_airtime_s))
    fixed = float(row.energy_j) - float(row.energy_uplink_j)
    cost = Cost(label=label, compute_s=0.0, phases=phases, transmissions=sent,
                payload_bits=bits, downlink_s=float(row.bs_airtime_s), energy_fixed_j=fixed,
                energy_bs_j=energy_bs, rounds=float(row["round"]), **setting)
    theta0, rate0 = setting["theta0"], setting["rate0"]
    # with compute_s = 0, time_s is the radio's part alone: P a(r0) + D
    compute = float(row.sim_time_s) - float(cost.time_s(theta0, rate0))
    cost = replace(cost, compute_s=compute)
    mean_s = device_s * phases / sent if sent else device_s  # every device as the average one
    slack = FIT_RTOL * float(row.sim_time_s) + 1e-15
    checks = [("energy_j", cost.energy_j(theta0, rate0)),
              ("energy_system_j", cost.system_j(theta0, rate0))]
    for column, got in checks:
        want = float(row[column])
        if not math.isclose(float(got), want, rel_tol=FIT_RTOL, abs_tol=1e-15):
            raise UserError(f"{where}: {label} at round {int(row['round'])}: compute + upload + "
                            f"download give {column} = {float(got):.9g}, the run recorded "
                            f"{want:.9g}; the re-costing does not fit this run (devices that "
                            "differ in rate, partial participation or batteries)")
    if not mean_s - slack <= compute <= device_s + slack:
        raise UserError(f"{where}: {label} at round {int(row['round'])}: the time left for "
                        f"compute ({compute:.9g} s) is not between the devices' mean "
                        f"({mean_s:.9g} s) and total ({device_s:.9g} s) compute time; the "
                        "re-costing does not fit this run (devices that differ in compute "
                        "speed or rate, waits between phases)")
    return cost


def run_costs(folder: Path, targets=None) -> dict[str, Cost | None]:
    """Label -> cost to the target of each algorithm in one run folder (None: not reached);
    ``targets`` (accuracy, f - f*, test loss[, ||grad f||^2[, worst-device accuracy]]) default to
    the run's own."""
    record = read_run(folder)
    setting = _setting(record.manifest, folder)
    target = (record.target_accuracy, record.target_suboptimality, record.target_loss,
              record.target_grad_norm_sq, record.target_worst_device_accuracy) \
        if targets is None else targets
    file = str(folder / "manifest.json")
    per_pass = _section(_section(record.manifest, "model", file), "per_pass", file, "model")
    out = {}
    for label, group in record.rounds.groupby("algorithm", sort=False):
        group = group.sort_values("round")
        reached = group[reached_mask(group, *target)]
        if label not in per_pass:
            raise UserError(f"{folder}: manifest has no model.per_pass entry for {label}; "
                            "rerun with this version")
        _section(per_pass, label, file, "model.per_pass")
        out[label] = (row_cost(reached.iloc[0], label, per_pass[label], setting, str(folder))
                      if len(reached) else None)
    return out


def mean_cost(costs: list[Cost]) -> Cost:
    """The seed mean of per-seed costs of one method (same packet size and setting)."""
    first = costs[0]
    for c in costs[1:]:
        same = (c.payload_bits, c.theta0, c.rate0, c.slot_s, c.header_bits, c.tx_draw_w,
                c.bandwidth_hz, c.bs_sleep_w)
        if same != (first.payload_bits, first.theta0, first.rate0, first.slot_s,
                    first.header_bits, first.tx_draw_w, first.bandwidth_hz, first.bs_sleep_w):
            raise UserError(f"{first.label}: evaluation runs differ in packet size or setting; "
                            "the crossover needs one setting across seeds")
    fields = ("compute_s", "phases", "transmissions", "downlink_s", "energy_fixed_j",
              "energy_bs_j", "rounds")
    return replace(first, seeds=len(costs),
                   **{f: float(np.mean([getattr(c, f) for c in costs])) for f in fields})


def study_runs(folder: Path) -> list[Path]:
    """The evaluation run folders of a tune folder, or of a reproduce folder (its tune/): the
    runs its evaluation sweep lists (sweep.json), so that the folders of an earlier choice,
    set aside when a re-tuned study replaced them (``*.replaced-<time>``), are not read."""
    folder = Path(folder)
    for base in (folder, folder / "tune"):
        runs = base / "evaluation" / "runs"
        if runs.is_dir():
            listed = _listed_runs(base / "evaluation")
            found = sorted(p for p in runs.iterdir() if (p / "manifest.json").is_file()
                           and (p.name in listed if listed is not None
                                else ".replaced-" not in p.name))
            if found:
                return found
    regimes = sorted(p.name for p in folder.glob("tune-*") if p.is_dir())
    if regimes:
        raise UserError(f"{folder}: a reproduction with regimes, one study each "
                        f"({', '.join(regimes)}); pass one of them, e.g. {folder / regimes[0]}")
    raise UserError(f"{folder}: no evaluation runs found (looked for evaluation/runs/ and "
                    "tune/evaluation/runs/); pass the folder 'wirelessfl tune --out' or "
                    "'wirelessfl reproduce --out' wrote")


def _listed_runs(sweep: Path) -> set[str] | None:
    """The run folders a sweep's manifest lists, or None when it cannot be read."""
    try:
        runs = json.loads((sweep / "sweep.json").read_text()).get("runs")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(runs, list):
        return None
    return {str(r.get("folder", "")).removeprefix("runs/") for r in runs if isinstance(r, dict)}


def study_names(folder: Path) -> dict[str, str]:
    """Label -> algorithm name of every evaluation run's algorithms, from their manifests (a
    manifest that cannot be read names nothing: run_costs says what is wrong with it)."""
    names: dict[str, str] = {}
    for run in study_runs(folder):
        try:
            scenario = json.loads((run / "manifest.json").read_text()).get("scenario") or {}
        except (OSError, ValueError, AttributeError):
            continue
        for entry in scenario.get("algorithms") or []:
            if isinstance(entry, dict) and entry.get("name"):
                names.setdefault(str(entry.get("label") or entry["name"]), str(entry["name"]))
    return names


def _seed_of(run: Path):
    """The evaluation seed a run folder ran (its manifest's ``seed``), or the folder's name
    where the manifest holds no whole number (run_costs has read it already)."""
    seed = json.loads((run / "manifest.json").read_text()).get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else run.name


def study_costs(folder: Path) -> dict[str, dict[object, Cost | None]]:
    """Tuned label -> evaluation seed -> that seed's cost (None: missed the target); untuned
    settings are left out."""
    per_label: dict[str, dict] = {}
    for run in study_runs(folder):
        costs = run_costs(run)
        seed = _seed_of(run)
        for label, cost in costs.items():
            if not label.endswith(UNTUNED_SUFFIX):
                per_label.setdefault(label, {})[seed] = cost
    return per_label


def seed_means(per_seed: dict[str, dict[object, Cost | None]]
               ) -> tuple[dict[str, Cost | None], dict[str, int]]:
    """Label -> seed-mean cost (None if some seed missed the target), and the seed count."""
    means = {label: (None if any(c is None for c in costs.values())
                     else mean_cost(list(costs.values())))
             for label, costs in per_seed.items()}
    return means, {label: len(costs) for label, costs in per_seed.items()}


def seed_pairs(ours: dict[object, Cost | None], other: dict[object, Cost | None]) -> list[tuple]:
    """(ours, other) per evaluation seed when both ran the same seeds, else every combination
    (either way the pairs' mean time difference is the seed means' difference)."""
    if set(ours) == set(other):
        return [(ours[seed], other[seed]) for seed in ours]
    return [(a, b) for a in ours.values() for b in other.values()]


def time_band(pairs: list[tuple], rate) -> tuple[np.ndarray, np.ndarray]:
    """Per uplink rate, the throughputs [low, high] over which the seed pairs disagree about who
    is faster: the narrowest range outside which every pair gives the same verdict (NaN where
    all pairs agree at every throughput, or a pair has a method that missed the target).

    A pair's win region is an interval (``time_boundary``): above its Theta_s (side +1), below
    it (-1), everywhere (2) or nowhere (0). Where no pair is faster below, low is the lowest
    throughput at which some pair wins (Theta_s, or 0 for a pair faster everywhere) and high the
    one above which every pair wins (Theta_s; 0 everywhere; inf never); where no pair is faster
    above, the same in 1 / Theta; where both occur, the seeds disagree near 0 and near inf."""
    rate = np.asarray(rate, float)
    if not pairs or any(a is None or b is None for a, b in pairs):
        return np.full(rate.shape, np.nan), np.full(rate.shape, np.nan)
    theta, sides = map(np.array, zip(*(time_boundary(a, b, rate) for a, b in pairs)))  # [S, R]
    below = (sides == -1).any(axis=0) & ~(sides == 1).any(axis=0)  # [R]: turned around
    with np.errstate(divide="ignore"):
        theta = np.where(below, 1.0 / theta, theta)
        sides = np.where(below & (np.abs(sides) == 1), -sides, sides)
        win_from = np.select([sides == 1, sides == 2, sides == -1], [theta, 0.0, 0.0], np.inf)
        all_from = np.select([sides == 1, sides == 2], [theta, 0.0], np.inf)
        low, high = win_from.min(axis=0), all_from.max(axis=0)
        low, high = np.where(below, 1.0 / high, low), np.where(below, 1.0 / low, high)
    agree = (low == high) & ((low == 0) | (low == np.inf))
    return np.where(agree, np.nan, low), np.where(agree, np.nan, high)


def energy_seed_wins(pairs: list[tuple], name: str, rate) -> np.ndarray:
    """Per uplink rate, on how many seed pairs the method spends less of metric ``name``
    ("energy" or "system", neither depends on throughput); a method that missed the target on
    a seed loses that pair."""
    rate = np.asarray(rate, float)
    wins = np.zeros(rate.shape, int)
    for ours, other in pairs:
        if ours is None:
            continue
        mine = ours.metric(name, ours.theta0, rate)
        theirs = np.inf if other is None else other.metric(name, other.theta0, rate)
        wins += (mine < theirs) & np.isfinite(mine)
    return wins


def time_boundary(ours: Cost, other: Cost, rate) -> tuple[np.ndarray, np.ndarray]:
    """Closed form, per uplink rate: the throughput Theta* where ``ours`` and ``other`` take
    equal time to the target, and the side where ``ours`` is faster: +1 above Theta*, -1 below,
    2 at every throughput, 0 at none (Theta* NaN in the last two).

    time_ours - time_other = (C_o - C_x) Theta0 / Theta + (U_o - U_x), U = P a(r) + D, so
    Theta* = Theta0 (C_o - C_x) / (U_x - U_o)."""
    rate = np.asarray(rate, float)
    dc = ours.compute_s * ours.theta0 - other.compute_s * other.theta0  # [s MAC/s]
    du = (ours.phases * ours.airtime(rate) + ours.downlink_s) \
        - (other.phases * other.airtime(rate) + other.downlink_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        theta = dc / -du
    valid = (theta > 0) & np.isfinite(theta)
    side = np.where(valid, np.where(dc > 0, 1, -1), 0)
    # no crossing: ours wins everywhere when both terms favour it (or tie one and win the other)
    always = ~valid & (dc <= 0) & (du <= 0) & ~((dc == 0) & (du == 0))
    side = np.where(always, 2, side)
    return np.where(valid, theta, np.nan), side


@dataclass
class Crossover:
    """The grid, who wins where, and the closed-form time boundary per rate."""

    method: str
    baselines: list[str]
    costs: dict[str, Cost | None]
    seeds: dict[str, int]
    theta: np.ndarray  # [T] throughputs [MAC/s]
    rate: np.ndarray  # [R] uplink rates [bit/s]
    values: dict[str, dict[str, np.ndarray]]  # metric -> label -> [T, R]
    wins: dict[str, dict[str, np.ndarray]]  # metric -> baseline or "all" -> [T, R] bool
    boundary: dict[str, tuple[np.ndarray, np.ndarray]]  # baseline -> time (Theta*, side) [R]
    theta0: float
    rate0: float
    # baseline -> the seeds' min-max band (low, high) [R] around the time boundary (time_band)
    band: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    # "energy" / "system" -> baseline -> seed pairs on which the method spends less [R]
    seed_wins: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    pairs: dict[str, int] = field(default_factory=dict)  # baseline -> seed pairs
    # the rates [bit/s] the MCS table carries on the uplink band, and whether the default range
    # was clipped to them (run_crossover); None when not known
    carried: tuple[float, float] | None = None
    clipped: bool = False
    per_seed: dict[str, dict[object, Cost | None]] = field(default_factory=dict)
    # label -> algorithm name (the runs' scenario entries): the figure's colours, which follow
    # the algorithm (report/colours.py); empty when not read
    names: dict[str, str] = field(default_factory=dict)


def compute(costs: dict[str, Cost | None], seeds: dict[str, int], method: str,
            theta: np.ndarray, rate: np.ndarray,
            per_seed: dict[str, dict[object, Cost | None]] | None = None) -> Crossover:
    """Who wins in each cell of ``theta`` x ``rate``: ``method`` against every other label in
    ``costs`` (the seed means). A method that never reached the target loses to one that did,
    everywhere. ``per_seed`` (label -> seed -> cost) gives the spread over the evaluation seeds;
    without it each mean is its own one seed, and the band is the boundary itself."""
    if method not in costs:
        raise UserError(f"no tuned method labelled '{method}' in the study (tuned: "
                        f"{', '.join(costs) or 'none'})")
    baselines = [label for label in costs if label != method]
    if not baselines:
        raise UserError(f"the study has no tuned method besides {method} to compare with")
    reached = [c for c in costs.values() if c is not None]
    if not reached:
        raise UserError("no tuned method reached the target on every evaluation seed")
    ref = reached[0]
    grid_t, grid_r = np.meshgrid(theta, rate, indexing="ij")
    values = {name: {label: (c.metric(name, grid_t, grid_r) if c is not None
                             else np.full(grid_t.shape, np.inf))
                     for label, c in costs.items()} for name, _ in METRICS}
    wins = {}
    for name, _ in METRICS:
        ours = values[name][method]
        per = {b: (ours < values[name][b]) & np.isfinite(ours) for b in baselines}
        per["all"] = np.logical_and.reduce([per[b] for b in baselines])
        wins[name] = per
    boundary = {}
    for b in baselines:
        if costs[method] is not None and costs[b] is not None:
            boundary[b] = time_boundary(costs[method], costs[b], rate)
        else:  # someone never reached: no crossing
            side = 2 if costs[method] is not None else 0
            boundary[b] = (np.full(rate.shape, np.nan), np.full(rate.shape, side))
    if per_seed is None:
        per_seed = {label: {0: c} for label, c in costs.items()}
    pairs = {b: seed_pairs(per_seed[method], per_seed[b]) for b in baselines}
    band = {b: time_band(pairs[b], rate) for b in baselines}
    seed_wins = {name: {b: energy_seed_wins(pairs[b], name, rate) for b in baselines}
                 for name in ("energy", "system")}
    return Crossover(method, baselines, costs, seeds, np.asarray(theta), np.asarray(rate),
                     values, wins, boundary, ref.theta0, ref.rate0, band=band,
                     seed_wins=seed_wins, pairs={b: len(p) for b, p in pairs.items()},
                     per_seed=per_seed)


def grid_table(result: Crossover) -> pd.DataFrame:
    """One row per (throughput, rate) cell: each method's three metrics and who wins."""
    t, r = np.meshgrid(result.theta, result.rate, indexing="ij")
    cols = {"throughput_macs_per_s": t.ravel(), "uplink_rate_bps": r.ravel()}
    for name, _ in METRICS:
        for label, v in result.values[name].items():
            cols[f"{name}_{label}"] = np.where(np.isfinite(v), v, np.nan).ravel()
        for b, w in result.wins[name].items():
            cols[f"{result.method}_wins_{name}_vs_{b}"] = w.ravel()
    return pd.DataFrame(cols)


SIDES = {1: "faster above", -1: "faster below", 2: "faster everywhere", 0: "never faster"}


def boundary_table(result: Crossover) -> pd.DataFrame:
    """One row per uplink rate: the closed-form time boundary against each baseline with the
    seeds' min-max band around it (``time_band``; 0 or inf where some seed is faster at every
    throughput or at none), and whether the method spends less device and system energy there
    (neither depends on throughput), with on how many of the seed pairs it does."""
    rows = []
    for j, rate in enumerate(result.rate):
        for b in result.baselines:
            theta, side = result.boundary[b]
            low, high = result.band[b]
            rows.append({"uplink_rate_bps": rate, "baseline": b,
                         "time_boundary_macs_per_s": theta[j],
                         "time_boundary_low_macs_per_s": low[j],
                         "time_boundary_high_macs_per_s": high[j],
                         "time": SIDES[int(side[j])],
                         "energy_wins": bool(result.wins["energy"][b][0, j]),
                         "system_energy_wins": bool(result.wins["system"][b][0, j]),
                         "seed_pairs": result.pairs[b],
                         "energy_wins_seeds": int(result.seed_wins["energy"][b][j]),
                         "system_energy_wins_seeds": int(result.seed_wins["system"][b][j])})
    return pd.DataFrame(rows)


def at_scenario(result: Crossover) -> dict:
    """Each metric of each method at the recorded (Theta0, r0), and who wins there."""
    out = {}
    for name, title in METRICS:
        vals = {label: (float(c.metric(name, result.theta0, result.rate0))
                        if c is not None else None) for label, c in result.costs.items()}
        ours = vals[result.method]
        out[name] = {"title": title, "values": vals, "wins": {
            b: ours is not None and (vals[b] is None or ours < vals[b])
            for b in result.baselines}}
    return out


def _finite(value) -> float | None:
    """A JSON number, or null for NaN and infinity (json.dumps would write neither as JSON)."""
    return float(value) if math.isfinite(value) else None


def band_at_scenario(result: Crossover) -> dict:
    """Per baseline, at the scenario's own rate r0: the time boundary from the seed means and
    the seeds' band (``time_band``; null: no crossing, the seeds all agreeing, or no upper edge,
    some seed never faster)."""
    rate = np.array([result.rate0])
    out = {}
    for b in result.baselines:
        ours, other = result.costs[result.method], result.costs[b]
        if ours is None or other is None:
            theta, side = np.array([np.nan]), np.array([2 if ours is not None else 0])
        else:
            theta, side = time_boundary(ours, other, rate)
        pairs = seed_pairs(result.per_seed[result.method], result.per_seed[b])
        low, high = time_band(pairs, rate)
        out[b] = {"time": SIDES[int(side[0])], "time_boundary_macs_per_s": _finite(theta[0]),
                  "low_macs_per_s": _finite(low[0]), "high_macs_per_s": _finite(high[0]),
                  "seed_pairs": len(pairs)}
    return out


def rate_axis(given: tuple[float, float] | None, ref: Cost) -> tuple[float, float, bool]:
    """The uplink rate axis (lo, hi) [bit/s] and whether the default was clipped: within the
    rates the MCS table carries on the uplink band (``carried_rate_range_bps``). A range the
    user gave beyond it is refused; the default, the scenario's / 100 to x 100, is clipped to
    it (to the whole carried range when the scenario's own rate lies far outside it)."""
    lo_c, hi_c = carried_rate_range_bps(ref.bandwidth_hz)
    if given is not None:
        lo, hi = given
        if lo < lo_c * (1 - CARRIED_RTOL) or hi > hi_c * (1 + CARRIED_RTOL):
            raise UserError(f"--rate {lo:g} {hi:g} goes beyond the rates the uplink's MCS "
                            f"table carries on its {ref.bandwidth_hz:g} Hz band, {lo_c:.6g} to "
                            f"{hi_c:.6g} bit/s (CQI 1 to 15, 3GPP TS 38.214 Table "
                            "5.2.2.1-2); give a range within it")
        return lo, hi, False
    lo, hi = ref.rate0 / 100, ref.rate0 * 100
    inside = (max(lo, lo_c), min(hi, hi_c))
    if inside[0] >= inside[1]:
        inside = (lo_c, hi_c)
    return *inside, inside != (lo, hi)


def range_note(result: Crossover) -> str | None:
    """The note that the default rate axis was clipped to what the MCS table carries."""
    if not result.clipped or result.carried is None:
        return None
    return (f"the uplink rate axis is {result.rate[0]:.6g} to {result.rate[-1]:.6g} bit/s: the "
            f"default ({result.rate0:.4g} bit/s / 100 to x 100) clipped to the "
            f"{result.carried[0]:.6g} to {result.carried[1]:.6g} bit/s the MCS table carries on "
            "the uplink band (3GPP TS 38.214 Table 5.2.2.1-2)")


def check_points(points: int) -> None:
    """2 to MAX_POINTS grid points per axis."""
    if points < 2:
        raise UserError(f"--points must be at least 2; got {points}")
    if points > MAX_POINTS:
        cells = points * points
        raise UserError(f"--points {points:,}: at most {MAX_POINTS} per axis ({points:,} x "
                        f"{points:,} = {cells:,} cells would take about "
                        f"{cells * CELL_BYTES / 2**30:.1f} GiB of memory and "
                        f"{cells * CELL_CSV_BYTES / 2**20:,.0f} MiB of grid CSV with three "
                        "methods, and the figure shows about 550 per axis); use --points "
                        f"{MAX_POINTS} or fewer, and a narrower --throughput / --rate range to "
                        "look closer")


def check_range(flag: str, lo: float, hi: float) -> None:
    """A positive, finite range lo < hi of at most MAX_DECADES decades."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or not 0 < lo < hi:
        raise UserError(f"{flag} needs 0 < LO < HI, both finite; got {lo:g} {hi:g}")
    decades = math.log10(hi) - math.log10(lo)  # hi / lo may overflow
    if decades > MAX_DECADES:
        raise UserError(f"{flag} {lo:g} {hi:g} spans {decades:.0f} decades, more "
                        f"than the {MAX_DECADES} a crossover grid may span; give a narrower "
                        "range around the scenario's value (the default is / 100 to x 100)")


def _check_finite(costs: dict[str, Cost | None], theta: np.ndarray, rate: np.ndarray) -> None:
    """Every re-costed metric stays a finite number over each axis (a throughput near 0 makes
    compute time overflow; a rate near 0 makes a packet's airtime overflow)."""
    for label, c in costs.items():
        if c is None:
            continue
        with np.errstate(all="ignore"):  # an overflow is the answer here, not a warning
            along = [("--throughput", c.time_s(theta, c.rate0), theta),
                     ("--rate", c.system_j(c.theta0, rate), rate),
                     ("--rate", c.time_s(c.theta0, rate), rate)]
        for flag, values, axis in along:
            bad = ~np.isfinite(np.asarray(values, float))
            if bad.any():
                raise UserError(f"{flag} {axis[0]:g} {axis[-1]:g}: {label}'s time or energy to "
                                f"the target overflows at {axis[bad][0]:g}; give a range nearer "
                                f"the scenario's ({c.theta0:g} MAC/s, {c.rate0:g} bit/s)")


def run_crossover(folder: Path, out: Path, method: str = "DZOFL",
                  throughput: tuple[float, float] | None = None,
                  rate: tuple[float, float] | None = None, points: int = 41) -> Crossover:
    """Read the study ``folder``, compute the grid, write crossover_grid.csv,
    crossover_boundary.csv and crossover.json into ``out``; the figure crossover.png is
    report/crossover_plots.py's ``draw_crossover``, called on the returned grid."""
    check_points(points)
    for given, flag in ((throughput, "--throughput"), (rate, "--rate")):
        if given is not None:  # the ranges given, before the study is read
            check_range(flag, *given)
    per_seed = study_costs(folder)
    costs, seeds = seed_means(per_seed)
    ref = next((c for c in costs.values() if c is not None), None)
    if ref is None:
        raise UserError(f"{folder}: no tuned method reached the target on every evaluation "
                        "seed; nothing to compare")
    lo, hi = throughput if throughput is not None else (ref.theta0 / 100, ref.theta0 * 100)
    check_range("--throughput", lo, hi)
    r_lo, r_hi, clipped = rate_axis(rate, ref)
    check_range("--rate", r_lo, r_hi)
    axes = [np.geomspace(lo, hi, points), np.geomspace(r_lo, r_hi, points)]
    _check_finite(costs, axes[0], axes[1])
    result = replace(compute(costs, seeds, method, axes[0], axes[1], per_seed),
                     names=study_names(folder), clipped=clipped,
                     carried=carried_rate_range_bps(ref.bandwidth_hz))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "crossover_grid.csv", grid_table(result))
    write_csv(out / "crossover_boundary.csv", boundary_table(result))
    write_json(out / "crossover.json", {
        "study": str(folder), "method": method, "baselines": result.baselines,
        "throughput0_macs_per_s": result.theta0, "uplink_rate0_bps": result.rate0,
        "seeds": seeds, "at_scenario": at_scenario(result),
        "time_band": {"kind": "min-max over the evaluation seeds' boundaries, paired by seed "
                              "(every combination where the methods ran different seeds)",
                      "at_scenario_rate": band_at_scenario(result)},
        "uplink_rate_axis_bps": [float(r_lo), float(r_hi)], "uplink_rate_clipped": clipped,
        "uplink_bandwidth_hz": ref.bandwidth_hz,
        "uplink_rate_carried_bps": list(result.carried),
        "costs": {label: (asdict(c) if c is not None else None) for label, c in costs.items()},
        "seed_costs": {label: {str(seed): (asdict(c) if c is not None else None)
                               for seed, c in by_seed.items()}
                       for label, by_seed in per_seed.items()}})
    return result


def summary_lines(result: Crossover) -> list[str]:
    """What the terminal shows: who wins at the scenario's point, and where the region is."""
    lines = [(f"{result.method} against {', '.join(result.baselines)}; scenario at throughput "
              f"{result.theta0:.4g} MAC/s, uplink {result.rate0:.4g} bit/s")]
    for name, info in at_scenario(result).items():
        vals = ", ".join(f"{k} {v:.4g}" if v is not None else f"{k} not reached"
                         for k, v in info["values"].items())
        won = all(info["wins"].values())
        share = float(result.wins[name]["all"].mean())
        lines.append(f"{info['title']}: {vals}; at the scenario {result.method} "
                     f"{'wins' if won else 'does not win'}; wins in {100 * share:.0f}% of the "
                     "grid")
    return lines

