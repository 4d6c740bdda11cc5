"""docs/results.md ("What the shipped scenarios show") and benchmarks/README.md against their files.

Every measured number in those parts lives in a generated block, rendered by
benchmarks/render_docs.py from benchmarks/*.json and docs/data/. These tests re-render every block
and compare it with the committed text, and check that the prose outside the blocks carries no
measured number (a decimal, or a number with a unit of energy, time, ratio or share) beyond the
configuration and paper constants allowed below.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"
BENCH_README = ROOT / "benchmarks" / "README.md"
SECTION = "## What the shipped scenarios show"

# Phrases outside generated blocks that carry a decimal or a unit but are not measurements: each
# is removed before the scan, so it must appear verbatim. Keep this list short.
ALLOWED = {
    "20 ms": "the radio-power-sweep scenario's upload deadline (configuration)",
    "+8 dBm": "the heterogeneous-devices scenario's transmit power (configuration)",
    "30 % of the training set": "seed000-table1-digits' server_fraction (configuration)",
    "30 % iid data": "the same server_fraction, in the paper's setting (configuration)",
    "(1, 0.5)": "the (alpha, beta) setting of seed000-table1-digits (configuration)",
    "participation 0.5": "seed000-table1-digits' participation (configuration)",
    "gamma0 = 0.5": "the spec's CPU recipe for ZO-HFL (configuration)",
    "Dir(0.3)": "seed003-toy's label-mix concentration (configuration)",
    "Dir(0.5)": "seed004-logistic's partition concentration (configuration)",
    "h = 0.3": "seed001-quadratic's problem constant (fedmsa.md Sec. 5.1)",
    "alpha = 0.02, beta = 0.1, rho = 0.5": "seed001-quadratic's step sizes (configuration)",
    "eta = 0.4": "seed001-quadratic's FedNest Neumann step, [D] (configuration)",
    "beta = 0.3": "seed001-mco's second step setting (configuration)",
    "rho=1.0": "the centralized seed001-mco override (configuration)",
    "ratio 0.1": "seed001-loss-tuning's long-tail ratio (configuration)",
    "q = 0.5": "seed001-loss-tuning's q-partition (configuration)",
    "alpha = beta = 0.5, rho = 0.5": "seed001-loss-tuning's FedMSA steps (configuration)",
    "worst_fraction: 0.2": "seed003-toy's worst-k fraction (configuration)",
    "23 ... -40 dBm": "the radio-power-sweep script's transmit powers (configuration)",
    "accuracy of 0.5": "fgdro.md Sec. 5's worst-device accuracy target (configuration)",
    "zo_hfl.md 5.3": "a section of the spec",
    "target accuracy 0.95": "seed002-digits28's target accuracy, [D] (configuration)",
    "95 % confidence": "the confidence level of wirelessfl reproduce's intervals (a constant)",
    "(alpha = 1000, beta = 0.9)": "seed 000 Table I's homogeneous setting (paper, configuration)",
    "(alpha = 1, beta = 0.5)": "seed 000 Table I's moderate setting (paper, configuration)",
    "(alpha = 0.1, beta = 0.1)": "seed 000 Table I's extreme setting (paper, configuration)",
}
# A decimal, or a number followed by a unit of energy, time, power, memory, ratio or share.
MEASURED = re.compile(
    r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?\s?(?:[mu]?J|[mu]?s|[mu]?W|dBm?|%|MB|GB|GFLOP/s"
    r"|[kMG]?bit/s|[kMG]Hz)(?![\w/])"
    r"|(?<![\w.])\d[\d,]*(?:\.\d+)?x(?!\w)"
    r"|(?<![\w.])[-+]?\d[\d,]*\.\d+")
# Section references ("Sec. 5.2", "fedmsa.md Sec. 4.1", "Alg. 4", "App. G") are not numbers.
REFERENCE = re.compile(r"(?:Secs?\.|App\.|Alg\.|Table|eqs?\.)\s*\d+(?:\.\d+)*")


def _render_docs():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module("render_docs")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def _prose(text: str) -> str:
    """TEXT without its generated blocks."""
    return re.sub(r"<!-- generated: .*?<!-- end generated -->", "", text, flags=re.DOTALL)


def measured_numbers(text: str) -> list[str]:
    """The measured-looking numbers of TEXT's prose, with their line."""
    hits = []
    for line in _prose(text).splitlines():
        clean = line
        for phrase in ALLOWED:
            clean = clean.replace(phrase, "")
        clean = REFERENCE.sub("", clean)
        hits += [f"{m.group(0)!r} in: {line.strip()}" for m in MEASURED.finditer(clean)]
    return hits


def _checked_texts() -> dict[str, str]:
    results = RESULTS.read_text()
    assert SECTION in results
    return {"docs/results.md": results[results.index(SECTION):],
            "benchmarks/README.md": BENCH_README.read_text()}


def test_generated_blocks_match_their_files():
    problems = _render_docs().check()
    assert not problems, ("generated blocks differ from their files; run "
                          "`python benchmarks/render_docs.py`:\n" + "\n".join(problems))


def test_every_generated_block_names_its_files():
    render = _render_docs()
    for text in _checked_texts().values():
        for name, body in render.blocks(text).items():
            sources = render.BLOCKS[name][0]
            assert sources, name
            assert f"(from {', '.join(sources)})" in body.splitlines()[0], name


@pytest.mark.parametrize("doc", ["docs/results.md", "benchmarks/README.md"])
def test_prose_outside_blocks_quotes_no_measured_number(doc):
    hits = measured_numbers(_checked_texts()[doc])
    assert not hits, (f"{doc}: measured numbers outside generated blocks (generate the "
                      "sentence, drop the number, or allow a constant with a reason):\n"
                      + "\n".join(hits))


def test_allowed_phrases_are_used():
    prose = "".join(_prose(t) for t in _checked_texts().values())
    assert [p for p in ALLOWED if p not in prose] == []


def test_check_catches_an_edited_number():
    render = _render_docs()
    text = RESULTS.read_text()
    block = render.blocks(text)["quickstart-table"]
    row = block.index("| DZOFL |")
    digit = re.compile(r"\d").search(block, row)
    bumped = str((int(digit.group()) + 1) % 10)
    edited = block[:digit.start()] + bumped + block[digit.end():]
    assert render.check({RESULTS: text.replace(block, edited)}) == [
        "docs/results.md: quickstart-table"]


def test_prose_check_catches_a_typed_number():
    assert measured_numbers("DZOFL needs 17x less energy (6.6 J against 110 J).") == [
        "'17x' in: DZOFL needs 17x less energy (6.6 J against 110 J).",
        "'6.6 J' in: DZOFL needs 17x less energy (6.6 J against 110 J).",
        "'110 J' in: DZOFL needs 17x less energy (6.6 J against 110 J)."]
    assert measured_numbers("90-100 % of uploads; loss 2.7e8; 52.8 ms") != []
    assert measured_numbers("d = 650, 50 devices, 16 bits, Sec. 5.2, 8x8 digits, 1e-6") == []
    generated = "<!-- generated: x (from f) -->\n0.75 and 17x\n<!-- end generated -->"
    assert measured_numbers(generated) == []


def test_direction_words_follow_the_numbers():
    """The readings' direction words come from the values, whichever way the data fall."""
    render = _render_docs()
    assert render.factor(10, 2) == "5.0x fewer"
    assert render.factor(2, 10) == "5.0x more"
    assert render.factor(367.7, 32.7) == "11x fewer"  # 0 decimals from a factor of 10 up
    assert render.factor(3.0, 3.02) == "as many"  # a factor that rounds to 1.0
    assert render.than(2, 30, "rounds", "GD") == "15x more rounds than GD"
    assert render.than(5, 5, "rounds", "GD") == "as many rounds as GD"
    assert render.side(0.749, 0.904) == "below"
    assert render.side(0.9041, 0.9039) == "level with"  # equal as printed (3 decimals)
    assert render.side(95.3, 94.0, "{:.1f}") == "above"
    assert render._trend([162, 79.5, 39]) == "falling"
    assert render._trend([87, 90, 32]) == "not monotone"
