"""Issue 20, outputs: every expected failure is one ``error:`` line (exit 2, no traceback) and
keeps what was recorded; an exception inside one algorithm is that algorithm's failure; outputs
are written atomically, never through a symbolic link, readable by the group; HTML escapes what
a run folder holds; figures draw any printable label literally.

One tiny run (tests/conftest.py's small scenario) is recorded once per session (its small_run
fixture); each test works on a copy of it. The truths compared against: the uninterrupted run's
own tables (rows kept, a resumed run), the file bytes before the command (snapshot), the modes
``0o666 & ~umask`` that open(2) gives any new file, and the exception's own type and text.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.text
import pandas as pd
import pytest

from tests.conftest import cli as _cli
from tests.hostile import (
    EXIT_USER_ERROR,
    RUNNERS,
    assert_refused,
    assert_untouched,
    run_cli,
    snapshot,
)
from wirelessfl.cli import main
from wirelessfl.results import records
from wirelessfl.results.records import read_run

ROUNDS_FILES = ("rounds.parquet", "devices.parquet")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask



def _refused(capsys, *argv, fragments=()) -> str:
    """In process: exit 2, one ``error:`` line holding every fragment (an exception escaping
    main() fails the test with its traceback)."""
    code, out, err = _cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == EXIT_USER_ERROR and len(lines) == 1, (code, out, err)
    for fragment in fragments:
        assert fragment.lower() in lines[0].lower(), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def recorded(small_run):
    """The small scenario run once, without figures, under umask 002 (its files must be 0664):
    tests/conftest.py's small_run, shared with other modules (read only; copy it to change it)."""
    return small_run


@pytest.fixture
def run_copy(recorded, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(recorded[0], folder)
    return folder


def _tables(folder: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_parquet(folder / name) for name in ROUNDS_FILES}


# ---- permissions -------------------------------------------------------------------------------

def test_every_file_of_a_run_folder_is_readable_as_open_would_make_it(recorded, tmp_path,
                                                                       capsys):
    """Tables used to be written 0600 (mkstemp) while figures were 0644: every output now gets
    0666 & ~umask, what open(2) gives a new file."""
    folder = recorded[0]
    for path in folder.iterdir():
        assert path.stat().st_mode & 0o777 == 0o664, path.name  # the fixture's umask 002
    copy = tmp_path / "run"
    shutil.copytree(folder, copy)
    previous = os.umask(0o027)
    try:
        code, _, _ = _cli(capsys, "report", copy, "--html")
    finally:
        os.umask(previous)
    assert code == 0
    written = {p.name for p in copy.iterdir()} - {p.name for p in folder.iterdir()}
    assert {"report.html", "accuracy_vs_energy.png"} <= written
    for name in written:
        assert (copy / name).stat().st_mode & 0o777 == 0o640, name


def test_a_published_run_folder_replaces_a_planted_link_and_is_group_readable(tmp_path):
    """A sweep's run folder (records.publish_folder): a link planted at its name is swapped out,
    never written through; folder 0777 & ~umask, files 0666 & ~umask; no staging left."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "manifest.json").write_text("precious")
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "r").symlink_to(outside)
    previous = os.umask(0o007)
    try:
        records.publish_folder({"manifest.json": b"{}", "rounds.parquet": b"x"}, runs / "r")
    finally:
        os.umask(previous)
    assert (outside / "manifest.json").read_text() == "precious"
    assert not (runs / "r").is_symlink() and (runs / "r" / "manifest.json").read_bytes() == b"{}"
    assert (runs / "r").stat().st_mode & 0o777 == 0o770
    assert {p.stat().st_mode & 0o777 for p in (runs / "r").iterdir()} == {0o660}
    assert sorted(p.name for p in runs.iterdir()) == ["r"]
    with pytest.raises(records.UserError, match="not a plain file name"):
        records.publish_folder({"../escape": b"x"}, runs / "s")
    assert not (tmp_path / "escape").exists()


# ---- symbolic links and temporary files ---------------------------------------------------------

def test_report_replaces_links_planted_in_the_run_folder_and_never_writes_through_them(
        run_copy, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in ("report.html", "accuracy_vs_energy.png", "energy_breakdown.png"):
        (run_copy / name).symlink_to(victim)
    before = snapshot(tmp_path)
    code, _, err = _cli(capsys, "report", run_copy, "--html")
    assert code == 0, err
    assert victim.read_text() == "precious\n"
    assert_untouched(tmp_path, before, allowed=[run_copy])
    for name in ("report.html", "accuracy_vs_energy.png", "energy_breakdown.png"):
        assert not (run_copy / name).is_symlink() and (run_copy / name).stat().st_size > 1000


def test_compare_replaces_a_linked_comparison_csv(run_copy, tmp_path, capsys):
    victim = tmp_path / "victim.csv"
    victim.write_text("precious\n")
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "comparison.csv").symlink_to(victim)
    code, _, err = _cli(capsys, "compare", run_copy, "--out", out)
    assert code == 0, err
    assert victim.read_text() == "precious\n"
    assert not (out / "comparison.csv").is_symlink()


def _dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_report_removes_temporary_files_left_by_interrupted_writes(run_copy, tmp_path, capsys):
    """A temporary file whose writer is gone is removed (a file, a folder, a link: the link
    itself, never its target); one whose writer still runs is left alone."""
    host = records._host()
    dead, alive = _dead_pid(), os.getppid()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    stale_file = run_copy / f".report.html.tmp-{dead}-{host}-0badc0de"
    stale_file.write_text("half a page")
    stale_dir = run_copy / f".x.tmp-{dead}-{host}-00000001"
    stale_dir.mkdir()
    (stale_dir / "f").write_text("x")
    stale_link = run_copy / f".y.tmp-{dead}-{host}-00000002"
    stale_link.symlink_to(victim)
    live = run_copy / f".rounds.parquet.tmp-{alive}-{host}-00000003"
    live.write_text("being written")
    foreign = run_copy / f".z.tmp-{dead}-{host}x-00000004"  # another host's: it may still write
    foreign.write_text("x")
    code, _, err = _cli(capsys, "report", run_copy, "--html")
    assert code == 0, err
    assert not stale_file.exists() and not stale_dir.exists() and not os.path.lexists(stale_link)
    assert victim.read_text() == "precious\n"
    assert live.read_text() == "being written" and foreign.exists()
    leftovers = [p.name for p in run_copy.iterdir() if records.TEMP_MARK in p.name]
    assert sorted(leftovers) == sorted([live.name, foreign.name])


# ---- disk full, read-only folder ----------------------------------------------------------------

def _limited_file_size(limit: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@contextlib.contextmanager
def _file_size_limit_here(limit: int):
    """RLIMIT_FSIZE's soft limit on this process for a while (SIGXFSZ ignored: EFBIG instead of
    a kill); the limits and the handler as they were afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@pytest.mark.parametrize(("limit", "failing", "runner"), [
    (20_000, "accuracy_vs_energy.png", "in-process"),
    pytest.param(20_000, "accuracy_vs_energy.png", "subprocess", marks=pytest.mark.slow),
    pytest.param(200_000, "report.html", "subprocess", marks=pytest.mark.slow)])
def test_a_write_that_fails_midway_leaves_the_previous_report_intact(limit, failing, runner,
                                                                     run_copy, capsys):
    """The kernel refuses to let a file grow past RLIMIT_FSIZE (EFBIG), as a full disk refuses
    with ENOSPC: at 20 kB the first figure fails, at 200 kB report.html (the figures, 30-70 kB,
    are written again, the same bytes); what was written before stays byte for byte, no
    temporary file is left, and the command says so in one line. In a fresh interpreter under
    the limit (slow), and in this process with the limit set around the command."""
    assert _cli(capsys, "report", run_copy, "--html")[0] == 0
    before = snapshot(run_copy)
    assert (run_copy / "report.html").stat().st_size > 200_000
    if runner == "in-process":
        with _file_size_limit_here(limit):
            proc = RUNNERS["in-process"]("report", str(run_copy), "--html")
        assert_refused(proc, "file size limit", str(run_copy / failing),
                       "as it was before is kept")
        assert snapshot(run_copy) == before
        return
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "wirelessfl", "report", str(run_copy), "--html"],
                          capture_output=True, text=True, env=env, timeout=240,
                          preexec_fn=_limited_file_size(limit), check=False)
    assert_refused(proc, "file size limit", str(run_copy / failing), "as it was before is kept")
    assert snapshot(run_copy) == before


def test_disk_full_while_running_keeps_what_was_recorded_and_resume_finishes(
        recorded, tmp_path, monkeypatch, capsys):
    """ENOSPC on the fourth table write (after the first algorithm was recorded): one error
    line, the folder holds the last complete write (no half-written table, no temporary file),
    and --resume finishes it to the uninterrupted run's tables."""
    folder, scenario = recorded
    real = pd.DataFrame.to_parquet
    calls = []

    def full_disk(self, path, *args, **kwargs):
        calls.append(path)
        if len(calls) > 4:
            Path(path).write_bytes(b"PAR1 half a table")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full_disk)
    out = tmp_path / "run"
    _refused(capsys, "run", scenario, "--out", out, "--quiet", "--no-report",
             fragments=("No space left on device", "disk is full", "rounds.parquet"))
    monkeypatch.setattr(pd.DataFrame, "to_parquet", real)
    assert not [p for p in out.iterdir() if records.TEMP_MARK in p.name]
    kept = read_run(out)
    assert kept.manifest["status"] == "running" and list(kept.manifest["algorithms"]) == ["dzofl"]
    truth = _tables(folder)
    pd.testing.assert_frame_equal(kept.rounds,
                                  truth["rounds.parquet"].query("algorithm == 'dzofl'"))
    code, _, err = _cli(capsys, "run", "--resume", out, "--quiet", "--no-report")
    assert code == 0, err
    for name, frame in _tables(out).items():
        pd.testing.assert_frame_equal(frame, truth[name])


def test_read_only_output_folder_is_one_error_line(run_copy, tmp_path, monkeypatch, capsys):
    """The file system refuses every new file in the folder (EROFS; as root, chmod would not
    stop us, so open(2) is made to refuse as a read-only mount does)."""
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(str(run_copy)) and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    before = snapshot(tmp_path)
    monkeypatch.setattr(os, "open", read_only)
    _refused(capsys, "report", run_copy, "--html",
             fragments=("Read-only file system", "--out", str(run_copy)))
    _refused(capsys, "run", "--resume", run_copy, "--quiet", fragments=("Read-only file system",))
    monkeypatch.undo()
    assert_untouched(tmp_path, before)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a folder chmod 555 anyway")
def test_read_only_output_folder_by_permissions(run_copy, tmp_path):
    before = snapshot(tmp_path)
    run_copy.chmod(0o555)
    try:
        proc = RUNNERS["in-process"]("report", str(run_copy), cwd=tmp_path)
    finally:
        run_copy.chmod(0o755)
    assert_refused(proc, "permission denied", "--out")
    assert_untouched(tmp_path, before)


# ---- a reader that stops reading ----------------------------------------------------------------

def test_output_into_a_closed_pipe_ends_quietly_in_process(capsys, monkeypatch):
    """main() itself, its stdout a pipe whose reader is gone: the write fails (EPIPE), main
    returns SIGPIPE's exit code (141) and writes nothing on stderr. What the interpreter does
    at its exit afterwards, and `report`: the next test, in a fresh interpreter (slow)."""
    read, write = os.pipe()
    os.close(read)  # the reader has already gone
    stdout = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stdout", stdout)
    try:
        code = main(["list"])
    finally:
        monkeypatch.undo()
        with contextlib.suppress(OSError):
            stdout.close()
    assert code == 128 + signal.SIGPIPE
    assert capsys.readouterr().err == ""


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["list"], ["report", "RUN"]])
def test_output_into_a_closed_pipe_ends_quietly(argv, run_copy):
    """``wirelessfl list | head -1``: the reader is gone before we write; nothing on stderr, the
    exit code of a command stopped by SIGPIPE (141), no traceback."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    argv = [str(run_copy) if a == "RUN" else a for a in argv]
    read, write = os.pipe()
    os.close(read)  # the reader has already gone
    try:
        proc = subprocess.run([sys.executable, "-m", "wirelessfl", *argv], stdout=write,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=240,
                              check=False)
    finally:
        os.close(write)
    assert proc.stderr == "" and proc.returncode == 128 + signal.SIGPIPE, proc.stderr


# ---- damaged run folders ------------------------------------------------------------------------

def _write_json(path: Path, doc) -> None:
    path.write_text(json.dumps(doc))


def _edit_manifest(edit):
    def damage(folder: Path) -> None:
        manifest = json.loads((folder / "manifest.json").read_text())
        edit(manifest)
        _write_json(folder / "manifest.json", manifest)
    return damage


def _edit_rounds(edit):
    def damage(folder: Path) -> None:
        frame = pd.read_parquet(folder / "rounds.parquet")
        edit(frame).to_parquet(folder / "rounds.parquet", index=False)
    return damage


def _truncate(name: str):
    def damage(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2])
    return damage


DAMAGES = {
    "rounds truncated": (_truncate("rounds.parquet"), "rounds.parquet"),
    "devices garbage": (lambda f: (f / "devices.parquet").write_bytes(os.urandom(3000)),
                        "devices.parquet"),
    "rounds empty file": (lambda f: (f / "rounds.parquet").write_bytes(b""), "rounds.parquet"),
    "manifest truncated": (_truncate("manifest.json"), "manifest.json"),
    "manifest not UTF-8": (lambda f: (f / "manifest.json").write_bytes(b"\xff\xfe{"),
                           "manifest.json"),
    "manifest a list": (lambda f: _write_json(f / "manifest.json", [1, 2]), "manifest.json"),
    "manifest nested too deep": (lambda f: (f / "manifest.json").write_text("[" * 100_000),
                                 "manifest.json"),
    "manifest without scenario": (_edit_manifest(lambda m: m.pop("scenario")), "scenario"),
    "manifest without algorithms": (_edit_manifest(lambda m: m.pop("algorithms")),
                                    "algorithms"),
    "manifest seed text": (_edit_manifest(lambda m: m.update(seed="three")), "seed"),
    "population not a mapping": (_edit_manifest(
        lambda m: m["scenario"].update(population=[8])), "num_devices"),
    "target a text": (_edit_manifest(
        lambda m: m["scenario"].update(target_accuracy="high")), "target_accuracy"),
    "health limits wrong": (_edit_manifest(
        lambda m: m["scenario"].update(health={"max_loss_growth": "big"})), "health"),
    "label counts ragged": (_edit_manifest(
        lambda m: m["partition"].update(label_counts=[[1, 2], [3]])), "partition"),
    "algorithm entry a number": (_edit_manifest(
        lambda m: m["algorithms"].update(dzofl=3)), "algorithms.dzofl"),
    "rounds column missing": (_edit_rounds(lambda r: r.drop(columns=["energy_j"])),
                              "energy_j"),
    "rounds numbers as text": (_edit_rounds(lambda r: r.assign(test_accuracy="high")),
                               "test_accuracy"),
    "rounds label with escape codes": (_edit_rounds(
        lambda r: r.assign(algorithm="\x1b]0;owned\x07")), "algorithm"),
}


@pytest.mark.parametrize("kind", list(DAMAGES))
@pytest.mark.parametrize("command", ["report", "compare", "resume"])
def test_damaged_run_folder_is_one_error_line_naming_it(kind, command, run_copy, tmp_path,
                                                       capsys):
    damage, fragment = DAMAGES[kind]
    damage(run_copy)
    before = snapshot(tmp_path)
    argv = {"report": ["report", run_copy, "--html"],
            "compare": ["compare", run_copy, "--out", tmp_path / "cmp"],
            "resume": ["run", "--resume", run_copy, "--quiet"]}[command]
    line = _refused(capsys, *argv, fragments=(str(run_copy), fragment))
    assert "damaged" in line or "not a readable" in line or "not a JSON" in line, line
    assert_untouched(tmp_path, before)


@pytest.mark.slow
def test_damaged_run_folder_in_a_fresh_interpreter(run_copy, tmp_path):
    """As a user meets it: the same refusal, no traceback, nothing changed."""
    _truncate("rounds.parquet")(run_copy)
    before = snapshot(tmp_path)
    assert_refused(run_cli("report", str(run_copy), "--html", cwd=tmp_path), "rounds.parquet",
                   "damaged")
    assert_untouched(tmp_path, before)


@pytest.mark.parametrize("content", ["{", "[]", '{"runs": 3}', '{"runs": [1]}'])
def test_damaged_sweep_manifest_is_one_error_line(content, tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(content)
    _refused(capsys, "compare", sweep, fragments=("sweep.json",))
    _refused(capsys, "report", sweep, fragments=("sweep.json",))


# ---- HTML escaping, literal labels --------------------------------------------------------------

SCRIPT = "<script>document.title='owned'</script>"


def test_report_html_escapes_what_the_run_folder_holds(run_copy, capsys):
    _edit_manifest(lambda m: (m.update(status=SCRIPT),
                              m["scenario"].update(name=f"n{SCRIPT}"),
                              m["versions"].update(python=SCRIPT)))(run_copy)
    _edit_rounds(lambda r: r.assign(algorithm=r.algorithm.replace({"fedsgd": SCRIPT})))(run_copy)
    code, _, err = _cli(capsys, "report", run_copy, "--html")
    assert code == 0, err
    page = (run_copy / "report.html").read_text()
    assert "<script" not in page.lower()
    escaped = "&lt;script&gt;document.title=&#x27;owned&#x27;&lt;/script&gt;"
    assert page.count(escaped) >= 4  # status, title (twice), the summary's and health's label
    assert "default-src 'none'" in page  # no script would run even if one slipped through


LABELS = ["$x$", "a$\\foo$b", "$", "price $5 and $6", "\\$"]


def test_any_printable_label_is_drawn_literally(run_copy, capsys):
    """Labels with '$' crashed mathtext ('$\\foo$') or were drawn as math ('$x$'): each is now
    drawn as written, in legends, titles and tick labels."""
    names = dict(zip(["dzofl", "fedsgd", "fedavg"], LABELS))
    _edit_rounds(lambda r: r.assign(algorithm=r.algorithm.map(names)))(run_copy)
    devices = pd.read_parquet(run_copy / "devices.parquet")
    devices.assign(algorithm=devices.algorithm.map(names),
                   device_class=LABELS[3]).to_parquet(run_copy / "devices.parquet", index=False)
    _edit_manifest(lambda m: m["scenario"].update(name=LABELS[1]))(run_copy)
    code, out, err = _cli(capsys, "report", run_copy)
    assert code == 0, err
    assert out.count("wrote") >= 6


def test_save_figure_draws_every_text_as_written(tmp_path):
    from wirelessfl.report.plots import literal, save_figure

    fig, ax = plt.subplots()
    for label in LABELS:
        ax.plot([1, 10], [1, 2], label=label)
    ax.set_xscale("log")  # its tick labels stay mathtext: 10^0, 10^1
    ax.legend()
    ax.set_title(LABELS[1])
    ax.set_xticks([1, 3, 10], [literal(v) for v in LABELS[:3]])
    texts = list(fig.findobj(matplotlib.text.Text))
    save_figure(fig, tmp_path / "f.png", 50)
    shown = {t._preprocess_math(t.get_text()) for t in texts if t.get_text()}
    assert {(label, False) for label in LABELS} <= shown
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- an exception inside one algorithm ----------------------------------------------------------

def _fail_fedsgd_at_round(monkeypatch, error: BaseException, at: int = 3) -> None:
    from wirelessfl.algorithms.fedavg import FedSGD

    real = FedSGD.apply

    def apply(self, mean_vector):
        if self.round_index == at:
            raise error
        return real(self, mean_vector)

    monkeypatch.setattr(FedSGD, "apply", apply)


def test_an_exception_in_one_algorithm_is_its_failure_and_the_others_run(
        recorded, tmp_path, monkeypatch, capsys):
    folder, scenario = recorded
    _fail_fedsgd_at_round(monkeypatch, RuntimeError("boom\nsecond line"))
    out = tmp_path / "run"
    code, _, err = _cli(capsys, "run", scenario, "--out", out, "--quiet", "--no-report")
    assert code == 0 and "Traceback" not in err, err  # the convention of a partial run
    warnings = [line for line in err.splitlines() if "RuntimeError" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: fedsgd: failed at round 3: "
                                                         "RuntimeError: boom second line")
    record = read_run(out)
    assert record.manifest["status"] == "partial"
    entry = record.manifest["algorithms"]["fedsgd"]
    assert entry["status"] == "failed" and "RuntimeError: boom" in entry["message"]
    assert "Traceback" in entry["traceback"] and entry["health"]["healthy"] is False
    assert {k: v["status"] for k, v in record.manifest["algorithms"].items()} == {
        "dzofl": "complete", "fedsgd": "failed", "fedavg": "complete"}
    truth = _tables(folder)["rounds.parquet"]
    # its rows before the failure (rounds 0 and 2 of eval_every 2) as the uninterrupted run's;
    # the other algorithms' rows all identical
    expected = pd.concat([truth[truth.algorithm == "dzofl"],
                          truth[(truth.algorithm == "fedsgd") & (truth["round"] < 3)],
                          truth[truth.algorithm == "fedavg"]], ignore_index=True)
    pd.testing.assert_frame_equal(record.rounds, expected)
    summary = pd.read_csv(out / "summary.csv").set_index("algorithm")
    assert not summary.healthy["fedsgd"] and "failed" in summary.health["fedsgd"]
    code, out_text, err = _cli(capsys, "report", out, "--html")
    assert code == 0, err
    assert "fedsgd: unhealthy: failed: an error stopped it after round 2" in out_text


def test_an_algorithm_failing_before_its_first_row_gets_a_summary_row(recorded, tmp_path,
                                                                      monkeypatch, capsys):
    from wirelessfl.algorithms.fedavg import FedSGD

    def setup(self):
        raise ValueError("cannot set up")

    monkeypatch.setattr(FedSGD, "setup", setup)
    out = tmp_path / "run"
    code, _, err = _cli(capsys, "run", recorded[1], "--out", out, "--quiet",
                              "--no-report")
    assert code == 0, err
    assert "fedsgd: failed at round 0: ValueError: cannot set up" in err
    assert read_run(out).manifest["algorithms"]["fedsgd"]["status"] == "failed"
    assert "fedsgd: unhealthy: failed: an error stopped it before its first evaluation" in \
        _cli(capsys, "report", out)[1]
    code, printed, err = _cli(capsys, "compare", out)
    assert code == 0, err
    fedsgd = next(line for line in printed.splitlines() if line.startswith("fedsgd"))
    assert "0/1" in fedsgd and "1/1" in fedsgd  # reached target 0 of 1 seed, unhealthy 1 of 1


def test_compare_of_a_run_without_rounds_yet_is_one_error_line(run_copy, capsys):
    for name in ROUNDS_FILES:
        frame = pd.read_parquet(run_copy / name)
        frame.iloc[:0].to_parquet(run_copy / name, index=False)
    _edit_manifest(lambda m: m.update(status="running", algorithms={}))(run_copy)
    _refused(capsys, "compare", run_copy, fragments=(str(run_copy), "no algorithm has recorded"))
    code, _, err = _cli(capsys, "report", run_copy, "--html")  # a table with no rows
    assert code == 0, err


def test_out_of_memory_in_an_algorithm_is_recorded_then_one_error_line(recorded, tmp_path,
                                                                        monkeypatch, capsys):
    """MemoryError is not swallowed: the algorithm is recorded failed, the run stops (status
    failed) with one error line, and --resume reruns it to the uninterrupted run's tables."""
    folder, scenario = recorded
    _fail_fedsgd_at_round(monkeypatch, MemoryError())
    out = tmp_path / "run"
    _refused(capsys, "run", scenario, "--out", out, "--quiet", "--no-report",
             fragments=("out of memory", "--resume"))
    monkeypatch.undo()
    manifest = read_run(out).manifest
    assert manifest["status"] == "failed"
    assert manifest["algorithms"]["fedsgd"]["status"] == "failed"
    assert "fedavg" not in manifest["algorithms"]
    code, _, err = _cli(capsys, "run", "--resume", out, "--quiet", "--no-report")
    assert code == 0, err
    for name, frame in _tables(out).items():
        pd.testing.assert_frame_equal(frame, _tables(folder)[name])
    assert read_run(out).manifest["status"] == "complete"


def test_keyboard_interrupt_in_an_algorithm_keeps_the_interrupted_path(recorded, tmp_path,
                                                                       monkeypatch, capsys):
    _fail_fedsgd_at_round(monkeypatch, KeyboardInterrupt())
    out = tmp_path / "run"
    code, _, err = _cli(capsys, "run", recorded[1], "--out", out, "--quiet", "--no-report")
    assert code == 130 and "interrupted" in err
    assert read_run(out).manifest["algorithms"]["fedsgd"]["status"] == "interrupted"


def test_an_atomic_write_reaches_the_disk_before_and_after_its_rename(tmp_path, monkeypatch):
    """The file's bytes are flushed before the rename makes them the file, and the folder's
    entry after it (issue 34: no fsync before the renames the resume promise rests on)."""
    import os

    from wirelessfl.results import records

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(records.os, "fsync", fsync)
    monkeypatch.setattr(records.os, "replace", replace)
    target = tmp_path / "manifest.json"
    records.write_json(target, {"status": "complete"})
    kinds = [kind for kind, _ in events]
    assert kinds == ["fsync", "replace", "fsync"], events
    assert events[0][1] != str(target) and events[0][1].startswith(str(tmp_path))  # the temp
    assert events[1][1] == str(target) and events[2][1] == str(tmp_path)
    assert target.read_text() == '{\n  "status": "complete"\n}\n'
