# GPL-2.0-or-later
"""Run the cachemgr CLI and read its JSON (schema 1). Exit codes: 0 done, 1 failed,
2 bad usage, 3 refused as unsafe, 4 already so, 5 timed out."""

from __future__ import annotations

import json

ALREADY = 4


def run_json(module, args, allow_already=True):  # type: ignore[no-untyped-def]
    argv = [module.params["cachemgr_bin"], *args]
    rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C"})
    if rc == ALREADY and allow_already:
        return rc, None, err
    if rc != 0:
        module.fail_json(msg=f"cachemgr failed (exit {rc}): {err.strip()}", rc=rc,
                         cmd=argv, stderr=err, stdout=out)
    try:
        return rc, json.loads(out) if out.strip() else None, err
    except ValueError as exc:
        module.fail_json(msg=f"cachemgr printed no JSON: {exc}", cmd=argv, stdout=out)
    return rc, None, err  # not reached


def find_device(status, target):  # type: ignore[no-untyped-def]
    for d in status.get("devices", []):
        if target in (d.get("device"), d.get("backing"), d.get("backing_uuid"),
                      d.get("by_uuid")):
            return d
    return None


COMMON_ARGS = {"cachemgr_bin": {"type": "str", "default": "cachemgr"}}
