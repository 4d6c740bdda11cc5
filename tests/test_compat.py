"""Old import paths of moved modules keep working for one release, with a DeprecationWarning
that names the new path (wirelessfl/_compat.py), and give the very objects the new paths hold."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "wirelessfl"
# old path -> (a name read through it, the module that holds it now)
MOVED = {
    "wirelessfl.engine.threads": ("configure", "wirelessfl.host.threads"),
    "wirelessfl.engine.allocator": ("keep_freed_memory", "wirelessfl.host.allocator"),
    "wirelessfl.progress": ("RunProgress", "wirelessfl.host.progress"),
    "wirelessfl.algorithms.types": ("Payload", "wirelessfl.contract.payload"),
    "wirelessfl.engine.participation": ("participant_count", "wirelessfl.algorithms.participation"),
    "wirelessfl.engine.build": ("build_world", "wirelessfl.pipeline.build"),
    "wirelessfl.engine.checkpoint": ("read_checkpoint", "wirelessfl.pipeline.checkpoint"),
    "wirelessfl.engine.fingerprint": ("scenario_fingerprint", "wirelessfl.pipeline.fingerprint"),
    "wirelessfl.engine.resources": ("ProblemFacts", "wirelessfl.contract.problem"),
    "wirelessfl.engine.runner": ("run_scenario", "wirelessfl.pipeline.runner"),
    "wirelessfl.engine.simulation": ("run_algorithm", "wirelessfl.pipeline.simulation"),
    "wirelessfl.engine.state_tree": ("skeleton", "wirelessfl.pipeline.state_tree"),
    "wirelessfl.scenario.checks": ("check_runnable", "wirelessfl.pipeline.preflight"),
    "wirelessfl.learning.evaluator": ("FlatModel", "wirelessfl.learning.flat_model"),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_warns_and_gives_the_moved_object(old):
    name, home = MOVED[old]
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=f"import {name} from {home}"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(home), name)


def test_from_import_of_an_old_path_works_and_an_unknown_name_is_an_import_error():
    with pytest.warns(DeprecationWarning):
        from wirelessfl.engine.resources import data_bytes, estimate_memory
    from wirelessfl.pipeline.memory import estimate_memory as new
    from wirelessfl.problems.data_size import data_bytes as new_data

    assert estimate_memory is new and data_bytes is new_data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ImportError):
            from wirelessfl.engine.runner import no_such_name  # noqa: F401


def test_every_stub_is_listed_here():
    """Every module that is a stub for ``moved`` is tested above."""
    stubs = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)
             for p in PACKAGE.rglob("*.py") if "\n__getattr__ = moved(__name__" in p.read_text()}
    assert stubs == set(MOVED)
