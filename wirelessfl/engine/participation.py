"""Moved to ``wirelessfl.algorithms.participation`` (issue 33); this path keeps working until
wirelessfl 0.3.0."""

from wirelessfl._compat import moved

__getattr__ = moved(__name__, "wirelessfl.algorithms.participation")
