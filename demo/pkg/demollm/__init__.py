"""demollm: a tiny vLLM-shaped package for testing oracle-build.

Offline API like vLLM's: ``from demollm import LLM, SamplingParams``.
Generation runs a bigram model through the compiled extension ``demollm._C``.
"""
from demollm._version import __version__
from demollm.entrypoints.llm import LLM
from demollm.outputs import CompletionOutput, Logprob, RequestOutput
from demollm.sampling_params import SamplingParams

__all__ = [
    "__version__",
    "LLM",
    "SamplingParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
]
