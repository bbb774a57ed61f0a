"""The topi registry API and op coverage."""

from __future__ import annotations

import pytest

from kiln import te, topi
from kiln.ir import OpPattern, list_ops
from kiln.runtime.errors import KilnError
from kiln.topi import registry


def test_every_ir_op_has_a_compute() -> None:
    from kiln.ir.ops.control import CONTROL_OPS  # run by the executor, never lowered to a kernel
    from kiln.ir.ops.strings import HOST_OPS  # string ops: executor host nodes, no kernel

    # a tensor-expression compute, or a kernel written as loop IR (data-dependent outputs)
    missing = [op for op in list_ops()
               if op != "constant" and op not in CONTROL_OPS and op not in HOST_OPS
               and not topi.has_compute(op) and topi.get_prim_kernel(op) is None]
    assert missing == []
    assert not topi.has_compute("constant")


def _case_modules() -> list:
    """Every ``tests/topi/test_*.py`` module that defines kernel ``CASES``.

    Discovered rather than listed, so that a new compute's test module counts as soon as it
    exists (without editing this file).
    """
    import glob
    import importlib
    import os

    mods = []
    here = os.path.dirname(os.path.abspath(__file__))
    for path in sorted(glob.glob(os.path.join(here, "test_*.py"))):
        name = os.path.splitext(os.path.basename(path))[0]
        if name == "test_registry":
            continue
        # by its package name: pytest imported the same module under that name, so this is no re-import
        mod = importlib.import_module(f"{__package__}.{name}")
        if isinstance(getattr(mod, "CASES", None), list):
            mods.append(mod)
    return mods


#: Computes whose op only exists on symbolic dims, so a static harness case cannot build them;
#: each is tested through a dynamic graph instead (the test named).
_DYNAMIC_ONLY = {"dim_value": "tests/topi/test_data_dependent.py::test_dim_value_reads_runtime_extents"}


def test_every_compute_is_tested() -> None:
    tested = {c.op for m in _case_modules() for c in m.CASES} | set(_DYNAMIC_ONLY)
    assert sorted(set(topi.list_computes()) - tested) == []


def test_get_compute_missing_names_op() -> None:
    with pytest.raises(KilnError, match="no_such_op"):
        topi.get_compute("no_such_op")


def test_register_compute_duplicate_and_override() -> None:
    def f(attrs, inputs, out_types):  # noqa: ANN001, ANN202
        return [inputs[0]]

    topi.register_compute("__test_op", f)
    try:
        assert topi.get_compute("__test_op") is f
        with pytest.raises(KilnError):
            topi.register_compute("__test_op", f)
        g = topi.register_compute("__test_op", override=True)(lambda a, i, o: i)
        assert topi.get_compute("__test_op") is g
    finally:
        registry._COMPUTES.pop("__test_op", None)


def test_schedule_lookup_order() -> None:
    calls: list[str] = []

    def mk(tag: str):  # noqa: ANN202
        def fn(outs, target):  # noqa: ANN001, ANN202
            calls.append(tag)
            return te.create_schedule([o.op for o in outs])
        return fn

    keys = [("op:__sched_op", "llvm"), ("op:__sched_op", "generic")]
    try:
        x = te.placeholder((4,), name="x")
        y = te.compute((4,), lambda i: x[i] + 1.0, name="y")
        # pattern fallback: no op-specific schedule yet
        assert isinstance(topi.schedule_group("__sched_op", OpPattern.ELEMWISE, [y], "llvm"), te.Schedule)
        topi.register_schedule("__sched_op", "generic", mk("op-generic"))
        topi.register_schedule("__sched_op", "llvm", mk("op-llvm"))
        topi.schedule_group("__sched_op", OpPattern.ELEMWISE, [y], "llvm -mcpu=native")
        topi.schedule_group("__sched_op", OpPattern.ELEMWISE, [y], "c")
        topi.schedule_group("__sched_op", OpPattern.ELEMWISE, [y], None)
        assert calls == ["op-llvm", "op-generic", "op-generic"]
    finally:
        for k in keys:
            registry._SCHEDULES.pop(k, None)


def test_schedule_pattern_keys_and_target_objects() -> None:
    from kiln.target import Target

    assert topi.target_kind("llvm -mcpu=native") == "llvm"
    assert topi.target_kind(Target("c")) == "c"
    assert topi.target_kind(None) == "generic"
    assert topi.get_schedule(None, "injective", "c") is topi.get_schedule(None, OpPattern.INJECTIVE, "c")
    assert topi.get_schedule("dense", OpPattern.OUT_ELEMWISE_FUSABLE, "llvm") is not \
        topi.get_schedule(None, OpPattern.OUT_ELEMWISE_FUSABLE, "llvm")
    with pytest.raises(KilnError, match="no schedule"):
        topi.get_schedule("__nothing__", None, "c")
