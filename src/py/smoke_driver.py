"""Smoke driver for one oracle case or the probe (oracle-build).

Usage, inside the oracle venv, from a directory outside any source tree:

    python -I smoke_driver.py probe CONFIG.json OUT.json
    python -I smoke_driver.py case  CONFIG.json OUT.json

It targets vLLM's offline API exactly: ``LLM(model=..., revision=...,
**engine_args)``, ``SamplingParams(temperature=0.0, max_tokens=N,
logprobs=k)``, ``llm.generate([prompt], params)``, results read from
``RequestOutput.prompt_token_ids`` and ``.outputs[0]``. Errors are written as
data (stage, exception, traceback), never raised. One process per case.
"""
import importlib
import json
import math
import os
import random
import sys
import time
import traceback


def write(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def error(stage, exc):
    return {"stage": stage, "exception": "%s: %s" % (type(exc).__name__, exc),
            "traceback": traceback.format_exc()[-6000:]}


def probe(cfg):
    """Execute ``<package>._custom_ops.rms_norm`` once and compare with a reference.

    With torch importable the inputs are torch tensors on the recipe's device
    (vLLM's kernels); without torch they are float32 ``array`` buffers.
    """
    result = {"op": cfg["package"] + "._custom_ops.rms_norm", "ok": False}
    stage = "import"
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
        result["max_abs_error"] = err
        result["tolerance"] = cfg.get("tolerance", 1e-3)
        result["ok"] = bool(err <= result["tolerance"])
    except BaseException as exc:
        result["error"] = error(stage, exc)
    return result


def effective_config(llm, requested):
    """The engine configuration the engine actually got, read back."""
    cfg = getattr(llm, "engine_config", None)
    if isinstance(cfg, dict):
        return {k: cfg.get(k) for k in sorted(set(cfg) | set(requested)) if k in cfg}
    out = {}
    vcfg = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    if vcfg is not None:  # vLLM: read each knob from where it lives
        places = {
            "max_model_len": ("model_config", "max_model_len"),
            "dtype": ("model_config", "dtype"),
            "enforce_eager": ("model_config", "enforce_eager"),
            "gpu_memory_utilization": ("cache_config", "gpu_memory_utilization"),
            "max_num_seqs": ("scheduler_config", "max_num_seqs"),
            "tensor_parallel_size": ("parallel_config", "tensor_parallel_size"),
        }
        for key, (section, attr) in places.items():
            value = getattr(getattr(vcfg, section, None), attr, None)
            if value is not None:
                out[key] = value if isinstance(value, (bool, int, float, str)) else str(value).replace("torch.", "")
    return out


def case(cfg):
    result = {"case": cfg["name"], "runs": [], "error": None}
    stage = "import"
    try:
        module = importlib.import_module(cfg["package"])
        LLM, SamplingParams = module.LLM, module.SamplingParams
        stage = "load"
        kwargs = dict(cfg.get("engine_args") or {})
        if cfg.get("revision"):
            kwargs["revision"] = cfg["revision"]
        t0 = time.monotonic()
        llm = LLM(model=cfg["model"], **kwargs)
        result["load_s"] = time.monotonic() - t0
        result["engine_config"] = effective_config(llm, cfg.get("engine_args") or {})
        stage = "generate"
        k = cfg.get("logprobs") or None
        params = SamplingParams(temperature=0.0, max_tokens=cfg["max_tokens"], logprobs=k)
        prompt = cfg["prompt"] if cfg.get("prompt_token_ids") is None else {"prompt_token_ids": cfg["prompt_token_ids"]}
        for _ in range(cfg["runs"]):
            t0 = time.monotonic()
            out = llm.generate([prompt], params)[0]
            dt = time.monotonic() - t0
            comp = out.outputs[0]
            run = {
                "prompt_token_ids": list(out.prompt_token_ids),
                "output_token_ids": list(comp.token_ids),
                "text": comp.text,
                "seconds": dt,
                "tokens_per_s": (len(comp.token_ids) / dt) if dt > 0 else None,
            }
            if k and comp.logprobs:
                run["logprobs"] = [
                    {str(tid): lp.logprob for tid, lp in step.items()} for step in comp.logprobs
                ]
            result["runs"].append(run)
    except BaseException as exc:
        result["error"] = error(stage, exc)
    return result


def main():
    mode, cfg_path, out_path = sys.argv[1:4]
    with open(cfg_path) as f:
        cfg = json.load(f)
    write(out_path, probe(cfg) if mode == "probe" else case(cfg))


if __name__ == "__main__":
    main()
