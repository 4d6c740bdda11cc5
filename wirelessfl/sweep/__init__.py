"""Sweeps: grid expansion (spec), the sweep folder (study), executors and the worker."""
