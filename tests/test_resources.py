"""The pre-run memory estimate: its formula by hand, a refusal that names the numbers and the
fix, and each algorithm's declared peak of [N, d] arrays against the state it really keeps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.conftest import algorithm_scenario, small_doc, small_scenario
from wirelessfl.algorithms.base import REGISTRY, _load_builtin_algorithms
from wirelessfl.cli import main
from wirelessfl.engine.build import build_world
from wirelessfl.engine.checkpoint import read_checkpoint
from wirelessfl.engine.resources import check_memory, run_bytes
from wirelessfl.engine.simulation import restore_algorithm, run_algorithm
from wirelessfl.errors import UserError

_load_builtin_algorithms()


def test_run_bytes_by_hand():
    # 7 arrays of 1,000 devices x 100 parameters in float64, plus a 16 MiB chunk
    assert run_bytes(1000, 100, 7, 8, 16.0) == 7 * 1000 * 100 * 8 + 16 * 2**20


def test_a_run_over_the_limit_is_refused_with_the_numbers_and_a_fix(scenario_file, capsys):
    sc = small_scenario(["engine.memory_limit_mb=8", "engine.max_chunk_mb=64"])
    with pytest.raises(UserError, match=r"needs about 0\.06 GiB .* 8 devices x 650 parameters "
                                        r"x 4 B .* engine\.max_chunk_mb = 64 MiB\), but 0\.01 "
                                        r"GiB is the engine\.memory_limit_mb; use a smaller "
                                        r"chunk \(--set engine\.max_chunk_mb=16\)"):
        check_memory(build_world(sc))
    assert main(["run", str(scenario_file(small_doc())), "--set", "engine.memory_limit_mb=8",
                 "--set", "engine.max_chunk_mb=64", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: small: this run needs about") and err.count("\n") == 1
    check_memory(build_world(small_scenario(["engine.memory_limit_mb=100",
                                             "engine.max_chunk_mb=64"])))  # fits: no error


def test_many_devices_of_a_stateful_method_suggest_fewer_devices():
    sc = algorithm_scenario({"name": "fedred", "rounds": 1},
                            ["engine.memory_limit_mb=20", "engine.max_chunk_mb=1"])
    # the estimate reads only N, d and the precision: a world of 100,000 devices, not built
    world = SimpleNamespace(scenario=sc, num_devices=100_000,
                            evaluator=SimpleNamespace(d=650, compute_dtype=torch.float32))
    with pytest.raises(UserError, match=r"fedred: 7 per-device vectors x 100,000 devices.*use "
                                        r"fewer devices \(population\.num_devices\)"):
        check_memory(world)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_declared_peak_covers_the_state_an_algorithm_keeps(tmp_path, name):
    """[N, d] tensors an algorithm keeps between rounds (read from its checkpointed state) are at
    most its declared ``peak_device_arrays``."""
    sc = algorithm_scenario({"name": name, "rounds": 3, "eval_every": 1},
                            ["data.server_fraction=0.3"])
    world = build_world(sc)
    run_algorithm(world, sc.algorithms[0], checkpoint_every=2, checkpoint_path=tmp_path / "c")
    algorithm = restore_algorithm(world, sc.algorithms[0], read_checkpoint(tmp_path / "c"))
    n, d = world.num_devices, world.evaluator.d
    kept = sum(v.numel() for v in vars(algorithm).values()
               if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[0] == n) / (n * d)
    assert kept <= REGISTRY[name].peak_device_arrays
