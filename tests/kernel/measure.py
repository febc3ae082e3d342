"""What kernel tests measured: printed (pytest -s shows it) and appended as JSON lines to the
file named by an environment variable when it is set."""

from __future__ import annotations

import json
import os


def report(env_var: str, name: str, **values: object) -> None:
    line = json.dumps({"test": name, **values})
    print(line)
    path = os.environ.get(env_var)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
