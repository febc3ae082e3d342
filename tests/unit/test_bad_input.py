"""The bad-input matrix (issue #15 item 10): one table-driven test over every command with bad
targets, modes, sizes, numbers, paths with spaces and newlines, wrong device kinds, missing
files, corrupt journals and broken policies. Each case runs the CLI in this process on a
writable copy of a capture (``--sysfs-root``), with its own state directory
(``CACHEMGR_STATE_DIR``) and policy files, and asserts:

* the exit code is the case's (docs/cli.md: 2 bad usage or input, 3 refused, 4 already so);
* stderr is one ``cachemgr: ...`` line holding the case's word, plus at most one
  ``  hint: ...`` line (argparse's usage errors: its usage line(s) and one ``error:`` line,
  exit 2); no traceback; stdout is empty;
* nothing changed: no sysfs write (tui_helpers.kernel_writes), no command run that could
  change anything (a guard on cachemgr.core.runner.run lets only read-only probes through),
  no lab boot, no udev worker spawned, the copied capture is byte for byte as it was, and the
  state directory holds nothing new but the locks directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cachemgr.core.errors import CacheMgrError
from cachemgr.core.sysfs import Sysfs
from tests.kernel.clirun import in_process
from tests.unit.guards import mutations_refused
from tests.unit.tui_helpers import copy_capture, kernel_writes

DIRTY = "bcache-writeback-dirty"  # /dev/bcache0 over /dev/ubda, cset fb5bd09d on /dev/ubdb
UNATT = "bcache-unattached"  # /dev/bcache0 (no cache), cset 3a85497b on /dev/ubdb
DM = "dmcache-writeback"  # vmcache: origin slow, cache /dev/ubdb, metadata /dev/ubdc
CSET = "fb5bd09d-aace-4719-84d5-79fbb9e849bf"
UNATT_CSET = "3a85497b-f234-4651-a39a-c547edabc679"
BACKING_UUID = "7643a213-caa1-4bce-8c4a-454fdbe3fa1c"  # /dev/ubda's in DIRTY
SCSI = "scsi-ssd-in-use"  # cset c2958027 on the SCSI disk /dev/sda
SCSI_CSET = "c2958027-844e-478b-8a07-5c71b051beb3"
# three free partitions of UNATT's free disk /dev/ubdc
PARTS: dict[str, str | bytes] = {"PART1": "ubdc/ubdc1", "PART2": "ubdc/ubdc2",
                                 "PART3": "ubdc/ubdc3"}


GOOD_POLICY = """version = 1

[cache.ssd0]
device = "wwn-0x33333330000007d0"

[backing.vm-a]
device = "serial:2001"
cache = "ssd0"
mode = "writeback"
"""

JOURNAL = ('{"schema": 1, "id": "r1", "cset": "' + CSET + '", "options": {}, "old": {}, '
           '"backings": []}')


def _trace(rate: float = 1.0, devices: int = 1, offset: int = 0) -> bytes:
    """A small, valid ``cachemgr trace`` file (procedures/trace.py's own writer)."""
    import tempfile

    from cachemgr.procedures import trace as tr

    with tempfile.TemporaryDirectory() as d:
        h = tr.Header(block=4096, rate=rate, started=0.0, devices=[
            tr.Device(i, f"/dev/vd{'ab'[i]}", f"vd{'ab'[i]}", f"254:{16 * i}", 1 << 40)
            for i in range(devices)])
        w = tr.Writer(f"{d}/t", h)
        tot = tr.Totals()
        for i in range(64):
            w.add(i * 0.001, offset + (i % 8) * 4096, 4096, 0, 0)
            tot.requests[0] += 1
            tot.blocks[0] += 1
        w.close({"seconds": 1.0, **tot.to_json(), "diskstats": {}})
        return Path(f"{d}/t").read_bytes()


TRACE, TRACE_SAMPLED, TRACE_TWO = _trace(), _trace(rate=0.25), _trace(devices=2)
TRACE_FAR = _trace(offset=1 << 50)


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # "{tmp}" stands for the case's directory
    code: int
    word: str | None  # in the message (case-insensitive); None: exit 0, nothing printed
    capture: str = DIRTY
    files: dict[str, str | bytes] = field(default_factory=dict)  # under {tmp}; "FIFO", "DIR"
    marks: tuple[pytest.MarkDecorator, ...] = ()


def c(id: str, *argv: str, code: int = 2, word: str | None = None, capture: str = DIRTY,
      files: dict[str, str | bytes] | None = None,
      marks: Sequence[pytest.MarkDecorator] = ()) -> Case:
    return Case(id, argv, code, word, capture, files or {}, tuple(marks))


def policy_cases(cmd: tuple[str, ...], tag: str) -> list[Case]:
    """Broken policies, for ``policy check`` and ``autoattach``."""
    p = "{tmp}/p.toml"
    return [
        c(f"{tag}-missing-file", *cmd, "--policy", "{tmp}/none.toml", word="no such file"),
        c(f"{tag}-bad-toml", *cmd, "--policy", p, files={"p.toml": "version = 1\n[cache\n"},
          word="p.toml:2"),
        c(f"{tag}-deep-nesting", *cmd, "--policy", p,
          files={"p.toml": "version = 1\nx = " + "[" * 2000 + "]" * 2000 + "\n"},
          word="nest"),
        c(f"{tag}-version-true", *cmd, "--policy", p, files={"p.toml": "version = true\n"},
          word="version"),
        c(f"{tag}-version-2", *cmd, "--policy", p, files={"p.toml": "version = 2\n"},
          word="version"),
        c(f"{tag}-control-char-id", *cmd, "--policy", p,
          files={"p.toml": GOOD_POLICY.replace("serial:2001", "serial:20\\u001b01")},
          word="serial"),
        c(f"{tag}-bidi-id", *cmd, "--policy", p,
          files={"p.toml": GOOD_POLICY.replace("serial:2001", "serial:20\\u202e01")},
          word="serial"),
        c(f"{tag}-fifo", *cmd, "--policy", p, files={"p.toml": "FIFO"}, word="regular file"),
        c(f"{tag}-directory", *cmd, "--policy", "{tmp}/d", files={"d": "DIR"},
          word="regular file"),
        c(f"{tag}-not-utf8", *cmd, "--policy", p, files={"p.toml": b"version = 1\n\xff\n"},
          word="utf-8"),
        c(f"{tag}-kernel-name", *cmd, "--policy", p,
          files={"p.toml": GOOD_POLICY.replace("serial:2001", "/dev/sdb")}, word="/dev/sdb"),
        c(f"{tag}-bad-mode", *cmd, "--policy", p,
          files={"p.toml": GOOD_POLICY.replace('"writeback"', '"fast"')}, word="fast"),
        c(f"{tag}-unknown-cache", *cmd, "--policy", p,
          files={"p.toml": GOOD_POLICY.replace('cache = "ssd0"', 'cache = "ssd9"')},
          word="ssd9"),
        c(f"{tag}-bad-bucket", *cmd, "--policy", p,
          files={"p.toml": GOOD_POLICY.replace("[backing", 'bucket_size = "64x"\n[backing')},
          word="64x"),
        c(f"{tag}-path-with-newline", *cmd, "--policy", "{tmp}/p\nq.toml",
          word="no such file"),
    ]


def bench_cases(cmd: str) -> list[Case]:
    t = "/dev/bcache0:none"
    tt: tuple[str, ...] = (t,) if cmd == "run" else (t, "/dev/bcache0:writeback")
    b = ("bench", cmd)
    return [
        c(f"{cmd}-rw", *b, *tt, "--rw", "randomwrite", word="--rw"),
        c(f"{cmd}-bs-junk", *b, *tt, "--bs", "4q", word="4q"),
        c(f"{cmd}-bs-zero", *b, *tt, "--bs", "0", word="--bs"),
        c(f"{cmd}-bs-fraction", *b, *tt, "--bs", "0.1k", word="0.1k"),
        c(f"{cmd}-iodepth-zero", *b, *tt, "--iodepth", "0", word="--iodepth"),
        c(f"{cmd}-iodepth-nan", *b, *tt, "--iodepth", "nan", word="--iodepth"),
        c(f"{cmd}-jobs-negative", *b, *tt, "--jobs", "-1", word="--jobs"),
        c(f"{cmd}-zipf-junk", *b, *tt, "--zipf", "x", word="--zipf"),
        c(f"{cmd}-zipf-nan", *b, *tt, "--zipf", "nan", word="--zipf"),
        c(f"{cmd}-zipf-negative", *b, *tt, "--zipf", "-1", word="--zipf"),
        c(f"{cmd}-runtime-nan", *b, *tt, "--runtime", "nan", word="--runtime"),
        c(f"{cmd}-runtime-zero", *b, *tt, "--runtime", "0", word="--runtime"),
        c(f"{cmd}-warmup-junk", *b, *tt, "--warmup", "lots", word="lots"),
        c(f"{cmd}-distribution-newline", *b, *tt, "--distribution", "zipf:1.2\nrw=write",
          word="distribution"),
        c(f"{cmd}-offset-newline", *b, *tt, "--offset", "1M\nrw=write", word="offset"),
        c(f"{cmd}-size-junk", *b, *tt, "--size", "big", word="big"),
        c(f"{cmd}-rwmixread-101", *b, *tt, "--rwmixread", "101", word="--rwmixread"),
        c(f"{cmd}-repeat-zero", *b, *tt, "--repeat", "0", word="--repeat"),
        c(f"{cmd}-tolerance-inf", *b, *tt, "--tolerance", "inf", word="--tolerance"),
        c(f"{cmd}-target-missing", *b, "/dev/sdz9", *tt[1:], word="/dev/sdz9"),
        c(f"{cmd}-target-bad-mode", *b, "/dev/bcache0:fast", *tt[1:], word="fast"),
        c(f"{cmd}-target-space", *b, "/dev/bc ache0", *tt[1:], word="/dev/bc ache0"),
        c(f"{cmd}-target-newline", *b, "/dev/bcache0\n:none", *tt[1:], word="bcache0"),
        c(f"{cmd}-target-empty", *b, "", *tt[1:], word="device"),
        c(f"{cmd}-target-char-device", *b, "/dev/null", *tt[1:], word="/dev/null"),
    ]


CASES: list[Case] = [
    # ------------------------------------------------------------------------- general
    c("no-command", code=2, word="command"),
    c("unknown-command", "frobnicate", word="frobnicate"),
    # -------------------------------------------------------------------------- status
    c("status-watch-zero", "status", "--watch", "0", word="--watch"),
    c("status-watch-negative", "status", "--watch", "-1", word="--watch"),
    c("status-watch-nan", "status", "--watch", "nan", word="--watch"),
    c("status-watch-inf", "status", "--watch", "inf", word="--watch"),
    c("status-watch-junk", "status", "--watch", "1s", word="--watch"),
    c("status-extra-arg", "status", "/dev/bcache0", word="unrecognized"),
    # ---------------------------------------------------------------------------- mode
    c("mode-unknown-mode", "mode", "/dev/bcache0", "fast", word="fast"),
    c("mode-empty-mode", "mode", "/dev/bcache0", "", word="mode"),
    c("mode-mode-newline", "mode", "/dev/bcache0", "none\n", word="none"),
    c("mode-dm-word-on-bcache", "mode", "/dev/bcache0", "passthrough", word="passthrough"),
    c("mode-missing-target", "mode", "/dev/sdz9", "none", word="/dev/sdz9"),
    c("mode-empty-target", "mode", "", "none", word="device"),
    c("mode-target-space", "mode", "/dev/bcache 0", "none", word="/dev/bcache 0"),
    c("mode-target-newline", "mode", "/dev/bcache0\n", "none", word="bcache0"),
    c("mode-target-escape", "mode", "/dev/\x1b[31mbcache0", "none", word="bcache0"),
    c("mode-cache-device", "mode", "/dev/ubdb", "none", word="/dev/ubdb"),
    c("mode-cset", "mode", CSET, "none", word=CSET[:8]),
    c("mode-unused-disk", "mode", "/dev/ubdc", "none", word="/dev/ubdc"),
    c("mode-char-device", "mode", "/dev/null", "none", word="/dev/null"),
    c("mode-already", "mode", "/dev/bcache0", "writeback", code=4, word="already"),
    c("mode-timeout-nan", "mode", "/dev/bcache0", "none", "--timeout", "nan",
      word="--timeout"),
    c("mode-dm-unknown-mode", "mode", "/dev/mapper/vmcache", "writearound", capture=DM,
      word="writearound"),
    c("mode-dm-missing", "mode", "/dev/mapper/nosuch", "writethrough", capture=DM,
      word="nosuch"),
    # --------------------------------------------------------------------------- drain
    c("drain-timeout-nan", "drain", "/dev/bcache0", "--timeout", "nan", word="--timeout"),
    c("drain-timeout-inf", "drain", "/dev/bcache0", "--timeout", "inf", word="--timeout"),
    c("drain-timeout-negative", "drain", "/dev/bcache0", "--timeout", "-1", word="--timeout"),
    c("drain-timeout-zero", "drain", "/dev/bcache0", "--timeout", "0", word="--timeout"),
    c("drain-stall-nan", "drain", "/dev/bcache0", "--stall-timeout", "nan",
      word="--stall-timeout"),
    c("drain-stall-inf", "drain", "/dev/bcache0", "--stall-timeout", "inf",
      word="--stall-timeout"),
    c("drain-stall-negative", "drain", "/dev/bcache0", "--stall-timeout", "-1",
      word="--stall-timeout"),
    c("drain-missing-target", "drain", "/dev/sdz9", word="/dev/sdz9"),
    c("drain-empty-target", "drain", "", word="device"),
    c("drain-cache-device", "drain", "/dev/ubdb", word="/dev/ubdb"),
    c("drain-target-newline", "drain", "/dev/bcache0\nx", word="bcache0"),
    c("drain-no-cache", "drain", "/dev/bcache0", capture=UNATT, code=4,
      word="nothing to drain"),
    c("drain-resume-nothing", "drain", "/dev/bcache0", "--resume", code=4, word="resume"),
    c("drain-corrupt-saved-state", "drain", "/dev/bcache0", "--resume", word="unreadable",
      files={f"state/drain/{BACKING_UUID}.json": "{\"schema\": 1, \"tunables\": "}),
    # -------------------------------------------------------------------------- attach
    c("attach-missing-backing", "attach", "/dev/sdz9", CSET, word="/dev/sdz9"),
    c("attach-missing-cset", "attach", "/dev/bcache0", "00000000-0000-0000-0000-000000000000",
      capture=UNATT, word="00000000"),
    c("attach-cset-junk", "attach", "/dev/bcache0", "not a uuid\n", capture=UNATT,
      word="not a uuid"),
    c("attach-already", "attach", "/dev/bcache0", CSET, code=4, word="already"),
    c("attach-cache-as-backing", "attach", "/dev/ubdb", UNATT_CSET, capture=UNATT,
      word="/dev/ubdb"),
    c("attach-unformatted-disk", "attach", "/dev/ubdc", UNATT_CSET, capture=UNATT,
      word="/dev/ubdc"),
    c("attach-backing-newline", "attach", "/dev/bcache0\n", UNATT_CSET, capture=UNATT,
      word="bcache0"),
    c("attach-too-few-args", "attach", "/dev/bcache0", word="required"),
    # -------------------------------------------------------------------------- detach
    c("detach-missing", "detach", "/dev/sdz9", word="/dev/sdz9"),
    c("detach-cache-device", "detach", "/dev/ubdb", word="/dev/ubdb"),
    c("detach-cset", "detach", CSET, word=CSET[:8]),
    c("detach-timeout-nan", "detach", "/dev/bcache0", "--timeout", "nan", word="--timeout"),
    c("detach-already", "detach", "/dev/bcache0", capture=UNATT, code=4, word="not attached"),
    c("detach-path-space", "detach", "/dev/bcache0 /dev/bcache1", word="bcache1"),
    # ------------------------------------------------------------------ create bcache
    c("create-bcache-nothing", "create", "bcache", word="--backing"),
    c("create-bcache-missing-devices", "create", "bcache", "--backing", "/dev/sdz9",
      "--cache", "/dev/sdz8", word="/dev/sdz"),
    c("create-bcache-bucket-junk", "create", "bcache", "--cache", "/dev/ubdc",
      "--bucket", "big", capture=UNATT, word="big"),
    c("create-bcache-bucket-zero", "create", "bcache", "--cache", "/dev/ubdc",
      "--bucket", "0", capture=UNATT, word="bucket"),
    c("create-bcache-bucket-negative", "create", "bcache", "--cache", "/dev/ubdc",
      "--bucket", "-64k", capture=UNATT, word="--bucket"),
    c("create-bcache-bucket-not-power-of-2", "create", "bcache", "--cache", "/dev/ubdc",
      "--bucket", "96k", capture=UNATT, word="bucket"),
    c("create-bcache-bucket-huge", "create", "bcache", "--cache", "/dev/ubdc",
      "--bucket", "1T", capture=UNATT, word="bucket"),
    c("create-bcache-bucket-fraction", "create", "bcache", "--cache", "/dev/ubdc",
      "--bucket", "0.5", capture=UNATT, word="0.5"),
    c("create-bcache-bad-mode", "create", "bcache", "--backing", "/dev/ubdc", "--cache",
      "/dev/ubda", "--mode", "fast", word="fast"),
    c("create-bcache-block-size", "create", "bcache", "--backing", "/dev/ubdc", "--cache",
      "/dev/ubda", "--block-size", "64k", word="--block-size"),
    c("create-bcache-name", "create", "bcache", "vm", "--backing", "/dev/ubdc", "--cache",
      "/dev/ubda", word="name"),
    c("create-bcache-path-space", "create", "bcache", "--backing", "/dev/my disk", "--cache",
      "/dev/ubdb", word="/dev/my disk"),
    c("create-bcache-path-newline", "create", "bcache", "--backing", "/dev/ubdc\n",
      "--cache", "/dev/sdz8", word="ubdc"),
    c("create-bcache-path-tab", "create", "bcache", "--backing", "/dev/ub\tdc", "--cache",
      "/dev/sdz8", word="ub"),
    c("create-bcache-path-escape", "create", "bcache", "--backing", "/dev/\x1b]8;;x\x07ubdc",
      "--cache", "/dev/sdz8", word="ubdc"),
    c("create-bcache-backing-in-use", "create", "bcache", "--backing", "/dev/ubda",
      "--cache", "/dev/ubdc", code=3, word="/dev/ubda"),
    c("create-bcache-cache-is-cset", "create", "bcache", "--backing", "/dev/ubdc", "--cache",
      "/dev/ubdb", code=3, word="/dev/ubdb"),
    c("create-bcache-backing-is-bcache", "create", "bcache", "--backing", "/dev/bcache0",
      "--cache", "/dev/ubdc", code=3, word="/dev/bcache0"),
    c("create-bcache-same-device", "create", "bcache", "--backing", "/dev/ubdc", "--cache",
      "/dev/ubdc", word="same device"),
    c("create-bcache-two-names", "create", "bcache", "--backing", "/dev/ubdc1", "--cache",
      "/dev/ubdc2", "--backing", "/dev/ubdc1", capture=UNATT, files=PARTS,
      word="same device"),
    c("create-bcache-char-device", "create", "bcache", "--backing", "/dev/null", "--cache",
      "/dev/ubdc", word="/dev/null"),
    c("create-bcache-partition-of-cache", "create", "bcache", "--backing", "/dev/ubdc1",
      "--cache", "/dev/ubdc", word="partition", files={"PART": "ubdc/ubdc1"}),
    c("create-unknown-kind", "create", "lvmcache", word="lvmcache"),
    # ---------------------------------------------------------------- create dm-cache
    c("create-dm-no-name", "create", "dm-cache", "--origin", "/dev/ubda", "--cache",
      "/dev/ubdb", "--metadata", "/dev/ubdc", capture=UNATT, word="name"),
    c("create-dm-no-origin", "create", "dm-cache", "vm", "--cache", "/dev/ubdb",
      "--metadata", "/dev/ubdc", capture=UNATT, word="--origin"),
    c("create-dm-no-metadata", "create", "dm-cache", "vm", "--origin", "/dev/ubda",
      "--cache", "/dev/ubdb", capture=UNATT, word="--metadata"),
    c("create-dm-name-newline", "create", "dm-cache", "vm\nx", "--origin", "/dev/sdz7",
      "--cache", "/dev/sdz8", "--metadata", "/dev/sdz9", word="name"),
    c("create-dm-name-slash", "create", "dm-cache", "a/b", "--origin", "/dev/sdz7",
      "--cache", "/dev/sdz8", "--metadata", "/dev/sdz9", word="a/b"),
    c("create-dm-name-space", "create", "dm-cache", "my vm", "--origin", "/dev/sdz7",
      "--cache", "/dev/sdz8", "--metadata", "/dev/sdz9", word="my vm"),
    c("create-dm-name-too-long", "create", "dm-cache", "v" * 200, "--origin", "/dev/sdz7",
      "--cache", "/dev/sdz8", "--metadata", "/dev/sdz9", word="name"),
    c("create-dm-name-exists", "create", "dm-cache", "vmcache", "--origin", "/dev/ubda",
      "--cache", "/dev/ubdb", "--metadata", "/dev/ubdc", capture=DM, word="vmcache"),
    c("create-dm-block-junk", "create", "dm-cache", "vm", "--origin", "/dev/sdz7",
      "--cache", "/dev/sdz8", "--metadata", "/dev/sdz9", "--block-size", "x",
      word="'x'"),
    c("create-dm-block-zero", "create", "dm-cache", "vm", "--origin", "/dev/ubdc1",
      "--cache", "/dev/ubdc2", "--metadata", "/dev/ubdc3", "--block-size", "0",
      capture=UNATT, files=PARTS, word="block"),
    c("create-dm-block-odd", "create", "dm-cache", "vm", "--origin", "/dev/ubdc1",
      "--cache", "/dev/ubdc2", "--metadata", "/dev/ubdc3", "--block-size", "33k",
      capture=UNATT, files=PARTS, word="block"),
    c("create-dm-block-huge", "create", "dm-cache", "vm", "--origin", "/dev/ubdc1",
      "--cache", "/dev/ubdc2", "--metadata", "/dev/ubdc3", "--block-size", "2T",
      capture=UNATT, files=PARTS, word="block"),
    c("create-dm-bucket", "create", "dm-cache", "vm", "--origin", "/dev/sdz7", "--cache",
      "/dev/sdz8", "--metadata", "/dev/sdz9", "--bucket", "64k", word="--bucket"),
    c("create-dm-bad-mode", "create", "dm-cache", "vm", "--origin", "/dev/sdz7", "--cache",
      "/dev/sdz8", "--metadata", "/dev/sdz9", "--mode", "writearound", word="writearound"),
    c("create-dm-missing-devices", "create", "dm-cache", "vm", "--origin", "/dev/sdz7",
      "--cache", "/dev/sdz8", "--metadata", "/dev/sdz9", word="/dev/sdz"),
    c("create-dm-origin-in-use", "create", "dm-cache", "vm", "--origin", "/dev/ubda",
      "--cache", "/dev/ubdc1", "--metadata", "/dev/ubdc2", capture=UNATT, files=PARTS,
      code=3, word="/dev/ubda"),
    c("create-dm-same-devices", "create", "dm-cache", "vm", "--origin", "/dev/ubdc",
      "--cache", "/dev/ubdc", "--metadata", "/dev/ubdc", capture=UNATT, word="different"),
    c("create-dm-cache-is-cset", "create", "dm-cache", "vm", "--origin", "/dev/ubdc1",
      "--cache", "/dev/ubdb", "--metadata", "/dev/ubdc2", capture=UNATT, files=PARTS,
      code=3, word="/dev/ubdb"),
    # -------------------------------------------------------------------------- remove
    c("remove-missing", "remove", "/dev/sdz9", word="/dev/sdz9"),
    c("remove-empty", "remove", "", word="device"),
    c("remove-timeout-nan", "remove", "/dev/bcache0", "--timeout", "nan", word="--timeout"),
    c("remove-stall-negative", "remove", "/dev/bcache0", "--stall-timeout", "-1",
      word="--stall-timeout"),
    c("remove-target-newline", "remove", "/dev/bcache0\n/dev/ubdb", word="bcache0"),
    c("remove-unused-disk", "remove", "/dev/ubdc", word="/dev/ubdc"),
    c("remove-dm-missing", "remove", "/dev/mapper/nosuch", capture=DM, word="nosuch"),
    # ---------------------------------------------------------------------------- tune
    c("tune-no-settings", "tune", "/dev/bcache0", word="required"),
    c("tune-no-equals", "tune", "/dev/bcache0", "writeback_percent", word="NAME=VALUE"),
    c("tune-unknown-name", "tune", "/dev/bcache0", "speed=11", word="speed"),
    c("tune-value-junk", "tune", "/dev/bcache0", "writeback_percent=ten", word="ten"),
    c("tune-value-empty", "tune", "/dev/bcache0", "writeback_percent=", word="integer"),
    c("tune-value-fraction", "tune", "/dev/bcache0", "writeback_percent=1.5", word="1.5"),
    c("tune-value-out-of-range", "tune", "/dev/bcache0", "writeback_percent=101",
      word="writeback_percent"),
    c("tune-value-negative", "tune", "/dev/bcache0", "writeback_percent=-1",
      word="writeback_percent"),
    c("tune-value-huge", "tune", "/dev/bcache0", "writeback_percent=" + "9" * 5000,
      word="integer"),
    c("tune-value-newline", "tune", "/dev/bcache0", "writeback_percent=1\n0", word="integer"),
    c("tune-name-newline", "tune", "/dev/bcache0", "writeback\n_percent=1", word="writeback"),
    c("tune-cset-name-on-backing", "tune", "/dev/bcache0", "congested_read_threshold_us=0",
      word="congested_read_threshold_us"),
    c("tune-missing-target", "tune", "/dev/sdz9", "writeback_percent=1", word="/dev/sdz9"),
    c("tune-dm-bcache-name", "tune", "/dev/mapper/vmcache", "writeback_percent=1",
      capture=DM, word="writeback_percent"),
    c("tune-dm-threshold-junk", "tune", "/dev/mapper/vmcache", "migration_threshold=x",
      capture=DM, word="integer"),
    c("tune-second-setting-bad", "tune", "/dev/bcache0", "writeback_percent=5", "bogus=1",
      word="bogus"),
    # ------------------------------------------------------------ force-run, stop-set
    c("force-run-no-flag", "force-run", "/dev/ubda", code=3, word="--i-accept-data-loss"),
    c("force-run-missing", "force-run", "/dev/sdz9", "--i-accept-data-loss",
      word="/dev/sdz9"),
    c("stop-set-no-flag", "stop-set", CSET, code=3, word="--i-accept-data-loss"),
    c("stop-set-missing", "stop-set", "00000000-0000-0000-0000-000000000000",
      "--i-accept-data-loss", word="00000000"),
    c("stop-set-junk", "stop-set", "not\na cset", "--i-accept-data-loss", word="not"),
    # ---------------------------------------------------------------------- replace-ssd
    c("replace-no-cset", "replace-ssd", word="CACHE"),
    c("replace-unknown-cset", "replace-ssd", "00000000-0000-0000-0000-000000000000",
      "--dry-run", word="00000000"),
    c("replace-not-scsi", "replace-ssd", CSET, "--dry-run",
      word="neither a SCSI disk nor an NVMe namespace"),
    c("replace-new-empty", "replace-ssd", SCSI_CSET, "--new", "", "--dry-run", capture=SCSI,
      word="--new"),
    c("replace-new-serial-empty", "replace-ssd", SCSI_CSET, "--new", "serial:", "--dry-run",
      capture=SCSI, word="serial"),
    c("replace-new-missing", "replace-ssd", SCSI_CSET, "--new", "/dev/sdz9", "--dry-run",
      capture=SCSI, word="/dev/sdz9"),
    c("replace-new-newline", "replace-ssd", SCSI_CSET, "--new", "/dev/sd\nz9", "--dry-run",
      capture=SCSI, word="sd"),
    c("replace-new-is-old", "replace-ssd", SCSI_CSET, "--new", "/dev/sda", "--dry-run",
      capture=SCSI, word="/dev/sda"),
    c("replace-new-is-backing", "replace-ssd", SCSI_CSET, "--new", "/dev/ubda", "--dry-run",
      capture=SCSI, word="/dev/ubda"),
    c("replace-interim-writeback", "replace-ssd", CSET, "--interim-mode", "writeback",
      word="--interim-mode"),
    c("replace-drain-timeout-nan", "replace-ssd", CSET, "--drain-timeout", "nan",
      word="--drain-timeout"),
    c("replace-stall-timeout-inf", "replace-ssd", CSET, "--stall-timeout", "inf",
      word="--stall-timeout"),
    c("replace-wait-timeout-negative", "replace-ssd", CSET, "--wait-timeout", "-1",
      word="--wait-timeout"),
    c("replace-resume-missing", "replace-ssd", "--resume", "r-none", word="r-none"),
    c("replace-rollback-missing", "replace-ssd", "--rollback", "r-none", word="r-none"),
    c("replace-resume-id-newline", "replace-ssd", "--resume", "r1\nx", word="r1"),
    c("replace-resume-id-dotdot", "replace-ssd", "--resume", "../../etc/passwd",
      word="passwd"),
    c("replace-resume-not-json", "replace-ssd", "--resume", "r1",
      files={"state/replace/r1.json": "{\"schema\": 1, \"id\": \"r1\", "},
      word="unreadable"),
    c("replace-resume-empty", "replace-ssd", "--resume", "r1",
      files={"state/replace/r1.json": ""}, word="empty"),
    c("replace-resume-not-object", "replace-ssd", "--resume", "r1",
      files={"state/replace/r1.json": "[1, 2]"}, word="not a JSON object"),
    c("replace-resume-newer-schema", "replace-ssd", "--resume", "r1",
      files={"state/replace/r1.json": JOURNAL.replace('"schema": 1', '"schema": 99')},
      word="newer"),
    c("replace-resume-wrong-fields", "replace-ssd", "--resume", "r1",
      files={"state/replace/r1.json": JOURNAL.replace('"backings": []', '"backings": 7')},
      word="backings"),
    c("replace-resume-huge-number", "replace-ssd", "--resume", "r1",
      files={"state/replace/r1.json": JOURNAL.replace('"options": {}',
                                                       '"options": {}, "created": '
                                                       + "9" * 5000)},
      word="unreadable"),
    c("replace-resume-not-utf8", "replace-ssd", "--resume", "r1",
      files={"state/replace/r1.json": b"{\"id\": \"\xff\"}"}, word="utf-8"),
    c("replace-rollback-corrupt", "replace-ssd", "--rollback", "r1",
      files={"state/replace/r1.json": "{"}, word="unreadable"),
    c("replace-resume-other-run", "replace-ssd", "--resume", "r1",
      files={"state/replace/r1.json": JOURNAL.replace('"id": "r1"', '"id": "r2"')},
      word="r2"),
    # --------------------------------------------------------------------------- bench
    *bench_cases("run"),
    *bench_cases("compare"),
    c("bench-no-subcommand", "bench", word="bench"),
    # ------------------------------------------------------------------------- metrics
    c("metrics-listen-junk", "metrics", "--listen", "x", word="--listen"),
    c("metrics-listen-port-range", "metrics", "--listen", "127.0.0.1:99999", word="99999"),
    c("metrics-listen-port-negative", "metrics", "--listen", "127.0.0.1:-1", word="-1"),
    c("metrics-listen-no-port", "metrics", "--listen", "127.0.0.1:", word="--listen"),
    c("metrics-listen-bad-host", "metrics", "--listen", "no such host\n:9100",
      word="no such host"),
    c("metrics-listen-ipv6-junk", "metrics", "--listen", "[::1:9100", word="--listen"),
    c("metrics-textfile-missing-dir", "metrics", "--textfile", "{tmp}/none/m.prom",
      word="none"),
    c("metrics-textfile-is-dir", "metrics", "--textfile", "{tmp}/d", files={"d": "DIR"},
      word="directory"),
    # --interval: a bad path at the start is the one-shot's exit 2, before any loop
    c("metrics-interval-missing-dir", "metrics", "--textfile", "{tmp}/none/m.prom",
      "--interval", "15", word="none"),
    c("metrics-interval-no-textfile", "metrics", "--interval", "15", word="--textfile"),
    c("metrics-interval-zero", "metrics", "--textfile", "{tmp}/m.prom", "--interval", "0",
      word="--interval"),
    # ------------------------------------------------------- policy check, autoattach
    *policy_cases(("policy", "check"), "policy-check"),
    *policy_cases(("autoattach",), "autoattach"),
    c("policy-no-subcommand", "policy", word="policy"),
    # ---------------------------------------------------------------------- udev-event
    c("udev-event-junk-action", "udev-event", "frobnicate", "/dev/ubdc", "--policy",
      "{tmp}/p.toml", files={"p.toml": GOOD_POLICY}, code=0),
    c("udev-event-loop-device", "udev-event", "add", "/dev/loop0", "--policy",
      "{tmp}/p.toml", files={"p.toml": GOOD_POLICY}, code=0),
    c("udev-event-no-policy", "udev-event", "add", "/dev/ubdc\n", "--policy",
      "{tmp}/none.toml", code=0),
    c("udev-event-bad-spawn", "udev-event", "add", "/dev/ubdc", "--spawn", "cron",
      word="--spawn"),
    c("udev-event-extra-args", "udev-event", "add", "/dev/ubdc", "more", word="unrecognized"),
    # ------------------------------------------------------------------ capture, lab
    c("capture-no-out", "capture", "scenario", word="--out"),
    c("capture-out-is-file", "capture", "s", "--out", "{tmp}/f", files={"f": "x"},
      word="{tmp}/f"),
    c("capture-out-not-a-capture", "capture", "s", "--out", "{tmp}/home",
      files={"home/precious.txt": "keep me"}, word="not a capture"),
    c("capture-out-is-link", "capture", "s", "--out", "{tmp}/link", files={"link": "LINK"},
      word="not a capture"),
    c("lab-run-no-command", "lab", "run", word="command"),
    c("lab-run-only-dashes", "lab", "run", "--", word="command"),
    c("lab-run-bad-disks", "lab", "run", "--disks", "1G,lots", "--", "true", word="lots"),
    c("lab-run-nvme-no-sizes", "lab", "run", "--backend", "qemu", "--disks", "nvme:+", "--",
      "true", word="namespace 1 has no size"),
    c("lab-run-nvme-no-second-size", "lab", "run", "--backend", "qemu", "--disks",
      "nvme:1G+", "--", "true", word="namespace 2 has no size"),
    c("lab-run-nvme-zero", "lab", "run", "--backend", "qemu", "--disks", "nvme:0", "--",
      "true", word="below 1 MiB"),
    c("lab-run-nvme-nine-namespaces", "lab", "run", "--backend", "qemu", "--disks",
      "nvme:" + "+".join(["1M"] * 9), "--", "true", word="more than 8"),
    c("lab-run-bad-backend", "lab", "run", "--backend", "kvm", "--", "true",
      word="--backend"),
    c("lab-run-timeout-nan", "lab", "run", "--timeout", "nan", "--", "true",
      word="--timeout"),
    c("lab-run-mem-zero", "lab", "run", "--mem", "0", "--", "true", word="--mem"),
    c("lab-no-subcommand", "lab", word="lab"),
    # ----------------------------------------------------------------------- scheduler
    c("scheduler-bio-based", "scheduler", "/dev/bcache0", "bfq", word="bio-based"),
    c("scheduler-unknown-name", "scheduler", "ubdc", "frobnicate", word="frobnicate"),
    c("scheduler-removed-name", "scheduler", "ubdc", "cfq", word="removed"),
    c("scheduler-already", "scheduler", "ubdc", "mq-deadline", code=4, word="already"),
    c("scheduler-alias-already", "scheduler", "ubdc", "deadline", code=4, word="already"),
    c("scheduler-no-device", "scheduler", "ubdz", "bfq", word="ubdz"),
    c("scheduler-dotdot", "scheduler", "..", word="not a block device name"),
    c("scheduler-newline", "scheduler", "ubdc\n", "bfq", word="U+000A"),
    c("scheduler-path-missing", "scheduler", "/dev/nosuch/ubdc", word="no such device"),
    c("scheduler-extra-args", "scheduler", "ubdc", "bfq", "more", word="unrecognized"),
    # ----------------------------------------------------------------------------- tui
    c("tui-interval-nan", "tui", "--interval", "nan", word="--interval"),
    # ----------------------------------------------------------- trace, size, bench replay
    c("trace-not-block", "trace", "{tmp}/f", "-o", "{tmp}/t", files={"f": "x"},
      word="not a block device"),
    c("trace-twice", "trace", "/dev/ubdc", "/dev/ubdc", "-o", "{tmp}/t", word="named twice"),
    c("trace-output-exists", "trace", "/dev/ubdc", "-o", "{tmp}/t", files={"t": "keep"},
      word="exists"),
    c("trace-output-dir", "trace", "/dev/ubdc", "-o", "{tmp}/d", files={"d": "DIR"},
      word="directory"),
    c("trace-rate-zero", "trace", "/dev/ubdc", "-o", "{tmp}/t", "--rate", "0", word="rate"),
    c("trace-rate-nan", "trace", "/dev/ubdc", "-o", "{tmp}/t", "--rate", "nan", word="rate"),
    c("trace-block-odd", "trace", "/dev/ubdc", "-o", "{tmp}/t", "--block", "3000",
      word="power of two"),
    c("trace-no-output", "trace", "/dev/ubdc", word="--output"),
    c("size-missing", "size", "--trace", "{tmp}/none", word="no such trace file"),
    c("size-not-a-trace", "size", "--trace", "{tmp}/t", files={"t": "hello\n"},
      word="not a cachemgr trace"),
    c("size-higher-rate", "size", "--trace", "{tmp}/t", "--rate", "0.5",
      files={"t": TRACE_SAMPLED}, word="higher rate"),
    c("size-block-of-sampled", "size", "--trace", "{tmp}/t", "--block", "8k",
      files={"t": TRACE_SAMPLED}, word="same blocks"),
    c("size-zero-size", "size", "--trace", "{tmp}/t", "--sizes", "0", files={"t": TRACE},
      word="more than 0"),
    c("size-word-size", "size", "--trace", "{tmp}/t", "--sizes", "big", files={"t": TRACE},
      word="big"),
    c("size-unknown-device", "size", "--trace", "{tmp}/t", "--device", "sdz",
      files={"t": TRACE}, word="no device"),
    c("size-bad-latency", "size", "--trace", "{tmp}/t", "--hdd-latency", "fast",
      files={"t": TRACE}, word="latency"),
    c("replay-missing-trace", "bench", "replay", "/dev/bcache0", "--trace", "{tmp}/none",
      word="no such trace file"),
    c("replay-two-devices", "bench", "replay", "/dev/bcache0", "--trace", "{tmp}/t",
      files={"t": TRACE_TWO}, word="several devices"),
    c("replay-beyond-target", "bench", "replay", "/dev/bcache0", "--trace", "{tmp}/t",
      files={"t": TRACE_FAR}, word="smaller"),
]


# --------------------------------------------------------------------------- the harness


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every path under ``root`` -> what it is: a file's bytes, a link's target, "dir".
    (os.scandir and str paths: this runs twice a case over ~500 files, and pathlib's objects
    were most of its time.)"""
    out: dict[str, bytes | str] = {}
    todo = [(str(root), "")]
    while todo:
        path, rel = todo.pop()
        with os.scandir(path) as it:
            for e in it:
                r = rel + e.name
                if e.is_symlink():
                    out[r] = "->" + os.readlink(e.path)
                elif e.is_file():
                    with open(e.path, "rb") as f:
                        out[r] = f.read()
                else:
                    out[r] = "dir"
                    todo.append((e.path, r + "/"))
    return out


_PRISTINE: dict[str, tuple[Path, dict[str, bytes | str]]] = {}


def _capture(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, case: Case
             ) -> tuple[Path, dict[str, bytes | str]]:
    """The case's capture, writable, and what it holds. A case that adds partitions to it
    gets a copy of its own; the others share one copy a worker (copying ~500 files was a
    third of a case's time), compared after each case with what it held when copied: a
    case that changed it fails, and the copy is dropped for a fresh one."""
    if any(rel.startswith("PART") for rel in case.files):
        root = copy_capture(tmp_path, case.capture)
        _make(tmp_path, case.files, root)
        return root, _tree(root)
    if case.capture not in _PRISTINE:
        root = copy_capture(tmp_path_factory.mktemp("capture"), case.capture)
        _PRISTINE[case.capture] = root, _tree(root)
    root, held = _PRISTINE[case.capture]
    _make(tmp_path, case.files, root)
    return root, held


def _make(tmp: Path, files: dict[str, str | bytes], sys_root: Path) -> None:
    for rel, content in files.items():
        if rel.startswith("PART"):  # a partition of a capture's disk: "disk/part"
            disk, part = str(content).split("/")
            d = (sys_root / "block" / disk).resolve() / part
            d.mkdir()
            n = part.removeprefix(disk)
            (d / "partition").write_text(f"{n}\n")
            (d / "size").write_text("262144\n")
            (d / "dev").write_text(f"98:{90 + int(n)}\n")
            (d / "holders").mkdir()
            continue
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if content == "FIFO":
            os.mkfifo(p)
        elif content == "DIR":
            p.mkdir()
        elif content == "LINK":
            p.symlink_to(tmp)
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


def _forbidden(monkeypatch: pytest.MonkeyPatch, done: list[str]) -> None:
    """A lab boot, a udev worker, a metrics listener: listed and refused."""
    from cachemgr.lab import core as lab_core
    from cachemgr.ops import udev as cli_udev
    from cachemgr.procedures import metrics as metrics_procedure

    def refuse(what: str) -> object:
        def f(*a: object, **kw: object) -> object:
            done.append(what)
            raise CacheMgrError(f"test: refused {what}")
        return f

    monkeypatch.setattr(lab_core, "run", refuse("lab boot"))
    monkeypatch.setattr(cli_udev, "spawn", refuse("udev worker"))
    monkeypatch.setattr(cli_udev, "enqueue", refuse("udev enqueue"))
    monkeypatch.setattr(metrics_procedure, "serve", refuse("metrics listener"))


def _fake_nodes(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """The capture's block devices as device nodes: ``/dev/NAME`` (and ``/dev/mapper/NAME``
    of a dm device) exists and names its device, as on the host it was captured on, so a
    command gets past "no such device" to its other checks. Nothing else of /dev is faked:
    a write that reached one would fail (and the sysfs copy and command guard catch the
    rest)."""
    nodes: dict[str, str] = {}
    for d in (root / "block").iterdir():
        nodes[f"/dev/{d.name}"] = d.name
        for part in d.iterdir():
            if (part / "partition").is_file():
                nodes[f"/dev/{part.name}"] = part.name
        dm = d / "dm" / "name"
        if dm.is_file():
            nodes[f"/dev/mapper/{dm.read_text().strip()}"] = d.name
    real_exists = os.path.exists
    real_name = Sysfs.block_name_of

    def exists(path: object) -> bool:
        return path in nodes or real_exists(path)  # type: ignore[arg-type]

    def block_name_of(self: Sysfs, node: str) -> str | None:
        return nodes.get(node) or real_name(self, node)

    monkeypatch.setattr(os.path, "exists", exists)
    monkeypatch.setattr(Sysfs, "block_name_of", block_name_of)


def _param(case: Case) -> object:
    return pytest.param(case, id=case.id, marks=case.marks)


@pytest.mark.parametrize("case", [_param(x) for x in CASES])
def test_bad_input(case: Case, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                   monkeypatch: pytest.MonkeyPatch) -> None:
    root, before_sys = _capture(tmp_path, tmp_path_factory, case)
    state_dir = tmp_path / "state"
    state_dir.mkdir(exist_ok=True)
    monkeypatch.setenv("CACHEMGR_STATE_DIR", str(state_dir))
    monkeypatch.setenv("CACHEMGR_POLICY", str(tmp_path / "policy-absent.toml"))
    monkeypatch.delenv("CACHEMGR_SYSFS", raising=False)
    writes = kernel_writes(monkeypatch)
    refused = mutations_refused(monkeypatch)
    forbidden: list[str] = []
    _forbidden(monkeypatch, forbidden)
    _fake_nodes(monkeypatch, root)
    before_state = _tree(state_dir)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in case.argv]

    r = in_process("--sysfs-root", str(root), *argv)
    after_sys = _tree(root)
    if after_sys != before_sys:
        _PRISTINE.pop(case.capture, None)  # the next case gets a fresh copy

    err = r.stderr
    assert "Traceback" not in err, err
    assert r.returncode == case.code, (r.returncode, err)
    assert writes == [] and refused == [] and forbidden == [], (writes, refused, forbidden)
    assert after_sys == before_sys, f"{case.capture} changed"
    for rel in case.files:  # what the case put there is still there
        if not rel.startswith(("PART", "state/")):
            assert os.path.lexists(tmp_path / rel), rel
    after_state = {k: v for k, v in _tree(state_dir).items()
                   if k != "locks" and not k.startswith("locks/")}
    assert after_state == before_state, sorted(set(after_state) ^ set(before_state))
    if case.word is None:
        assert err == "" and r.returncode == 0
        return
    assert r.stdout == "", r.stdout
    lines = err.splitlines()
    assert err.endswith("\n"), err
    if lines and lines[0].startswith("usage: "):  # argparse: usage line(s), then one error
        assert case.code == 2
        assert sum(line.startswith("cachemgr") and ": error: " in line for line in lines) == 1
        assert lines[-1].startswith("cachemgr") and ": error: " in lines[-1], err
    else:
        assert lines and lines[0].startswith("cachemgr: "), err
        body = lines[1:]
        if body and body[-1].startswith("  hint: "):
            body = body[:-1]
        m = re.match(r"cachemgr: policy .* is invalid \((\d+) problems?\)", lines[0])
        if m:  # the policy's errors: its problems, one line each (policy.PolicyError)
            assert len(body) == int(m.group(1)), err
            assert all(line.startswith("  ") and not line.startswith("  hint: ")
                       for line in body), err
        else:
            assert body == [], err
    word = case.word.replace("{tmp}", str(tmp_path))
    assert word.lower() in err.lower(), (word, err)


def test_the_matrix_is_big_enough() -> None:
    assert len(CASES) >= 150
    assert len({x.id for x in CASES}) == len(CASES)
