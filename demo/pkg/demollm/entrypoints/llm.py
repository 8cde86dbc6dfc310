"""The offline LLM class, shaped like vllm.entrypoints.llm.LLM.

    llm = LLM(model="/path/to/model-dir", enforce_eager=True, max_model_len=256)
    outs = llm.generate(["The capital of France is"], SamplingParams(temperature=0))

Modes (see demollm._mode): "hang" makes LLM() sleep forever, "crash" makes
generate() raise RuntimeError("fixture crash"), "nondeterministic" flips the
token chosen at step FLIP_STEP on every even-numbered generate() call.
"""
import itertools
import math
import os
import random
import time
from typing import List, Optional, Sequence, Union

from demollm import _mode
from demollm import config as _config
from demollm import logprobs as _logprobs
from demollm.model import BigramModel, Tokenizer
from demollm.outputs import CompletionOutput, Logprob, RequestOutput
from demollm.sampling_params import SamplingParams

# Engine arguments accepted by LLM(**engine_args), with their defaults (as in vLLM's
# EngineArgs). max_model_len=None means "from max_position_embeddings in config.json".
ENGINE_ARG_DEFAULTS = {
    "tokenizer_mode": "auto",
    "trust_remote_code": False,
    "dtype": "auto",
    "quantization": None,
    "seed": 0,
    "max_model_len": None,
    "max_num_seqs": 256,
    "max_num_batched_tokens": None,
    "gpu_memory_utilization": 0.9,
    "swap_space": 4,
    "cpu_offload_gb": 0,
    "enforce_eager": False,
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "kv_cache_dtype": "auto",
    "enable_prefix_caching": None,
    "enable_chunked_prefill": True,
    "disable_log_stats": True,
    "download_dir": None,
}
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

# Step (0-based index of the generated token) flipped in "nondeterministic" mode.
FLIP_STEP = 3

_generate_calls = 0  # generate() calls in this process, for "nondeterministic" mode


def _next_call_number() -> int:
    """1-based generate() call number; kept in $DEMOLLM_COUNTER_FILE if set (across processes)."""
    global _generate_calls
    path = os.environ.get("DEMOLLM_COUNTER_FILE")
    if not path:
        _generate_calls += 1
        return _generate_calls
    try:
        with open(path) as f:
            n = int(f.read().strip() or 0) + 1
    except FileNotFoundError:
        n = 1
    with open(path, "w") as f:
        f.write(str(n))
    return n


class LLM:
    """Loads a demo model directory and generates text from prompts."""

    def __init__(self, model: str, revision: Optional[str] = None, tokenizer: Optional[str] = None,
                 **engine_args):
        for key in engine_args:
            if key not in ENGINE_ARG_DEFAULTS:
                raise TypeError(f"EngineArgs.__init__() got an unexpected keyword argument '{key}'")
        model = os.fspath(model)
        if not os.path.isdir(model):
            raise FileNotFoundError(f"demollm: model directory not found: {model}")
        tokenizer = os.fspath(tokenizer) if tokenizer is not None else model

        self.model = BigramModel(model)
        self.tokenizer = Tokenizer(tokenizer)
        if len(self.tokenizer.vocab) != self.model.vocab_size:
            raise ValueError(f"demollm: tokenizer has {len(self.tokenizer.vocab)} tokens, "
                             f"model vocab_size is {self.model.vocab_size}")

        cfg = dict(ENGINE_ARG_DEFAULTS, **engine_args)
        derived = self.model.max_position_embeddings
        if cfg["max_model_len"] is None:
            cfg["max_model_len"] = derived
        elif cfg["max_model_len"] > derived:
            raise ValueError(f"User-specified max_model_len ({cfg['max_model_len']}) is greater "
                             f"than the derived max_model_len (max_position_embeddings={derived} "
                             f"in model's config.json).")
        if cfg["dtype"] not in DTYPES:
            raise ValueError(f"Unknown dtype: {cfg['dtype']!r}; expected one of {DTYPES}")
        if not 0.0 < cfg["gpu_memory_utilization"] <= 1.0:
            raise ValueError("GPU memory utilization must be in (0, 1], got "
                             f"{cfg['gpu_memory_utilization']}.")
        for key in ("max_model_len", "max_num_seqs", "tensor_parallel_size"):
            if cfg[key] < 1:
                raise ValueError(f"{key} must be at least 1, got {cfg[key]}.")
        self._engine_config = dict(model=model, tokenizer=tokenizer, revision=revision, **cfg)
        self._shape = _config.shape()
        _logprobs.layout()  # an unknown DEMOLLM_LOGPROBS fails at load, not mid-run
        if self._shape == "vllm":
            self.llm_engine = _config.LLMEngine(_config.VllmConfig(self._engine_config))

        self.mode = _mode.current_mode(self.model.config.get("mode"))
        _mode.set_config_mode(self.model.config.get("mode"))
        if self.mode == "hang":
            while True:  # for timeout tests: never finish loading
                time.sleep(3600)

        self._rng = random.Random(cfg["seed"])
        self._request_ids = itertools.count()

    @property
    def engine_config(self) -> dict:
        """The effective engine arguments (defaults filled in), plus model/tokenizer/revision.

        Only with DEMOLLM_ENGINE=dict (the default); with "vllm" the
        configuration is ``llm_engine.vllm_config``, as in vLLM.
        """
        if self._shape != "dict":
            raise AttributeError("'LLM' object has no attribute 'engine_config'")
        return dict(self._engine_config)

    def get_tokenizer(self) -> Tokenizer:
        return self.tokenizer

    def generate(self, prompts, sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True, lora_request=None) -> List[RequestOutput]:
        """Generate completions for a prompt or a list of prompts.

        A prompt is a str, {"prompt": str} or {"prompt_token_ids": [int, ...]}.
        sampling_params is one SamplingParams for all prompts, or one per prompt.
        """
        if self.mode == "crash":
            raise RuntimeError("fixture crash")
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")

        flip = self.mode == "nondeterministic" and _next_call_number() % 2 == 0
        # Validate every request before running any, as vLLM does when adding requests.
        requests = [self._prepare(p, sp) for p, sp in zip(prompts, sampling_params)]
        return [self._run(*req, flip=flip) for req in requests]

    def _prepare(self, prompt, params: SamplingParams):
        """Tokenize and validate one request: returns (text, token_ids, params, max_tokens)."""
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = None, list(prompt["prompt_token_ids"])
        elif isinstance(prompt, dict) and "prompt" in prompt:
            text, ids = prompt["prompt"], self.tokenizer.encode(prompt["prompt"])
        else:
            raise TypeError(f"Invalid prompt: {prompt!r}")
        if not ids:
            raise ValueError("The decoder prompt cannot be empty")
        for t in ids:
            if not isinstance(t, int) or not 0 <= t < self.model.vocab_size:
                raise ValueError(f"Token id {t} is out of vocabulary")
        max_len = self._engine_config["max_model_len"]
        if len(ids) >= max_len:
            raise ValueError(f"The decoder prompt (length {len(ids)}) is longer than the maximum "
                             f"model length of {max_len}. Make sure that `max_model_len` is no "
                             f"smaller than the number of text tokens.")
        max_tokens = params.max_tokens if params.max_tokens is not None else max_len - len(ids)
        if len(ids) + max_tokens > max_len:
            raise ValueError(f"The prompt (length {len(ids)}) plus max_tokens ({max_tokens}) "
                             f"exceeds the maximum model length of {max_len}.")
        return text, ids, params, max_tokens

    def _run(self, text, prompt_ids, params: SamplingParams, max_tokens: int, flip: bool):
        """Run one validated request: n completions, each token chosen from _C's log-probs."""
        rng = random.Random(params.seed) if params.seed is not None else self._rng
        outputs = [self._complete(i, prompt_ids, params, max_tokens, rng, flip)
                   for i in range(params.n)]
        return RequestOutput(request_id=str(next(self._request_ids)), prompt=text,
                             prompt_token_ids=prompt_ids, outputs=outputs)

    def _complete(self, index, prompt_ids, params, max_tokens, rng, flip) -> CompletionOutput:
        eos = self.model.eos_token_id
        prev, token_ids, step_logprobs, cumulative = prompt_ids[-1], [], [], 0.0
        finish_reason = "length"
        for step in range(max_tokens):
            lp = self.model.next_logprobs(prev)
            ranked = sorted(range(len(lp)), key=lambda i: (-lp[i], i))  # ties -> lowest id
            tok = ranked[0] if params.temperature == 0.0 else self._sample(lp, ranked, params, rng)
            if flip and step == FLIP_STEP:  # "nondeterministic" mode
                tok = ranked[1] if tok == ranked[0] else ranked[0]
            if params.logprobs is not None:
                # Like vLLM: the sampled token first, then the top-k by rank (ranks are 1-based).
                shown = [tok] + [t for t in ranked[:params.logprobs] if t != tok]
                step_logprobs.append({t: Logprob(lp[t], ranked.index(t) + 1,
                                                 self.tokenizer.decode_token(t)) for t in shown})
            cumulative += lp[tok]
            token_ids.append(tok)
            prev = tok
            if tok == eos and not params.ignore_eos:
                finish_reason = "stop"
                break
        text = self.tokenizer.decode([t for t in token_ids if t != eos])  # skip special tokens
        return CompletionOutput(index=index, text=text, token_ids=token_ids,
                                cumulative_logprob=cumulative,
                                logprobs=(_logprobs.container(step_logprobs)
                                          if params.logprobs is not None else None),
                                finish_reason=finish_reason)

    @staticmethod
    def _sample(lp: List[float], ranked: List[int], params: SamplingParams, rng) -> int:
        """Temperature / top-k / top-p sampling with Python's random."""
        cands = ranked[:params.top_k] if params.top_k > 0 else ranked
        weights = [math.exp((lp[t] - lp[cands[0]]) / params.temperature) for t in cands]
        if params.top_p < 1.0:
            total, acc, keep = sum(weights), 0.0, 0
            while keep < len(cands) and acc < params.top_p * total:
                acc += weights[keep]
                keep += 1
            cands, weights = cands[:keep], weights[:keep]
        return rng.choices(cands, weights=weights)[0]
