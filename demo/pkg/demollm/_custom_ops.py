"""Python wrappers of the compiled ops, shaped like vllm/_custom_ops.py."""
from demollm import _C
from demollm._mode import current_mode


def rms_norm(out, input, weight, epsilon: float) -> None:
    """RMS-normalize ``input`` ([rows, hidden] float32, flattened) into ``out``.

    Mirrors ``vllm._custom_ops.rms_norm(out, input, weight, epsilon)``:
    out[r, j] = input[r, j] / sqrt(mean(input[r, :]^2) + epsilon) * weight[j].
    Buffers are float32 buffer-protocol objects, e.g. ``array.array('f')``.
    """
    _C.rms_norm(out, input, weight, epsilon)
    if current_mode() == "broken-op":
        # Deliberately wrong result, so that an op probe compares unequal.
        for i in range(len(out)):
            out[i] *= 2.0
