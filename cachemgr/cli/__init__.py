"""The command line: ``main`` (cachemgr/cli/main.py) and one module per command group. Kept
empty so that ``python -m cachemgr.udev_cli`` (udev's fast entry) loads nothing else."""
