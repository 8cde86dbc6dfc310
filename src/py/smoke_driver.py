"""Smoke driver for one oracle case or the probe (oracle-build).

Usage, inside the oracle venv, from a directory outside any source tree:

    python -I smoke_driver.py probe CONFIG.json OUT.json
    python -I smoke_driver.py case  CONFIG.json OUT.json

It targets vLLM's offline API exactly: ``LLM(model=..., revision=...,
**engine_args)``, ``SamplingParams(temperature=0.0, max_tokens=N,
logprobs=k)``, ``llm.generate([prompt], params)`` with the prompt as raw text
(no chat template) or as ``{"prompt_token_ids": [...]}``, results read from
``RequestOutput.prompt_token_ids`` and ``.outputs[0].token_ids / .text /
.logprobs``. The engine configuration the engine actually got is read back
and recorded. Errors are written as data (stage, exception, traceback, last
log lines), never raised; the caller enforces a timeout. One process per case,
with the case's environment; everything runs under the ``__main__`` guard.
"""
import collections
import importlib
import json
import logging
import math
import os
import random
import sys
import time
import traceback

_LOG = collections.deque(maxlen=30)  # last log records, reported with an error


class _Tail(logging.Handler):
    def emit(self, record):
        try:
            _LOG.append(self.format(record))
        except Exception:  # never let logging break the driver
            pass


def capture_logs(*names):
    """Keep the last log records of the root logger and of ``names``."""
    handler = _Tail()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for name in (None,) + names:
        logger = logging.getLogger(name)
        if handler not in logger.handlers:
            logger.addHandler(handler)


_STAGE_FILE = None  # where the current stage is written, so a timeout can name it


def mark(stage):
    """Record the stage being entered (read by oracle-build when it has to kill us)."""
    if _STAGE_FILE:
        try:
            with open(_STAGE_FILE, "w") as f:
                f.write(stage)
        except OSError:
            pass


def write(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, allow_nan=False)
    os.replace(tmp, path)


def error(stage, exc):
    return {"stage": stage, "exception": "%s: %s" % (type(exc).__name__, exc),
            "traceback": traceback.format_exc()[-6000:], "log": list(_LOG)}


def finite(x):
    """A float, or None for NaN / infinities (JSON has neither)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def plain(value):
    """A JSON-able rendering of an engine-config value (dtype torch.bfloat16 -> "bfloat16")."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return finite(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    name = getattr(value, "name", None)  # enums
    if isinstance(name, str) and type(value).__module__ != "builtins":
        return name
    return str(value).replace("torch.", "")


def builtin_probe(cfg):
    """Execute ``<package>._custom_ops.rms_norm`` once and compare with a reference.

    With torch importable the inputs are torch tensors on the recipe's device
    (vLLM's kernels, reference computed by torch); without torch they are
    float32 ``array`` buffers (the test fixture) and the reference is Python.
    """
    result = {"op": cfg["package"] + "._custom_ops.rms_norm", "ok": False}
    stage = "import"
    mark("probe")
    try:
        ops = importlib.import_module(cfg["package"] + "._custom_ops")
        rows, hidden, eps = 4, 64, 1e-6
        rng = random.Random(0)
        try:
            import torch
        except ImportError:
            torch = None
        stage = "run"
        if torch is not None:
            device = "cuda" if cfg.get("device") == "cuda" else "cpu"
            if device == "cuda" and not torch.cuda.is_available():
                raise RuntimeError("torch reports no CUDA device")
            gen = torch.Generator(device="cpu").manual_seed(0)
            x = torch.randn(rows, hidden, generator=gen).to(device)
            w = torch.randn(hidden, generator=gen).to(device)
            out = torch.empty_like(x)
            ops.rms_norm(out, x, w, eps)
            if device == "cuda":
                torch.cuda.synchronize()
                result["device_name"] = torch.cuda.get_device_name()
            ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
            err = (out - ref).abs().max().item()
            result["device"] = device
            result["backend"] = "torch"
        else:
            import array
            x = array.array("f", [rng.uniform(-2, 2) for _ in range(rows * hidden)])
            w = array.array("f", [rng.uniform(0.5, 1.5) for _ in range(hidden)])
            out = array.array("f", [0.0] * (rows * hidden))
            ops.rms_norm(out, x, w, eps)
            err = 0.0
            for r in range(rows):
                row = x[r * hidden:(r + 1) * hidden]
                scale = 1.0 / math.sqrt(sum(v * v for v in row) / hidden + eps)
                for j in range(hidden):
                    err = max(err, abs(out[r * hidden + j] - row[j] * scale * w[j]))
            result["device"] = "cpu"
            result["backend"] = "array"
        result["max_abs_error"] = finite(err)
        result["tolerance"] = cfg.get("tolerance", 1e-3)
        result["ok"] = result["max_abs_error"] is not None and err <= result["tolerance"]
    except BaseException as exc:
        result["error"] = error(stage, exc)
    return result


def custom_probe(cfg):
    """Call ``function(device)`` of the recipe's probe module.

    Passes on a true return value, or a dict whose "ok" is true (recorded).
    """
    result = {"op": "%s.%s" % (cfg["module"], cfg["function"]), "ok": False,
              "device": cfg.get("device")}
    stage = "import"
    mark("probe")
    try:
        fn = getattr(importlib.import_module(cfg["module"]), cfg["function"])
        stage = "run"
        value = fn(cfg.get("device"))
        if isinstance(value, dict):
            result.update({str(k): plain(v) for k, v in value.items() if k != "op"})
            result["ok"] = bool(value.get("ok"))
        else:
            result["ok"] = bool(value)
            result["returned"] = repr(value)[:200]
    except BaseException as exc:
        result["error"] = error(stage, exc)
    return result


def probe(cfg):
    return custom_probe(cfg) if cfg.get("module") else builtin_probe(cfg)


# Where vLLM keeps each engine knob: EngineArgs name -> (VllmConfig section, attribute).
VLLM_PLACES = {
    "max_model_len": ("model_config", "max_model_len"),
    "dtype": ("model_config", "dtype"),
    "enforce_eager": ("model_config", "enforce_eager"),
    "quantization": ("model_config", "quantization"),
    "seed": ("model_config", "seed"),
    "revision": ("model_config", "revision"),
    "tokenizer_revision": ("model_config", "tokenizer_revision"),
    "tokenizer_mode": ("model_config", "tokenizer_mode"),
    "trust_remote_code": ("model_config", "trust_remote_code"),
    "max_logprobs": ("model_config", "max_logprobs"),
    "gpu_memory_utilization": ("cache_config", "gpu_memory_utilization"),
    "block_size": ("cache_config", "block_size"),
    "kv_cache_dtype": ("cache_config", "cache_dtype"),
    "enable_prefix_caching": ("cache_config", "enable_prefix_caching"),
    "max_num_seqs": ("scheduler_config", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
    "enable_chunked_prefill": ("scheduler_config", "chunked_prefill_enabled"),
    "tensor_parallel_size": ("parallel_config", "tensor_parallel_size"),
    "pipeline_parallel_size": ("parallel_config", "pipeline_parallel_size"),
}


def effective_config(llm):
    """The engine configuration the engine actually got, read back from it.

    The test fixture exposes ``llm.engine_config`` (a dict); vLLM keeps it in
    ``llm.llm_engine.vllm_config`` (model / cache / scheduler / parallel
    sections), read knob by knob.
    """
    cfg = getattr(llm, "engine_config", None)
    if isinstance(cfg, dict):
        return {str(k): plain(v) for k, v in sorted(cfg.items())}
    engine = getattr(llm, "llm_engine", None)
    vcfg = getattr(engine, "vllm_config", None)
    if vcfg is None and hasattr(engine, "get_vllm_config"):
        vcfg = engine.get_vllm_config()
    out = {}
    if vcfg is None:
        return out
    for key, (section, attr) in VLLM_PLACES.items():
        sect = getattr(vcfg, section, None)
        if sect is not None and hasattr(sect, attr):
            out[key] = plain(getattr(sect, attr))
    model_config = getattr(vcfg, "model_config", None)
    if model_config is not None:
        out["model"] = plain(getattr(model_config, "model", None))
        out["tokenizer"] = plain(getattr(model_config, "tokenizer", None))
    comp = getattr(vcfg, "compilation_config", None)
    for attr in ("mode", "level", "cudagraph_mode"):
        if comp is not None and hasattr(comp, attr):
            out["compilation_config." + attr] = plain(getattr(comp, attr))
    return dict(sorted(out.items()))


def top_logprobs(step):
    """One step's {token id: Logprob} as a list, most likely first."""
    entries = []
    for tid, lp in step.items():
        entries.append({"id": int(tid), "logprob": finite(getattr(lp, "logprob", lp)),
                        "rank": getattr(lp, "rank", None),
                        "token": getattr(lp, "decoded_token", None)})
    entries.sort(key=lambda e: (-(e["logprob"] if e["logprob"] is not None else -1e300), e["id"]))
    return entries


def case(cfg):
    result = {"case": cfg["name"], "runs": [], "error": None}
    stage = "import"
    mark(stage)
    try:
        module = importlib.import_module(cfg["package"])
        capture_logs(cfg["package"])
        result["package_version"] = getattr(module, "__version__", None)
        LLM, SamplingParams = module.LLM, module.SamplingParams
        stage = "load"
        mark(stage)
        kwargs = dict(cfg.get("engine_args") or {})
        if cfg.get("revision"):
            kwargs["revision"] = cfg["revision"]
        t0 = time.monotonic()
        llm = LLM(model=cfg["model"], **kwargs)
        result["load_s"] = time.monotonic() - t0
        stage = "engine_config"
        result["engine_config"] = effective_config(llm)
        stage = "generate"
        k = cfg.get("logprobs") or None
        params = SamplingParams(temperature=0.0, max_tokens=cfg["max_tokens"], logprobs=k)
        if cfg.get("prompt_token_ids") is not None:
            prompt = {"prompt_token_ids": list(cfg["prompt_token_ids"])}
        else:
            prompt = cfg["prompt"]  # raw text, no chat template
        for i in range(cfg["runs"]):
            mark("generate (run %d of %d)" % (i + 1, cfg["runs"]))
            t0 = time.monotonic()
            out = llm.generate([prompt], params, use_tqdm=False)[0]
            dt = time.monotonic() - t0
            comp = out.outputs[0]
            run = {
                "prompt_token_ids": [int(t) for t in out.prompt_token_ids],
                "output_token_ids": [int(t) for t in comp.token_ids],
                "text": comp.text,
                "finish_reason": getattr(comp, "finish_reason", None),
                "seconds": dt,
                "tokens_per_s": (len(comp.token_ids) / dt) if dt > 0 else None,
            }
            if k and comp.logprobs:
                run["logprobs"] = [top_logprobs(step) for step in comp.logprobs]
            result["runs"].append(run)
    except BaseException as exc:
        result["error"] = error(stage, exc)
    return result


def main():
    global _STAGE_FILE
    mode, cfg_path, out_path = sys.argv[1:4]
    with open(cfg_path) as f:
        cfg = json.load(f)
    _STAGE_FILE = out_path + ".stage"
    write(out_path, probe(cfg) if mode == "probe" else case(cfg))
    sys.stdout.flush()
    sys.stderr.flush()
    # An engine's background threads can keep the interpreter from exiting;
    # the result is written, so leave now.
    os._exit(0)


if __name__ == "__main__":
    main()
