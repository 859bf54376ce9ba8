"""The gateway's own CPU per request, in-process: the ASGI app called directly, no HTTP server.

At concurrency 16 with one worker the gateway is CPU-bound (one core at 99%), so its
throughput there is about one over this number; it is also steady enough to compare changes
on a shared, noisy machine. Each row is the best of three rounds of N sequential requests, on
a throwaway pgserver PostgreSQL, with a namespace-scoped key (as each plugin runs); the row
marked ``(admin)`` repeats kv get with the admin key. ``--profile ROW`` prints a cProfile of that
row's requests. ``--s3`` keeps file bytes in a local SeaweedFS (``tests/s3server.py``): the file
rows then measure the gateway's side of an S3 upload and download (SeaweedFS's and PostgreSQL's
CPU are other processes, not counted). ``--fast-paths`` measures every row once per
``fast_paths`` configuration (``bench/bench_fast_paths.py``'s: every piece on, each off, all
off), app after app in one run, and prints one column per configuration.

    .venv/bin/python bench/bench_request_cpu.py [-n N] [--files] [--s3] [--profile "kv get"] [--fast-paths]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import json
import os
import pstats
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import ADMIN_KEY, Backend, backend_env, create_postgres_databases, gateway_env, run_cli  # noqa: E402

ROWS: dict[str, tuple[str, str, bytes, bytes]] = {
    "healthz": ("GET", "/healthz", b"", b""),
    "kv get": ("GET", "/v1/bench/kv/c/k", b"", b""),
    "kv get (admin)": ("GET", "/v1/bench/kv/c/k", b"", b""),
    "kv set": ("PUT", "/v1/bench/kv/c/k", b'{"a": 2}', b""),
    "record upsert": ("PUT", "/v1/bench/records/h/0001", b'{"a": 2}', b""),
    "ordered list (50)": ("GET", "/v1/bench/records/h", b"", b"order=desc&limit=50"),
    "record get": ("GET", "/v1/bench/records/h/0001", b"", b""),
    "vector search": ("POST", "/v1/bench/vectors/v/search", b'{"vector": [0.1, 0.2, 0.3, 0.4], "limit": 5}', b""),
    # As users search: a 384-d text embedding, top 10, over 3,000 points with their index built.
    "vector search 384-d": ("POST", "/v1/bench/vectors/w/search", json.dumps(
        {"vector": [round(random.Random(7).gauss(0, 1), 6) for _ in range(384)], "limit": 10}).encode(), b""),
}
CHECKPOINT = json.dumps({
    "thread_id": "t", "checkpoint_id": "1ef00000000000000000000000000000001", "channel_versions": {"messages": "0001"},
    "checkpoint": {"type": "msgpack", "data": base64.b64encode(b"\x80" * 200).decode()}, "metadata": {"source": "loop", "step": 1},
    "blobs": [{"channel": "messages", "version": "0001", "type": "msgpack", "data": base64.b64encode(b"m" * 300).decode()}],
}).encode()
STORE_GET = b'{"ops": [{"op": "get", "namespace": ["u", "m"], "key": "k", "refresh_ttl": true}], "omit_expired": false}'
STORE_GETS = json.dumps({"ops": [
    {"op": "get", "namespace": ["u", "m"], "key": f"k{i}", "refresh_ttl": True} for i in range(16)], "omit_expired": False}).encode()
ROWS |= {
    "checkpoint put": ("POST", "/v1/bench/checkpoints/put", CHECKPOINT, b""),
    "checkpoint get": ("GET", "/v1/bench/checkpoints/tuple", b"", b"thread_id=t"),
    "checkpoint search": ("POST", "/v1/bench/checkpoints/search", b'{"thread_id": "t", "limit": 10}', b""),
    # What GatewayStore sends for one aget (and a tick of 16), the same gets in a read batch, and
    # one aput of an item with one 384-d vector.
    "store get": ("POST", "/v1/bench/store/get", STORE_GET, b""),
    "store get x16": ("POST", "/v1/bench/store/get", STORE_GETS, b""),
    "store get in /read": ("POST", "/v1/bench/store/read", STORE_GET, b""),
    "store get x16 in /read": ("POST", "/v1/bench/store/read", STORE_GETS, b""),
    "store put": ("POST", "/v1/bench/store/batch", json.dumps({"ops": [{
        "op": "put", "namespace": ["u", "m"], "key": "k", "value": {"text": "memory 1", "group": 1, "kind": "note"},
        "vectors": [{"field": "text", "vector": [round(random.Random(8).gauss(0, 1), 6) for _ in range(384)]}]}],
        "omit_expired": False}).encode(), b""),
}
FILE_ROWS: dict[str, tuple[str, str, bytes, bytes]] = {  # with --files
    "file upload (1 MiB)": ("PUT", "/v1/bench/files/f/up", bytes(range(256)) * 4096, b""),
    "file download (1 MiB)": ("GET", "/v1/bench/files/f/down", b"", b""),
}
KEY = {"key": ADMIN_KEY}


async def call(
    app: Any, method: str, path: str, body: bytes = b"", query: bytes = b"", key: str | None = None
) -> tuple[int, bytes]:
    """One request through the ASGI app, as uvicorn would hand it over."""
    headers = [(b"host", b"bench"), (b"authorization", f"Bearer {key or KEY['key']}".encode()),
               (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()
        return {}

    status = 0
    pieces: list[bytes] = []  # joined once: adding each piece to the last would copy a 1 MiB body ~4 times

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            pieces.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(pieces)


async def setup_384(app: Any) -> None:
    """3,000 random 384-d points in collection ``w``, searched once its index is ready (PostgreSQL
    builds HNSW in the background; SQLite's sqlite-vec search is exact: nothing to wait for)."""
    rng = random.Random(1)
    await call(app, "PUT", "/v1/bench/vectors/w", b'{"vector_size": 384, "distance": "cosine"}')
    for batch in range(3):
        points = [{"id": f"p{batch}-{i}", "vector": [round(rng.gauss(0, 1), 6) for _ in range(384)],
                   "payload": {"i": i, "kind": "note"}} for i in range(1000)]
        status, answer = await call(app, "POST", "/v1/bench/vectors/w/points", json.dumps({"points": points}).encode())
        if status >= 300:
            raise SystemExit(f"384-d points: {status} {answer[:200]!r}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        _, answer = await call(app, "GET", "/v1/bench/vectors/w")
        index = json.loads(answer)["index"]
        if index["kind"] == "exact" or index["state"] == "ready":
            return
        await asyncio.sleep(0.5)
    raise SystemExit("the 384-d collection's index was not ready within 120 s")


async def measure(n: int, profile: str | None, rows: dict[str, tuple[str, str, bytes, bytes]]) -> dict[str, float]:
    from app.core.config import Settings
    from app.main import create_app

    app = create_app(Settings())  # read from the environment now (a --fast-paths run changes it)
    results = {}
    async with app.router.lifespan_context(app):
        _, made = await call(app, "POST", "/v1/admin/keys",
                             b'{"namespace": "bench", "scopes": ["kv:write", "records:write", "vectors:write", "files:write", '
                             b'"checkpoints:write", "store:write"]}')
        scoped = json.loads(made)["key"]
        await call(app, "PUT", "/v1/bench/kv/c/k", b'{"a": 1}')
        await call(app, "PUT", "/v1/bench/files/f/down", bytes(range(256)) * 4096)
        for i in range(60):
            await call(app, "PUT", f"/v1/bench/records/h/{i:04d}", b'{"a": 1}')
        await call(app, "POST", "/v1/bench/checkpoints/put", CHECKPOINT)
        await call(app, "POST", "/v1/bench/store/batch", ROWS["store put"][2])
        await call(app, "POST", "/v1/bench/store/batch", json.dumps({"ops": [
            {"op": "put", "namespace": ["u", "m"], "key": f"k{i}", "value": {"text": f"memory {i}", "group": i}} for i in range(16)]}).encode())
        await call(app, "PUT", "/v1/bench/vectors/v", b'{"vector_size": 4, "distance": "cosine"}')
        points = [{"id": f"p{i}", "vector": [i % 7, i % 5, i % 3, 1], "payload": {"i": i}} for i in range(200)]
        await call(app, "POST", "/v1/bench/vectors/v/points", json.dumps({"points": points}).encode())
        if "vector search 384-d" in rows:  # 3,000 points and an index build: only when measured
            await setup_384(app)
        for name, (method, path, body, query) in rows.items():
            key = ADMIN_KEY if "(admin)" in name else scoped
            for _ in range(300):  # warm up
                status, answer = await call(app, method, path, body, query, key)
            if status >= 300:
                raise SystemExit(f"{name}: {status} {answer[:200]!r}")
            best = float("inf")
            for _ in range(3):
                started = time.process_time()
                for _ in range(n):
                    await call(app, method, path, body, query, key)
                best = min(best, (time.process_time() - started) / n * 1e6)
            results[name] = best
        if profile:
            method, path, body, query = rows[profile]
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            for _ in range(n):
                await call(app, method, path, body, query, ADMIN_KEY if "(admin)" in profile else scoped)
            profiler.disable()
            if os.environ.get("BENCH_PROFILE_DUMP"):
                profiler.dump_stats(os.environ["BENCH_PROFILE_DUMP"])
            pstats.Stats(profiler).sort_stats(os.environ.get("BENCH_PROFILE_SORT", "cumulative")).print_stats(50)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3000, help="requests per round (default 3000)")
    parser.add_argument("--profile", choices=sorted(ROWS | FILE_ROWS), help="print a cProfile of this row")
    parser.add_argument("--files", action="store_true", help="add 1 MiB file upload and download rows")
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres", help="default postgres")
    parser.add_argument("--only", help="only the rows whose name contains this")
    parser.add_argument("--skip", help="leave out the rows whose name contains this")
    parser.add_argument("--s3", action="store_true", help="file bytes in a local SeaweedFS (implies --files)")
    parser.add_argument("--fast-paths", action="store_true", help="one column per fast_paths configuration")
    args = parser.parse_args()
    from bench.bench_fast_paths import CONFIGS

    configs = {name: env for name, env in CONFIGS.items() if args.fast_paths or name == "fast"}
    if args.backend == "postgres":
        configs.pop("no inline_sqlite", None)

    work = Path(tempfile.mkdtemp(prefix="bench-cpu-"))
    pg = None
    seaweed = None
    try:
        if args.backend == "postgres":
            import pgserver

            pg = pgserver.get_server(work / "pg", cleanup_mode="stop")
            urls = create_postgres_databases(pg.get_uri(), f"cpu_{uuid.uuid4().hex[:8]}")
        else:
            urls = {db: f"sqlite+aiosqlite:///{work}/sqlite/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
        env = backend_env(urls, work / "data")
        if args.s3:
            from tests.s3server import SeaweedS3

            seaweed = SeaweedS3(work / "seaweed")
            seaweed.start()
            seaweed.create_bucket("bench-cpu")
            env.update(seaweed.env(), GATEWAY_FILES__BACKEND="s3", GATEWAY_FILES__S3__BUCKET="bench-cpu",
                       GATEWAY_FILES__S3__ENDPOINT_URL=seaweed.endpoint)
        backend = Backend(args.backend, env, urls, files="s3" if args.s3 else "database")
        if run_cli(backend, "migrate", GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY).returncode != 0:
            raise SystemExit("migration failed")
        os.environ.update(gateway_env(backend, GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY, GATEWAY_LOG_LEVEL="warning"))
        rows = ROWS | FILE_ROWS if args.files or args.s3 or (args.profile in FILE_ROWS) else ROWS
        if args.only:
            rows = {name: row for name, row in rows.items() if args.only in name or name == args.profile}
        if args.skip:
            rows = {name: row for name, row in rows.items() if args.skip not in name}
        columns = {}
        for name, config in configs.items():
            for piece in ("PLANS", "ONE_STATEMENT", "INLINE_SQLITE"):
                os.environ.pop(f"GATEWAY_FAST_PATHS__{piece}", None)
            os.environ.update(config)
            columns[name] = asyncio.run(measure(args.n, args.profile, rows))
            if len(configs) > 1:
                print(f"{name}: " + ", ".join(f"{row} {us:.0f}" for row, us in columns[name].items()), flush=True)
    finally:
        if seaweed is not None:
            seaweed.stop()
        if pg is not None:
            pg.cleanup()
        shutil.rmtree(work, ignore_errors=True)  # a PostgreSQL data directory: ~1-7 GB a run
    where = "PostgreSQL" if args.backend == "postgres" else "SQLite (the embedded default)"
    if args.s3:
        where += ", file bytes in SeaweedFS"
    print(f"\ngateway CPU per request, in-process on {where}, namespace-scoped key (best of 3 x {args.n})")
    if len(columns) == 1:
        print(f"{'request':<18} {'CPU us':>7} {'1/CPU req/s':>11}")
        for name, micros in columns["fast"].items():
            print(f"{name:<18} {micros:>7.0f} {1e6 / micros:>11.0f}")
        return
    print(f"{'request':<22} " + " ".join(f"{c:>17}" for c in columns) + "   (CPU µs; x: relative to fast)")
    for name, micros in columns["fast"].items():
        print(f"{name:<22} " + " ".join(f"{columns[c][name]:>9.0f} x{columns[c][name] / micros:>5.2f} " for c in columns))


if __name__ == "__main__":
    main()
