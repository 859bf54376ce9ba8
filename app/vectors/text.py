"""The text half of hybrid search: one tokenizer for both backends, and BM25 as both rank with it.

A text becomes terms by one rule, in Python, whatever the backend, so that a collection ranks
alike on SQLite and PostgreSQL (the backends are given terms, never text to split):

1. NFKC normalisation, then Unicode case folding (``str.casefold``: ``Straße`` is ``strasse``);
2. words are the runs of letters and digits (Unicode categories L and N): punctuation,
   underscores, hyphens, apostrophes and dots separate (``os.path.join`` is three words);
3. a word longer than ``MAX_TERM_CHARS`` is left out (hashes and encoded blobs past that length);
4. each word is stemmed by the collection's ``text_language``'s Snowball stemmer (PyStemmer);
   ``none`` keeps words as they are. There is no stop-word list: BM25's inverse document
   frequency weighs common words down.

Ranking is Okapi BM25 as SQLite's FTS5 ``bm25()`` computes it, over the collection's own
statistics: for each distinct query term ``t`` in document ``D``,
``idf(t) * tf * (K1 + 1) / (tf + K1 * (1 - B + B * |D| / avgdl))``, summed, where
``idf(t) = ln((N - df + 0.5) / (df + 0.5))`` (``IDF_FLOOR`` when that is not positive), ``N`` the
documents with at least one term, ``avgdl`` their mean length in terms. SQLite ranks with FTS5
itself; PostgreSQL with the same formula over statistics kept with the rows (``pgvector.py``).
"""

from __future__ import annotations

import math
import re
import threading
import unicodedata
from collections import Counter
from collections.abc import Iterable
from typing import Any, Literal, Protocol, get_args

import Stemmer

K1 = 1.2
B = 0.75
IDF_FLOOR = 1e-6  # FTS5's: a term in more than half the documents still counts, a little
MAX_TERM_CHARS = 64
MAX_QUERY_TERMS = 32  # distinct terms of a query that are searched

# The Snowball stemmers of PyStemmer 3 (``Stemmer.algorithms()``, less the older ``porter`` and
# ``dutch_porter`` variants), and ``none``.
TextLanguage = Literal[
    "none", "arabic", "armenian", "basque", "catalan", "czech", "danish", "dutch", "english",
    "esperanto", "estonian", "finnish", "french", "german", "greek", "hindi", "hungarian",
    "indonesian", "irish", "italian", "lithuanian", "nepali", "norwegian", "persian", "polish",
    "portuguese", "romanian", "russian", "serbian", "sesotho", "spanish", "swedish", "tamil",
    "turkish", "yiddish",
]
LANGUAGES: tuple[str, ...] = get_args(TextLanguage)
DEFAULT_LANGUAGE: TextLanguage = "english"

_WORD = re.compile(r"[^\W_]+")
# PyStemmer's stemmers are not safe to share between threads; each thread (the event loop's, a
# worker thread tokenizing a large batch) keeps its own, each with its cache of stems.
_local = threading.local()


class _Stemmer(Protocol):
    def stemWords(self, words: list[str]) -> list[str]: ...


def _stemmer(language: str) -> _Stemmer | None:
    if language == "none":
        return None
    stemmers: dict[str, _Stemmer] | None = getattr(_local, "stemmers", None)
    if stemmers is None:
        stemmers = _local.stemmers = {}
    found = stemmers.get(language)
    if found is None:
        found = stemmers[language] = Stemmer.Stemmer(language, 100_000)
    return found


def text_of(payload: dict[str, Any] | None, field: str | None) -> str | None:
    """The text a payload gives its collection's text field: a string, or a list of strings
    (joined by spaces); None for anything else."""
    if field is None or not payload:
        return None
    value = payload.get(field)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return " ".join(value)
    return None


def words(text: str) -> list[str]:
    """The words of ``text`` (steps 1-3), not stemmed."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return [w for w in _WORD.findall(folded) if len(w) <= MAX_TERM_CHARS]


def terms(text: str, language: str) -> list[str]:
    """The terms of ``text``, in order, repeats kept."""
    found = words(text)
    stemmer = _stemmer(language)
    if stemmer is None or not found:
        return found
    # Stemming does not lengthen a word by more than a few characters; keep the bound exact.
    return [t for t in stemmer.stemWords(found) if 0 < len(t) <= MAX_TERM_CHARS]


def query_terms(query: str, language: str) -> list[str]:
    """The distinct terms of a query, in order of first appearance, at most ``MAX_QUERY_TERMS``."""
    return list(dict.fromkeys(terms(query, language)))[:MAX_QUERY_TERMS]


def document_terms(text: str | None, language: str) -> list[str] | None:
    """The terms a document is indexed with; None for no text or no terms (it is not indexed)."""
    if not text:
        return None
    return terms(text, language) or None


def idf(n_docs: int, df: int) -> float:
    value = math.log((n_docs - df + 0.5) / (df + 0.5)) if n_docs > 0 else 0.0
    return value if value > 0 else IDF_FLOOR


def bm25(tf: int, dl: int, avgdl: float, term_idf: float) -> float:
    """One term's part of a document's score."""
    if tf <= 0:
        return 0.0
    norm = 1 - B + B * dl / avgdl if avgdl > 0 else 1.0
    return term_idf * tf * (K1 + 1) / (tf + K1 * norm)


def upper_bound(term_idf: float) -> float:
    """The most one term adds to any document's score (``bm25`` as tf grows without bound)."""
    return term_idf * (K1 + 1)


def score(counts: Counter[str], query: Iterable[str], n_docs: int, avgdl: float, dfs: dict[str, int]) -> float:
    """A document's BM25 score (the reference the backends are tested against)."""
    dl = sum(counts.values())
    return sum(bm25(counts.get(t, 0), dl, avgdl, idf(n_docs, dfs.get(t, 0))) for t in query)
