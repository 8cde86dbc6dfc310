"""Logprob containers shaped like vllm/logprobs.py: ``Logprob`` and ``FlatLogprobs``.

``FlatLogprobs`` keeps every (position, rank) entry in flat lists; position i
spans ``start_indices[i]:end_indices[i]``. A position appended as None spans
nothing and reads back as an empty dict, as in vLLM. It is a read-only
sequence of ``dict[int, Logprob]`` (len, indexing, iteration).

Which container a completion carries is chosen by env DEMOLLM_LOGPROBS:
  list       list[dict[int, Logprob]] (the default, vLLM's default)
  flat       FlatLogprobs (vLLM with SamplingParams(flat_logprobs=True))
  list-none  a list whose position NONE_STEP is None
  flat-none  FlatLogprobs whose position NONE_STEP was appended as None
"""
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

LAYOUTS = ("list", "flat", "list-none", "flat-none")

# Position (0-based) left empty by the "-none" layouts.
NONE_STEP = 2


@dataclass
class Logprob:
    """Log-probability of one token at one step; rank is 1-based (1 = most likely)."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


@dataclass
class FlatLogprobs:
    """Flat per-position logprobs (the layout of vLLM's FlatLogprobs)."""

    start_indices: List[int] = field(default_factory=list)
    end_indices: List[int] = field(default_factory=list)
    token_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    ranks: List[Optional[int]] = field(default_factory=list)
    decoded_tokens: List[Optional[str]] = field(default_factory=list)

    def append(self, position: Optional[Dict[int, Logprob]]) -> None:
        """Add the next position (None: a position without entries)."""
        self.start_indices.append(len(self.logprobs))
        for tid, lp in (position or {}).items():
            self.token_ids.append(tid)
            self.logprobs.append(lp.logprob)
            self.ranks.append(lp.rank)
            self.decoded_tokens.append(lp.decoded_token)
        self.end_indices.append(len(self.logprobs))

    def __len__(self) -> int:
        return len(self.start_indices)

    def __getitem__(self, i: int) -> Dict[int, Logprob]:
        if not isinstance(i, int):
            raise TypeError(f"Invalid index type: {type(i)}")
        return {self.token_ids[j]: Logprob(self.logprobs[j], self.ranks[j], self.decoded_tokens[j])
                for j in range(self.start_indices[i], self.end_indices[i])}

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


def layout() -> str:
    """The container layout chosen by env DEMOLLM_LOGPROBS (default "list")."""
    value = os.environ.get("DEMOLLM_LOGPROBS") or "list"
    if value not in LAYOUTS:
        raise ValueError(f"unknown DEMOLLM_LOGPROBS {value!r}; expected one of {LAYOUTS}")
    return value


def container(steps: List[Dict[int, Logprob]]):
    """The completion's ``logprobs`` for per-step dicts, in the chosen layout."""
    chosen = layout()
    if chosen.endswith("-none") and len(steps) > NONE_STEP:
        steps = list(steps)
        steps[NONE_STEP] = None
    if chosen.startswith("flat"):
        flat = FlatLogprobs()
        for step in steps:
            flat.append(step)
        return flat
    return list(steps)
