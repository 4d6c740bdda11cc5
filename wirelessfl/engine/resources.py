"""Moved to ``wirelessfl.pipeline.memory`` (issue 33); this path keeps working until
wirelessfl 0.3.0."""

from wirelessfl._compat import moved

__getattr__ = moved(__name__, "wirelessfl.pipeline.memory", {
    "ProblemFacts": "wirelessfl.contract.problem",
    "dataset_shape": "wirelessfl.problems.data_size",
    "data_bytes": "wirelessfl.problems.data_size",
    "DataShape": "wirelessfl.problems.data_size",
    "DataBytes": "wirelessfl.problems.data_size",
    "drawn_samples": "wirelessfl.problems.data_size",
})
