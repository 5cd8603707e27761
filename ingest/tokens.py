"""Token counts from the embedding model's own tokenizer, without torch.

The ``tokenizers`` library reads the model directory's ``tokenizer.json`` (a few MB, loaded in
~0.1 s), so parse worker processes can count word pieces exactly as the model will, without
importing sentence-transformers. ``model_max_tokens`` reads ``sentence_bert_config.json``: the
number of word pieces the model reads, two of which are its ``[CLS]`` and ``[SEP]`` markers.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass

SPECIAL_TOKENS = 2  # [CLS] … [SEP]: the model's window holds this many besides the text
_FALLBACK_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
COUNT_BATCH_CHARS = 1 << 20  # characters a count_many batch encodes at once (~30 bytes each)


@dataclass(frozen=True)
class TokenSpan:
    """A token's character range in the text it came from, and the word it belongs to."""

    start: int
    end: int
    word: int


class TextTokenizer:
    """Counts and locates word pieces; a regex fallback when the model has no tokenizer.json."""

    def __init__(self, tokenizer_json: str | None) -> None:
        self._tok = None
        if tokenizer_json is not None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(tokenizer_json)
            tok.no_truncation()
            tok.no_padding()
            self._tok = tok

    @property
    def exact(self) -> bool:
        """True when counts come from the model's tokenizer, not the word/punctuation estimate."""
        return self._tok is not None

    def count(self, text: str) -> int:
        if self._tok is None:
            return len(_FALLBACK_TOKEN.findall(text))
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        """Token counts, encoded in batches of at most :data:`COUNT_BATCH_CHARS` characters: an
        encoding holds ~150 bytes a token, and ``tokenizers`` (Rust) aborts the process when an
        allocation fails under the parse worker's memory cap, rather than raise MemoryError
        (a whole 24 MB text in one batch did, under 700 MB)."""
        if self._tok is None:
            return [self.count(t) for t in texts]
        counts: list[int] = []
        batch: list[str] = []
        size = 0
        for text in texts:
            if batch and size + len(text) > COUNT_BATCH_CHARS:
                counts += [len(e.ids) for e in self._tok.encode_batch(batch, add_special_tokens=False)]
                batch, size = [], 0
            batch.append(text)
            size += len(text)
        if batch:
            counts += [len(e.ids) for e in self._tok.encode_batch(batch, add_special_tokens=False)]
        return counts

    def spans(self, text: str) -> list[TokenSpan]:
        """Each token's character span in ``text`` and its word index (cuts go between words)."""
        if self._tok is None:
            return [TokenSpan(m.start(), m.end(), i) for i, m in enumerate(_FALLBACK_TOKEN.finditer(text))]
        enc = self._tok.encode(text, add_special_tokens=False)
        words = enc.word_ids
        return [
            TokenSpan(start, end, w if (w := words[i]) is not None else i)
            for i, (start, end) in enumerate(enc.offsets)
        ]


def _local_dir(model: str) -> str | None:
    path = os.path.expanduser(model)
    return path if os.path.isdir(path) else None


@functools.lru_cache(maxsize=8)
def load_tokenizer(model: str) -> TextTokenizer:
    """The tokenizer of ``model`` (a directory or a name), cached per process."""
    local = _local_dir(model)
    if local and os.path.isfile(os.path.join(local, "tokenizer.json")):
        return TextTokenizer(os.path.join(local, "tokenizer.json"))
    cached = _hub_cached_file(model, "tokenizer.json")
    return TextTokenizer(cached)


@functools.lru_cache(maxsize=8)
def model_max_tokens(model: str) -> int | None:
    """Word pieces ``model`` reads, special markers included (256 for all-MiniLM-L6-v2)."""
    local = _local_dir(model)
    path = (
        os.path.join(local, "sentence_bert_config.json")
        if local
        else _hub_cached_file(model, "sentence_bert_config.json")
    )
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        value = json.load(fh).get("max_seq_length")
    return int(value) if value else None


def model_text_tokens(model: str) -> int | None:
    """Word pieces of a chunk's own text that the model reads (its window less the markers)."""
    window = model_max_tokens(model)
    return None if window is None else window - SPECIAL_TOKENS


def _hub_cached_file(model: str, filename: str) -> str | None:
    """A file of a hub model already in the local cache (never downloads)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency of sentence-transformers
        return None
    try:
        found = try_to_load_from_cache(model, filename)
    except Exception:  # noqa: BLE001 - a malformed name just means "not cached"
        return None
    return found if isinstance(found, str) else None
