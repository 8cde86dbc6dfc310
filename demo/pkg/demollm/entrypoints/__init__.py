"""Entry points, like vllm.entrypoints (only the offline LLM class here)."""
