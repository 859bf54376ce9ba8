"""Benchmark: a page of checkpoints whose order needs a sort, before and after a change, in one run.

One thread of ``--checkpoints`` checkpoints spread over 7 ``checkpoint_ns``, 50 channel versions
each, on the embedded default (SQLite) and on PostgreSQL. Two gateways on the same databases (one
worker each, a namespace-scoped key): the code at ``--before`` (a git worktree) and this tree.
Each answers ``POST checkpoints/search`` with ``limit`` 10 for the thread (every
``checkpoint_ns``: a sort) and for the namespace; the two gateways are measured alternately,
``--rounds`` rounds of ``--requests`` sequential requests each (concurrency 1), and the median
of each side's per-round p50 is printed.

    .venv/bin/python bench/bench_checkpoint_pages.py --before 2571a28 [--checkpoints 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import (  # noqa: E402
    Backend, backend_env, create_postgres_databases, run_cli, start_server, stop_server,
)

ADMIN_KEY = "bench-admin-key-" + uuid.uuid4().hex
NS, THREAD = "bench", "long"
QUERIES = {"thread, every checkpoint_ns": {"thread_id": THREAD, "limit": 10}, "namespace": {"limit": 10}}


async def scoped_key(url: str) -> str:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        r = await admin.post("/v1/admin/keys", json={"namespace": NS, "scopes": ["checkpoints:write"]})
        r.raise_for_status()
        return str(r.json()["key"])


async def load(url: str, key: str, n: int) -> None:
    versions = {f"channel_{k:02}": f"{k:032}" for k in range(50)}
    data = base64.b64encode(b"x" * 200).decode()
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
        async def put(i: int) -> None:
            body = {"thread_id": THREAD, "checkpoint_ns": f"ns{i % 7}", "checkpoint_id": f"c{i:08}",
                    "checkpoint": {"type": "bytes", "data": data}, "channel_versions": versions,
                    "metadata": {"step": i}}
            (await c.post(f"/v1/{NS}/checkpoints/put", json=body)).raise_for_status()

        for start in range(0, n, 64):
            await asyncio.gather(*(put(i) for i in range(start, min(n, start + 64))))


async def p50(url: str, key: str, body: dict, requests: int) -> float:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
        times = []
        for _ in range(requests):
            t0 = time.perf_counter()
            r = await c.post(f"/v1/{NS}/checkpoints/search", json=body)
            times.append(time.perf_counter() - t0)
            assert r.status_code == 200 and len(r.json()["items"]) == 10, r.text[:300]
        return statistics.median(times) * 1000


def measure(backend: Backend, work: Path, before_tree: Path, n: int, rounds: int, requests: int) -> dict:
    result = run_cli(backend, "migrate", GATEWAY_AUTH__ADMIN_KEY=ADMIN_KEY)
    if result.returncode != 0:
        raise SystemExit(result.stderr)
    env = {"GATEWAY_AUTH__ADMIN_KEY": ADMIN_KEY, "GATEWAY_LOG_LEVEL": "warning"}
    after = start_server(backend, work / f"after-{backend.name}.log", "--workers", "1", **env)
    before = start_server(backend, work / f"before-{backend.name}.log", "--workers", "1",
                          PYTHONPATH=f"{before_tree}:{before_tree}/clients/python", **env)
    try:
        key = asyncio.run(scoped_key(after.url))
        asyncio.run(load(after.url, key, n))
        out: dict = {}
        for name, body in QUERIES.items():
            sides: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(rounds):
                for side, server in (("before", before), ("after", after)):
                    sides[side].append(asyncio.run(p50(server.url, key, body, requests)))
            out[name] = {side: statistics.median(values) for side, values in sides.items()}
        return out
    finally:
        stop_server(after)
        stop_server(before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--checkpoints", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()

    import pgserver

    work = Path(tempfile.mkdtemp(prefix="bench-pages-"))
    tree = work / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), args.before], check=True)
    pg = pgserver.get_server(work / "pg", cleanup_mode="stop")
    results = {}
    try:
        sqlite_urls = {db: f"sqlite+aiosqlite:///{work}/sqlite/{db}.db" for db in ("metadata", "vectors", "checkpoints")}
        (work / "sqlite").mkdir()
        pg_urls = create_postgres_databases(pg.get_uri(), f"benchpages_{uuid.uuid4().hex[:8]}")
        for name, urls in (("sqlite", sqlite_urls), ("postgres", pg_urls)):
            backend = Backend(name, backend_env(urls, work / f"data-{name}"), urls)
            results[name] = measure(backend, work, tree, args.checkpoints, args.rounds, args.requests)
    finally:
        pg.cleanup()
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.checkpoints:,} checkpoints in one thread (7 checkpoint_ns, 50 versions each); search limit 10, "
          f"c1 p50 ms (median of {args.rounds} rounds of {args.requests}), one worker, a namespace-scoped key")
    print(f"| backend | search | before ({args.before}) | after | before ÷ after |\n|---|---|---|---|---|")
    for backend, cells in results.items():
        for query, sides in cells.items():
            b, a = sides["before"], sides["after"]
            print(f"| {backend} | {query} | {b:.1f} | {a:.1f} | {b / a:.1f} |")


if __name__ == "__main__":
    main()
