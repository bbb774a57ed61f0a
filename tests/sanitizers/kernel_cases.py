"""Run kernel cases built for the ``c`` target with sanitizer flags; the child process of
``test_sanitizers.py`` (which sets ``LD_PRELOAD`` to the sanitizer runtime).

Usage::

    python -m tests.sanitizers.kernel_cases GROUP [GROUP ...]

Groups reuse the topi harness's case lists (each group compiles into one module, as the topi
tests do), plus ``cnn`` (a small CNN through ``kiln.build`` and the graph executor) and
``gather_zero_axis`` (ONNX Gather on an empty axis). The C flags come from ``KILN_SAN_CFLAGS``
(space-separated), passed through the ``c`` target's ``-cflags`` option. Prints one ``ok``
line per case; a sanitizer report aborts the process (ASan) or is printed (UBSan).
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any, Callable

import numpy as np

from kiln.runtime import ndarray as nd
from kiln.runtime.device import ALLOC_ALIGNMENT, CPUDeviceAPI, DeviceType, register_device_api
from kiln.runtime.errors import DeviceError

#: Sanitizer flags (appended after the target's ``-O3``, so ``-O0`` wins). ``-O0`` because
#: compiling dominates this job (test_nn's 50 kernels: 110 s at -O3, 33 s at -O1, 10 s at -O0
#: on a busy 2-core Zen 3) while ASan checks every access the source makes at any level; set
#: ``KILN_SAN_CFLAGS`` for an optimized run (see docs/dev/fuzzing.md).
DEFAULT_CFLAGS = "-fsanitize=address -fsanitize=undefined -fno-omit-frame-pointer -O0"


def sanitizer_target() -> Any:
    """The ``c`` target with the sanitizer flags appended (``-cflags`` come last, so they win).

    One flag per sanitizer (no ``-fsanitize=a,b``): the target's string form joins list
    options with commas.
    """
    from kiln.target import Target

    flags = os.environ.get("KILN_SAN_CFLAGS", DEFAULT_CFLAGS).split()
    return Target({"kind": "c", "cflags": flags})


def _harness_group(cases: list[Any], prefix: str) -> None:
    from tests.topi.harness import build_cases, run_and_check

    mod, built = build_cases(cases, sanitizer_target(), prefix)
    for b in built:
        run_and_check(mod, b)
        print("ok", b.case.id, flush=True)


def _fused_group() -> None:
    from kiln import codegen
    from tests.topi.harness import fused_reference, lower_fused, make_inputs
    from tests.topi.test_fused import GROUPS

    target = sanitizer_target()
    funcs = [lower_fused(g, f"san_fz_{i}", target)[0] for i, g in enumerate(GROUPS)]
    mod = codegen.build_module(funcs, target)
    for i, g in enumerate(GROUPS):
        xs = make_inputs(g, i)  # type: ignore[arg-type]  # Fused has the Case fields make_inputs reads
        ref = np.asarray(fused_reference(g, xs))
        out = nd.empty(ref.shape, str(ref.dtype))
        mod[f"san_fz_{i}"](*[nd.array(x) for x in xs], out)
        np.testing.assert_allclose(out.numpy(), ref, rtol=g.rtol, atol=g.atol, err_msg=g.label)
        print("ok", g.label, flush=True)


def _cnn() -> None:
    """conv-bias-relu → max pool → depthwise conv → global avg pool → dense → softmax."""
    import kiln
    from kiln import ir

    rng = np.random.default_rng(0)
    g = ir.Graph("san_cnn")
    x = g.add_input("x", (1, 3, 17, 17), "float32")
    params = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype("float32") * 0.3,
        "b1": rng.standard_normal(8).astype("float32"),
        "w2": rng.standard_normal((8, 1, 3, 3)).astype("float32") * 0.3,
        "fc": rng.standard_normal((5, 8)).astype("float32"),
    }
    w = {k: g.add_input(k, v.shape, "float32") for k, v in params.items()}
    y = g.add("relu", g.add("bias_add", g.add("conv2d", x, w["w1"], padding=(1, 1, 1, 1)), w["b1"], axis=1))
    y = g.add("max_pool2d", y, pool_size=(3, 3), strides=(2, 2), ceil_mode=True)
    y = g.add("conv2d", y, w["w2"], groups=8, padding=(1, 1, 1, 1))
    y = g.add("reshape", g.add("reduce_mean", y, axes=(2, 3), keepdims=True), newshape=(1, 8))
    g.outputs = [g.add("softmax", g.add("dense", y, w["fc"]), axis=-1)]
    data = rng.standard_normal((1, 3, 17, 17)).astype("float32")
    ref = ir.evaluate(g, {"x": data}, params)[0]
    factory = kiln.build(g, target=sanitizer_target(), params=params)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.run(x=data)
    np.testing.assert_allclose(m.get_output(0).numpy(), ref, rtol=1e-4, atol=1e-5)
    print("ok cnn", flush=True)


#: (data shape, axis, fused with a Relu) of the Gather-on-an-empty-axis cases.
GATHER_ZERO_AXIS = (((0, 3), 0, False), ((4, 0), 1, True), ((2, 0, 3), 1, False))


def _gather_zero_axis() -> None:
    """ONNX Gather along an axis of size 0, alone and fused with a following Relu: every index
    is out of range, so the kernel must raise a KernelError (see
    tests/topi/test_index_bounds.py) without reading the empty data."""
    import kiln
    from onnx import TensorProto, helper

    from kiln.runtime.errors import KernelError

    for xshape, axis, relu in GATHER_ZERO_AXIS:
        oshape = list(xshape[:axis]) + [2] + list(xshape[axis + 1:])
        nodes = [helper.make_node("Gather", ["x", "i"], ["g" if relu else "y"], axis=axis, name="lookup")]
        if relu:
            nodes.append(helper.make_node("Relu", ["g"], ["y"]))
        graph = helper.make_graph(
            nodes, "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xshape)),
             helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, oshape)],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        mod, params = kiln.frontend.from_onnx(model)
        factory = kiln.build(mod, target=sanitizer_target(), params=params)
        m = kiln.GraphModule(factory["default"](kiln.cpu()))
        what = f"gather_zero_axis x{list(xshape)} axis={axis}{' +relu' if relu else ''}"
        try:
            m.run(x=np.zeros(xshape, "float32"), i=np.array([0, -1], "int64"))
        except KernelError:
            print("ok", what, "(KernelError)", flush=True)
            continue
        raise AssertionError(f"{what}: returned data instead of raising KernelError")


class ExactCPUDeviceAPI(CPUDeviceAPI):
    """CPU allocations that end exactly where the tensor ends, so ASan sees every overrun.

    The stock CPU API over-allocates by the alignment (up to 64 bytes of slack after the
    data, and NumPy caches small blocks), which would hide a kernel reading or writing a few
    elements past its tensor. Here every tensor is its own ``posix_memalign`` block, which
    the preloaded ASan runtime surrounds with poisoned redzones.
    """

    def __init__(self) -> None:
        super().__init__()
        self._libc = ctypes.CDLL(None)  # with LD_PRELOAD, malloc & co. resolve to ASan's
        self._libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
        self._libc.free.argtypes = [ctypes.c_void_p]

    def alloc_data_space(self, dev: Any, nbytes: int, alignment: int = ALLOC_ALIGNMENT, dtype: Any = None) -> int:
        out = ctypes.c_void_p()
        if self._libc.posix_memalign(ctypes.byref(out), max(int(alignment), ALLOC_ALIGNMENT), int(nbytes)) != 0:
            raise DeviceError(f"posix_memalign of {nbytes} bytes failed on {dev}")
        return out.value or 0

    def alloc_zeroed_data_space(self, dev: Any, nbytes: int, alignment: int = ALLOC_ALIGNMENT,
                                dtype: Any = None) -> int:
        ptr = self.alloc_data_space(dev, nbytes, alignment, dtype)
        ctypes.memset(ptr, 0, int(nbytes))
        return ptr

    def free_data_space(self, dev: Any, ptr: int) -> None:
        self._libc.free(ptr)


_OVERFLOW_KERNEL = r"""
#include <kiln/c_runtime_api.h>
KILN_DLL int32_t san_overflow(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  DLTensor* t = (DLTensor*)args[0].v_handle;
  ((float*)t->data)[t->shape[0]] = 1.0f;  /* one element past the end */
  return 0;
}
KILN_DLL int32_t san_signed_overflow(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc,
                                     void* h) {
  int32_t x = (int32_t)args[0].v_int64;
  rv->v_int64 = x + 2147483647;  /* signed overflow for any x > 0 */
  *rc = kKilnArgInt;
  return 0;
}
"""


def _self_check(name: str, *args: Any) -> None:
    """Run a deliberately broken kernel: the sanitizers must report it (the job can fail)."""
    from kiln.runtime import csource_module

    mod = csource_module(_OVERFLOW_KERNEL, ["san_overflow", "san_signed_overflow"],
                         os.environ.get("KILN_SAN_CFLAGS", DEFAULT_CFLAGS).split())
    mod[name](*args)
    print("self-check kernel", name, "ran without a sanitizer report", flush=True)


#: Groups that run a topi test module's ``CASES`` through the harness.
_HARNESS = {"elemwise": "test_elemwise", "nn": "test_nn", "reduce": "test_reduce",
            "transform": "test_transform", "index_bounds": "test_index_bounds",
            "conv_nchwc": "test_conv_nchwc", "softmax": "test_softmax"}


def _harness_cases(module: str) -> list[Any]:
    import importlib

    return list(importlib.import_module(f"tests.topi.{module}").CASES)


def expected_ok_lines(group: str) -> int:
    """How many ``ok`` lines a clean run of ``group`` prints (so no case goes missing)."""
    if group in _HARNESS:
        return len(_harness_cases(_HARNESS[group]))
    if group == "fused":
        from tests.topi.test_fused import GROUPS as fused

        return len(fused)
    return {"cnn": 1, "gather_zero_axis": len(GATHER_ZERO_AXIS)}.get(group, 0)


def _groups() -> dict[str, Callable[[], None]]:
    def harness(module: str) -> Callable[[], None]:
        return lambda: _harness_group(_harness_cases(module), f"san_{module}")

    return {
        **{group: harness(module) for group, module in _HARNESS.items()},
        "fused": _fused_group,
        "cnn": _cnn,
        "gather_zero_axis": _gather_zero_axis,
        "self_check_overflow": lambda: _self_check("san_overflow", nd.empty((5,), "float32")),
        "self_check_ub": lambda: _self_check("san_signed_overflow", 3),
    }


GROUPS = tuple(_groups())


def main(argv: list[str]) -> int:
    groups = _groups()
    unknown = [a for a in argv if a not in groups]
    if not argv or unknown:
        print(f"usage: python -m tests.sanitizers.kernel_cases GROUP...; groups: {', '.join(groups)}", file=sys.stderr)
        return 2
    register_device_api(DeviceType.CPU, ExactCPUDeviceAPI(), override=True)
    for name in argv:
        groups[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
