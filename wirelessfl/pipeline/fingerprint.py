"""What a run folder and a checkpoint belong to: sha256 fingerprints of the scenario they ran.

A run folder's manifest records ``scenario_sha256`` when the run starts: the sha256 of the
canonical JSON (sorted keys, no whitespace) of the resolved scenario document and the seed. The
algorithms recorded in the folder ran with exactly that scenario, so ``--resume`` refuses a
manifest whose scenario no longer matches it (edited by hand, say, to change a learning rate):
continuing would record the new parameters beside results of the old ones. A checkpoint carries
the fingerprint of the scenario, the seed and its own algorithm's parameters, so one written
by another run (copied between folders) or before an edit is refused too.
"""

from __future__ import annotations

import hashlib
import json

from wirelessfl.algorithms.base import AlgorithmParams
from wirelessfl.errors import UserError
from wirelessfl.scenario.loader import resolved_document
from wirelessfl.scenario.schema import Scenario

MANIFEST_KEY = "scenario_sha256"


def canonical_sha256(value) -> str:
    """sha256 (hex) of ``value`` as canonical JSON: sorted keys, no whitespace, ASCII."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def scenario_fingerprint(scenario: Scenario) -> str:
    """The run folder's fingerprint: the resolved scenario document and the seed."""
    return canonical_sha256({"scenario": resolved_document(scenario), "seed": scenario.seed})


def algorithm_fingerprint(scenario: Scenario, params: AlgorithmParams) -> str:
    """A checkpoint's fingerprint: the scenario, the seed and that algorithm's parameters."""
    return canonical_sha256({"scenario": resolved_document(scenario), "seed": scenario.seed,
                             "algorithm": params.model_dump(mode="json")})


def check_manifest_fingerprint(folder, manifest: dict) -> None:
    """Raise a UserError when ``manifest``'s scenario document, as written, does not match the
    fingerprint recorded when the run started: checked on the plain data, before the document
    is validated, so that no name in an edited manifest is resolved (a part's module imported)
    first. A manifest without a fingerprint (an older wirelessfl) passes here; ``check_resumable``
    warns about it once the scenario is read."""
    recorded = manifest.get(MANIFEST_KEY)
    if recorded is None:
        return
    document = manifest.get("scenario")
    seed = document.get("seed") if isinstance(document, dict) else None
    if recorded != canonical_sha256({"scenario": document, "seed": seed}):
        raise UserError(_edited(folder))


def _edited(folder) -> str:
    return (f"{folder}/manifest.json: its scenario no longer matches the fingerprint recorded "
            f"when the run started ({MANIFEST_KEY}): it was edited (or written by another "
            "wirelessfl version), and the algorithms recorded there ran with the original "
            "parameters; restore the manifest, or run the edited scenario into a new folder")


def check_resumable(folder, manifest: dict, scenario: Scenario) -> str | None:
    """Raise a UserError when ``manifest``'s scenario (parsed as ``scenario``) no longer matches
    the fingerprint recorded when the run started. Returns a warning for a folder written before
    fingerprints were recorded (it cannot be checked), else None."""
    recorded = manifest.get(MANIFEST_KEY)
    if recorded is None:
        return (f"warning: {folder}/manifest.json records no scenario fingerprint (written by "
                "an older wirelessfl); resuming without checking that its scenario is the one "
                "the recorded algorithms ran")
    if recorded != scenario_fingerprint(scenario):
        raise UserError(_edited(folder))
    return None
