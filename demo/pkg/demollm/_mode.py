"""Failure modes used by tests, chosen by env DEMOLLM_MODE or config.json "mode".

The environment variable wins over the model's config.  A mode set by a model's
config.json is remembered for the process once an LLM loads that model (so a
"broken-op" model also breaks demollm._custom_ops afterwards).
"""
import os

MODES = ("normal", "nondeterministic", "hang", "crash", "broken-op")

_config_mode = None  # mode of the most recently loaded model's config.json


def _check(mode, source):
    if mode not in MODES:
        raise ValueError(f"unknown demollm mode {mode!r} from {source}; expected one of {MODES}")
    return mode


def set_config_mode(mode):
    """Record the "mode" of a loaded model's config.json (None for none)."""
    global _config_mode
    _config_mode = None if mode is None else _check(mode, "config.json")


def current_mode(config_mode=None):
    """The effective mode: env DEMOLLM_MODE, else config_mode, else the last loaded model's."""
    env = os.environ.get("DEMOLLM_MODE")
    if env:
        return _check(env, "DEMOLLM_MODE")
    if config_mode is not None:
        return _check(config_mode, "config.json")
    return _config_mode or "normal"
