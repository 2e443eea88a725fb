"""TLS termination in a process of its own for SSL and SASL_SSL listeners (``ssl.offload``).

In the broker's event loop TLS costs every byte a decryption (or encryption) and a copy under
the interpreter's lock, and a TLS connection cannot ``sendfile``: SASL_SSL produce ran at 71% of
plaintext (docs/benchmarks.md). With ``ssl.offload`` a small Go program
(``tls_offload/main.go``, built with the machine's Go on first use into
``~/.cache/stratalog/tls-offload/<digest>``, as the JVM sources are compiled) listens on the
listener's address, does the handshake and the record layer on its own threads, and hands each
connection to the broker in clear over a Unix socket in a private directory (mode 0700), after
a PROXY v2 header with the client's address and verified certificate
(broker/proxied_connection.py). The broker then treats the connection as one of that listener
(SASL, principals, ACLs, advertised address) with plaintext costs.

The key never goes to a file: the broker, which already checks and decrypts the keystore
(``ssl.key.password``), writes the certificate chain and the key to the process's standard
input; the process exits when that pipe closes, so it never outlives the broker. If it dies,
the broker starts it again on the same port (clients reconnect).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from stratalog.security.listeners import SSL, Listener

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("tls_offload")
CACHE = Path.home() / ".cache" / "stratalog" / "tls-offload"
BINARY = "stratalog-tls-offload"
START_TIMEOUT_S = 30.0
RESTART_PAUSE_S = 1.0
_GO_HOME = "/usr/local/go/bin/go"  # the official tarball's place, often not on PATH


class OffloadError(RuntimeError):
    """The offload process cannot be built or started; the message says why."""


def _go() -> str:
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None
    )
    if go is None:
        raise OffloadError(
            "ssl.offload needs Go to build its TLS process (apt-get install golang-go), "
            "or set ssl.offload=false"
        )
    return go


def binary() -> Path:
    """The offload program, built once per version of its source."""
    h = hashlib.sha256()
    for f in sorted(SOURCE.glob("*")):
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    out = CACHE / h.hexdigest()[:16]
    program = out / BINARY
    if program.exists():
        return program
    partial = Path(tempfile.mkdtemp(prefix=".build-", dir=_cache_dir()))
    try:
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
        proc = subprocess.run(
            [_go(), "build", "-trimpath", "-o", str(partial / BINARY), "."],
            cwd=SOURCE, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise OffloadError(f"building the TLS offload process failed: {proc.stderr[-1200:]}")
        try:
            partial.rename(out)  # atomic; a concurrent build of the same source may win
        except OSError:
            pass
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return program


def _cache_dir() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    return CACHE


def keystore_pem(config: Any) -> bytes:
    """The listener's certificate chain and its private key, unencrypted, as PEM."""
    from cryptography.hazmat.primitives import serialization

    pem = Path(config["ssl.keystore.location"]).read_bytes()
    password = config["ssl.key.password"] or None
    key = serialization.load_pem_private_key(pem, password.encode() if password else None)
    clear = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    chain = b"".join(
        block + b"-----END CERTIFICATE-----\n"
        for block in pem.split(b"-----END CERTIFICATE-----")[:-1]
        if b"-----BEGIN CERTIFICATE-----" in block
    )
    return chain + clear


class TlsOffload:
    """The offload process of one listener, and its Unix socket."""

    def __init__(self, config: Any, listener: Listener) -> None:
        self.config = config
        self.listener = listener
        self.directory = Path(tempfile.mkdtemp(prefix="stratalog-tls-"))  # mode 0700
        self.socket_path = self.directory / "broker.sock"
        self.process: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task | None = None
        self._stopping = False
        self._program = binary()  # (a build error is a start error, before any thread)
        self._pem = keystore_pem(config)

    def _args(self, host: str, port: int) -> list[str]:
        auth = self.config["ssl.client.auth"] if self.listener.protocol == SSL else "none"
        args = [
            str(self._program),
            "-listen", f"{host}:{port}",
            "-upstream", str(self.socket_path),
            "-client-auth", auth,
            "-protocols", self.config["ssl.enabled.protocols"],
        ]  # fmt: skip
        if self.config["ssl.truststore.location"] and auth != "none":
            args += ["-ca", self.config["ssl.truststore.location"]]
        return args

    async def start(self, host: str, port: int) -> int:
        """Start the process on ``host:port`` (0: any port); the port it listens on."""
        proc = await asyncio.create_subprocess_exec(
            *self._args(host, port),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(struct.pack(">I", len(self._pem)) + self._pem)
        await proc.stdin.drain()
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        text = line.decode(errors="replace").strip()
        if not text.startswith("listening "):
            proc.kill()
            await proc.wait()
            raise OffloadError(
                f"the TLS offload process of listener {self.listener.name} did not start "
                f"({text or 'no answer'}; its errors are in the broker's log)"
            )
        self.process = proc
        bound = int(text.rsplit(":", 1)[1])
        if self._watch is None:
            self._watch = asyncio.ensure_future(self._restart_when_gone(host, bound))
        return bound

    async def _restart_when_gone(self, host: str, port: int) -> None:
        while not self._stopping:
            proc = self.process
            assert proc is not None
            code = await proc.wait()
            if self._stopping:
                return
            log.error(
                "the TLS offload process of listener %s (pid %d) exited (%s): starting it again",
                self.listener.name, proc.pid, code,
            )  # fmt: skip
            await asyncio.sleep(RESTART_PAUSE_S)
            try:
                await self.start(host, port)
            except (OSError, OffloadError) as e:
                log.error("%s", e)

    async def stop(self) -> None:
        self._stopping = True
        proc = self.process
        if proc is not None and proc.returncode is None:
            assert proc.stdin is not None
            proc.stdin.close()  # its signal to exit
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._watch is not None:
            self._watch.cancel()
        shutil.rmtree(self.directory, ignore_errors=True)
