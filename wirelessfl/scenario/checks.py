"""Moved to ``wirelessfl.pipeline.preflight`` (issue 33); this path keeps working until
wirelessfl 0.3.0."""

from wirelessfl._compat import moved

__getattr__ = moved(__name__, "wirelessfl.pipeline.preflight")
