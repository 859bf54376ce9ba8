"""Hybrid search's text half ranks as BM25 does, alike on every backend: against a reference
computed here from the points as stored (``app.vectors.text``'s formula, which SQLite's FTS5
``bm25()`` computes itself), as points come, change and go; filters on both halves; weighted
fusion and each hit's ``debug``; the text language."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import numpy as np
import pytest

from storage_gateway_client import Conflict, GatewayClient, InvalidRequest

from app.vectors import text as bm25
from tests.conftest import VECTOR_BACKENDS

pytestmark = pytest.mark.backends(*VECTOR_BACKENDS)

DIM = 4


def reference(texts: dict[str, str], query: str, language: str = "english") -> dict[str, float]:
    """Each point's BM25 score for ``query`` over the collection ``texts`` (id -> text)."""
    docs = {pid: Counter(bm25.terms(t, language)) for pid, t in texts.items()}
    docs = {pid: c for pid, c in docs.items() if c}
    n = len(docs)
    avgdl = sum(sum(c.values()) for c in docs.values()) / n
    q = bm25.query_terms(query, language)
    df = {t: sum(1 for c in docs.values() if t in c) for t in q}
    return {pid: bm25.score(c, q, n, avgdl, df) for pid, c in docs.items()}


def vectors(n: int, seed: int) -> list[list[float]]:
    return np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32).tolist()


async def text_scores(gw: GatewayClient, collection: str, query: str, limit: int = 50, **options: object) -> dict[str, float]:
    """The text half's score of each hit holding a term of ``query``, best first (weighted
    fusion, alpha 0: by the text alone)."""
    answer = await gw.vectors.search_explained(
        collection, [1, 0, 0, 0], limit, query=query, fusion="weighted", alpha=0.0, **options  # type: ignore[arg-type]
    )
    return {h["id"]: h["debug"]["text"]["score"] for h in answer["results"] if h["debug"]["text"]["score"] > 0}


def assert_scores(found: dict[str, float], expected: dict[str, float]) -> None:
    matching = {pid: s for pid, s in expected.items() if s > 0}
    assert set(found) == set(matching)
    for pid, s in matching.items():
        assert found[pid] == pytest.approx(s, rel=1e-9), pid


async def test_the_rare_words_outrank_a_repeated_common_word(gw: GatewayClient) -> None:
    """The report: PostgreSQL ranked by cover density without inverse document frequency, so
    the point repeating a word every point holds came before the one holding the rare words."""
    await gw.vectors.setup_collection("m", DIM, "cosine", text_field="text")
    texts = {
        "common": "memory memory memory memory memory, memory of memories",
        "rare": "a memory of the zeppelin hangar",
        **{f"f{i}": f"memory number {i} of the garden" for i in range(20)},
    }
    vecs = vectors(len(texts), 1)
    await gw.vectors.upsert_points("m", vecs, [{"text": t} for t in texts.values()], list(texts))
    query = "memory zeppelin hangar"
    expected = reference(texts, query)
    found = await text_scores(gw, "m", query)
    assert_scores(found, expected)
    assert list(found)[:2] == ["rare", "common"]
    # The default fusion (RRF) with a vector nearest to a filler: the text half ranks "rare" first.
    answer = await gw.vectors.search_explained("m", vecs[5], len(texts), query=query)
    debug = {h["id"]: h["debug"] for h in answer["results"]}
    assert debug["rare"]["text"]["rank"] == 1 and debug["common"]["text"]["rank"] == 2
    assert answer["plan"]["text"]["terms"] == ["memori", "zeppelin", "hangar"]


async def test_scores_follow_the_points_as_they_come_change_and_go(gw: GatewayClient) -> None:
    """The statistics (documents, lengths, each term's documents) are the collection's as it is
    now: after inserts, upserts, payload updates, deletes by id and by filter, concurrent ones
    too, the scores are the reference's over the points then stored."""
    await gw.vectors.setup_collection("s", DIM, "cosine", text_field="text")
    texts = {f"p{i}": f"note {i} about the garden and its {'roses' if i % 3 else 'tulips'}" for i in range(12)}
    texts["z"] = "the zeppelin over the garden"
    await gw.vectors.upsert_points("s", vectors(len(texts), 2), [{"text": t, "n": i} for i, t in enumerate(texts.values())], list(texts))
    # a point without text, or with a list of strings, or with no terms
    await gw.vectors.upsert_points("s", vectors(3, 3), [{"other": "zeppelin"}, {"text": ["zeppelin", "roses"]}, {"text": "!!"}], ["none", "list", "empty"])
    texts["list"] = "zeppelin roses"
    query = "zeppelin roses garden"
    first = await text_scores(gw, "s", query)
    assert_scores(first, reference(texts, query))

    more = {f"z{i}": f"zeppelin {'zeppelin ' * i}rides" for i in range(6)}
    await asyncio.gather(*(
        gw.vectors.upsert_points("s", vectors(1, 10 + i), [{"text": t}], [pid]) for i, (pid, t) in enumerate(more.items())
    ))
    texts |= more
    grown = await text_scores(gw, "s", query)
    assert_scores(grown, reference(texts, query))
    assert grown["z"] < first["z"]  # zeppelin is commoner now

    # upserts replacing texts and payload updates, at once; a vector-only update keeps the text
    await asyncio.gather(
        gw.vectors.upsert_points("s", vectors(2, 20), [{"text": "tulips only"}, {"text": "zeppelin zeppelin garden"}], ["z0", "p1"]),
        gw.vectors.update_point("s", "z1", payload={"text": "no airship here"}),
        gw.vectors.update_point("s", "p2", payload={"other": 1}),
        gw.vectors.update_point("s", "z2", vector=[0, 1, 0, 0]),
    )
    texts |= {"z0": "tulips only", "p1": "zeppelin zeppelin garden", "z1": "no airship here"}
    del texts["p2"]
    assert_scores(await text_scores(gw, "s", query), reference(texts, query))

    await asyncio.gather(gw.vectors.delete_point("s", "z3"), gw.vectors.delete_points("s", filters={"n": {"$lt": 4}}))
    for pid in ("z3", "p0", "p3"):  # p1 was written without "n"
        del texts[pid]
    assert_scores(await text_scores(gw, "s", query), reference(texts, query))

    await gw.vectors.delete_points("s", ids=[*more, "p1", "list"])
    await gw.vectors.upsert_points("s", vectors(2, 30), [{"text": texts_p} for texts_p in ("note 0 about the garden and its tulips", "note 1 about the garden and its roses")], ["p0", "p1"])
    await gw.vectors.upsert_points("s", vectors(2, 31), [{"text": "note 2 about the garden and its roses", "n": 2}, {"text": ["zeppelin", "roses"]}], ["p2", "list"])
    await gw.vectors.upsert_points("s", vectors(1, 32), [{"text": "note 3 about the garden and its tulips"}], ["p3"])
    # every point as at first: the scores are the first ones
    assert_scores(await text_scores(gw, "s", query), first)

    await gw.vectors.reset_collection("s")
    assert await text_scores(gw, "s", query) == {}
    await gw.vectors.upsert_points("s", vectors(1, 40), [{"text": "zeppelin"}], ["only"])
    assert_scores(await text_scores(gw, "s", query), reference({"only": "zeppelin"}, query))


async def test_filters_apply_to_both_halves_before_the_limit(gw: GatewayClient) -> None:
    await gw.vectors.setup_collection("f", DIM, "l2", text_field="text", payload_indexes=[{"field": "user", "kind": "keyword"}])
    texts = {f"a{i}": f"zeppelin log {i}" for i in range(8)} | {f"b{i}": f"garden log {i}" for i in range(8)}
    users = ["u1" if i % 2 else "u2" for i in range(len(texts))]
    await gw.vectors.upsert_points("f", vectors(len(texts), 4), [{"text": t, "user": u} for t, u in zip(texts.values(), users, strict=True)], list(texts))
    mine = {pid for pid, u in zip(texts, users, strict=True) if u == "u1"}
    for fusion in ("rrf", "weighted"):
        hits = await gw.vectors.search("f", [0, 0, 0, 0], 5, query="zeppelin", filters={"user": "u1"}, fusion=fusion)
        assert len(hits) == 5 and {h["id"] for h in hits} <= mine
        # the text half ranked the filter's matches only: u1's zeppelin points first
        assert {h["id"] for h in hits[:4]} == {pid for pid in mine if pid.startswith("a")} or fusion == "rrf"
        everything = await gw.vectors.search("f", [0, 0, 0, 0], 20, query="zeppelin", filters={"user": "u1"}, fusion=fusion)
        assert {h["id"] for h in everything} == mine
    found = await text_scores(gw, "f", "zeppelin", filters={"user": "u1"})
    # the statistics are the collection's, whatever the filter: scores as unfiltered
    expected = reference(texts, "zeppelin")
    assert_scores(found, {pid: s for pid, s in expected.items() if pid in mine})


async def test_weighted_fusion_and_the_debug_field(gw: GatewayClient, http: httpx.AsyncClient, namespace: str) -> None:
    await gw.vectors.setup_collection("w", DIM, "cosine", text_field="text")
    texts = {f"p{i}": " ".join(["zeppelin"] * (i % 4) + ["garden", "notes", str(i)]) for i in range(30)}
    vecs = vectors(len(texts), 5)
    await gw.vectors.upsert_points("w", vecs, [{"text": t} for t in texts.values()], list(texts))
    q = [0.3, -0.2, 0.9, 0.1]

    async def ranked(**options: object) -> list[dict]:
        answer = await gw.vectors.search_explained("w", q, 30, query="zeppelin", **options)  # type: ignore[arg-type]
        return answer["results"]

    vector_only = [h["id"] for h in await gw.vectors.search("w", q, 30)]
    by_vector = await ranked(fusion="weighted", alpha=1.0)
    assert [h["id"] for h in by_vector] == vector_only
    by_text = await ranked(fusion="weighted", alpha=0.0)
    # by the text score, ties to the nearer point
    expected = reference(texts, "zeppelin")
    text_order = [(-h["debug"]["text"]["score"], h["distance"]) for h in by_text]
    assert text_order == sorted(text_order)
    assert [-s for s, _ in text_order] == pytest.approx(sorted(expected.values(), reverse=True)[: len(text_order)])
    for alpha in (0.3, 0.5):
        hits = await ranked(fusion="weighted", alpha=alpha)
        best_text = max(h["debug"]["text"]["score"] for h in hits)
        scores = [h["debug"]["vector"]["score"] for h in hits]
        for h in hits:
            d = h["debug"]
            assert d["fusion"] == "weighted" and d["alpha"] == alpha
            assert d["text"]["normalised"] == pytest.approx(d["text"]["score"] / best_text)
            assert d["vector"]["normalised"] == pytest.approx((d["vector"]["score"] - min(scores)) / (max(scores) - min(scores)))
            assert h["score"] == pytest.approx(alpha * d["vector"]["normalised"] + (1 - alpha) * d["text"]["normalised"])
            assert d["vector"]["score"] == pytest.approx(1 - h["distance"])
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    for h in await ranked():  # RRF
        d = h["debug"]
        assert "alpha" not in d and d["fusion"] == "rrf"
        ranks = [r for r in (d["vector"]["rank"], d["text"]["rank"]) if r is not None]
        assert h["score"] == pytest.approx(sum(1 / (60 + r) for r in ranks))
    # no debug without explain; a bad fusion or alpha is a 422 naming it
    assert all("debug" not in h for h in await gw.vectors.search("w", q, 5, query="zeppelin", fusion="weighted"))
    path = f"/v1/{namespace}/vectors/w/search"
    for body, field in (({"alpha": 0.5}, "alpha"), ({"fusion": "weighted", "alpha": 1.5}, "alpha"),
                        ({"fusion": "max"}, "fusion"), ({"fusion": "weighted", "alpha": "half"}, "alpha")):
        r = await http.post(path, json={"vector": q, "query": "zeppelin", **body})
        assert r.status_code == 422 and field in r.text, r.text
        assert r.headers["content-type"] == "application/problem+json"


async def test_text_language(gw: GatewayClient, http: httpx.AsyncClient, namespace: str) -> None:
    made = await gw.vectors.setup_collection("en", DIM, text_field="text")
    assert made["text_language"] == "english"
    await gw.vectors.setup_collection("raw", DIM, text_field="text", text_language="none")
    await gw.vectors.setup_collection("fr", DIM, text_field="text", text_language="french")
    for name in ("en", "raw", "fr"):
        await gw.vectors.upsert_points(name, vectors(2, 6), [{"text": "Running connections"}, {"text": "les chevaux courent"}], ["en", "fr"])
    assert set(await text_scores(gw, "en", "run connection")) == {"en"}
    assert await text_scores(gw, "raw", "run connection") == {}
    assert set(await text_scores(gw, "raw", "RUNNING")) == {"en"}
    assert set(await text_scores(gw, "fr", "cheval")) == {"fr"}
    assert (await gw.vectors.describe_collection("fr"))["text_language"] == "french"
    assert (await gw.vectors.setup_collection("fr", DIM, text_field="text"))["text_language"] == "french"
    with pytest.raises(Conflict):
        await gw.vectors.setup_collection("fr", DIM, text_field="text", text_language="german")
    with pytest.raises(InvalidRequest):
        await gw.vectors.setup_collection("x", DIM, text_field="text", text_language="klingon")
    r = await http.put(f"/v1/{namespace}/vectors/y", json={"vector_size": DIM, "text_language": "english"})
    assert r.status_code == 422 and "text_language" in r.text
    assert (await http.get(f"/v1/{namespace}/vectors/y")).status_code == 404


@pytest.mark.postgres_only
async def test_a_bounded_text_search_answers_its_proven_top_exactly(backend, server, tmp_path, namespace, monkeypatch) -> None:  # noqa: ANN001
    """PostgreSQL scores only the points holding a query's rarest terms (``TEXT_CANDIDATES`` of
    their postings, here 5): the hits scoring above every other term's upper bound are BM25's
    exact top (``exact``), the others the best of those points."""
    from app.main import create_app
    from app.vectors import pgvector
    from tests.conftest import in_process_settings

    monkeypatch.setattr(pgvector, "TEXT_CANDIDATES", 5)
    texts = {f"c{i}": f"common words {'middle ' * (i % 2)}and more" for i in range(40)}
    texts |= {"r0": "rare middle common", "r1": "rare rare words", "r2": "rare text here"}
    app = create_app(in_process_settings(backend, tmp_path))
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        path = f"/v1/{namespace}/vectors/b"
        assert (await http.put(path, json={"vector_size": DIM, "text_field": "text"})).status_code == 201
        r = await http.post(f"{path}/points", json={
            "ids": list(texts), "vectors": vectors(len(texts), 7), "payloads": [{"text": t} for t in texts.values()]})
        assert r.status_code == 200, r.text
        query = "common middle rare"
        r = await http.post(f"{path}/search", json={
            "vector": [1, 0, 0, 0], "query": query, "limit": 10, "fusion": "weighted", "alpha": 0.0, "explain": True})
        answer = r.json()
    expected = reference(texts, query)
    best = sorted(expected, key=lambda p: (-expected[p], p))
    text_hits = [h for h in answer["results"] if h["debug"]["text"]["rank"] is not None]
    plan = answer["plan"]["text"]
    # "rare" (3 points) fits in 5 postings, "middle" (21) does not: the three are scored, all of them
    # above middle's and common's bounds
    assert plan["matched"] == 3 and plan["exact"] == 3
    assert [h["id"] for h in text_hits] == best[:3]
    assert [h["debug"]["text"]["score"] for h in text_hits] == pytest.approx([expected[p] for p in best[:3]])
