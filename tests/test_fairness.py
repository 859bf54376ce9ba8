"""One namespace's heavy writes cannot starve another namespace's writes (issue 44), on both backends.

Found by attack: two clients copying a 240 MiB checkpoint thread back to back for 15 s let 5 of
another namespace's checkpoint writes through on SQLite instead of about 230, the worst after
5.03 s, one a 503: a copy was one transaction holding SQLite's write lock for seconds. Copies,
deletes, prunes and sweeps now write in turns (``app.fairness.fairshare``, ``app.checkpoints.heavy``),
and one namespace runs at most ``fairness.heavy_per_namespace`` copies at once (429).

The bound stated: another namespace's single write waits for at most one turn of a heavy write
(``fairness.chunk_bytes`` of rows, 1 MiB, or one row larger than that) and SQLite's own retry
sleep (see ``bench/bench_fairness.py`` and ``docs/benchmarks.md`` for what it measures). Here, on
a shared test machine, the victim's p99 is held to ``BOUND`` or five times its own p99 measured
just before the flood, whichever is larger; before, it was the length of a whole copy on SQLite
(a second or more for the 60 MiB copied here), and up to 1.6 s on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
from typing import Any

import httpx

from tests.conftest import Server

MiB = 1024 * 1024
VALUES_PER_PUT, PUTS = 10, 6  # a thread of 60 MiB of values (1 MiB each), in puts of 10
FLOOD_SECONDS = 4.0
BOUND = 0.3  # seconds: the victim's p99 under the flood (see the module's docstring)


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def seed(http: httpx.AsyncClient, ns: str, thread: str) -> None:
    """``PUTS`` checkpoints, each storing ``VALUES_PER_PUT`` values of 1 MiB; only the newest
    references one of them (a read of a checkpoint stays small, a copy writes all 60 MiB)."""
    for i in range(PUTS):
        blobs = [
            {"channel": f"v{k}", "version": str(i), "type": "bytes", "data": base64.b64encode(os.urandom(MiB)).decode()}
            for k in range(VALUES_PER_PUT)
        ]
        body = {
            "thread_id": thread, "checkpoint_id": f"c{i}", "parent_checkpoint_id": f"c{i - 1}" if i else None,
            "checkpoint": {"type": "bytes", "data": "AA=="}, "blobs": blobs,
            "channel_versions": {"v0": str(i)} if i == PUTS - 1 else {}, "metadata": {"step": i},
        }
        r = await http.post(f"/v1/{ns}/checkpoints/put", json=body)
        assert r.status_code == 200, r.text


async def victim(http: httpx.AsyncClient, ns: str, until: float, latencies: list[float], statuses: list[int]) -> None:
    """Another namespace's single checkpoint writes, one after another."""
    i = 0
    while time.monotonic() < until:
        body = {"thread_id": "t", "checkpoint_id": f"c{time.time_ns()}", "checkpoint": {"type": "bytes", "data": "AA=="},
                "metadata": {"i": i}}
        started = time.monotonic()
        r = await http.post(f"/v1/{ns}/checkpoints/put", json=body)
        latencies.append(time.monotonic() - started)
        statuses.append(r.status_code)
        i += 1
        await asyncio.sleep(0.02)


async def test_a_copy_flood_does_not_stall_another_namespaces_writes(
    server: Server, auth_headers: dict[str, str], namespace: str
) -> None:
    heavy, light = f"{namespace}-heavy", f"{namespace}-light"
    async with httpx.AsyncClient(base_url=server.url, timeout=60, headers=auth_headers) as http:
        await seed(http, heavy, "big")
        base = f"/v1/{heavy}/checkpoints"

        # the reference: the victim alone
        reference: list[float] = []
        await victim(http, light, time.monotonic() + 1.0, reference, [])

        # three copies of one namespace at once: the third is refused (fairness.heavy_per_namespace: 2)
        answers = await asyncio.gather(*(
            http.post(f"{base}/threads/copy", json={"source_thread_id": "big", "target_thread_id": f"at-once-{i}"})
            for i in range(3)
        ))
        statuses = sorted(r.status_code for r in answers)
        assert statuses[0] == 200 and statuses[-1] == 429, [(r.status_code, r.text[:200]) for r in answers]
        refused = next(r for r in answers if r.status_code == 429)
        assert refused.headers["retry-after"] == "1" and refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["code"] == "rate_limited"
        for i, r in enumerate(answers):
            if r.status_code == 200:
                assert r.json() == {"copied": PUTS}
                assert (await http.delete(f"{base}/threads", params={"thread_id": f"at-once-{i}"})).status_code == 200

        # the flood: two clients copying back to back (and deleting each copy), the victim writing,
        # and a reader that must never see a copy half made
        until = time.monotonic() + FLOOD_SECONDS
        latencies: list[float] = []
        victim_statuses: list[int] = []
        copies: list[int] = []
        seen: list[int] = []
        current = ["copy-0-0", "copy-1-0"]

        async def copier(k: int) -> None:
            n = 0
            while time.monotonic() < until:
                target = current[k] = f"copy-{k}-{n}"
                r = await http.post(f"{base}/threads/copy", json={"source_thread_id": "big", "target_thread_id": target})
                copies.append(r.status_code)
                assert r.status_code == 200 and r.json() == {"copied": PUTS}, r.text
                r = await http.delete(f"{base}/threads", params={"thread_id": target})
                assert r.status_code == 200 and r.json() == {"deleted": PUTS}, r.text
                n += 1

        async def reader() -> None:
            while time.monotonic() < until:
                for target in list(current):
                    r = await http.post(f"{base}/search", json={"thread_id": target, "limit": PUTS + 1})
                    assert r.status_code == 200, r.text[:200]
                    items = r.json()["items"]
                    seen.append(len(items))
                    if items:
                        assert base64.b64decode(items[0]["values"]["v0"]["data"]), items[0]["checkpoint_id"]
                await asyncio.sleep(0.01)

        await asyncio.gather(victim(http, light, until, latencies, victim_statuses), copier(0), copier(1), reader())

    assert set(victim_statuses) == {200}, victim_statuses
    assert copies and set(copies) == {200}
    assert set(seen) <= {0, PUTS}, seen  # a copy appears whole, or not at all
    bound = max(BOUND, 5 * p99(reference))
    assert p99(latencies) < bound, (
        f"another namespace's write p99 {p99(latencies) * 1000:.0f} ms under the flood (max {max(latencies) * 1000:.0f} "
        f"ms, {len(latencies)} writes, {len(copies)} copies), bound {bound * 1000:.0f} ms; alone: p99 "
        f"{p99(reference) * 1000:.0f} ms"
    )


async def test_a_copy_into_a_thread_in_use_adds_to_it(server: Server, auth_headers: dict[str, str], namespace: str) -> None:
    """A copy into a thread that already has checkpoints keeps them (rows the target has stay) and
    adds the source's; copied again, nothing more is added."""
    async with httpx.AsyncClient(base_url=server.url, timeout=60, headers=auth_headers) as http:
        base = f"/v1/{namespace}/checkpoints"
        for thread, cid in (("src", "a"), ("src", "b"), ("dst", "b"), ("dst", "z")):
            body: dict[str, Any] = {"thread_id": thread, "checkpoint_id": cid, "checkpoint": {"type": "bytes", "data": "AA=="},
                                    "metadata": {"from": thread}}
            assert (await http.post(f"{base}/put", json=body)).status_code == 200
        r = await http.post(f"{base}/threads/copy", json={"source_thread_id": "src", "target_thread_id": "dst"})
        assert r.status_code == 200 and r.json() == {"copied": 1}, r.text
        items = (await http.post(f"{base}/search", json={"thread_id": "dst"})).json()["items"]
        assert [(c["checkpoint_id"], c["metadata"]["from"]) for c in items] == [("z", "dst"), ("b", "dst"), ("a", "src")]
        r = await http.post(f"{base}/threads/copy", json={"source_thread_id": "src", "target_thread_id": "dst"})
        assert r.status_code == 200 and r.json() == {"copied": 0}, r.text
