"""A user's own learning problem, written outside the package (tests/test_problem_plugins.py).

f_i(x) = s/2 ||x - b_i||^2 on N clients (one device each), b_i ~ N(0, I) from the stream (seed,
"plugin-problem"): the mean Hessian is s I, so x* = mean_i b_i and f(x) - f* = s/2 ||x - x*||^2.
It reuses the package's ``QuadraticProblem`` (A_i = s I, c_i = s b_i) as a user would, and
declares its section, builder and memory part the way the built-ins do.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from wirelessfl.contract.problem import ProblemFacts
from wirelessfl.learning.seeds import keyed_rng
from wirelessfl.problems.base import (
    ALL_CONSTANTS,
    BuiltProblem,
    ProblemConfig,
    ProblemSpec,
    one_device_per_client,
    refuse_data_sections,
)
from wirelessfl.problems.quadratic import QuadraticProblem


class ScaledQuadraticConfig(ProblemConfig):
    clients: int | None = Field(None, gt=0, description="N clients = devices (default 3)")
    dimension: int = Field(4, gt=0, description="d")
    scale: float = Field(2.0, gt=0, description="s, the curvature of every f_i")


def minimisers(seed: int, clients: int, dimension: int) -> np.ndarray:
    """b_i [N, d]: each client's own minimiser."""
    return keyed_rng(seed, "plugin-problem").standard_normal((clients, dimension))


def build(scenario, device) -> BuiltProblem:
    p = scenario.problem
    b = minimisers(scenario.seed, p.clients, p.dimension)
    a = np.repeat(p.scale * np.eye(p.dimension)[None], p.clients, axis=0)
    return BuiltProblem(QuadraticProblem(a, p.scale * b, device=device))


def fit(scenario) -> None:
    one_device_per_client(scenario, 3)
    refuse_data_sections(scenario)


def memory(scenario, limit_bytes: float) -> ProblemFacts:
    p = scenario.problem
    held = 8 * p.clients * p.dimension * (p.dimension + 1)
    return ProblemFacts(p.dimension, 8, held, 2 * held)


SPEC = ProblemSpec(name="scaled-quadratic", Config=ScaledQuadraticConfig, build=build,
                   memory=memory, fit=fit, constants=lambda scenario, facts: set(ALL_CONSTANTS),
                   summary="s/2 ||x - b_i||^2, x* = mean b_i (a test plugin)")
