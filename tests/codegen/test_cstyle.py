"""The one C-style printer (:mod:`kiln.codegen.cstyle`) behind the C, OpenCL C and CUDA C code.

* Structure: the host-C and the GPU code generators are subclasses of ``CStylePrinter`` and
  print no expression or statement of their own (naming, literals, operators, offsets and
  loops live in one place), and the GPU dialects are ``CDialect`` s like host C.
* Behaviour: constants at the edges of their types, NumPy integer wrap, floor division and
  NaN-propagating min/max compute the same on the ``c`` target and on OpenCL (PoCL), and
  agree with NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import codegen, te
from kiln.codegen.c import CCodeGen, HostC
from kiln.codegen.cstyle import CDialect, CStylePrinter
from kiln.codegen.cuda import CUDADialect
from kiln.codegen.gpu_source import GPUSourceGenerator
from kiln.codegen.opencl import OpenCLDialect

# What every C-style language prints alike: a code generator that redefines one of these has
# forked the printer again.
_SHARED = ("expr", "_binary", "_call", "_offset", "_nonneg", "_name", "_stmt", "_for", "_serial_loop",
           "float_literal", "int_literal", "helper_source", "_check_symbol")


@pytest.mark.parametrize("gen", [CCodeGen, GPUSourceGenerator])
def test_code_generators_print_through_the_one_base(gen: type) -> None:
    assert issubclass(gen, CStylePrinter)
    forked = [m for m in _SHARED if m in vars(gen)]
    assert not forked, f"{gen.__name__} redefines {forked}: change kiln.codegen.cstyle instead"


@pytest.mark.parametrize("dialect", [HostC, OpenCLDialect, CUDADialect])
def test_every_language_is_a_dialect(dialect: type) -> None:
    d = dialect()
    assert isinstance(d, CDialect)
    assert d.value_type("bool") == d.type_name("int32")  # bools compute as int, stored narrower
    with pytest.raises(kiln.runtime.errors.CompileError, match=f"{d.name} codegen: dtype complex64"):
        d.type_name("complex64")


N = 16
_I64_MIN, _I64_BIG, _I32_MIN = -(2**63), 2**62 + 12345, -(2**31)


def _edge_kernel():
    a = te.placeholder((N,), name="a", dtype="int8")
    u = te.placeholder((N,), name="u", dtype="uint16")
    x = te.placeholder((N,), name="x", dtype="int64")
    f = te.placeholder((N,), name="f", dtype="float32")
    outs = [
        # the products overflow the narrow type: NumPy wraps before dividing, C would promote to int
        te.compute((N,), lambda i: te.floordiv(a[i] * a[i] + a[i], te.const(7, "int8")), name="wrap_i8"),
        te.compute((N,), lambda i: (u[i] * u[i] - u[0]) // te.const(3, "uint16"), name="wrap_u16"),
        te.compute((N,), lambda i: te.floordiv(x[i], te.const(-3, "int64")) + te.floormod(x[i], te.const(5, "int64")),
                   name="floor_i64"),
        te.compute((N,), lambda i: te.if_then_else(x[i] < 0, te.const(_I64_MIN, "int64"), te.const(_I64_BIG, "int64")),
                   name="edge_i64"),
        te.compute((N,), lambda i: te.if_then_else(a[i] < 0, te.const(_I32_MIN, "int32"), te.const(2**31 - 1, "int32")),
                   name="edge_i32"),
        te.compute((N,), lambda i: te.maximum(f[i], te.const(0.5, "float32"))
                   + te.minimum(f[i], te.const(float("inf"), "float32")), name="nan_minmax"),
        te.compute((N,), lambda i: te.if_then_else(te.isnan(f[i]), te.const(float("-inf"), "float32"),
                                                   te.const(float("inf"), "float32")), name="special"),
    ]
    s = te.create_schedule([o.op for o in outs])
    return kiln.tir.lower(s, [a, u, x, f, *outs], name="edges"), outs


def _inputs() -> list[np.ndarray]:
    r = np.random.default_rng(7)
    a = r.integers(-128, 128, N).astype(np.int8)
    u = r.integers(0, 2**15, N).astype(np.uint16)  # u * u stays below INT_MAX after C's promotion
    x = r.integers(-(2**40), 2**40, N).astype(np.int64)
    f = r.standard_normal(N).astype(np.float32)
    f[::3] = np.nan
    return [a, u, x, f]


def _expected(a: np.ndarray, u: np.ndarray, x: np.ndarray, f: np.ndarray) -> list[np.ndarray]:
    with np.errstate(over="ignore"):
        return [
            (a * a + a) // np.int8(7),
            (u * u - u[0]) // np.uint16(3),
            x // -3 + x % 5,
            np.where(x < 0, np.int64(_I64_MIN), np.int64(_I64_BIG)),
            np.where(a < 0, np.int32(_I32_MIN), np.int32(2**31 - 1)),
            np.maximum(f, np.float32(0.5)) + np.minimum(f, np.float32(np.inf)),
            np.where(np.isnan(f), np.float32(-np.inf), np.float32(np.inf)),
        ]


@pytest.mark.parametrize("target", ["c", pytest.param("opencl", marks=pytest.mark.skipif(
    not kiln.opencl().exist, reason="no OpenCL device (install ocl-icd-libopencl1 and pocl-opencl-icd)"))])
def test_edge_constants_wrap_and_nan_semantics_agree_with_numpy(target: str) -> None:
    func, outs = _edge_kernel()
    mod = codegen.build_module([func], target)
    dev = kiln.cpu() if target == "c" else kiln.opencl()
    ins = _inputs()
    args = [kiln.nd.array(v, device=dev) for v in ins]
    res = [kiln.nd.empty((N,), o.dtype, dev) for o in outs]
    mod["edges"](*args, *res)
    for o, got, want in zip(outs, res, _expected(*ins)):
        np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{target}: {o.op.name}")
