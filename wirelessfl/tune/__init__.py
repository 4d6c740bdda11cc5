"""Tuning before comparing: per-algorithm grid search on tuning seeds, the best configuration of
each re-run on fresh evaluation seeds beside its untuned setting (docs/tuning.md)."""
