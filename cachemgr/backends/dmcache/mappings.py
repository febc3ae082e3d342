"""Which origin blocks a dm-cache device holds in its cache, and where: its metadata's
mappings, read by ``cache_dump`` (thin-provisioning-tools), the one wrapper of that tool.

``cache_dump`` refuses metadata that a live cache device holds open ("syscall 'open' failed:
Device or resource busy / Note: you cannot run this tool with these options on live
metadata": it opens with O_EXCL), and dm-cache has no metadata snapshot message
(``reserve_metadata_snap`` is dm-thin's: dm-cache answers EINVAL; lab, 7.2). So the
metadata is read through a read-only dm ``linear`` twin of the metadata device (device-
mapper tables may share a device with another table; the twin's own node is opened by
nobody else): what it reads is the last committed transaction (the metadata is copy on
write: blocks of a committed transaction are not rewritten until the next one), which a
``dmsetup status`` without ``--noflush`` just before makes the current one (dm-cache
otherwise commits on a flush and every second). A read across a commit
can find an inconsistent tree, which ``cache_dump`` reports as an error: it is tried again.
docs/kernel-notes.md, "Scrubbing a cache: which blocks are cached".

Output (thin-provisioning-tools 0.9.0)::

    <superblock uuid="" block_size="128" nr_cache_blocks="1024" policy="" hint_width="4">
      <mappings>
        <mapping cache_block="0" origin_block="0" dirty="false"/>
      </mappings>
      <hints> ... </hints>
    </superblock>
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

from cachemgr.backends.dmcache import command
from cachemgr.core import runner
from cachemgr.core.errors import CacheMgrError, CommandError, KernelFormatError
from cachemgr.core.model import DmCacheDevice

_MAPPING = re.compile(r'\s*<mapping cache_block="(\d+)" origin_block="(\d+)" '
                      r'dirty="(true|false)"/>\s*')
TRIES = 3  # a read across a metadata commit fails; the next one sees the new transaction


def parse(text: str) -> dict[int, tuple[int, bool]]:
    """origin block -> (cache block, dirty) of ``cache_dump``'s output; a line inside
    ``<mappings>`` that is not a mapping raises KernelFormatError with the line."""
    out: dict[int, tuple[int, bool]] = {}
    inside = seen = False
    for line in text.splitlines():
        s = line.strip()
        if s == "<mappings>":
            inside = seen = True
            continue
        if s == "</mappings>":
            inside = False
            continue
        if not inside:
            continue
        m = _MAPPING.fullmatch(line)
        if m is None:
            raise KernelFormatError("cache_dump mapping line", line)
        out[int(m.group(2))] = (int(m.group(1)), m.group(3) == "true")
    if not seen and "<superblock" not in text:
        raise KernelFormatError("cache_dump output (no superblock)", text[:200])
    return out


@contextlib.contextmanager
def _twin(d: DmCacheDevice) -> Iterator[str]:
    """A read-only linear dm device over ``d``'s metadata device, removed on the way out."""
    if d.metadata is None or not d.metadata.devno or not d.metadata.size_bytes:
        raise CacheMgrError(f"{d.node}: its metadata device is not known: the blocks it "
                            "caches cannot be listed")
    name = f"cachemgr-scrub-{d.name}"[:120]
    sectors = d.metadata.size_bytes // 512
    command.dmsetup("create", name, "--readonly", "--table",
                    f"0 {sectors} linear {d.metadata.devno} 0", timeout=30)
    try:
        yield f"/dev/mapper/{name}"
    finally:
        command.dmsetup("remove", "--retry", name, timeout=30, check=False)


def mapped(d: DmCacheDevice) -> dict[int, tuple[int, bool]]:
    """origin block -> (cache block, dirty) of every block ``d``'s cache holds, as of its
    last metadata commit (module docstring). CacheMgrError when ``cache_dump`` is missing
    or keeps failing."""
    last: str = ""
    with _twin(d) as node:
        for i in range(TRIES):
            # a status read without --noflush commits the metadata (dm-cache-target.c,
            # cache_status): the blocks promoted since the last commit are listed too (lab:
            # 3 of 5 corrupted blocks found without it, the two promoted last missing)
            command.dmsetup("status", d.name, timeout=30)
            try:
                r = runner.run(["cache_dump", node], timeout=300, check=False)
            except CommandError as exc:  # CommandNotFound: thin-provisioning-tools missing
                raise CacheMgrError(f"{d.node}: cache_dump could not run ({exc}): the blocks "
                                    "it caches cannot be listed",
                                    hint="install thin-provisioning-tools") from exc
            if r.returncode == 0:
                return parse(r.stdout)
            last = (r.stderr or r.stdout).strip()
            time.sleep(0.2 * (i + 1))
    raise CacheMgrError(f"{d.node}: cache_dump failed {TRIES} times on its metadata: {last}")

