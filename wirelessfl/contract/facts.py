"""What an algorithm may know of the scenario it is asked to run in, before anything is built.

Pre-run checks (pipeline/preflight.py) hand each algorithm a ``ScenarioFacts``: the number of
devices, the problem's capabilities, the problem constants its default rules can read and
whether the base station holds a loss. An algorithm checks its own constraints against these
facts (``Algorithm.problem_needs``, ``Algorithm.check_scenario``, ...), so it never imports the
scenario or the problems, and no module above it branches on which algorithm it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Capabilities of a learning problem, named as ProblemSpec's flags (problems/base.py).
# A multi-sequence problem (an MSAProblem: maps of several sequences, FedMSA's problem).
MULTI_SEQUENCE = "multi_sequence"
# A bilevel problem (a BilevelProblem: FedNest's problem; every bilevel problem is also
# multi-sequence).
BILEVEL = "bilevel"
# A problem on a dataset (its ``data`` section is read).
READS_DATA = "reads_data"
# A compositional problem whose composed objective the base station can take minibatch
# gradients of with every client's samples pooled (``MSAProblem.pooled_gradient``: the
# centralized reference of the Fed-MCO experiment, fedmsa.md 4.1).
COMPOSITIONAL = "compositional"
# The flags a ProblemSpec carries.
PROBLEM_FLAGS = (MULTI_SEQUENCE, BILEVEL, READS_DATA, COMPOSITIONAL)
# A single-level problem: one loss f_i a device takes gradients of (any problem that is not
# multi-sequence); what every algorithm needs unless it says otherwise.
SINGLE_LEVEL = "single_level"


def problem_capabilities(flags: Mapping[str, bool]) -> frozenset[str]:
    """The capabilities of a problem whose ``PROBLEM_FLAGS`` are ``flags`` (name: set): the
    flags set, and ``SINGLE_LEVEL`` for a problem that is not multi-sequence."""
    found = {name for name in PROBLEM_FLAGS if flags.get(name)}
    return frozenset(found if MULTI_SEQUENCE in found else found | {SINGLE_LEVEL})


@dataclass(frozen=True)
class ScenarioFacts:
    """A scenario as its algorithms' checks read it (module docstring)."""

    num_devices: int  # N, population.num_devices
    problem: str  # the problem's name, for messages
    capabilities: frozenset[str]  # problem_capabilities of the problem
    # names of the problem constants (L, mu, delta_A, ...) its Problem.constants will hold;
    # None when only building the problem tells
    constants: frozenset[str] | None
    server_loss: bool  # the base station holds a loss of its own
