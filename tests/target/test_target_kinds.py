"""Target parsing, host resolution, the kind registry, and an externally registered kind."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import codegen, te, tir
from kiln.runtime.errors import CompileError, TargetError
from kiln.target import Target, get_target_kind, host_cpu_name, list_target_kinds, register_target_kind


def test_parse_llvm_string():
    t = Target("llvm -mcpu=znver4 -mattr=+avx2,+fma")
    assert t.kind == "llvm" and t.kind.name == "llvm"
    assert t.attrs["mcpu"] == "znver4"
    assert t.mattr == ["+avx2", "+fma"]
    assert t.attrs["opt_level"] == 3  # default filled in
    assert t.keys == ["cpu"]
    assert str(t) == "llvm -mcpu=znver4 -mattr=+avx2,+fma"


def test_str_roundtrip_equality_hash():
    a = Target("llvm -mattr=+fma -mcpu=skylake -opt_level=2")
    b = Target(str(a))
    assert a == b and hash(a) == hash(b) and a == str(a)
    assert Target(a.export()) == a
    assert Target("c") != Target("llvm")
    assert len({Target("c"), Target("c"), Target("llvm")}) == 2


def test_dict_and_typed_options():
    t = Target({"kind": "llvm", "mcpu": "haswell", "fast_math": "true", "opt_level": "1"})
    assert t.attrs["fast_math"] is True and t.attrs["opt_level"] == 1
    assert Target("llvm -fast_math").attrs["fast_math"] is True  # bare flag
    assert Target("c -keys=cpu,arm_cpu").keys == ["cpu", "arm_cpu"]
    with pytest.raises(TargetError, match="opt_level.*expects int"):
        Target("llvm -opt_level=fast")
    with pytest.raises(TargetError, match="fast_math.*expects bool"):
        Target("llvm -fast_math=maybe")


def test_native_resolves_to_host():
    t = Target({"kind": "llvm", "mcpu": "native"})
    assert t.mcpu == host_cpu_name() != "native"
    assert t.mattr and all(f[0] in "+-" for f in t.mattr)
    assert Target("llvm -mcpu=native") == t


def test_unknown_kind_and_option_list_valid_ones():
    with pytest.raises(TargetError, match=r"unknown target kind 'cuda9'.*registered kinds: .*c, .*llvm"):
        Target("cuda9")
    with pytest.raises(TargetError, match=r"no option 'mcpux'; valid options: .*mcpu"):
        Target("llvm -mcpux=a")
    with pytest.raises(TargetError):
        Target("")
    with pytest.raises(TargetError):
        Target(42)
    assert isinstance(TargetError("x"), ValueError)


def test_register_duplicate_kind_rejected():
    with pytest.raises(TargetError, match="already registered"):
        register_target_kind("llvm")
    with pytest.raises(TargetError, match="must be"):
        register_target_kind("bad_opts_kind", {"x": (float, 0.0)})


def test_external_kind_with_reused_c_codegen():
    """A plug-in registers kind 'mycpu' + its codegen with public APIs only."""
    from kiln.codegen.c_module import build_c

    register_target_kind("mycpu", {"vector_width": (int, 8), "mcpu": (str, ""), "mattr": (list, []),
                                   "opt_level": (int, 2)}, default_keys=("cpu", "mycpu"), override=True)
    seen = {}

    def build_mycpu(funcs, target):
        seen["target"] = target
        return build_c(funcs, target, extra_options=[f"-DMYCPU_VW={target.attrs['vector_width']}", "-O1"])

    codegen.register_codegen("mycpu", build_mycpu, override=True)
    assert "mycpu" in list_target_kinds() and "mycpu" in codegen.list_codegens()
    t = Target("mycpu -vector_width=4")
    assert t.keys == ["cpu", "mycpu"] and get_target_kind("mycpu").options["vector_width"] == (int, 8)

    A = te.placeholder((10,), name="A")
    B = te.compute((10,), lambda i: A[i] * A[i], name="B")
    m = codegen.build_module(tir.lower(te.create_schedule(B), [A, B], "square"), t)
    assert "-DMYCPU_VW=4" in m.options and "-O1" in m.options
    a = np.arange(10, dtype="float32")
    b = np.zeros(10, "float32")
    m["square"](a, b)
    np.testing.assert_array_equal(b, a * a)
    assert seen["target"] == t


def test_kind_without_codegen():
    register_target_kind("nocodegen", {}, override=True)
    A = te.placeholder((2,), name="A")
    B = te.compute((2,), lambda i: A[i] + 1.0, name="B")
    f = tir.lower(te.create_schedule(B), [A, B], "f")
    with pytest.raises(CompileError, match=r"no code generator for target kind 'nocodegen'.*available: .*c"):
        codegen.build_module([f], "nocodegen")
