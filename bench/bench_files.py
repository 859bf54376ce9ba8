"""Files throughput and memory: the gateway on SQLite and PostgreSQL next to nginx.

For 1 MiB, 64 MiB and 1 GiB files (``--quick``: no 1 GiB), on each backend: upload MB/s
(the Python client streaming a path), download MB/s (the same httpx streaming loop for the gateway
and for nginx serving the same file from local disk, so client costs cancel out in the ratio),
and the gateway's peak RSS above its idle RSS while the 1 GiB file goes up and comes down
(``/proc/<pid>/status`` VmRSS sampled every 10 ms).

Targets: peak RSS within 64 MiB of idle for the 1 GiB transfers; download >= 0.3x nginx on
PostgreSQL. Usage: ``.venv/bin/python bench/bench_files.py [--quick] [--backends sqlite,postgres]``.
"""

from __future__ import annotations

import argparse
import asyncio
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

BIN = Path(sys.executable).parent
MiB = 1024 * 1024
SIZES = {"1 MiB": MiB, "64 MiB": 64 * MiB, "1 GiB": 1024 * MiB}
REPEATS = {"1 MiB": 20, "64 MiB": 3, "1 GiB": 1}
NGINX = "/usr/sbin/nginx"


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
        env.update(GATEWAY_AUTH__MODE="disabled", GATEWAY_LOG_LEVEL="warning")
        subprocess.run([str(BIN / "storage-gateway"), "migrate"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        self.process = subprocess.Popen([str(BIN / "storage-gateway"), "serve", "--port", str(self.port)],
                                        env=env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
        wait_http(f"{self.url}/readyz", ok=(200,), process=self.process)

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


async def bench_backend(gateway: Gateway, nginx: Nginx, files: dict[str, Path], settle: float) -> list[Row]:
    rows = []
    assert gateway.process is not None
    pid = gateway.process.pid
    limits = httpx.Timeout(300.0)
    async with GatewayClient(gateway.url, namespace="bench", timeout=limits) as gw, \
            httpx.AsyncClient(timeout=limits) as raw:
        # Warm up: one small round trip so that pools and imports are in place before "idle".
        await gw.files.save_file("warm", "w", b"x" * 1000)
        await download(raw, f"{gateway.url}/v1/bench/files/warm/w")
        for label, path in files.items():
            size = path.stat().st_size
            reps = REPEATS[label]
            big = label == "1 GiB"
            if big:
                await asyncio.sleep(settle)
            idle = rss_kib(pid)
            up_times = []
            with RssSampler(pid) as up_rss:
                for _ in range(reps):
                    t = time.perf_counter()
                    info = await gw.files.upload("bench", label, path)
                    up_times.append(time.perf_counter() - t)
                    assert info.size == size
            if big:
                await asyncio.sleep(settle)
            idle_down = rss_kib(pid)
            down_times, nginx_times = [], []
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
            rows.append(
                Row(
                    gateway.name, label,
                    up=mbps(size, sorted(up_times)[len(up_times) // 2]),
                    down=mbps(size, sorted(down_times)[len(down_times) // 2]),
                    nginx=mbps(size, sorted(nginx_times)[len(nginx_times) // 2]),
                    rss_up=(up_rss.peak - idle) / 1024 if big else None,
                    rss_down=(down_rss.peak - idle_down) / 1024 if big else None,
                )
            )
            print(f"  {gateway.name} {label}: done", flush=True)
        await gw.files.delete_file("bench", "1 GiB")
    return rows


def print_table(rows: list[Row]) -> None:
    header = (f"{'backend':<9} {'size':>7} {'upload MB/s':>12} {'download MB/s':>14} {'nginx MB/s':>11} "
              f"{'down/nginx':>11} {'RSS up +MiB':>12} {'RSS down +MiB':>14}")
    print(header)
    print("-" * len(header))
    for r in rows:
        rss_up = f"{r.rss_up:.1f}" if r.rss_up is not None else "-"
        rss_down = f"{r.rss_down:.1f}" if r.rss_down is not None else "-"
        print(f"{r.backend:<9} {r.size:>7} {r.up:>12.1f} {r.down:>14.1f} {r.nginx:>11.1f} "
              f"{r.down / r.nginx:>10.2f}x {rss_up:>12} {rss_down:>14}")


# --- backends ------------------------------------------------------------------------------


def make_file(path: Path, size: int) -> None:
    block = os.urandom(MiB)
    with open(path, "wb") as f:
        for i in range(size // MiB):
            f.write(block[i % 97 :] + block[: i % 97])  # distinct blocks, cheap to make
        f.write(os.urandom(size % MiB))
    path.chmod(0o644)


def postgres_env(work: Path) -> tuple[dict[str, str], object]:
    import asyncpg
    import pgserver
    from sqlalchemy.engine import make_url

    pgdata = work / "pg"
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    base = server.get_uri()
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
    env["GATEWAY_DATA_DIR"] = str(work / "pg-data")
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
    rows: list[Row] = []
    try:
        files = {}
        for label, size in SIZES.items():
            if args.quick and label == "1 GiB":
                continue
            files[label] = served / f"{label.replace(' ', '')}.bin"
            make_file(files[label], size)
        nginx.start()
        for name in backends:
            if name == "sqlite":
                env = {f"GATEWAY_DATABASES__{db.upper()}__URL": f"sqlite+aiosqlite:///{work}/sqlite/{db}.db"
                       for db in ("metadata", "vectors", "checkpoints")}
                env["GATEWAY_DATA_DIR"] = str(work / "sqlite")
            elif name == "postgres":
                env, pg_server = postgres_env(work)
            else:
                raise SystemExit(f"unknown backend {name!r}")
            gateway = Gateway(name, env, work / f"gateway-{name}.log")
            print(f"benchmarking {name}...", flush=True)
            gateway.start()
            try:
                rows += asyncio.run(bench_backend(gateway, nginx, files, args.settle))
            finally:
                gateway.stop()
        print()
        print_table(rows)
    finally:
        nginx.stop()
        if pg_server is not None:
            pg_server.cleanup()  # type: ignore[attr-defined]
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
