"""A labelled text-retrieval set built from the Python standard library's docstrings.

Built from the interpreter that runs this file (nothing is downloaded or committed): every
public function and public method of a public class in the standard library's ``.py`` files
(``ast``, no module is imported; test packages and private modules left out) whose docstring
has at least ``MIN_TERMS`` terms is a document; its id is the qualified name of its first
definition (sorted by path), and a docstring found again elsewhere is the same document.

Queries (seeded, so every run of the same Python makes the same set):

- ``text_queries``: words of one document, the relevant one. Two of its five rarest words in the
  collection (its distinctive identifiers and words) and two more of its words, shuffled.
- ``hybrid_queries``: queries that need both halves. The text is two of the document's words
  that each appear in between ``AMBIGUOUS`` documents (exact words, but not enough alone); the
  meaning is the function's name with its words spelled out (``get_event_loop`` -> "get event
  loop", with its class and module), embedded as the vector (never in the text query).

The tokenizer and stemmer are the gateway's (``app.vectors.text``) so that the reference BM25
sees the documents as the gateway does.

    .venv/bin/python bench/stdlib_docs.py           # sizes and a few queries
"""

from __future__ import annotations

import ast
import random
import re
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
import sys

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.vectors.text import terms, words  # noqa: E402

MIN_TERMS = 5
SKIP = {"test", "tests", "idle_test", "site-packages", "dist-packages"}
AMBIGUOUS = (5, 300)
LANGUAGE = "english"


@dataclass(frozen=True)
class Doc:
    id: str  # module.Class.function
    text: str  # the docstring, its whitespace collapsed


@dataclass(frozen=True)
class Query:
    text: str
    relevant: str  # the id of the one relevant document
    meaning: str = ""  # what the vector of a hybrid query embeds


def documents() -> list[Doc]:
    root = Path(sysconfig.get_paths()["stdlib"])
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if any(p in SKIP for p in parts):
            continue
        module = [p for p in parts if p != "__init__"]
        if not module or any(p.startswith("_") for p in module):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        _collect(tree.body, ".".join(module) + ".", found, top=True)
    return [Doc(name, text) for text, name in found.items() if len(terms(text, LANGUAGE)) >= MIN_TERMS]


def _collect(body: list[ast.stmt], prefix: str, found: dict[str, str], top: bool) -> None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if doc:
                found.setdefault(" ".join(doc.split()), prefix + node.name)
        elif top and isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            _collect(node.body, f"{prefix}{node.name}.", found, top=False)


def document_frequencies(docs: list[Doc]) -> Counter[str]:
    df: Counter[str] = Counter()
    for d in docs:
        df.update(set(terms(d.text, LANGUAGE)))
    return df


def _candidate_words(doc: Doc) -> list[str]:
    """The document's distinct words worth typing: three characters or more, not all digits."""
    return list(dict.fromkeys(w for w in words(doc.text) if len(w) >= 3 and not w.isdigit()))


def _df_of(word: str, df: Counter[str]) -> int:
    found = terms(word, LANGUAGE)
    return df[found[0]] if found else 0


def text_queries(docs: list[Doc], n: int, seed: int = 1) -> list[Query]:
    df = document_frequencies(docs)
    rng = random.Random(seed)
    out = []
    for doc in rng.sample(docs, min(n, len(docs))):
        cands = _candidate_words(doc)
        if len(cands) < 4:
            continue
        by_rarity = sorted(cands, key=lambda w: (_df_of(w, df), w))
        chosen = rng.sample(by_rarity[:5], 2)
        rest = [w for w in cands if w not in chosen]
        chosen += rng.sample(rest, 2)
        rng.shuffle(chosen)
        out.append(Query(" ".join(chosen), doc.id))
    return out


def _spelled(name: str) -> str:
    """``asyncio.events.AbstractEventLoop.run_until_complete`` -> "asyncio events abstract event
    loop run until complete"."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return " ".join(re.split(r"[._\s]+", spaced)).lower().strip()


def hybrid_queries(docs: list[Doc], n: int, seed: int = 2) -> list[Query]:
    df = document_frequencies(docs)
    rng = random.Random(seed)
    lo, hi = AMBIGUOUS
    out = []
    for doc in rng.sample(docs, len(docs)):
        meaning = _spelled(doc.id)
        said = set(terms(meaning, LANGUAGE))
        cands = [w for w in _candidate_words(doc) if lo <= _df_of(w, df) <= hi and not set(terms(w, LANGUAGE)) & said]
        if len(cands) < 2:
            continue
        out.append(Query(" ".join(rng.sample(cands, 2)), doc.id, meaning))
        if len(out) == n:
            break
    return out


def synthetic(docs: list[Doc], n: int, seed: int = 3) -> list[str]:
    """``n`` texts with the corpus's word statistics, for sizes beyond it: each a window of 10 to
    60 words from the docstrings laid end to end in a shuffled order."""
    rng = random.Random(seed)
    order = docs[:]
    rng.shuffle(order)
    stream = " ".join(d.text for d in order).split()
    out = []
    for _ in range(n):
        size = rng.randint(10, 60)
        start = rng.randrange(0, len(stream) - size)
        out.append(" ".join(stream[start:start + size]))
    return out


def main() -> None:
    docs = documents()
    print(f"{len(docs)} documents, {sum(len(terms(d.text, LANGUAGE)) for d in docs) / len(docs):.1f} terms each on average")
    for q in text_queries(docs, 5):
        print("text  ", repr(q.text), "->", q.relevant)
    for q in hybrid_queries(docs, 5):
        print("hybrid", repr(q.text), "+", repr(q.meaning), "->", q.relevant)


if __name__ == "__main__":
    main()
