"""Two gateway replicas behind nginx at ``/storage/``, sharing one set of databases.

nginx is the Debian package, installed by the test when missing (the CI machine is fresh). The
client talks only to nginx (``http://127.0.0.1:<port>/storage``); every capability whose routes
exist works through it, 200 concurrent compare-and-swap increments spread over both replicas end
with the exact count, request ids pass through both ways, ``/docs`` works under the sub-path, and
``X-Forwarded-For`` is honoured from the proxy only.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from storage_gateway_client import GatewayClient
from tests.conftest import ADMIN_KEY, Backend, Server, free_port, start_server, stop_server

ROOT_PATH = "/storage"
INCREMENTS = 200
RACERS = 12  # increments contending at any moment (all 200 are started at once)

NGINX_CONF = """\
worker_processes 1;
daemon off;
user {user};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    # Keep the caller's X-Request-ID, or make one, and log it on both sides.
    map $http_x_request_id $gateway_request_id {{
        default $http_x_request_id;
        ""      $request_id;
    }}
    log_format gateway '$remote_addr "$request" $status rid=$gateway_request_id upstream=$upstream_addr';
    access_log {dir}/access.log gateway;
    upstream storage_gateway {{
        server 127.0.0.1:{port_a};
        server 127.0.0.1:{port_b};
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        location {root_path}/ {{
            proxy_pass http://storage_gateway/;   # trailing slash: strips {root_path}
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Request-ID $gateway_request_id;
            proxy_request_buffering off;          # stream uploads straight through
            proxy_buffering off;                  # and downloads
            client_max_body_size 0;               # the gateway enforces its own limits
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def nginx_binary() -> str:
    """nginx from the Debian package; installed here when missing (fresh CI machines)."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for attempt in range(3):
        update = subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True, timeout=300)
        install = subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "nginx"],
            env=env, capture_output=True, text=True, timeout=600,
        )
        if install.returncode == 0:
            break
        time.sleep(2 + attempt * 3)  # another apt may hold the lock
    else:
        raise RuntimeError(f"cannot install nginx:\n{update.stderr[-2000:]}\n{install.stderr[-2000:]}")
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    assert Path(found).exists(), "nginx installed but not found"
    return found


@dataclass
class Proxied:
    url: str  # what the client uses: http://127.0.0.1:<nginx port>/storage
    replicas: list[Server]
    nginx: subprocess.Popen
    nginx_dir: Path

    def nginx_access_log(self) -> str:
        return (self.nginx_dir / "access.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def proxied(backend: Backend, server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    """nginx at /storage/ in front of two replicas on the backend's (already migrated) databases."""
    binary = nginx_binary()
    tmp = tmp_path_factory.mktemp(f"proxy-{backend.name}")
    env = {"GATEWAY_ROOT_PATH": ROOT_PATH, "GATEWAY_FORWARDED_ALLOW_IPS": "127.0.0.1"}
    replicas = []
    try:
        with ThreadPoolExecutor(2) as pool:  # start both at once: half the wait
            starting = [pool.submit(start_server, backend, tmp / f"replica-{n}.log", **env) for n in "ab"]
            replicas.extend(f.result() for f in starting if f.exception() is None)  # stopped below
            for future in starting:
                if future.exception() is not None:
                    raise future.exception()
        nginx_dir = tmp / "nginx"
        nginx_dir.mkdir()
        for attempt in range(3):  # a free port can be taken by someone else before nginx binds it
            process, url = start_nginx(binary, nginx_dir, replicas)
            if process is not None:
                break
        else:
            raise RuntimeError("nginx did not start:\n" + (nginx_dir / "stderr.log").read_text())
        yield Proxied(url, replicas, process, nginx_dir)
        process.terminate()
        process.wait(timeout=10)
    finally:
        for replica in replicas:
            stop_server(replica)


def logged_by(replicas: list[Server], needle: str, timeout: float = 5.0) -> int:
    """How many replicas logged ``needle`` (access lines are written just after the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        count = sum(needle in replica.log() for replica in replicas)
        if count or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def eventually(check, timeout: float = 5.0) -> bool:  # noqa: ANN001
    """``check()`` turned true within ``timeout`` (for logs written just after an answer)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def start_nginx(binary: str, nginx_dir: Path, replicas: list[Server]) -> tuple[subprocess.Popen | None, str]:
    """nginx on a free port in front of the replicas; (None, url) if it could not bind."""
    port = free_port()
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "nobody")
    conf = NGINX_CONF.format(
        dir=nginx_dir, port=port, root_path=ROOT_PATH, user=user,
        port_a=httpx.URL(replicas[0].url).port, port_b=httpx.URL(replicas[1].url).port,
    )
    (nginx_dir / "nginx.conf").write_text(conf)
    check = subprocess.run([binary, "-t", "-c", str(nginx_dir / "nginx.conf")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    process = subprocess.Popen(
        [binary, "-c", str(nginx_dir / "nginx.conf")],
        stdout=subprocess.DEVNULL, stderr=open(nginx_dir / "stderr.log", "wb"),
    )
    url = f"http://127.0.0.1:{port}{ROOT_PATH}"
    deadline = time.monotonic() + 20
    while process.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    if process.poll() is None:
        process.kill()
    process.wait()
    return None, url


def routes(openapi: dict) -> set[str]:
    return set(openapi["paths"])


async def test_docs_and_openapi_work_under_the_sub_path(proxied: Proxied) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        docs = await http.get(f"{proxied.url}/docs")
        assert docs.status_code == 200
        assert f"{ROOT_PATH}/openapi.json" in docs.text  # the page loads the spec through the proxy
        spec = await http.get(f"{proxied.url}/openapi.json")
        assert spec.status_code == 200 and spec.json()["info"]["title"] == "storage-gateway"
        assert {"url": ROOT_PATH} in spec.json().get("servers", [])
        # Outside the sub-path nginx has nothing: the gateway is only reachable under /storage/.
        assert (await http.get(proxied.url.removesuffix(ROOT_PATH) + "/healthz")).status_code == 404


async def test_every_capability_works_through_the_proxy(
    proxied: Proxied, namespace: str, client_transport: str
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        paths = routes((await http.get(f"{proxied.url}/openapi.json")).json())
    done = []
    async with GatewayClient(proxied.url, namespace=namespace, api_key=ADMIN_KEY, transport=client_transport) as gw:
        assert "/v1/{namespace}/kv/{collection}/{key}" in paths
        await gw.kv.set("settings", "theme/dark mode", {"on": True})
        assert await gw.kv.get("settings", "theme/dark mode") == {"on": True}
        assert await gw.kv.get_all("settings") == [{"on": True}]
        await gw.kv.delete("settings", "theme/dark mode")
        assert await gw.kv.get("settings", "theme/dark mode") is None
        done.append("kv")
        if "/v1/{namespace}/records/{collection}/{key}" in paths:
            for i in range(5):
                await gw.records.upsert_record("history", f"{i:05d}", {"i": i})
            assert await gw.records.trim_records_before("history", "00002") == 2
            ordered = await gw.records.get_ordered_records("history")
            assert [k for k, _ in ordered] == ["00002", "00003", "00004"]
            done.append("records")
        if "/v1/{namespace}/files/{collection}/{file_id}" in paths:
            data = os.urandom(3 * 1024 * 1024 + 17)  # streamed through nginx both ways
            await gw.files.save_file("avatars", "u1/pic.png", data)
            assert await gw.files.get_file("avatars", "u1/pic.png") == data
            await gw.files.delete_file("avatars", "u1/pic.png")
            assert await gw.files.get_file("avatars", "u1/pic.png") is None
            done.append("files")
        if "/v1/{namespace}/vectors/{collection}" in paths:
            await gw.vectors.setup_collection("memories", 3)
            await gw.vectors.insert_vectors("memories", [
                {"id": "a", "embedding": [1.0, 0.0, 0.0], "text": "a"},
                {"id": "b", "embedding": [0.0, 1.0, 0.0], "text": "b"},
            ])
            found = await gw.vectors.search_vectors("memories", [0.9, 0.1, 0.0], 1)
            assert found and found[0].get("text") == "a"
            done.append("vectors")
    assert "kv" in done


async def test_compare_and_swap_increments_across_replicas_end_exact(
    proxied: Proxied, namespace: str, auth_headers: dict[str, str]
) -> None:
    url = f"{proxied.url}/v1/{namespace}/kv/counters/hits"
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    conflicts = 0
    statuses: list[int] = []  # of every conditional PUT, for the failure message
    async with httpx.AsyncClient(timeout=60, headers=headers, limits=limits) as http:
        r = await http.put(url, json=0, headers={"If-None-Match": "*"})
        assert r.status_code in (200, 201, 204), r.text

        racing = asyncio.Semaphore(RACERS)

        async def increment() -> None:
            async with racing:
                await try_until_it_counts()

        async def try_until_it_counts() -> None:
            nonlocal conflicts
            for attempt in range(500):
                current = await http.get(url)
                assert current.status_code == 200, current.text
                r = await http.put(url, json=current.json() + 1, headers={"If-Match": current.headers["etag"]})
                statuses.append(r.status_code)
                if r.status_code in (200, 201, 204):
                    return
                assert r.status_code in (412, 503), r.text  # lost the race (or busy): try again
                conflicts += 1
                await asyncio.sleep(random.uniform(0, 0.002 * min(attempt + 1, 25)))
            raise AssertionError("an increment never got through")

        await asyncio.gather(*(increment() for _ in range(INCREMENTS)))
        final = await http.get(url)
    # More than INCREMENTS: a PUT answered 412 or 503 had been applied (or nginx sent one twice:
    # its access line then names two upstreams).
    retried = [line for line in proxied.nginx_access_log().splitlines() if "," in line.partition("upstream=")[2]]
    assert final.json() == INCREMENTS, {"statuses": Counter(statuses), "sent to two upstreams": retried}
    assert conflicts > 0  # the increments really raced
    # Both replicas took part in the conditional writes.
    for replica in proxied.replicas:
        puts = [
            line for line in replica.log().splitlines()
            if '"logger": "app.access"' in line and f'"namespace": "{namespace}"' in line and '"method": "PUT"' in line
        ]
        assert puts, f"replica {replica.url} served no increment"


async def test_request_ids_pass_through_the_proxy_both_ways(proxied: Proxied, namespace: str) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(timeout=30, headers=headers) as http:
        # Sent by the client: reaches a replica (its log line) and comes back unchanged.
        rid = f"proxy-{uuid.uuid4().hex}"
        r = await http.put(f"{proxied.url}/v1/{namespace}/kv/c/k", json=1, headers={"X-Request-ID": rid})
        assert r.status_code in (200, 201, 204) and r.headers["x-request-id"] == rid
        assert logged_by(proxied.replicas, rid) == 1
        # Problems carry it too, in the header and the body.
        r = await http.get(f"{proxied.url}/v1/{namespace}/kv/c/missing", headers={"X-Request-ID": rid + "-404"})
        assert r.status_code == 404 and r.headers["x-request-id"] == rid + "-404"
        assert r.json()["request_id"] == rid + "-404"
        # Not sent: nginx makes one, and the gateway, nginx's log and the answer all agree on it.
        r = await http.get(f"{proxied.url}/v1/{namespace}/kv/c/k")
        made = r.headers["x-request-id"]
        assert len(made) == 32
        assert eventually(lambda: f"rid={made}" in proxied.nginx_access_log())  # nginx logs after answering
        assert logged_by(proxied.replicas, made) == 1


async def test_forwarded_for_is_trusted_from_the_proxy_only(proxied: Proxied, namespace: str) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}", "X-Forwarded-For": "203.0.113.7"}
    async with httpx.AsyncClient(timeout=30, headers=headers) as http:
        via_proxy = f"via-proxy-{uuid.uuid4().hex}"
        await http.get(f"{proxied.url}/healthz", headers={"X-Request-ID": via_proxy})
    # A client that is not a configured proxy (another loopback address) cannot claim an address.
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(timeout=30, headers=headers, transport=transport) as http:
        direct = f"direct-{uuid.uuid4().hex}"
        await http.get(f"{proxied.replicas[0].url}/healthz", headers={"X-Request-ID": direct})

    def logged_client(rid: str) -> str | None:
        for replica in proxied.replicas:
            for line in replica.log().splitlines():
                if rid in line and '"logger": "app.access"' in line:
                    return json.loads(line)["client"]
        return None

    def client_of(rid: str) -> str:
        # The access line is written after the answer is sent: a loaded machine may show the
        # answer first (a fresh-clone make test did, once).
        assert eventually(lambda: logged_client(rid) is not None), f"no access log line for {rid}"
        return logged_client(rid) or ""

    assert client_of(via_proxy) == "203.0.113.7"
    assert client_of(direct) == "127.0.0.2"


async def test_idempotency_keys_hold_across_replicas(proxied: Proxied, namespace: str) -> None:
    """The same insert retried on both replicas at once is applied once, and both get its answer."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    a, b = (replica.url for replica in proxied.replicas)
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:
        r = await http.put(f"{a}/v1/{namespace}/vectors/idem", json={"vector_size": 2, "distance": "l2"})
        assert r.is_success, r.text
        body = {"points": [{"vector": [1.0, 2.0], "payload": {"n": 1}}]}  # no id: each insert would mint one
        for round_ in range(5):
            key = f"retry-{round_}"
            answers = await asyncio.gather(*(
                http.post(f"{url}/v1/{namespace}/vectors/idem/points", json=body, headers={"Idempotency-Key": key})
                for url in (a, b, a, b)
            ))
            ok = [r for r in answers if r.is_success]
            assert ok, [r.text for r in answers]
            assert all(r.status_code in (200, 201, 409) for r in answers), [r.text for r in answers]
            assert len({tuple(r.json()["ids"]) for r in ok}) == 1, "replicas answered the same key differently"
        listed = (await http.post(f"{b}/v1/{namespace}/vectors/idem/points/list", json={"limit": 100})).json()
    assert len(listed["items"]) == 5  # one point per idempotency key, not one per attempt


async def test_trims_race_appends_across_replicas_without_losing_newer_records(
    proxied: Proxied, namespace: str
) -> None:
    """Writers append on one replica while the other trims below a moving cutoff."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    a, b = (replica.url for replica in proxied.replicas)
    written: list[int] = []
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:
        async def append(start: int) -> None:
            for i in range(start, 400, 4):
                r = await http.put(f"{a}/v1/{namespace}/records/log/{i:06d}", json={"i": i})
                assert r.status_code == 204, r.text
                written.append(i)

        async def trim() -> None:
            for cutoff in range(0, 300, 20):
                r = await http.post(f"{b}/v1/{namespace}/records/log/trim", json={"before": f"{cutoff:06d}"})
                assert r.status_code == 200, r.text
                await asyncio.sleep(0.005)

        await asyncio.gather(*(append(s) for s in range(4)), trim())
        final_cutoff = 280
        keys, cursor = [], None
        while True:
            params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            page = (await http.get(f"{a}/v1/{namespace}/records/log", params=params)).json()
            keys += [int(item["key"]) for item in page["items"]]
            cursor = page["next_cursor"]
            if not cursor:
                break
    assert sorted(written) == list(range(400))
    survivors = set(keys)
    assert {i for i in range(400) if i >= final_cutoff} <= survivors, "a record at or above the cutoff was lost"
