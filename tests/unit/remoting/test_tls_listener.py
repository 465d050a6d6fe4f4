"""The TLS modes on the standard asyncio loop (the broker runs uvloop; the integration tests cover
that): one port for plain and TLS clients, enforcing refusals, silent probes, a large frame over
TLS, and tls.properties parsing."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rmqbroker.remoting import tls
from rmqbroker.remoting.client import RemotingClient, RemotingConnectError
from rmqbroker.remoting.frame import RemotingCommand
from rmqbroker.remoting.server import Connection, RemotingServer
from tests.support.certs import TestCA


async def _echo(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.make_response(0, body=cmd.body)


async def _server(mode: str) -> RemotingServer:
    srv = RemotingServer("127.0.0.1", 0, tls=tls.TlsSettings(server_mode=mode))
    srv.register(1, _echo)
    await srv.start()
    return srv


@pytest.fixture(params=["permissive", "enforcing"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[RemotingServer]:
    srv = await _server(request.param)
    yield srv
    await srv.stop()


TLS_CLIENT = tls.client_context(tls.TlsSettings(client_enable=True))


async def _call(addr: str, use_tls: bool, body: bytes = b"x") -> RemotingCommand:
    client = RemotingClient(ssl_context=TLS_CLIENT if use_tls else None)
    try:
        return await client.invoke(addr, RemotingCommand(1, body=body), 5)
    finally:
        await client.close()


async def test_modes_on_the_asyncio_loop(server: RemotingServer) -> None:
    addr = f"127.0.0.1:{server.port}"
    big = bytes(range(256)) * 4096  # 1 MiB: many TLS records each way
    resp = await _call(addr, True, big)
    assert resp.code == 0 and bytes(resp.body) == big
    assert server.stats.tls_connections == 1
    if server.tls is not None and server.tls.server_mode == "enforcing":
        with pytest.raises(RemotingConnectError):
            await _call(addr, False)
        assert server.stats.tls_refused == {"plaintext": 1}
    else:
        assert (await _call(addr, False)).code == 0
        assert server.stats.tls_refused == {}
    # A TCP probe that connects and leaves is neither served nor counted as refused.
    _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(0.1)
    assert sum(server.stats.tls_refused.values()) <= 1 and server.stats.connections_total == \
        (1 if server.tls is not None and server.tls.server_mode == "enforcing" else 2)


async def test_stop_closes_connections_still_being_sniffed() -> None:
    srv = await _server("permissive")
    silent = socket.create_connection(("127.0.0.1", srv.port))
    await asyncio.sleep(0.1)
    await asyncio.wait_for(srv.stop(), 5)
    silent.settimeout(2)
    assert silent.recv(1) == b""  # closed by the server, not left hanging
    silent.close()


def test_tls_properties_parsing(tmp_path: Path) -> None:
    props = tmp_path / "tls.properties"
    props.write_text("# comment\n! also a comment\n\ntls.test.mode.enable : false\n"
                     "tls.server.need.client.auth=optional\ntls.client.authServer=TRUE\ntls.unknown=1\n")
    with pytest.raises(tls.TlsConfigError, match=r"tls\.server\.certPath and tls\.server\.keyPath"):
        tls.load_settings("enforcing", False, str(props))
    s = tls.load_settings("disabled", False, str(props))
    assert (s.test_mode, s.server_need_client_auth, s.client_auth_server) == (False, "optional", True)
    # Java's default file may be missing; a file named explicitly may not.
    assert tls.load_settings("permissive", False, tls.DEFAULT_CONFIG_FILE) == tls.TlsSettings() \
        or Path(tls.DEFAULT_CONFIG_FILE).exists()
    with pytest.raises(tls.TlsConfigError, match="does not exist"):
        tls.load_settings("permissive", False, str(tmp_path / "missing.properties"))
    with pytest.raises(tls.TlsConfigError, match=r"tls\.server\.mode"):
        tls.load_settings("strict", False, "")


async def test_client_shows_a_renewed_certificate_without_a_restart(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker's own connections (tls.ClientContexts) pick up renewed client certificate files:
    refused with a certificate the server's CA did not sign, accepted once the files hold one it did."""
    monkeypatch.setattr(tls, "RELOAD_CHECK_SECONDS", 0.0)
    ca, other = TestCA(tmp_path / "ca"), TestCA(tmp_path / "other", name="other CA")
    server_cert, good, bad = ca.issue("server"), ca.issue("client"), other.issue("client")
    srv = RemotingServer("127.0.0.1", 0, tls=tls.TlsSettings(
        server_mode="enforcing", test_mode=False, server_cert_path=str(server_cert.cert),
        server_key_path=str(server_cert.key), server_need_client_auth="require", server_auth_client=True,
        server_trust_cert_path=str(ca.cert)))
    srv.register(1, _echo)
    await srv.start()
    cert, key = tmp_path / "client.crt", tmp_path / "client.key"
    cert.write_bytes(bad.cert.read_bytes())
    key.write_bytes(bad.key.read_bytes())
    contexts = tls.ClientContexts(tls.TlsSettings(
        client_enable=True, test_mode=False, client_cert_path=str(cert), client_key_path=str(key),
        client_auth_server=True, client_trust_cert_path=str(ca.cert)))
    addr = f"127.0.0.1:{srv.port}"

    async def call() -> RemotingCommand:
        client = RemotingClient(ssl_context=contexts)
        try:
            return await client.invoke(addr, RemotingCommand(1, body=b"hi"), 5)
        finally:
            await client.close()

    try:
        with pytest.raises(RemotingConnectError):
            await call()
        cert.write_bytes(good.cert.read_bytes())
        key.write_bytes(good.key.read_bytes() + b"\n")  # another size: a change even within one mtime tick
        assert (await call()).code == 0
        # Half a renewal (a certificate without its key) keeps the last good pair.
        cert.write_bytes(ca.issue("client-2").cert.read_bytes())
        assert (await call()).code == 0
        assert srv.stats.tls_refused == {"handshake": 1}
    finally:
        await srv.stop()
