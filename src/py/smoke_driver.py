"""Smoke driver for one oracle case or the probe (oracle-build).

Usage, inside the oracle venv, from a directory outside any source tree:

    python -I smoke_driver.py probe CONFIG.json OUT.json
    python -I smoke_driver.py case  CONFIG.json OUT.json

It targets vLLM's offline API exactly: ``LLM(model=..., revision=...,
**engine_args)``, ``SamplingParams(temperature=0.0, max_tokens=N,
logprobs=k)``, ``llm.generate([prompt], params)`` with the prompt as raw text
(no chat template) or as ``{"prompt_token_ids": [...]}``, results read from
``RequestOutput.prompt_token_ids`` and ``.outputs[0].token_ids / .text /
.logprobs``. A case with several prompts (``prompts`` in its config) loads
the engine once and runs each prompt in turn, each run carrying its
``prompt_index``. The engine configuration the engine actually got is read back
and recorded. Errors are written as data (stage, exception, traceback, last
log lines), never raised; the caller enforces a timeout. After a case's runs
the shared objects its processes mapped (``/proc`` maps of this process and
every descendant, e.g. vLLM V1's engine core) are reported as ``mapped_objects``. One process per case,
with the case's environment; everything runs under the ``__main__`` guard.
"""
import collections
import enum
import importlib
import json
import logging
import math
import os
import random
import re
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
    if isinstance(value, enum.Enum):
        # Before the int check: vLLM's CompilationMode is an IntEnum
        # (vllm/config/compilation.py), recorded by name like CUDAGraphMode.
        return value.name
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
    A recipe for ``cuda`` without torch fails: the array path runs on the
    CPU, which proves nothing about the CUDA kernels the recipe asks for.
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
        except ImportError as exc:
            if cfg.get("device") == "cuda":
                raise RuntimeError(
                    "the recipe's target_device is cuda but torch cannot be imported "
                    "in the oracle (%s): the probe would run on the CPU and prove "
                    "nothing about the CUDA kernels" % exc)
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
    result = custom_probe(cfg) if cfg.get("module") else builtin_probe(cfg)
    # The probe runs a compiled op on the device: what it loaded is judged too.
    try:
        result["mapped_objects"] = mapped_objects()
    except Exception:
        result["mapped_objects"] = []
    return result


# Where vLLM keeps each engine knob: EngineArgs name -> the (VllmConfig
# section, attribute) places to try, first found wins. Checked against
# vllm/config/{model,cache,scheduler,parallel,compilation}.py of vLLM main at
# 2026-02 and at 2026-08: both carry ``SchedulerConfig.enable_chunked_prefill``
# and no ``chunked_prefill_enabled`` (only v0.9-era trees, one vllm/config.py,
# have that derived name, so it is tried second); ``CacheConfig.swap_space``
# is in the 2026-02 tree and gone by 2026-08; ``CompilationConfig.level`` is
# deprecated in favour of ``mode`` in 2026-02 and gone by 2026-08, so both
# are read.
VLLM_PLACES = {
    "max_model_len": [("model_config", "max_model_len")],
    "dtype": [("model_config", "dtype")],
    "enforce_eager": [("model_config", "enforce_eager")],
    "quantization": [("model_config", "quantization")],
    "seed": [("model_config", "seed")],
    "revision": [("model_config", "revision")],
    "tokenizer_revision": [("model_config", "tokenizer_revision")],
    "tokenizer_mode": [("model_config", "tokenizer_mode")],
    "trust_remote_code": [("model_config", "trust_remote_code")],
    "max_logprobs": [("model_config", "max_logprobs")],
    "gpu_memory_utilization": [("cache_config", "gpu_memory_utilization")],
    "block_size": [("cache_config", "block_size")],
    "kv_cache_dtype": [("cache_config", "cache_dtype")],
    "enable_prefix_caching": [("cache_config", "enable_prefix_caching")],
    "swap_space": [("cache_config", "swap_space")],
    "max_num_seqs": [("scheduler_config", "max_num_seqs")],
    "max_num_batched_tokens": [("scheduler_config", "max_num_batched_tokens")],
    "enable_chunked_prefill": [("scheduler_config", "enable_chunked_prefill"),
                               ("scheduler_config", "chunked_prefill_enabled")],
    "tensor_parallel_size": [("parallel_config", "tensor_parallel_size")],
    "pipeline_parallel_size": [("parallel_config", "pipeline_parallel_size")],
}

# Read as "compilation_config.<attr>" whenever present (not engine arguments).
COMPILATION_ATTRS = ("mode", "level", "cudagraph_mode")

_MISSING = object()


def _attr(obj, name):
    """``obj.name``, or _MISSING when obj is None or has no such attribute.

    ``hasattr`` is not enough: a pydantic dataclass can raise something
    other than AttributeError from a property, which would stop the read-back.
    """
    if obj is None:
        return _MISSING
    try:
        return getattr(obj, name)
    except Exception:
        return _MISSING


def effective_config(llm, engine_args=None):
    """The engine configuration the engine actually got, read back from it.

    Returns ``(config, unread)``: ``config`` maps knob names (EngineArgs
    spelling) to plain values; ``unread`` lists, for every knob the case
    passed in ``engine_args`` that could not be read back, ``{"knob",
    "reason"}``, so the gate can say that the recorded configuration is
    incomplete instead of silently leaving the knob out.

    vLLM keeps the configuration in ``llm.llm_engine.vllm_config`` (or
    ``get_vllm_config()``), sections ``model_config`` / ``cache_config`` /
    ``scheduler_config`` / ``parallel_config`` / ``compilation_config``
    (vllm/config/*.py), read knob by knob through VLLM_PLACES. An engine
    that exposes ``llm.engine_config`` as a dict (the test fixture's plain
    mode) is read as that dict.
    """
    engine_args = dict(engine_args or {})
    cfg = _attr(llm, "engine_config")
    if isinstance(cfg, dict):
        out = {str(k): plain(v) for k, v in cfg.items()}
        unread = [{"knob": k, "reason": "not in the engine's engine_config"}
                  for k in sorted(engine_args) if k not in out]
        return dict(sorted(out.items())), unread
    engine = _attr(llm, "llm_engine")
    vcfg = _attr(engine, "vllm_config")
    if vcfg is _MISSING or vcfg is None:
        getter = _attr(engine, "get_vllm_config")
        vcfg = None
        if callable(getter):
            try:
                vcfg = getter()
            except Exception:
                vcfg = None
    if vcfg is None:
        return {}, [{"knob": k, "reason": "the engine exposes no vllm_config"}
                    for k in sorted(engine_args)]
    out = {}
    for key, places in VLLM_PLACES.items():
        for section, attr in places:
            value = _attr(_attr(vcfg, section), attr)
            if value is not _MISSING:
                out[key] = plain(value)
                break
    model_config = _attr(vcfg, "model_config")
    if model_config is not _MISSING and model_config is not None:
        for attr in ("model", "tokenizer"):
            value = _attr(model_config, attr)
            out[attr] = None if value is _MISSING else plain(value)
    comp = _attr(vcfg, "compilation_config")
    for attr in COMPILATION_ATTRS:
        value = _attr(comp, attr)
        if value is not _MISSING:
            out["compilation_config." + attr] = plain(value)
    unread = []
    for knob in sorted(engine_args):
        if knob in out:
            continue
        places = VLLM_PLACES.get(knob)
        if places:
            reason = "none of %s exists on this engine's vllm_config" % ", ".join(
                "%s.%s" % p for p in places)
        else:
            reason = "oracle-build does not know where vLLM keeps it"
        unread.append({"knob": knob, "reason": reason})
    return dict(sorted(out.items())), unread


def _entries(token_ids, logprobs, ranks, tokens):
    """Top-k entries of one position, most likely first (ties: lowest id)."""
    entries = [{"id": int(t), "logprob": finite(lp), "rank": r, "token": d}
               for t, lp, r, d in zip(token_ids, logprobs, ranks, tokens)]
    entries.sort(key=lambda e: (-(e["logprob"] if e["logprob"] is not None else -1e300), e["id"]))
    return entries


def top_logprobs(step):
    """One position's {token id: Logprob} as a list, most likely first.

    A position may be ``None`` (vLLM's ``PromptLogprobs`` is
    ``list[dict[int, Logprob] | None]``; the first prompt position is None):
    it reads as an empty list, as does an empty dict.
    """
    if not step:
        return []
    ids, lps, ranks, tokens = [], [], [], []
    for tid, lp in step.items():
        ids.append(tid)
        lps.append(getattr(lp, "logprob", lp))
        ranks.append(getattr(lp, "rank", None))
        tokens.append(getattr(lp, "decoded_token", None))
    return _entries(ids, lps, ranks, tokens)


def _is_flat(logprobs):
    """Whether ``logprobs`` has vLLM's ``FlatLogprobs`` layout (vllm/logprobs.py)."""
    return all(isinstance(getattr(logprobs, name, None), list) for name in
               ("start_indices", "end_indices", "token_ids", "logprobs", "ranks",
                "decoded_tokens"))


def read_logprobs(logprobs):
    """Per-position top-k lists of a completion's ``logprobs``.

    Takes vLLM's ``FlatLogprobs`` (vllm/logprobs.py: flat ``token_ids`` /
    ``logprobs`` / ``ranks`` / ``decoded_tokens`` lists, position i spanning
    ``start_indices[i]:end_indices[i]``; a position appended as None spans
    nothing) read from its lists directly, or any sequence of
    ``dict[int, Logprob] | None``. None and empty positions read as [].
    """
    if logprobs is None:
        return []
    if _is_flat(logprobs):
        f = logprobs
        out = []
        for start, end in zip(f.start_indices, f.end_indices):
            out.append(_entries(f.token_ids[start:end], f.logprobs[start:end],
                                f.ranks[start:end], f.decoded_tokens[start:end]))
        return out
    return [top_logprobs(step) for step in logprobs]


def _accepted_fields(cls):
    """Keyword names ``cls(...)`` accepts, or None when they cannot be told.

    vLLM's SamplingParams is a ``msgspec.Struct`` (``__struct_fields__``,
    keyword construction); older ones and the fixture are plain classes or
    dataclasses (read through ``inspect.signature``).
    """
    fields = getattr(cls, "__struct_fields__", None)
    if fields:
        return set(fields)
    try:
        import inspect
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def sampling_params(SamplingParams, max_tokens, k):
    """``SamplingParams(temperature=0.0, max_tokens=N[, logprobs=k])``.

    Greedy decoding, ``logprobs`` only when asked for (vLLM's default is None:
    no logprobs; 0 would still return the sampled token's). A keyword the
    class does not accept raises a TypeError naming it and the accepted ones.
    """
    kwargs = {"temperature": 0.0, "max_tokens": max_tokens}
    if k:
        kwargs["logprobs"] = k
    accepted = _accepted_fields(SamplingParams)
    if accepted is not None:
        missing = sorted(set(kwargs) - accepted)
        if missing:
            raise TypeError("%s.%s accepts no %s (it takes %s)" % (
                SamplingParams.__module__, SamplingParams.__name__, ", ".join(missing),
                ", ".join(sorted(accepted))))
    return SamplingParams(**kwargs)


_SO = re.compile(r"\.so(\.[0-9][0-9.]*)?$")
MAX_PROCS = 256  # engine processes whose maps are read
MAX_MAPPED = 4096  # shared objects reported
MAX_MAPS_LINES = 200000  # lines read from one maps file


def _children(pid):
    """The child pids of ``pid``, from /proc/<pid>/task/<tid>/children (proc(5))."""
    out = []
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                out.extend(int(c) for c in f.read(65536).split())
        except (OSError, ValueError):
            pass
    return out


def mapped_objects():
    """The absolute paths of the shared objects this process and every
    descendant (vLLM's engine core runs in a child) have mapped now, from
    /proc/<pid>/maps: sorted, unique, bounded (MAX_PROCS processes,
    MAX_MAPPED paths). Empty where /proc cannot be read."""
    pids, seen = [os.getpid()], set()
    i = 0
    while i < len(pids) and len(pids) < MAX_PROCS:
        pid = pids[i]
        i += 1
        if pid in seen:
            continue
        seen.add(pid)
        pids.extend(c for c in _children(pid) if c not in seen)
    paths = set()
    for pid in pids[:MAX_PROCS]:
        try:
            with open("/proc/%d/maps" % pid) as f:
                for n, line in enumerate(f):
                    if n >= MAX_MAPS_LINES:
                        break
                    parts = line.rstrip("\n").split(None, 5)
                    if len(parts) < 6:
                        continue
                    path = parts[5]
                    if path.endswith(" (deleted)"):
                        path = path[: -len(" (deleted)")]
                    if path.startswith("/") and _SO.search(os.path.basename(path)):
                        paths.add(path)
        except OSError:
            pass
    return sorted(paths)[:MAX_MAPPED]


def case(cfg):
    result = {"case": cfg["name"], "runs": [], "error": None, "unread_engine_args": []}
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
        result["engine_config"], result["unread_engine_args"] = effective_config(llm, kwargs)
        stage = "sampling_params"
        k = cfg.get("logprobs") or None
        params = sampling_params(SamplingParams, cfg["max_tokens"], k)
        stage = "generate"
        several = cfg.get("prompts") is not None
        if several:
            prompts = list(cfg["prompts"])  # each on its own, raw text
        elif cfg.get("prompt_token_ids") is not None:
            prompts = [{"prompt_token_ids": list(cfg["prompt_token_ids"])}]
        else:
            prompts = [cfg["prompt"]]  # raw text, no chat template
        todo = [(p, i) for p in range(len(prompts)) for i in range(cfg["runs"])]
        for p, i in todo:
            prompt = prompts[p]
            if several:
                mark("generate (prompt %d of %d, run %d of %d)"
                     % (p + 1, len(prompts), i + 1, cfg["runs"]))
            else:
                mark("generate (run %d of %d)" % (i + 1, cfg["runs"]))
            t0 = time.monotonic()
            out = llm.generate([prompt], params, use_tqdm=False)[0]
            dt = time.monotonic() - t0
            comp = out.outputs[0]
            run = {
                # vLLM's RequestOutput.prompt_token_ids is ``list[int] | None``.
                "prompt_token_ids": (None if out.prompt_token_ids is None
                                     else [int(t) for t in out.prompt_token_ids]),
                "output_token_ids": [int(t) for t in comp.token_ids],
                "text": comp.text,
                "finish_reason": getattr(comp, "finish_reason", None),
                "seconds": dt,
                "tokens_per_s": (len(comp.token_ids) / dt) if dt > 0 else None,
            }
            if several:
                run["prompt_index"] = p
            if k and comp.logprobs is not None:
                run["logprobs"] = read_logprobs(comp.logprobs)
            result["runs"].append(run)
    except BaseException as exc:
        result["error"] = error(stage, exc)
    # Read while the engine (and its child processes) still runs.
    try:
        result["mapped_objects"] = mapped_objects()
    except Exception:  # never let this break the case's result
        result["mapped_objects"] = []
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
