"""Declares the C extension demollm._C; all other metadata is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("demollm._C", sources=["csrc/ops.c"])])
