"""Stands in for get-pip.py, the script ansible-test downloads to put pip into each virtualenv
it builds for a sanity test, from a host this machine (and CI) cannot reach.

ansible-test takes a script cached as ~/.ansible/test/cache/get_pip_<version>.py instead of
downloading one (ansible_test/_util/target/setup/requirements.py, bootstrap()) and runs it with
the new virtualenv's Python and pip install's arguments (the pip release it wants, plus
--no-setuptools/--no-wheel, which only get-pip.py knows). This script installs the pip that
Python's own ensurepip carries, then has that pip install what ansible-test asked for from the
indexes pip is configured with, the way every other package of the sanity tests comes in.
"""

from __future__ import annotations

import subprocess
import sys

GET_PIP_ONLY = ("--no-setuptools", "--no-wheel")


def main() -> int:
    args = [a for a in sys.argv[1:] if a not in GET_PIP_ONLY]
    subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True,
                   stdout=subprocess.DEVNULL)
    return subprocess.run([sys.executable, "-m", "pip", "install", *args]).returncode


if __name__ == "__main__":
    sys.exit(main())
