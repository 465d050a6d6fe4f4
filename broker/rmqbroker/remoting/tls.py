"""TLS on the remoting ports, with RocketMQ 4.9's modes and settings (TlsSystemConfig, TlsHelper).

A server runs in one of three modes (Java's ``tls.server.mode``): ``disabled`` (plain connections
only), ``permissive`` (Java's default: plain and TLS on the same port; a connection whose first
byte is a TLS handshake record gets TLS) and ``enforcing`` (TLS only; a plain connection is closed
and counted). A client uses TLS when ``tls.enable`` is true. Certificates and client
authentication come from RocketMQ's ``tls.properties`` keys; in test mode (Java's default,
``tls.test.mode.enable=true``) a server presents a self-signed certificate made when the first TLS
client arrives and a client checks no certificate, as Java's do.

Python's ``ssl`` cannot ask for a client certificate without verifying it, so a server that needs
client certificates must verify them (``tls.server.authClient=true`` with a trust file).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from rmqbroker.properties import parse_properties

log = logging.getLogger(__name__)

# The first byte of a TLS record carrying a handshake message (a ClientHello, when a client
# starts): what tells a TLS client from a plain RocketMQ frame, whose first byte is the high
# byte of a frame length (0 for any frame under 16 MiB).
HANDSHAKE_RECORD = 0x16

MODES = ("disabled", "permissive", "enforcing")
CLIENT_AUTH_MODES = ("none", "optional", "require")
# Where Java looks for tls.properties when -Dtls.config.file is not given.
DEFAULT_CONFIG_FILE = "/etc/rocketmq/tls.properties"
# How long an accepted connection may stay silent before its first byte decides plain or TLS.
SNIFF_TIMEOUT = 120.0
HANDSHAKE_TIMEOUT = 30.0
# How often a server looks whether its certificate files changed.
RELOAD_CHECK_SECONDS = 5.0


class TlsConfigError(ValueError):
    """A TLS setting or file that cannot be used; the message names the key or the file."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """One process's TLS settings; the file keys are Java's ``tls.properties`` names."""

    server_mode: str = "permissive"
    client_enable: bool = False
    test_mode: bool = True
    server_need_client_auth: str = "none"
    server_key_path: str = ""
    server_key_password: str = ""
    server_cert_path: str = ""
    server_auth_client: bool = False
    server_trust_cert_path: str = ""
    client_key_path: str = ""
    client_key_password: str = ""
    client_cert_path: str = ""
    client_auth_server: bool = False
    client_trust_cert_path: str = ""


# tls.properties key -> TlsSettings field (TlsHelper.extractTlsConfigFromFile's keys).
FILE_KEYS: dict[str, str] = {
    "tls.test.mode.enable": "test_mode",
    "tls.server.need.client.auth": "server_need_client_auth",
    "tls.server.keyPath": "server_key_path",
    "tls.server.keyPassword": "server_key_password",
    "tls.server.certPath": "server_cert_path",
    "tls.server.authClient": "server_auth_client",
    "tls.server.trustCertPath": "server_trust_cert_path",
    "tls.client.keyPath": "client_key_path",
    "tls.client.keyPassword": "client_key_password",
    "tls.client.certPath": "client_cert_path",
    "tls.client.authServer": "client_auth_server",
    "tls.client.trustCertPath": "client_trust_cert_path",
}
_BOOL_FIELDS = {f.name for f in fields(TlsSettings) if f.type in (bool, "bool")}


def _parse_bool(key: str, value: str) -> bool:
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise TlsConfigError(f"{key}: expected true or false, got {value!r}")
    return text == "true"


def load_settings(server_mode: str = "permissive", client_enable: bool = False,
                  config_file: str = DEFAULT_CONFIG_FILE) -> TlsSettings:
    """The mode and client switch (Java's ``-Dtls.server.mode`` and ``-Dtls.enable``) with the
    certificate settings of ``config_file``, validated. Java's default file may be absent; a file
    named explicitly must exist. Raises :class:`TlsConfigError`."""
    values: dict[str, object] = {"server_mode": server_mode.strip().lower(), "client_enable": client_enable}
    if config_file:
        path = Path(os.path.expanduser(config_file))
        try:
            props = parse_properties(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            if config_file != DEFAULT_CONFIG_FILE:
                raise TlsConfigError(f"TLS config file {path} does not exist") from exc
            props = {}
        except (OSError, UnicodeDecodeError) as exc:
            raise TlsConfigError(f"cannot read the TLS config file {path}: {exc}") from exc
        for key, value in props.items():
            name = FILE_KEYS.get(key)
            if name is None:
                if key.startswith("tls."):
                    log.warning("%s: unknown key %r ignored", path, key)
                continue
            values[name] = _parse_bool(key, value) if name in _BOOL_FIELDS else value
    settings = TlsSettings(**values)  # type: ignore[arg-type]
    validate(settings)
    return settings


# cert-manager's file names for a certificate, its key and the CA, as Secrets hold them.
CERT_FILES = ("tls.crt", "tls.key", "ca.crt")
PROPERTIES_FILE = "tls.properties"


def render_properties(directory: str, client_auth: str, header: str = "") -> str:
    """tls.properties for a server that is also a client (a broker, a nameserver): the
    certificate ``directory/tls.crt`` with ``tls.key`` serves and identifies it, ``ca.crt`` is
    trusted both ways (cert-manager's file names); host names are not checked, as in RocketMQ."""
    if client_auth not in CLIENT_AUTH_MODES:
        raise TlsConfigError(f"client auth must be one of {', '.join(CLIENT_AUTH_MODES)}, got {client_auth!r}")
    props = {
        "tls.test.mode.enable": "false",
        "tls.server.certPath": f"{directory}/tls.crt",
        "tls.server.keyPath": f"{directory}/tls.key",
        "tls.server.need.client.auth": client_auth,
        "tls.server.authClient": str(client_auth != "none").lower(),
        "tls.server.trustCertPath": f"{directory}/ca.crt",
        "tls.client.certPath": f"{directory}/tls.crt",
        "tls.client.keyPath": f"{directory}/tls.key",
        "tls.client.authServer": "true",
        "tls.client.trustCertPath": f"{directory}/ca.crt",
    }
    return header + "".join(f"{k}={v}\n" for k, v in props.items())


def validate(s: TlsSettings) -> None:
    """Reject settings no connection could use, naming the key; certificate files are loaded to
    prove they are readable and match, so a mistake stops the start, not the first client."""
    if s.server_mode not in MODES:
        raise TlsConfigError(f"tls.server.mode: expected one of {', '.join(MODES)}, got {s.server_mode!r}")
    if s.server_need_client_auth not in CLIENT_AUTH_MODES:
        raise TlsConfigError(f"tls.server.need.client.auth: expected one of {', '.join(CLIENT_AUTH_MODES)}, "
                             f"got {s.server_need_client_auth!r}")
    if s.server_mode != "disabled" and not s.test_mode:
        server_context(s)
    if s.client_enable:
        client_context(s)


def _load_chain(ctx: ssl.SSLContext, cert_key: str, cert: str, key_key: str, key: str, password: str) -> None:
    if not cert or not key:
        raise TlsConfigError(f"{cert_key} and {key_key} are both needed outside test mode "
                             "(tls.test.mode.enable=false)")
    try:
        ctx.load_cert_chain(os.path.expanduser(cert), os.path.expanduser(key), password or None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"{cert_key}={cert}, {key_key}={key}: cannot load the certificate and key: "
                             f"{exc}") from exc


def _load_trust(ctx: ssl.SSLContext, key: str, path: str) -> None:
    try:
        ctx.load_verify_locations(cafile=os.path.expanduser(path))
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"{key}={path}: cannot load the trusted certificates: {exc}") from exc


def server_context(s: TlsSettings) -> ssl.SSLContext:
    """A server context: the configured certificate, or a fresh self-signed one in test mode."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if s.test_mode:
        cert_pem, key_pem = self_signed_certificate()
        with tempfile.TemporaryDirectory(prefix="rmq-tls-") as tmp:
            cert_file, key_file = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            cert_file.write_bytes(cert_pem)
            key_file.write_bytes(key_pem)
            ctx.load_cert_chain(cert_file, key_file)
        return ctx
    _load_chain(ctx, "tls.server.certPath", s.server_cert_path, "tls.server.keyPath", s.server_key_path,
                s.server_key_password)
    if s.server_need_client_auth != "none":
        if not s.server_auth_client or not s.server_trust_cert_path:
            raise TlsConfigError(
                f"tls.server.need.client.auth={s.server_need_client_auth} needs tls.server.authClient=true and "
                "tls.server.trustCertPath: this server verifies every client certificate it asks for")
        _load_trust(ctx, "tls.server.trustCertPath", s.server_trust_cert_path)
        ctx.verify_mode = ssl.CERT_REQUIRED if s.server_need_client_auth == "require" else ssl.CERT_OPTIONAL
    return ctx


def client_context(s: TlsSettings) -> ssl.SSLContext | None:
    """A client context when ``tls.enable`` is on, else None. As in Java, the server's host name
    is not checked; its certificate is, when ``tls.client.authServer`` is on outside test mode."""
    if not s.client_enable:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    if s.test_mode or not s.client_auth_server:
        ctx.verify_mode = ssl.CERT_NONE
    elif s.client_trust_cert_path:
        _load_trust(ctx, "tls.client.trustCertPath", s.client_trust_cert_path)
    else:
        ctx.load_default_certs()
    if not s.test_mode and (s.client_cert_path or s.client_key_path):
        _load_chain(ctx, "tls.client.certPath", s.client_cert_path, "tls.client.keyPath", s.client_key_path,
                    s.client_key_password)
    return ctx


def self_signed_certificate(common_name: str = "localhost") -> tuple[bytes, bytes]:
    """A self-signed certificate and its key (PEM), valid for a year: what Java's test mode uses."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(common_name)]), critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _files_stamp(s: TlsSettings, client: bool = False) -> tuple[tuple[str, float, int], ...]:
    """Modification time and size of the server's (or the client's) certificate files (none in
    test mode)."""
    if s.test_mode:
        return ()
    out = []
    paths = ((s.client_cert_path, s.client_key_path, s.client_trust_cert_path) if client
             else (s.server_cert_path, s.server_key_path, s.server_trust_cert_path))
    for path in paths:
        if path:
            try:
                st = os.stat(os.path.expanduser(path))
            except OSError:
                out.append((path, -1.0, -1))
            else:
                out.append((path, st.st_mtime, st.st_size))
    return tuple(out)


class _Reloading:
    """A context made on first use and made again, for the next connection, when its certificate
    files change (looked at every few seconds): a renewed Secret is used without a restart. A
    renewal that does not load is logged and the previous context kept."""

    def __init__(self, build: Callable[[], ssl.SSLContext],
                 stamp: Callable[[], tuple[tuple[str, float, int], ...]], what: str) -> None:
        self._build = build
        self._stamp_of = stamp
        self.what = what
        self._context: ssl.SSLContext | None = None
        self._stamp: tuple[tuple[str, float, int], ...] = ()
        self._next_check = 0.0

    def get(self) -> ssl.SSLContext:
        now = time.monotonic()
        if self._context is not None and now < self._next_check:
            return self._context
        self._next_check = now + RELOAD_CHECK_SECONDS
        stamp = self._stamp_of()
        if self._context is not None and stamp == self._stamp:
            return self._context
        try:
            context = self._build()
        except TlsConfigError as exc:
            if self._context is None:
                raise
            log.error("%s: the changed TLS certificate files do not load; keeping the previous ones: %s",
                      self.what, exc)
            self._stamp = stamp
            return self._context
        if self._context is not None:
            log.info("%s: TLS certificate files changed; new connections use them", self.what)
        self._context, self._stamp = context, stamp
        return context


class ClientContexts:
    """The client context for each new connection of a process's own client (None without
    ``tls.enable``), with renewed ``tls.client.*`` files picked up as a server's are."""

    def __init__(self, settings: TlsSettings) -> None:
        def build() -> ssl.SSLContext:
            ctx = client_context(settings)
            assert ctx is not None  # only built with tls.enable on
            return ctx

        self._source = _Reloading(build, lambda: _files_stamp(settings, client=True), "TLS client") \
            if settings.client_enable else None

    def __call__(self) -> ssl.SSLContext | None:
        return self._source.get() if self._source is not None else None


class SniffingListener:
    """A listening socket whose connections are served plain or over TLS by their first byte.

    Accepting here instead of in ``loop.create_server`` lets the first byte be peeked
    (``MSG_PEEK``) before a transport exists, so the TLS handshake reads the ClientHello itself.
    Only connection set-up passes through here; frames go through the transport as usual.
    """

    def __init__(self, settings: TlsSettings, factory: Callable[[], asyncio.Protocol], name: str,
                 on_rejected: Callable[[str], None], on_tls: Callable[[], None],
                 sniff_timeout: float = SNIFF_TIMEOUT, on_idle: Callable[[], None] | None = None) -> None:
        self.settings = settings
        # How long a connection may stay without its first byte (the server's idle timeout).
        self.sniff_timeout = sniff_timeout
        self.on_idle = on_idle
        self.factory = factory
        self.name = name
        # Called with a reason ("plaintext", "handshake") for each connection refused here, and
        # for each connection served over TLS.
        self.on_rejected = on_rejected
        self.on_tls = on_tls
        self.port = 0
        # Made when the first TLS client arrives: test mode makes a key pair then, so a server that
        # never sees TLS pays nothing for it.
        self._contexts = _Reloading(lambda: server_context(settings), lambda: _files_stamp(settings), name)
        self._sock: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int, backlog: int = 1024) -> int:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            # Name the address: "[Errno 98] Address already in use" alone does not say which of a
            # broker's ports (listen, VIP channel) another process holds.
            raise OSError(exc.errno, f"cannot listen on {host or '0.0.0.0'}:{port}: {exc.strerror}") from exc
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        self._accept_task = loop.create_task(self._accept_loop(sock), name=f"{self.name} accept")
        return self.port

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:
                # EMFILE and friends: back off instead of spinning, as asyncio's own accept does.
                log.warning("%s: accept failed: %s", self.name, exc)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._serve(conn, addr))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _serve(self, conn: socket.socket, addr: object) -> None:
        peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        conn.setblocking(False)
        try:
            async with asyncio.timeout(self.sniff_timeout):
                first = await _peek(conn)
        except asyncio.CancelledError:
            conn.close()  # the server is stopping
            raise
        except (TimeoutError, OSError) as exc:
            log.info("%s: %s sent nothing it could be served on (%s); closed", self.name, peer, exc or "timeout")
            conn.close()
            if isinstance(exc, TimeoutError) and self.on_idle is not None:
                self.on_idle()
            return
        if not first:
            conn.close()  # connected and left without a byte (a TCP probe)
            return
        is_tls = first[0] == HANDSHAKE_RECORD
        if not is_tls and self.settings.server_mode == "enforcing":
            self.on_rejected("plaintext")
            log.warning("%s: %s opened a plain connection, but this server runs in TLS enforcing mode; closed",
                        self.name, peer)
            conn.close()
            return
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        loop = asyncio.get_running_loop()
        try:
            if is_tls:
                await loop.connect_accepted_socket(self.factory, conn, ssl=self._contexts.get(),
                                                   ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
                self.on_tls()
            else:
                await loop.connect_accepted_socket(self.factory, conn)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            self.on_rejected("handshake" if is_tls else "setup")
            log.warning("%s: %s: %s failed: %s", self.name, peer, "TLS handshake" if is_tls else "connection set-up",
                        exc)
            conn.close()
        except TlsConfigError as exc:
            self.on_rejected("handshake")
            log.error("%s: cannot serve TLS to %s: %s", self.name, peer, exc)
            conn.close()

    def close(self) -> None:
        if self._accept_task is not None:
            self._accept_task.cancel()
        for task in list(self._pending):
            task.cancel()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def wait_closed(self) -> None:
        tasks = [t for t in (self._accept_task, *self._pending) if t is not None]
        self._accept_task = None
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


async def _peek(conn: socket.socket) -> bytes:
    """The connection's first byte, left in the socket; b"" when the peer closed first."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return conn.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            pass
        ready: asyncio.Future[None] = loop.create_future()
        fd = conn.fileno()
        loop.add_reader(fd, _set_once, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
