"""Benchmark: another namespace's single write while one namespace runs heavy writes (issue 44).

One namespace (``heavy``) runs a heavy operation from 4 clients back to back, in a process of
their own (their bodies encoded once, so their CPU is not the measuring client's); another
(``light``) writes once at a time from one client (20 ms between writes) to the same database,
and its latency is measured: alone first (the reference, in the same run), then under the load.
Each namespace uses a key scoped to it. One gateway worker, on SQLite (a temporary directory) and on
PostgreSQL (a throwaway pgserver), default settings (``fairness.chunk_bytes`` 1 MiB,
``fairness.heavy_per_namespace`` 2: two of the four copiers are refused with 429 at any time and
retry after its ``Retry-After``).

Heavy operations, each from 4 clients:
- ``copy``: copy a thread of ``--copy-mib`` MiB (values of 1 MiB; the issue's flood: 240), then
  delete the copy; the light namespace puts a checkpoint;
- ``copy + prune``: copy a thread of 2,000 checkpoints (16 KiB of values each, 32 MiB), then prune
  the copy to its newest checkpoint; the light namespace puts a checkpoint;
- ``records batch``: 1,000 records of 8 KiB; the light namespace puts a checkpoint (records and
  checkpoints share a database);
- ``vector batch``: 250 points of 1,536 dimensions; the light namespace upserts one point.

    .venv/bin/python bench/bench_fairness.py [--seconds N] [--copy-mib N] [--backends sqlite,postgres] [--ops copy,...]
        [--gateway-env GATEWAY_X=VALUE] [--pg-setting max_wal_size=8GB]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import Backend, backend_env, create_postgres_databases, run_cli, start_server, stop_server  # noqa: E402

ADMIN_KEY = "bench-admin-key-" + uuid.uuid4().hex
HEAVY, LIGHT = "heavy", "light"
CLIENTS = 4
MiB = 1024 * 1024
DIMS = 1536


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000 if ordered else float("nan")


async def key_for(url: str, ns: str) -> str:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        scopes = [f"{c}:{a}" for c in ("checkpoints", "records", "vectors") for a in ("read", "write")]
        r = await admin.post("/v1/admin/keys", json={"namespace": ns, "scopes": scopes})
        r.raise_for_status()
        return str(r.json()["key"])


def client(url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300)


async def ok(r: Awaitable[httpx.Response]) -> httpx.Response:
    response = await r
    if response.status_code >= 400:
        raise RuntimeError(f"{response.request.method} {response.request.url}: {response.status_code} {response.text[:300]}")
    return response


# --- what the heavy namespace holds -------------------------------------------------------------


async def seed(url: str, key: str, copy_mib: int, ops: list[str]) -> None:
    async with client(url, key) as c:
        base = f"/v1/{HEAVY}/checkpoints"
        value = base64.b64encode(os.urandom(MiB)).decode()
        per_put = 10
        for i in range(copy_mib // per_put):  # the big thread: 1 MiB values, 10 a put
            blobs = [{"channel": f"v{k}", "version": str(i), "type": "bytes", "data": value} for k in range(per_put)]
            await ok(c.post(f"{base}/put", json={
                "thread_id": "big", "checkpoint_id": f"c{i:05}", "parent_checkpoint_id": f"c{i - 1:05}" if i else None,
                "checkpoint": {"type": "bytes", "data": "AA=="}, "blobs": blobs, "channel_versions": {"v0": str(i)},
            }))
        small = base64.b64encode(os.urandom(16 * 1024)).decode()
        for i in range(2000 if "copy + prune" in ops else 0):  # the long thread: 2,000 checkpoints of 16 KiB
            await ok(c.post(f"{base}/put", json={
                "thread_id": "long", "checkpoint_id": f"c{i:05}", "parent_checkpoint_id": f"c{i - 1:05}" if i else None,
                "checkpoint": {"type": "bytes", "data": "AA=="}, "channel_versions": {"m": str(i)},
                "blobs": [{"channel": "m", "version": str(i), "type": "bytes", "data": small}], "metadata": {"step": i},
            }))
        await ok(c.put(f"/v1/{HEAVY}/vectors/v", json={"vector_size": DIMS}))


# --- the heavy operations -------------------------------------------------------------------------

Op = Callable[[httpx.AsyncClient, int, int], Awaitable[int]]  # (client, its number, round) -> 429s met


async def admitted(send: Callable[[], Awaitable[httpx.Response]]) -> tuple[httpx.Response, int]:
    """``send()`` again after each 429, as its ``Retry-After`` says; the answer and the 429s met."""
    refused = 0
    while True:
        r = await send()
        if r.status_code != 429:
            if r.status_code >= 400:
                raise RuntimeError(f"{r.request.url}: {r.status_code} {r.text[:300]}")
            return r, refused
        refused += 1
        await asyncio.sleep(float(r.headers.get("retry-after", "1")))


async def copy_op(c: httpx.AsyncClient, k: int, n: int) -> int:
    base, target = f"/v1/{HEAVY}/checkpoints", f"copy-{k}-{n}"
    _, refused = await admitted(lambda: c.post(f"{base}/threads/copy", json={"source_thread_id": "big", "target_thread_id": target}))
    await ok(c.delete(f"{base}/threads", params={"thread_id": target}))
    return refused


async def prune_op(c: httpx.AsyncClient, k: int, n: int) -> int:
    base, target = f"/v1/{HEAVY}/checkpoints", f"pruned-{k}-{n}"
    _, refused = await admitted(lambda: c.post(f"{base}/threads/copy", json={"source_thread_id": "long", "target_thread_id": target}))
    await ok(c.post(f"{base}/prune", json={"thread_ids": [target], "strategy": "keep_latest"}))
    await ok(c.delete(f"{base}/threads", params={"thread_id": target}))
    return refused


JSON = {"Content-Type": "application/json"}
RECORDS = json.dumps({"records": [{"key": f"k{i:04}", "value": {"text": "x" * 8000, "i": i}} for i in range(1000)]}).encode()


async def records_op(c: httpx.AsyncClient, k: int, n: int) -> int:
    _, refused = await admitted(lambda: c.post(f"/v1/{HEAVY}/records/c{k}", content=RECORDS, headers=JSON))
    return refused


def _points(seed: int) -> bytes:
    rng = random.Random(seed)
    points = [{"id": f"p{i}", "vector": [rng.random() for _ in range(DIMS)], "payload": {"i": i}} for i in range(250)]
    return json.dumps({"points": points}).encode()


async def vectors_op(c: httpx.AsyncClient, k: int, n: int) -> int:
    _, refused = await admitted(lambda: c.post(f"/v1/{HEAVY}/vectors/v/points", content=POINTS[k], headers=JSON))
    return refused


POINTS: list[bytes] = []  # made in the heavy process only


# --- the light namespace's single writes ------------------------------------------------------------


async def checkpoint_put(c: httpx.AsyncClient, i: int) -> None:
    await ok(c.post(f"/v1/{LIGHT}/checkpoints/put", json={
        "thread_id": "t", "checkpoint_id": f"c{time.time_ns()}", "checkpoint": {"type": "bytes", "data": "AA=="}, "metadata": {"i": i},
    }))


async def point_put(c: httpx.AsyncClient, i: int) -> None:
    await ok(c.post(f"/v1/{LIGHT}/vectors/v/points", json={"points": [{"id": f"p{i % 100}", "vector": [0.5] * 8}]}))


async def light_writes(
    url: str, key: str, write: Callable[[httpx.AsyncClient, int], Awaitable[None]], until: float,
) -> tuple[list[float], int]:
    """The light namespace's writes until ``until``: their latencies (failed ones too), and how many failed."""
    latencies: list[float] = []
    failed = 0
    async with client(url, key) as c:
        i = 0
        while time.monotonic() < until:
            started = time.monotonic()
            try:
                await write(c, i)
            except (RuntimeError, httpx.HTTPError):  # a 503 or a timeout is a result here, not the end of the run
                failed += 1
            latencies.append(time.monotonic() - started)
            i += 1
            await asyncio.sleep(0.02)
    return latencies, failed


def heavy_load(url: str, key: str, name: str, seconds: float, started: Any, out: Any) -> None:
    """The heavy namespace's clients, in a process of their own: (operations done, 429s met)."""
    op = next(o for n, o, _ in ROWS if n == name)
    if name == "vector batch":
        POINTS.extend(_points(k) for k in range(CLIENTS))

    async def run() -> tuple[int, int, int]:
        done, refused, failed = 0, 0, 0
        started.set()
        until = time.monotonic() + seconds

        async def heavy_client(k: int) -> None:
            nonlocal done, refused, failed
            async with client(url, key) as c:
                n = 0
                while time.monotonic() < until:
                    try:
                        refused += await op(c, k, n)
                        done += 1
                    except (RuntimeError, httpx.HTTPError):
                        failed += 1
                    n += 1

        await asyncio.gather(*(heavy_client(k) for k in range(CLIENTS)))
        return done, refused, failed

    out.put(asyncio.run(run()))


async def row(url: str, keys: dict[str, str], name: str, write: Callable[[httpx.AsyncClient, int], Awaitable[None]],
              seconds: float) -> dict[str, Any]:
    alone, _ = await light_writes(url, keys[LIGHT], write, time.monotonic() + seconds / 2)
    spawn = multiprocessing.get_context("spawn")
    started, out = spawn.Event(), spawn.Queue()
    load = spawn.Process(target=heavy_load, args=(url, keys[HEAVY], name, seconds, started, out))
    load.start()
    await asyncio.get_running_loop().run_in_executor(None, started.wait)
    loaded, light_failed = await light_writes(url, keys[LIGHT], write, time.monotonic() + seconds)
    done, refused, failed = await asyncio.get_running_loop().run_in_executor(None, out.get, True, seconds + 600)
    load.join()
    return {"alone": (pct(alone, 0.5), pct(alone, 0.99)), "loaded": (pct(loaded, 0.5), pct(loaded, 0.99), pct(loaded, 1.0)),
            "writes": len(loaded), "failed": light_failed, "ops": done, "refused": refused, "ops_failed": failed}


ROWS: list[tuple[str, Op, Callable[[httpx.AsyncClient, int], Awaitable[None]]]] = [
    ("copy", copy_op, checkpoint_put),
    ("copy + prune", prune_op, checkpoint_put),
    ("records batch", records_op, checkpoint_put),
    ("vector batch", vectors_op, point_put),
]


async def bench(url: str, seconds: float, copy_mib: int, ops: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    keys = {ns: await key_for(url, ns) for ns in (HEAVY, LIGHT)}
    await seed(url, keys[HEAVY], copy_mib, ops)
    async with client(url, keys[LIGHT]) as c:
        await ok(c.put(f"/v1/{LIGHT}/vectors/v", json={"vector_size": 8}))
    return [(name, write.__name__, await row(url, keys, name, write, seconds)) for name, _, write in ROWS if name in ops]


def run_backend(name: str, seconds: float, copy_mib: int, ops: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-fair-{name}-"))
    pg = None
    try:
        if name == "postgres":
            import pgserver

            pg = pgserver.get_server(work / "pg", cleanup_mode="stop")
            for setting in PG_SETTINGS:  # --pg-setting: the server as an operator configured it
                name, _, value = setting.partition("=")
                pg.psql(f"ALTER SYSTEM SET {name} = '{value}';")
            if PG_SETTINGS:
                pg.psql("SELECT pg_reload_conf();")
            urls = create_postgres_databases(pg.get_uri(), f"benchfair_{uuid.uuid4().hex[:8]}")
            backend = Backend("postgres", backend_env(urls, work / "data"), urls)
        else:
            backend = Backend("sqlite", {"GATEWAY_DATA_DIR": str(work / "data")})
        result = run_cli(backend, "migrate", GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY)
        if result.returncode != 0:
            raise SystemExit(result.stderr)
        server = start_server(backend, work / "gateway.log", "--workers", "1",
                              GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY, GATEWAY_LOG_LEVEL="warning", **GATEWAY_ENV)
        try:
            return asyncio.run(bench(server.url, seconds, copy_mib, ops))
        finally:
            stop_server(server)
    finally:
        if pg is not None:
            pg.cleanup()
        shutil.rmtree(work, ignore_errors=True)


GATEWAY_ENV: dict[str, str] = {}  # --gateway-env: settings of the gateways this run starts
PG_SETTINGS: list[str] = []  # --pg-setting: ALTER SYSTEM settings of the throwaway PostgreSQL


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds under load per row (default 15)")
    parser.add_argument("--copy-mib", type=int, default=240, help="MiB of the thread copied (default 240)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--ops", default=",".join(name for name, _, _ in ROWS), help="heavy operations (default all)")
    parser.add_argument("--gateway-env", action="append", default=[], metavar="GATEWAY_X=VALUE",
                        help="a setting of the gateways it starts (repeatable)")
    parser.add_argument("--pg-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the throwaway PostgreSQL, e.g. max_wal_size=8GB (repeatable)")
    args = parser.parse_args()
    PG_SETTINGS.extend(args.pg_setting)
    GATEWAY_ENV.update(item.split("=", 1) for item in args.gateway_env)
    ops = args.ops.split(",")
    if unknown := set(ops) - {name for name, _, _ in ROWS}:
        parser.error(f"unknown operations: {sorted(unknown)}")
    print(f"bench_fairness {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, 1 worker, {CLIENTS} heavy clients, "
          f"{args.seconds:g} s a row, copy of {args.copy_mib} MiB, PostgreSQL settings {PG_SETTINGS or 'pgserver defaults'}; latencies of the light namespace's writes in ms")
    print("| backend | heavy operation (x4) | light write | alone p50 / p99 | under load p50 / p99 / max | light writes (failed) | heavy ops (failed) | 429s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.backends.split(","):
        for op, write, r in run_backend(name, args.seconds, args.copy_mib, ops):
            alone, loaded = r["alone"], r["loaded"]
            print(f"| {name} | {op} | {write.replace('_', ' ')} | {alone[0]:.1f} / {alone[1]:.1f} | "
                  f"{loaded[0]:.1f} / {loaded[1]:.1f} / {loaded[2]:.1f} | {r['writes']} ({r['failed']}) | {r['ops']} ({r['ops_failed']}) | {r['refused']} |",
                  flush=True)


if __name__ == "__main__":
    main()
