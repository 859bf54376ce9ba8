"""The relay ceiling, bare: direct S3 downloads next to a copy relay and a splice relay.

Measured before ``app.core.http.splice`` was built, to see whether splicing pays on this machine:
a SeaweedFS (``tests.s3server``), one object of 64 MiB and one of 1 GiB, each downloaded by the
same aiohttp client (1) straight from SeaweedFS on a presigned URL, (2) through ``relay_app`` of
``bench_files`` (a bare ASGI app under uvicorn copying aiohttp's pieces to the client, as the
gateway's copied path does) and (3) through a bare splice relay (``serve``: raw sockets, the S3
body moved to the client with ``os.splice`` through a pipe). Interleaved; medians of 9 (64 MiB)
and 3 (1 GiB) transfers; the ratio to direct in parentheses.

``gateway`` mode: the fast path's verdict, on the gateway itself. Two gateways on the same
SQLite files and bucket (bytes in SeaweedFS, a key scoped to the bench namespace, one worker
each), ``files.s3.splice_downloads`` on and off, serve the same 64 MiB and 1 GiB files; the same
aiohttp client downloads them in turn (medians of 7 and 3), with the gateway's CPU per download
read from ``/proc``.

Usage: ``.venv/bin/python bench/bench_splice_relay.py [gateway]``.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_files import free_port, wait_http  # noqa: E402
from tests.s3server import SeaweedS3  # noqa: E402

MiB = 1 << 20
BUCKET = "bench-splice"
SIZES = {"64 MiB": 64 * MiB, "1 GiB": 1024 * MiB}
PIPE = MiB


async def _wait(loop: asyncio.AbstractEventLoop, fd: int, write: bool) -> None:
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def _relay_one(loop: asyncio.AbstractEventLoop, client: socket.socket, url: str, size: int) -> None:
    parts = urlsplit(url)
    s3 = socket.socket()
    s3.setblocking(False)
    await loop.sock_connect(s3, (parts.hostname, parts.port))
    await loop.sock_sendall(s3, (f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                                 f"Range: bytes=0-{size - 1}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += await loop.sock_recv(s3, 4096)
    body = head.partition(b"\r\n\r\n")[2]
    await loop.sock_sendall(client, f"HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n".encode() + body)
    left, held = size - len(body), 0
    out, into = os.pipe()
    fcntl.fcntl(into, 1031, PIPE)  # F_SETPIPE_SZ
    flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
    try:
        while left or held:
            if left and held < PIPE:
                try:
                    moved = os.splice(s3.fileno(), into, min(left, PIPE - held), flags=flags)
                    if moved == 0:
                        raise RuntimeError("S3 ended early")
                    left, held = left - moved, held + moved
                except BlockingIOError:
                    if not held:
                        await _wait(loop, s3.fileno(), write=False)
                        continue
            if held:
                try:
                    held -= os.splice(out, client.fileno(), held, flags=flags)
                except BlockingIOError:
                    await _wait(loop, client.fileno(), write=True)
    finally:
        os.close(out)
        os.close(into)
        s3.close()


async def _serve(port: int, url: str, size: int) -> None:
    loop = asyncio.get_running_loop()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(64)
    server.setblocking(False)

    async def handle(client: socket.socket) -> None:
        try:
            while True:
                request = b""
                while b"\r\n\r\n" not in request:
                    piece = await loop.sock_recv(client, 65536)
                    if not piece:
                        return
                    request += piece
                await _relay_one(loop, client, url, size)
        finally:
            client.close()

    tasks = set()
    while True:
        client, _ = await loop.sock_accept(server)
        client.setblocking(False)
        task = asyncio.ensure_future(handle(client))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def main() -> None:
    import aiohttp
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    s3 = SeaweedS3(Path(tempfile.mkdtemp()) / "s3")
    s3.start()
    processes: list[subprocess.Popen] = []
    try:
        env = s3.env()
        config = AioConfig(s3={"addressing_style": "path"}, request_checksum_calculation="when_required",
                           response_checksum_validation="when_required")
        async with get_session().create_client(
            "s3", endpoint_url=s3.endpoint, region_name="us-east-1", config=config,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        ) as client, aiohttp.ClientSession() as http:
            await client.create_bucket(Bucket=BUCKET)
            urls: dict[str, dict[str, str]] = {}
            for label, size in SIZES.items():
                part = os.urandom(8 * MiB)
                upload = (await client.create_multipart_upload(Bucket=BUCKET, Key=label))["UploadId"]
                parts = []
                for number in range(1, size // (8 * MiB) + 1):
                    etag = (await client.upload_part(Bucket=BUCKET, Key=label, UploadId=upload,
                                                     PartNumber=number, Body=part))["ETag"]
                    parts.append({"ETag": etag, "PartNumber": number})
                await client.complete_multipart_upload(Bucket=BUCKET, Key=label, UploadId=upload,
                                                       MultipartUpload={"Parts": parts})  # type: ignore[typeddict-item]
                url = await client.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": label},
                                                          ExpiresIn=3600)
                copy_port, splice_port = free_port(), free_port()
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "uvicorn", "bench_files:relay_app", "--port", str(copy_port), "--loop",
                     "uvloop", "--http", "httptools", "--log-level", "warning", "--no-access-log"],
                    env=dict(os.environ, RELAY_URL=url, RELAY_SIZE=str(size), PYTHONPATH=str(ROOT / "bench"))))
                wait_http(f"http://127.0.0.1:{copy_port}/ready", ok=(200,), process=processes[-1])
                processes.append(subprocess.Popen([sys.executable, __file__, "serve", str(splice_port), url, str(size)]))
                time.sleep(1.5)
                urls[label] = {"direct": url, "copy relay": f"http://127.0.0.1:{copy_port}/",
                               "splice relay": f"http://127.0.0.1:{splice_port}/"}

            async def get(url: str, size: int) -> float:
                started, n = time.perf_counter(), 0
                async with http.get(url) as response:
                    async for piece in response.content.iter_chunked(MiB):
                        n += len(piece)
                assert n == size, (n, size)
                return time.perf_counter() - started

            for label, size in SIZES.items():
                times: dict[str, list[float]] = {name: [] for name in urls[label]}
                for _ in range(9 if size < 1024 * MiB else 3):
                    for name, url in urls[label].items():
                        times[name].append(await get(url, size))
                median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
                cells = [f"{name} {size / MiB / t:.0f} MB/s ({median['direct'] / t:.2f})" for name, t in median.items()]
                print(f"{label}: " + ", ".join(cells), flush=True)
    finally:
        for process in processes:
            process.terminate()
        s3.stop()


def gateway_main() -> None:
    """Splice on against splice off, on the gateway (see the module)."""
    from tests.conftest import ADMIN_KEY, Backend, backend_env, run_cli, start_server, stop_server

    work = Path(tempfile.mkdtemp(prefix="bench-splice-"))
    s3 = SeaweedS3(work / "s3")
    s3.start()
    s3.create_bucket(BUCKET)
    urls = {db: f"sqlite+aiosqlite:///{work}/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
    env = {**s3.env(), "GATEWAY_FILES__BACKEND": "s3", "GATEWAY_FILES__S3__BUCKET": BUCKET,
           "GATEWAY_FILES__S3__ENDPOINT_URL": s3.endpoint, "GATEWAY_AUTH__ADMIN_KEY": ADMIN_KEY, "GATEWAY_LOG_LEVEL": "warning"}
    backend = Backend("sqlite", backend_env(urls, work / "data"), urls)
    servers = {}
    try:
        assert run_cli(backend, "migrate", **env).returncode == 0
        for name, on in (("splice", "true"), ("copy", "false")):
            servers[name] = start_server(backend, work / f"{name}.log", "--workers", "1",
                                         GATEWAY_FILES__S3__SPLICE_DOWNLOADS=on, **env)
        asyncio.run(_compare({name: (server.url, server.process.pid) for name, server in servers.items()}, ADMIN_KEY))
    finally:
        for server in servers.values():
            stop_server(server)
        s3.stop()


async def _compare(servers: dict[str, tuple[str, int]], admin_key: str) -> None:
    import aiohttp

    from bench.bench_peers import tree_cpu_seconds

    first = servers["splice"][0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        async with http.post(f"{first}/v1/admin/keys", headers={"Authorization": f"Bearer {admin_key}"},
                             json={"namespace": "bench", "scopes": ["files:write"]}) as r:
            key = {"Authorization": f"Bearer {(await r.json())['key']}"}
        for label, size in SIZES.items():
            data = os.urandom(8 * MiB) * (size // (8 * MiB))
            async with http.put(f"{first}/v1/bench/files/big/{label.replace(' ', '')}", data=data, headers=key) as r:
                assert r.status in (200, 201), await r.text()
            del data

        async def get(url: str, size: int, pid: int) -> tuple[float, float]:
            cpu, started, n = tree_cpu_seconds(pid), time.perf_counter(), 0
            async with http.get(url, headers=key) as response:
                async for piece in response.content.iter_chunked(MiB):
                    n += len(piece)
            assert n == size, (n, size)
            return time.perf_counter() - started, tree_cpu_seconds(pid) - cpu

        print(f"splice on vs off, one gateway worker each, medians; {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC")
        for label, size in SIZES.items():
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
            for _ in range(7 if size < 1024 * MiB else 3):
                for name, (url, pid) in servers.items():
                    runs[name].append(await get(f"{url}/v1/bench/files/big/{label.replace(' ', '')}", size, pid))
            median = {name: (sorted(t for t, _ in timed)[len(timed) // 2], sorted(c for _, c in timed)[len(timed) // 2])
                      for name, timed in runs.items()}
            cells = [f"{name} {size / MiB / t:.0f} MB/s, gateway CPU {c:.2f} s" for name, (t, c) in median.items()]
            print(f"{label}: " + "; ".join(cells) + f"; splice/copy x{median['copy'][0] / median['splice'][0]:.2f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["gateway"]:
        gateway_main()
    elif sys.argv[1:2] == ["serve"]:
        import uvloop

        uvloop.run(_serve(int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
    else:
        asyncio.run(main())
