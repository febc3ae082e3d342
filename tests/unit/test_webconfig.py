"""The listener's TLS and basic auth from a web-config file (exporter-toolkit's format,
procedures/webconfig.py), checked with curl against a self-signed certificate made by
openssl: the real `cachemgr metrics --listen ... --web-config FILE` process on the
bcache-writeback-dirty-uml capture."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from cachemgr.core.errors import UsageError
from cachemgr.procedures import webconfig
from tests.unit.test_metrics import FX, ROOT, cli, free_port, listening

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None or shutil.which("curl") is None,
    reason="openssl and curl are needed (scripts/setup.sh installs them)")


def bcrypt(password: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 10))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, the server's certificate for 127.0.0.1 signed by it, and a client's."""
    d = tmp_path_factory.mktemp("certs")

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.crt")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"),
                      ("client", "extendedKeyUsage=clientAuth")):
        ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout",
            f"{name}.key", "-out", f"{name}.csr")
        (d / f"{name}.ext").write_text(ext + "\n")
        ssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt")
    return d


class Served:
    def __init__(self, config: Path) -> None:
        self.port = free_port()
        env = {**os.environ, "CACHEMGR_SYSFS": str(FX), "PYTHONPATH": str(ROOT)}
        self.p = subprocess.Popen(
            [sys.executable, "-m", "cachemgr", "metrics", "--listen", f"127.0.0.1:{self.port}",
             "--web-config", str(config)], env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while not listening(self.port):
            assert self.p.poll() is None, self.p.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.05)

    def curl(self, *args: str) -> tuple[int, str]:
        r = subprocess.run(["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", *args],
                           capture_output=True, text=True, timeout=30)
        body, _, code = r.stdout.rpartition("\n")
        return (int(code) if code.isdigit() else 0), body

    def close(self) -> str:
        self.p.terminate()
        return self.p.communicate(timeout=10)[1]


def test_tls_and_basic_auth_with_curl(certs: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    # relative paths: to the file's directory, as exporter-toolkit resolves them
    for f in ("server.crt", "server.key"):
        shutil.copy(certs / f, tmp_path / f)
    cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                   f"basic_auth_users:\n  prometheus: '{bcrypt('s3cret: with colon')}'\n")
    srv = Served(cfg)
    url = f"https://127.0.0.1:{srv.port}/metrics"
    try:
        code, body = srv.curl("--cacert", str(certs / "ca.crt"), "-u",
                              "prometheus:s3cret: with colon", url)
        assert code == 200 and "cachemgr_bcache_loaded" in body
        # again: the remembered pair (bcrypt is not paid per scrape)
        assert srv.curl("--cacert", str(certs / "ca.crt"), "-u",
                        "prometheus:s3cret: with colon", url)[0] == 200
        assert srv.curl("--cacert", str(certs / "ca.crt"), "-u", "prometheus:wrong",
                        url)[0] == 401
        assert srv.curl("--cacert", str(certs / "ca.crt"), "-u", "nobody:x", url)[0] == 401
        assert srv.curl("--cacert", str(certs / "ca.crt"), url)[0] == 401
        # plain HTTP is not served; a client that does not trust the CA is refused
        assert srv.curl(f"http://127.0.0.1:{srv.port}/metrics")[0] != 200
        assert srv.curl("-u", "prometheus:s3cret: with colon", url)[0] == 0
        # a client that connects and never handshakes does not stall the others
        import socket

        with socket.create_connection(("127.0.0.1", srv.port)):
            assert srv.curl("--cacert", str(certs / "ca.crt"), "-u",
                            "prometheus:s3cret: with colon", url)[0] == 200
    finally:
        err = srv.close()
    assert "TLS, basic auth (1 users)" in err and "Traceback" not in err, err


def test_client_certificates_required(certs: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {certs / 'server.crt'}\n"
                   f"  key_file: {certs / 'server.key'}\n"
                   "  client_auth_type: RequireAndVerifyClientCert\n"
                   f"  client_ca_file: {certs / 'ca.crt'}\n  min_version: TLS12\n")
    srv = Served(cfg)
    url = f"https://127.0.0.1:{srv.port}/metrics"
    try:
        assert srv.curl("--cacert", str(certs / "ca.crt"), url)[0] == 0  # no client cert
        code, body = srv.curl("--cacert", str(certs / "ca.crt"), "--cert",
                              str(certs / "client.crt"), "--key", str(certs / "client.key"), url)
        assert code == 200 and "cachemgr_bcache_loaded" in body
    finally:
        srv.close()


@pytest.mark.parametrize(("text", "words"), [
    ("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n  cipher_suites: [x]\n",
     "tls_server_config.cipher_suites: not supported by cachemgr"),
    ("http_server_config:\n  http2: false\n", "http_server_config: not supported"),
    ("basic_auth_users:\n  u: plaintext\n", "expected a bcrypt hash"),
    ("tls_server_config:\n  key_file: a.key\n", "cert_file is required"),
    ("tls_server_config:\n  cert_file: none.crt\n  key_file: none.key\n", "cannot load"),
    ("- a\n- b\n", "not a YAML mapping"),
    ("a: [\n", "not valid YAML"),
])
def test_a_config_it_cannot_honour_is_refused(tmp_path: Path, text: str, words: str) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(text)
    with pytest.raises(UsageError, match=words.replace("[", r"\[")):
        webconfig.load(str(cfg))
    r = cli("--listen", f"127.0.0.1:{free_port()}", "--web-config", str(cfg))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


def test_web_config_without_listen_is_a_usage_error(tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text("{}\n")
    r = cli("--web-config", str(cfg))
    assert r.returncode == 2 and "give --listen too" in r.stderr
