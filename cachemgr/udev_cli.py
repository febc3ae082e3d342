"""``python -m cachemgr.udev_cli``: the entry point udev rules installed by earlier releases
run. The code lives in cachemgr/cli/udev.py; this alias keeps those rules working."""

import sys

from cachemgr.cli.udev import main

if __name__ == "__main__":
    sys.exit(main())
