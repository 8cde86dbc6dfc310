"""Output types shaped like vllm.outputs (RequestOutput, CompletionOutput) and vLLM's Logprob."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from demollm.logprobs import Logprob  # noqa: F401  (re-exported, as vllm.outputs does)


@dataclass
class CompletionOutput:
    """One completion of a request."""

    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[List[Optional[Dict[int, Logprob]]]]  # or FlatLogprobs
    finish_reason: Optional[str] = None  # "length" or "stop"


@dataclass
class RequestOutput:
    """The result of one prompt passed to LLM.generate()."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput] = field(default_factory=list)
    prompt_logprobs: None = None
    finished: bool = True
