"""The reproduction's verdict table, read as a person reads it (issue 35): in a 100-column
terminal with every word of a 200-character statement kept, the verdict first, a verdict's
optional note after its reason, and in report.html a claims table with a header per column that
fits a 1,280 px window (the CSS everywhere; measured in headless Chromium where installed)."""

from __future__ import annotations

import re

import pytest
from conftest import table_right_edges

from wirelessfl.report.html import CSS, _page
from wirelessfl.report.tune_html import claims_section
from wirelessfl.results.summary import text_table
from wirelessfl.tune.reproduce import verdict_cells, verdict_text

STATEMENT = ("DZOFL reaches the target with lower total energy than standard FL (transmission "
             "energy of the uplink and the downlink, and computation) when every device draws "
             "its own fading coefficient each round and the base station decodes after all")
MEASURED = {"DZOFL": {"mean": 0.2752, "ci95": 0.1499, "scored": 5, "seeds": 5, "healthy": 5},
            "FedSGD": {"mean": 9.253, "ci95": 7.173, "scored": 5, "seeds": 5, "healthy": 5}}


def _verdicts() -> list[dict]:
    """Two verdicts as tune/claims.py's judge gives them, one with what it may gain (a longer
    verdict, a note, keys the table does not show)."""
    plain = {"claim": "energy", "statement": STATEMENT, "where": "Sec. V (and Sec. IV)",
             "metric": "system_energy_to_target", "measured": MEASURED, "verdict": "holds",
             "reason": "the 95 % intervals do not overlap", "ratio": 33.6}
    longer = {**plain, "claim": "time-paired", "where": "",
              "verdict": "not reproduced (inconclusive)",
              "reason": "the paired differences over the evaluation seeds straddle zero whichever "
                        "seed is left out of the comparison",
              "note": "regime: the uplink is not the bottleneck at the scenario's rate",
              "paired": {"estimate": 1.21, "low": 0.62, "high": 2.37, "seeds": 5,
                         "seeds_past": 3, "times": 1.0},
              "regime": "compute-bound"}
    return [plain, longer]


def test_the_terminal_table_fits_100_columns_and_keeps_every_word():
    verdicts = _verdicts()
    text = verdict_text(verdicts)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, text
    words = {w for row in verdict_cells(verdicts) for cell in row for w in cell.split()}
    assert words <= set(text.split()), words - set(text.split())
    assert len(lines) > len(verdicts) + 2  # the long cells wrapped onto more lines


def test_the_verdict_is_the_first_column():
    verdicts = _verdicts()
    cells = verdict_cells(verdicts)
    assert cells[0][0] == "verdict" and [r[0] for r in cells[1:]] == [v["verdict"] for v in verdicts]
    lines = verdict_text(verdicts).splitlines()
    assert lines[0].startswith("verdict ")
    starts = [line for line in lines if line.startswith(("holds ", "not reproduced "))]
    assert len(starts) == 2 and "energy" in starts[0] and "time-paired" in starts[1]


def test_a_note_follows_the_reason_and_other_keys_are_left_alone():
    plain, longer = verdict_cells(_verdicts())[1:]
    assert plain[-1] == "the 95 % intervals do not overlap"
    assert longer[-1] == f"{_verdicts()[1]['reason']}; {_verdicts()[1]['note']}"
    assert not any("compute-bound" in c for c in longer)


def test_a_table_that_fits_prints_as_it_did():
    cells = [["algorithm", "rounds", "energy [J]"], ["FedAvg", "12", "3.14"],
             ["DZOFL", "160", "0.275"]]
    assert text_table(cells, width=100) == text_table(cells) == (
        "algorithm  rounds  energy [J]\n" + "-" * 29 + "\nFedAvg         12        3.14\n"
        "DZOFL         160       0.275")


def _claims_table() -> str:
    return "".join(claims_section(_verdicts()))


def test_the_html_claims_table_has_a_header_per_column():
    table = _claims_table()
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table)
    assert len(rows) == 1 + len(_verdicts())
    headers = re.findall(r"<th[^>]*>(.*?)</th>", rows[0])
    assert headers[0] == "verdict" and all(headers)
    assert all(len(re.findall(r"<td[^>]*>", r)) == len(headers) for r in rows[1:])


def test_the_html_claims_table_fits_the_page_by_its_css():
    """As wide as the page and no wider (fixed layout, every column a share of 100 %), every
    cell wrapping, a long token (a metric's name) broken anywhere; not in a scrolling box."""
    table = _claims_table()
    assert '<table class="prose">' in table and 'class="scroll"' not in table
    widths = [float(w) for w in re.findall(r'<col style="width: ([\d.]+)%">', table)]
    assert len(widths) == 5 and sum(widths) == pytest.approx(100, abs=0.5)
    rule = re.search(r"table\.prose \{([^}]*)\}", CSS).group(1)
    assert "table-layout: fixed" in rule and "width: 100%" in rule
    cells = re.search(r"table\.prose th, table\.prose td \{([^}]*)\}", CSS).group(1)
    assert "white-space: normal" in cells and "overflow-wrap: anywhere" in cells


@pytest.mark.slow
def test_the_html_claims_table_fits_1280_pixels_in_chromium(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(_page("Reproduction: long claims", "test", claims_section(_verdicts())))
    edges = table_right_edges(page)
    if edges is None:
        pytest.skip("Chromium is not installed")
    assert max(edges) <= 1280 - 15  # a scrollbar's width
