"""Learning problems, one module each, with the plugin contract in ``base.py``.

Nothing is imported here: the ``PROBLEMS`` registry (wirelessfl/plugins.py) imports a problem's
module when a scenario names it.
"""
