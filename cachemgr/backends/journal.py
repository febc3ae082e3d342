"""The system journal, written through journald's native protocol (systemd's "Native
Journal Protocol"): one datagram per entry to ``/run/systemd/journal/socket``
(``CACHEMGR_JOURNAL_SOCKET`` overrides the path, for tests), with no library of systemd's.

An entry is its fields, each ``NAME=value\\n``; a value holding a line break goes in the
binary form (``NAME\\n``, its length as 64 bits little-endian, the bytes, ``\\n``), so a
device name with a newline or a ``=`` stays one field's value and cannot forge another
field. An entry too big for one datagram goes in a sealed memfd passed along the socket, as
sd_journal_sendv does.

Writing never fails the caller: with no journal (a container, a lab guest without
systemd), a full socket or any other error, :func:`send` returns False and nothing else
happens.
"""

from __future__ import annotations

import array
import contextlib
import errno
import os
import re
import socket
import struct
from collections.abc import Iterable

DEFAULT_SOCKET = "/run/systemd/journal/socket"

# syslog's priorities, as journald's PRIORITY field takes them
ERR, WARNING, NOTICE, INFO, DEBUG = 3, 4, 5, 6, 7

# journald's rule for a field name: upper-case letters, digits and underscores, not
# starting with a digit or an underscore (those are the journal's own), at most 64 bytes
_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}\Z")


def socket_path() -> str:
    return os.environ.get("CACHEMGR_JOURNAL_SOCKET") or DEFAULT_SOCKET


def encode(fields: Iterable[tuple[str, str]]) -> bytes:
    """The entry's bytes. A field name that is not a journal field name is a bug of ours:
    ValueError (names are constants; only values come from outside)."""
    out = bytearray()
    for name, value in fields:
        if not _NAME.match(name):
            raise ValueError(f"not a journal field name: {name!r}")
        data = value.encode("utf-8", "surrogateescape")
        if b"\n" in data:
            out += name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name.encode() + b"=" + data + b"\n"
    return bytes(out)


def send(fields: Iterable[tuple[str, str]], *, path: str | None = None) -> bool:
    """Write one entry; True when the journal took it. Never raises for the journal's
    sake (no socket, nobody listening, a full queue): the entry is then dropped."""
    data = encode(fields)
    target = path or socket_path()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.settimeout(1.0)  # a journal too busy to take one datagram does not hold us
            try:
                s.sendto(data, target)
            except OSError as exc:
                if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                    raise
                _send_memfd(s, data, target)
        return True
    except (OSError, ValueError):
        return False


def _send_memfd(s: socket.socket, data: bytes, target: str) -> None:
    """A big entry: its bytes in a sealed memfd, passed with an empty datagram."""
    fd = os.memfd_create("cachemgr-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, data)
        with contextlib.suppress(OSError):  # journald takes an unsealed one too
            import fcntl

            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                        | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
        s.sendmsg([b""], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))], 0,
                  target)
    finally:
        os.close(fd)
