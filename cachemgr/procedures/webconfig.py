"""TLS and basic authentication for the /metrics listener, from a web-config file in the
format every Prometheus exporter reads (Prometheus's exporter-toolkit, ``--web.config.file``),
so that one file serves node_exporter and cachemgr alike::

    tls_server_config:
      cert_file: /etc/cachemgr/metrics.crt     # relative paths: to this file's directory
      key_file: /etc/cachemgr/metrics.key
      client_auth_type: RequireAndVerifyClientCert   # optional (default NoClientCert)
      client_ca_file: /etc/cachemgr/clients-ca.crt   # with a client_auth_type that verifies
      min_version: TLS12                             # optional: TLS10..TLS13
      max_version: TLS13                             # optional
    basic_auth_users:
      prometheus: $2y$10$...                         # bcrypt hashes (htpasswd -nBC 10 "")

What cachemgr does not implement (cipher_suites, curve_preferences, http_server_config, ...)
is refused by name, never ignored: a file written for a stricter exporter must not serve
weaker here. Passwords are checked with the C library's bcrypt (Python's ``crypt`` module on
Debian 12's libxcrypt), each good (user, password) pair remembered (hashed) so that a scrape
does not pay bcrypt's cost every time; a bad one costs the full check.

The TLS handshake runs in the scrape's own thread (never in the accept loop, where one client
that never finishes its handshake would stall every other), with a 10 s timeout.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import ssl
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cachemgr.core.errors import UsageError

TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
            "max_version"}
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,  # asked for, not checked: Go's semantics differ
    "RequireAnyClientCert": None,  # Go: required but not verified: refused, too weak to map
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
            "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
HANDSHAKE_TIMEOUT = 10.0


@dataclass
class WebConfig:
    path: str
    tls: ssl.SSLContext | None = None
    users: dict[str, str] = field(default_factory=dict)  # user -> bcrypt hash
    _good: set[bytes] = field(default_factory=set)  # sha256 of "user\0password" checked ok
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def words(self) -> str:
        bits = ["TLS" if self.tls is not None else "no TLS"]
        if self.tls is not None and self.tls.verify_mode == ssl.CERT_REQUIRED:
            bits.append("client certificates required")
        bits.append(f"basic auth ({len(self.users)} users)" if self.users else "no auth")
        return ", ".join(bits)

    def check(self, header: str | None) -> bool:
        """An ``Authorization`` header's basic credentials against ``users``."""
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode(
                "utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        want = self.users.get(user)
        if want is None:
            _bcrypt(password, DUMMY_HASH)  # the same cost for an unknown user
            return False
        key = hashlib.sha256(f"{user}\0{password}\0{want}".encode()).digest()
        with self._lock:
            if key in self._good:
                return True
        if not hmac.compare_digest(_bcrypt(password, want), want):
            return False
        with self._lock:
            self._good.add(key)
        return True


# a valid bcrypt hash of no one's password, checked for an unknown user
DUMMY_HASH = "$2b$10$cachemgrdummysaltxxxxuFG8udLPL8Wq6FHWX7wk67hdNIQWOFz2"


def _bcrypt(password: str, salt_hash: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # the C library's crypt(3): libxcrypt has bcrypt

    out = crypt.crypt(password, salt_hash)
    return out or ""


def _crypt_has_bcrypt() -> bool:
    try:
        return _bcrypt("x", DUMMY_HASH).startswith("$2b$10$")
    except ImportError:
        return False


def load(path: str) -> WebConfig:
    """Read and check ``path``; UsageError (exit 2) naming what is wrong."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise UsageError(f"--web-config {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--web-config {path}: not valid YAML ({exc})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"--web-config {path}: not a YAML mapping")
    unknown = sorted(set(data) - {"tls_server_config", "basic_auth_users"})
    if unknown:
        raise UsageError(f"--web-config {path}: {', '.join(map(str, unknown))}: not "
                         "supported by cachemgr (it reads tls_server_config and "
                         "basic_auth_users); refusing rather than serving without them")
    base = os.path.dirname(os.path.abspath(path))
    cfg = WebConfig(path)
    tls = data.get("tls_server_config")
    if tls is not None:
        cfg.tls = _tls(path, base, tls)
    users = data.get("basic_auth_users")
    if users is not None:
        cfg.users = _users(path, users)
    return cfg


def _file(path: str, base: str, tls: dict[str, Any], key: str) -> str:
    v = tls.get(key)
    if not isinstance(v, str) or not v:
        raise UsageError(f"--web-config {path}: tls_server_config.{key} is required (a file)")
    return v if os.path.isabs(v) else os.path.join(base, v)


def _tls(path: str, base: str, tls: Any) -> ssl.SSLContext:
    if not isinstance(tls, dict):
        raise UsageError(f"--web-config {path}: tls_server_config is not a mapping")
    unknown = sorted(set(tls) - TLS_KEYS)
    if unknown:
        raise UsageError(f"--web-config {path}: tls_server_config.{', '.join(unknown)}: not "
                         "supported by cachemgr; refusing rather than serving without it")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # exporter-toolkit's default
    for key, attr in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        v = tls.get(key)
        if v is None:
            continue
        if v not in VERSIONS:
            raise UsageError(f"--web-config {path}: tls_server_config.{key} {v!r}: expected "
                             + ", ".join(VERSIONS))
        setattr(ctx, attr, VERSIONS[v])
    cert, key_file = _file(path, base, tls, "cert_file"), _file(path, base, tls, "key_file")
    try:
        ctx.load_cert_chain(cert, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"--web-config {path}: cannot load {cert} / {key_file}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in CLIENT_AUTH or CLIENT_AUTH[auth] is None:
        raise UsageError(f"--web-config {path}: tls_server_config.client_auth_type {auth!r}: "
                         "expected NoClientCert, RequestClientCert, VerifyClientCertIfGiven or "
                         "RequireAndVerifyClientCert")
    mode = CLIENT_AUTH[auth]
    assert mode is not None
    if mode != ssl.CERT_NONE:
        if auth != "RequestClientCert" or tls.get("client_ca_file"):
            ca = _file(path, base, tls, "client_ca_file")
            try:
                ctx.load_verify_locations(ca)
            except (OSError, ssl.SSLError) as exc:
                raise UsageError(f"--web-config {path}: cannot load client_ca_file {ca}: "
                                 f"{getattr(exc, 'strerror', None) or exc}") from None
        ctx.verify_mode = mode
    return ctx


def _users(path: str, users: Any) -> dict[str, str]:
    if not isinstance(users, dict):
        raise UsageError(f"--web-config {path}: basic_auth_users is not a mapping")
    out = {}
    for user, h in users.items():
        if not isinstance(user, str) or ":" in user or not isinstance(h, str) \
                or not h.startswith(("$2a$", "$2b$", "$2y$")):
            raise UsageError(f"--web-config {path}: basic_auth_users.{user}: expected a "
                             "bcrypt hash ($2y$..., htpasswd -nBC 10 USER)")
        out[user] = h
    if out and not _crypt_has_bcrypt():
        raise UsageError(f"--web-config {path}: basic_auth_users needs bcrypt, which this "
                         "system's crypt(3) lacks")
    return out


def wrap_app(cfg: WebConfig, app: Callable[..., Iterable[bytes]]) -> Callable[..., Any]:
    """The WSGI app behind ``cfg``'s basic auth (401 with a challenge otherwise)."""
    if not cfg.users:
        return app

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if cfg.check(environ.get("HTTP_AUTHORIZATION")):
            return app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("WWW-Authenticate",
                                             'Basic realm="cachemgr", charset="UTF-8"')])
        return [b"Unauthorized\n"]

    return guarded
