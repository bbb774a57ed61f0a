"""Fixtures of the topi tests: one compiled module per (test module, target)."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from harness import TARGETS, Built, Case, build_cases  # noqa: E402


def target_available(target: str) -> str | None:
    """None if ``target`` can be built here, else the reason it cannot."""
    if target == "llvm":
        try:
            import llvmlite  # noqa: F401
            from kiln.codegen import llvm_module  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the environment
            return f"llvm codegen unavailable: {exc}"
    return None


def module_builder(cases: list[Case], prefix: str) -> Callable[[str], tuple[Any, list[Built]]]:
    """A memoised ``target -> (module, built cases)`` builder for one test module."""
    cache: dict[str, tuple[Any, list[Built]]] = {}

    def get(target: str) -> tuple[Any, list[Built]]:
        reason = target_available(target)
        if reason:
            pytest.skip(reason)
        if target not in cache:
            cache[target] = build_cases(cases, target, prefix)
        return cache[target]

    return get


def case_params(cases: list[Case]) -> list[Any]:
    """``pytest.param((target, index), id=...)`` for every case on every target."""
    return [pytest.param(t, i, id=f"{t}-{c.id}") for t in TARGETS for i, c in enumerate(cases)]
