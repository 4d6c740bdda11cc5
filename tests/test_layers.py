"""The package's layers hold (wirelessfl/layers.py; docs/architecture.md): no module imports a
higher layer or a sibling, counting every import statement (inside functions and under
TYPE_CHECKING too), and no folder-level import cycle; and the checker finds an upward import
or a cycle where one is added."""

from __future__ import annotations

import shutil
from pathlib import Path

from wirelessfl import layers

PACKAGE = Path(layers.__file__).resolve().parent


def test_every_import_goes_down():
    assert layers.violations() == []


def test_no_folder_level_cycle():
    assert layers.folder_cycles() == []


def test_every_folder_and_top_module_is_in_a_layer():
    parts = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    parts |= {p.stem for p in PACKAGE.glob("*.py")}
    for part in parts:
        layers.height(part)  # KeyError names the folder missing from LAYERS


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "wirelessfl"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_an_upward_import_anywhere_in_a_file_is_found(tmp_path):
    """The deliberate violations: learning (low) importing the pipeline inside a function,
    channel importing the CLI under TYPE_CHECKING, and the engine importing an algorithm (its
    sibling) at module level."""
    root = _copy(tmp_path)
    seeds = root / "learning" / "seeds.py"
    seeds.write_text(seeds.read_text() + "\n\ndef _late():\n"
                     "    from wirelessfl.pipeline import runner\n    return runner\n")
    fading = root / "channel" / "fading.py"
    fading.write_text(fading.read_text() + "\nfrom typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    import wirelessfl.cli\n")
    ledger = root / "engine" / "ledger.py"
    ledger.write_text("from wirelessfl.algorithms import base\n" + ledger.read_text())
    found = layers.violations(root)
    assert len(found) == 3, found
    assert any("learning/seeds.py" in f and "imports wirelessfl.pipeline.runner" in f
               and "'pipeline' is a higher layer than 'learning'" in f for f in found)
    assert any("channel/fading.py" in f and "wirelessfl.cli" in f for f in found)
    assert any("engine/ledger.py:1:" in f and "siblings" in f for f in found)
    assert layers.main([str(root)]) == 1


def test_a_folder_cycle_is_found(tmp_path):
    root = tmp_path / "wirelessfl"
    for name, imports in {"a": "b", "b": "c", "c": "a", "d": "a"}.items():
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(f"import wirelessfl.{imports}\n")
    (root / "__init__.py").write_text("")
    assert layers.folder_cycles(root) == [["a", "b", "c"]]


def test_the_checker_passes_on_the_package_from_the_command_line(capsys):
    assert layers.main([]) == 0
    assert "no folder cycle" in capsys.readouterr().out


def test_the_architecture_doc_shows_the_layers_as_the_checker_holds_them():
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    start = doc.index("<!-- layers:")
    block = doc[doc.index("\n", start) + 1:doc.index("<!-- /layers -->")].strip()
    assert block == layers.markdown_table()
