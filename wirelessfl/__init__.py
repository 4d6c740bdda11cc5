"""wirelessfl: federated learning over simulated wireless cells, timed in seconds and costed in joules."""

__version__ = "0.1.0"
