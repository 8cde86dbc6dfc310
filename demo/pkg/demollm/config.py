"""Engine configuration shaped like vLLM's VllmConfig (vllm/config/*.py, v0.20-era).

Env DEMOLLM_ENGINE picks how an LLM exposes what it was configured with:
  dict  ``llm.engine_config``, a dict of every engine argument (the default)
  vllm  ``llm.llm_engine.vllm_config`` with model / cache / scheduler /
        parallel / compilation sections and vLLM's attribute names
        (``cache_config.cache_dtype`` for kv_cache_dtype,
        ``scheduler_config.enable_chunked_prefill``, no
        ``chunked_prefill_enabled``, ``compilation_config.mode``, no
        ``level``); ``swap_space``, ``cpu_offload_gb``, ``disable_log_stats``
        and ``download_dir`` are kept nowhere, as in vLLM's sections here.
"""
import os
from types import SimpleNamespace

SHAPES = ("dict", "vllm")


def shape() -> str:
    """The configuration shape chosen by env DEMOLLM_ENGINE (default "dict")."""
    value = os.environ.get("DEMOLLM_ENGINE") or "dict"
    if value not in SHAPES:
        raise ValueError(f"unknown DEMOLLM_ENGINE {value!r}; expected one of {SHAPES}")
    return value


class VllmConfig:
    """Sections of vLLM's VllmConfig built from the effective engine arguments."""

    def __init__(self, cfg: dict):
        self.model_config = SimpleNamespace(
            model=cfg["model"], tokenizer=cfg["tokenizer"], revision=cfg["revision"],
            tokenizer_revision=None, tokenizer_mode=cfg["tokenizer_mode"],
            trust_remote_code=cfg["trust_remote_code"], dtype=cfg["dtype"],
            quantization=cfg["quantization"], seed=cfg["seed"],
            max_model_len=cfg["max_model_len"], enforce_eager=cfg["enforce_eager"],
            max_logprobs=20)
        self.cache_config = SimpleNamespace(
            gpu_memory_utilization=cfg["gpu_memory_utilization"], block_size=16,
            cache_dtype=cfg["kv_cache_dtype"],
            enable_prefix_caching=cfg["enable_prefix_caching"])
        self.scheduler_config = SimpleNamespace(
            max_num_seqs=cfg["max_num_seqs"],
            max_num_batched_tokens=cfg["max_num_batched_tokens"] or cfg["max_model_len"],
            enable_chunked_prefill=cfg["enable_chunked_prefill"])
        self.parallel_config = SimpleNamespace(
            tensor_parallel_size=cfg["tensor_parallel_size"],
            pipeline_parallel_size=cfg["pipeline_parallel_size"])
        self.compilation_config = SimpleNamespace(
            mode="NONE" if cfg["enforce_eager"] else "VLLM_COMPILE",
            cudagraph_mode="NONE" if cfg["enforce_eager"] else "FULL_AND_PIECEWISE")


class LLMEngine:
    """Holds ``vllm_config``, like vllm.v1.engine.llm_engine.LLMEngine."""

    def __init__(self, vllm_config: VllmConfig):
        self.vllm_config = vllm_config

    def get_vllm_config(self) -> VllmConfig:
        return self.vllm_config
