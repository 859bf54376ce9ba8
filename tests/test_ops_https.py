"""The ``https://`` path end to end: nginx terminating TLS in front of the gateway.

The certificates are made here with the ``openssl`` CLI: a self-signed test CA, a server
certificate it signs for ``127.0.0.1``/``localhost``, one it signs for another host name, and an
unrelated second CA. nginx (the Debian package, installed when missing: ``nginx_binary`` of
``test_ops_proxy``) listens twice: with the right certificate, and with the one for the other
name. The client, given the CA bundle (``GatewayClient(verify=...)``), does kv, records, files
(streamed upload, ranged download), vectors and LangGraph checkpoints round trips over https; a
certificate it cannot trust (unknown CA, another CA's bundle, another host's name) is refused
before any request leaves. On both backends (the session ``server`` is the upstream).
"""

from __future__ import annotations

import os
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from storage_gateway_client import GatewayClient, TransportError

from tests.checkpoint_graphs import interrupting_graph
from tests.conftest import ADMIN_KEY, Backend, Server, free_port
from tests.test_ops_proxy import nginx_binary

NGINX_CONF = """\
worker_processes 1;
daemon off;
user {user};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    log_format tls '$remote_addr "$request" $status $ssl_protocol';
    access_log {dir}/access.log tls;
    ssl_protocols TLSv1.2 TLSv1.3;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {dir}/server.pem;
        ssl_certificate_key {dir}/server.key;
        location / {{ include {dir}/proxy.conf; }}
    }}
    server {{
        listen 127.0.0.1:{wrong_name_port} ssl;
        ssl_certificate {dir}/other-host.pem;
        ssl_certificate_key {dir}/other-host.key;
        location / {{ include {dir}/proxy.conf; }}
    }}
}}
"""

PROXY_CONF = """\
proxy_pass http://127.0.0.1:{upstream_port};
proxy_http_version 1.1;
proxy_set_header Connection "";
proxy_set_header Host $host;
proxy_set_header X-Forwarded-Proto $scheme;
proxy_request_buffering off;
proxy_buffering off;
client_max_body_size 0;
proxy_read_timeout 300s;
"""

LEAF_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = {san}
"""


def openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def make_ca(directory: Path, name: str) -> None:
    """``name.pem`` / ``name.key``: a self-signed CA certificate (P-256, valid two days)."""
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=storage-gateway {name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )


def make_leaf(directory: Path, name: str, ca: str, san: str) -> None:
    """``name.pem`` / ``name.key``: a server certificate for ``san``, signed by the CA ``ca``."""
    (directory / f"{name}.ext").write_text(LEAF_EXTENSIONS.format(san=san))
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory,
    )
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=directory,
    )


@dataclass
class Tls:
    url: str  # https://127.0.0.1:<port>: the certificate for 127.0.0.1, signed by the test CA
    wrong_name_url: str  # https://127.0.0.1:<port>: a certificate of the test CA for another host
    ca_bundle: Path  # the test CA (what the client is given)
    other_ca_bundle: Path  # an unrelated CA
    nginx_dir: Path

    def access_log(self) -> str:
        return (self.nginx_dir / "access.log").read_text(errors="replace")


def start_tls_nginx(binary: str, directory: Path, upstream: Server) -> tuple[subprocess.Popen | None, int, int]:
    port, wrong_name_port = free_port(), free_port()
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "nobody")
    (directory / "proxy.conf").write_text(PROXY_CONF.format(upstream_port=httpx.URL(upstream.url).port))
    conf = directory / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=directory, user=user, port=port, wrong_name_port=wrong_name_port))
    check = subprocess.run([binary, "-t", "-c", str(conf)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    with open(directory / "stderr.log", "wb") as stderr:  # nginx keeps its own copy of the descriptor
        process = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=stderr)
    trusted = ssl.create_default_context(cafile=str(directory / "ca.pem"))
    deadline = time.monotonic() + 20
    while process.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"https://127.0.0.1:{port}/readyz", verify=trusted, timeout=1).status_code == 200:
                return process, port, wrong_name_port
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    if process.poll() is None:
        process.kill()
    process.wait()
    return None, port, wrong_name_port


@pytest.fixture(scope="module")
def tls(backend: Backend, server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    binary = nginx_binary()
    directory = tmp_path_factory.mktemp(f"tls-{backend.name}")
    make_ca(directory, "ca")
    make_ca(directory, "other-ca")
    make_leaf(directory, "server", "ca", "IP:127.0.0.1, DNS:localhost")
    make_leaf(directory, "other-host", "ca", "DNS:other-host.example")
    for attempt in range(3):  # a free port can be taken by someone else before nginx binds it
        process, port, wrong_name_port = start_tls_nginx(binary, directory, server)
        if process is not None:
            break
    else:
        raise RuntimeError("nginx did not start:\n" + (directory / "stderr.log").read_text())
    yield Tls(
        f"https://127.0.0.1:{port}", f"https://127.0.0.1:{wrong_name_port}",
        directory / "ca.pem", directory / "other-ca.pem", directory,
    )
    process.terminate()
    process.wait(timeout=10)


async def test_every_capability_round_trips_over_https(tls: Tls, namespace: str) -> None:
    async with GatewayClient(tls.url, namespace=namespace, api_key=ADMIN_KEY, verify=tls.ca_bundle) as gw:
        assert (await gw.health())["ready"] is True

        await gw.kv.set("settings", "theme", {"dark": True})
        assert await gw.kv.get("settings", "theme") == {"dark": True}
        await gw.kv.delete("settings", "theme")
        assert await gw.kv.get("settings", "theme") is None

        for i in range(4):
            await gw.records.upsert_record("history", f"{i:05d}", {"i": i})
        assert await gw.records.trim_records_before("history", "00001") == 1
        assert [k for k, _ in await gw.records.get_ordered_records("history")] == ["00001", "00002", "00003"]

        data = os.urandom(3 * 1024 * 1024 + 17)  # several TLS records and client chunks each way

        async def pieces() -> AsyncIterator[bytes]:
            for i in range(0, len(data), 256 * 1024):
                yield data[i : i + 256 * 1024]

        info = await gw.files.upload("avatars", "u1/pic.bin", pieces())
        assert info.size == len(data)
        start, end = 1024 * 1024 - 5, 2 * 1024 * 1024 + 5
        async with gw.files.download("avatars", "u1/pic.bin", start=start, end=end) as download:
            ranged = b"".join([chunk async for chunk in download.aiter_bytes()])
        assert ranged == data[start : end + 1]
        assert await gw.files.get_file("avatars", "u1/pic.bin") == data
        await gw.files.delete_file("avatars", "u1/pic.bin")
        assert await gw.files.get_file("avatars", "u1/pic.bin") is None

        await gw.vectors.setup_collection("memories", 3)
        await gw.vectors.insert_vectors("memories", [
            {"id": "a", "embedding": [1.0, 0.0, 0.0], "text": "a"},
            {"id": "b", "embedding": [0.0, 1.0, 0.0], "text": "b"},
        ])
        found = await gw.vectors.search_vectors("memories", [0.9, 0.1, 0.0], 1)
        assert found and found[0].get("text") == "a"

        from langgraph.types import Command

        graph = interrupting_graph(gw.checkpointer())
        config = {"configurable": {"thread_id": "over-tls"}}
        first = await graph.ainvoke({"steps": []}, config)
        assert first["steps"] == ["plan"] and "__interrupt__" in first
        resumed = await graph.ainvoke(Command(resume="forty-two"), config)
        assert resumed == {"steps": ["plan", "ask", "done"], "answer": "forty-two"}
        history = [s async for s in graph.aget_state_history(config)]
        assert len(history) >= 3 and history[0].values == resumed

    # It was TLS all the way to nginx: every request of this namespace came in over TLS.
    mine = [line for line in tls.access_log().splitlines() if f"/v1/{namespace}/" in line]
    assert len(mine) > 10
    assert all(line.endswith(("TLSv1.3", "TLSv1.2")) for line in mine), mine[:3]


@pytest.mark.parametrize("verify_as", ["path", "str", "context"])
async def test_the_ca_bundle_can_be_given_as_a_path_a_string_or_a_context(
    tls: Tls, namespace: str, verify_as: str
) -> None:
    verify = {
        "path": tls.ca_bundle,
        "str": str(tls.ca_bundle),
        "context": ssl.create_default_context(cafile=str(tls.ca_bundle)),
    }[verify_as]
    async with GatewayClient(tls.url, namespace=namespace, api_key=ADMIN_KEY, verify=verify) as gw:
        await gw.kv.set("c", "k", 1)
        assert await gw.kv.get("c", "k") == 1


@pytest.mark.parametrize("case", ["system_cas", "another_ca", "another_host"])
async def test_a_certificate_the_client_cannot_trust_is_refused(tls: Tls, namespace: str, case: str) -> None:
    url, verify = {
        "system_cas": (tls.url, True),  # the default: the test CA is in no system store
        "another_ca": (tls.url, tls.other_ca_bundle),
        "another_host": (tls.wrong_name_url, tls.ca_bundle),  # the right CA, the wrong name
    }[case]
    before = tls.access_log().count(f"/v1/{namespace}/")
    async with GatewayClient(url, namespace=namespace, api_key=ADMIN_KEY, verify=verify, retries=1) as gw:
        with pytest.raises(TransportError) as refused:
            await gw.kv.set("c", "k", 1)
    cause = refused.value.__cause__
    assert isinstance(cause, httpx.ConnectError), cause
    assert "CERTIFICATE_VERIFY_FAILED" in str(cause), str(cause)
    wanted = "mismatch" if case == "another_host" else "unable to get local issuer certificate"
    assert wanted in str(cause), str(cause)
    # Nothing reached the gateway: the handshake failed before the request was sent.
    assert tls.access_log().count(f"/v1/{namespace}/") == before
    # The same key, with the right bundle, works (it was the certificate, nothing else).
    async with GatewayClient(tls.url, namespace=namespace, api_key=ADMIN_KEY, verify=tls.ca_bundle) as gw:
        await gw.kv.set("c", "k", 1)
        assert await gw.kv.get("c", "k") == 1


def test_transport_and_verify_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="plain http only"):
        GatewayClient("https://127.0.0.1:1", namespace="ns", transport="http11")
    with pytest.raises(ValueError, match="one of"):
        GatewayClient("http://127.0.0.1:1", namespace="ns", transport="h2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="verify="):
        GatewayClient("https://127.0.0.1:1", namespace="ns", http_client=httpx.AsyncClient(), verify=False)
    with pytest.raises(ValueError, match="verify="):
        GatewayClient("https://127.0.0.1:1", namespace="ns", transport=httpx.AsyncHTTPTransport(), verify=False)
    with pytest.raises(FileNotFoundError):  # a bundle that is not there fails now, not at the first call
        GatewayClient("https://127.0.0.1:1", namespace="ns", verify=tmp_path / "missing.pem")
