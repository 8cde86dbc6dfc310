"""The demo "model": a bigram logit table loaded from a model directory.

Model directory layout:
  config.json   {"model_type": "demo-bigram", "vocab_size": N,
                 "max_position_embeddings": 256, "eos_token_id": 1 (optional),
                 "mode": "normal" (optional, see demollm._mode)}
  vocab.json    list of N token strings; the index is the token id.
                Must contain "<unk>" (used for unknown words).
  weights.json  {"bigram": [[float] * N] * N}: row p holds the logits of the
                token following token p.

Logits and log-softmax are computed by the compiled extension demollm._C.
"""
import array
import json
import os
import re
from typing import List

from demollm import _C

_WORD = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


def _read_json(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"demollm: missing model file: {path}")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class Tokenizer:
    """Lowercases, splits words and punctuation, maps unknown words to <unk>."""

    def __init__(self, path: str):
        self.vocab: List[str] = _read_json(os.path.join(path, "vocab.json"))
        self.ids = {tok: i for i, tok in enumerate(self.vocab)}
        if "<unk>" not in self.ids:
            raise ValueError(f"demollm: {path}/vocab.json has no <unk> token")
        self.unk_id = self.ids["<unk>"]

    def encode(self, text: str) -> List[int]:
        return [self.ids.get(w, self.unk_id) for w in _WORD.findall(text.lower())]

    def decode_token(self, token_id: int) -> str:
        """One token as it appears in continuation text: preceded by a space."""
        return " " + self.vocab[token_id]

    def decode(self, token_ids: List[int]) -> str:
        return "".join(self.decode_token(t) for t in token_ids)


class BigramModel:
    """Weights and config of one model directory."""

    def __init__(self, path: str):
        self.config = _read_json(os.path.join(path, "config.json"))
        if self.config.get("model_type") != "demo-bigram":
            raise ValueError(f"demollm: {path}: model_type must be 'demo-bigram', "
                             f"got {self.config.get('model_type')!r}")
        self.vocab_size = int(self.config["vocab_size"])
        self.max_position_embeddings = int(self.config.get("max_position_embeddings", 256))
        self.eos_token_id = self.config.get("eos_token_id")
        rows = _read_json(os.path.join(path, "weights.json"))["bigram"]
        if len(rows) != self.vocab_size or any(len(r) != self.vocab_size for r in rows):
            raise ValueError(f"demollm: {path}/weights.json: bigram table must be "
                             f"{self.vocab_size} x {self.vocab_size}")
        # Flattened float32 table, read by the C extension.
        self.table = array.array("f", (x for row in rows for x in row))

    def next_logprobs(self, prev_token: int) -> List[float]:
        """Log-probabilities of the next token given the previous one (via demollm._C)."""
        return _C.log_softmax(_C.next_logits(self.table, self.vocab_size, prev_token))
