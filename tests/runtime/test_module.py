"""Module / PackedFunction / registry / benchmark behaviour, with one in-process C source module."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

import kiln.runtime as rt
from kiln.runtime import benchmark, registry
from kiln.runtime.errors import FunctionNotFoundError, InputError, KernelError, KilnError
from kiln.runtime.module import Module, PackedFunction

KERNELS = r"""
#include <kiln/c_runtime_api.h>
#include <string.h>

/* out[i] = in[i] + 1 over float32 tensors of any shape. */
KILN_DLL int32_t add_one(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  if (n != 2 || codes[0] != kKilnDLTensorHandle || codes[1] != kKilnDLTensorHandle) {
    KilnAPISetLastError("add_one: expected (DLTensor* in, DLTensor* out)");
    return -1;
  }
  DLTensor* x = (DLTensor*)args[0].v_handle;
  DLTensor* y = (DLTensor*)args[1].v_handle;
  int64_t size = 1;
  for (int i = 0; i < x->ndim; ++i) size *= x->shape[i];
  const float* a = (const float*)((char*)x->data + x->byte_offset);
  float* b = (float*)((char*)y->data + y->byte_offset);
  for (int64_t i = 0; i < size; ++i) b[i] = a[i] + 1.0f;
  return 0;
}

/* Returns its only argument back with the same type code. */
KILN_DLL int32_t echo(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  if (n != 1) { KilnAPISetLastError("echo: expected one argument"); return -1; }
  *rv = args[0];
  *rc = codes[0];
  return 0;
}

/* Returns the type codes of all arguments as a decimal number, e.g. (7, 0, 2) -> 702. */
KILN_DLL int32_t codes_of(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  int64_t acc = 0;
  for (int i = 0; i < n; ++i) acc = acc * (codes[i] >= 10 ? 100 : 10) + codes[i];
  rv->v_int64 = acc;
  *rc = kKilnArgInt;
  return 0;
}

/* Sum of a float32 tensor's elements + the workspace allocator round trip. */
KILN_DLL int32_t tensor_sum(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  DLTensor* x = (DLTensor*)args[0].v_handle;
  int64_t size = 1;
  for (int i = 0; i < x->ndim; ++i) size *= x->shape[i];
  float* tmp = (float*)KilnBackendAllocWorkspace(kDLCPU, 0, (uint64_t)size * 4, kDLFloat, 32);
  if (!tmp) return -1;
  memcpy(tmp, (char*)x->data + x->byte_offset, (size_t)size * 4);
  double s = 0;
  for (int64_t i = 0; i < size; ++i) s += tmp[i];
  KilnBackendFreeWorkspace(kDLCPU, 0, tmp);
  rv->v_float64 = s;
  *rc = kKilnArgFloat;
  return 0;
}
"""


@pytest.fixture(scope="module")
def cmod() -> rt.CSourceModule:
    return rt.csource_module(KERNELS, ["add_one", "echo", "codes_of", "tensor_sum"])


def test_csource_module_properties(cmod, tmp_path):
    assert cmod.type_key == "c"
    assert cmod.is_dso_exportable and cmod.is_runnable and not cmod.is_binary_serializable
    assert cmod.get_source() == KERNELS
    cmod.save(tmp_path / "k.c")
    assert (tmp_path / "k.c").read_text() == KERNELS


def test_run_kernel_on_ndarrays_and_numpy(cmod):
    x = np.arange(12, dtype="float32").reshape(3, 4)
    a = rt.ndarray.array(x)
    b = rt.ndarray.empty((3, 4), "float32")
    assert cmod["add_one"](a, b) is None
    np.testing.assert_array_equal(b.numpy(), x + 1)
    # NumPy arrays go through DLPack without a copy: the kernel writes into `out` itself.
    out = np.zeros_like(x)
    cmod["add_one"](x, out)
    np.testing.assert_array_equal(out, x + 1)
    assert cmod["tensor_sum"](x) == pytest.approx(float(x.sum()))


def test_argument_packing(cmod):
    echo = cmod["echo"]
    assert echo(3) == 3 and echo(-2**40) == -2**40
    assert echo(True) == 1 and echo(np.int32(7)) == 7
    assert echo(2.5) == 2.5 and echo(np.float32(0.5)) == 0.5
    assert echo("héllo") == "héllo"
    assert echo(None) is None
    a = rt.ndarray.empty((2,), "float32")
    assert cmod["codes_of"](a, 1, 2.0, "s", None) == int("70" + "2" + "11" + "4")
    assert cmod["codes_of"]() == 0


def test_bad_argument_type_names_position(cmod):
    with pytest.raises(InputError, match=r"argument 1 .*list"):
        cmod["add_one"](np.zeros(2, "float32"), [1, 2])


def test_kernel_error_carries_library_message(cmod):
    with pytest.raises(KernelError, match=r"add_one.*expected \(DLTensor\* in, DLTensor\* out\)"):
        cmod["add_one"](1, 2)


def test_function_lookup(cmod):
    f = cmod.get_function("add_one")
    assert isinstance(f, PackedFunction) and f.name == "add_one"
    assert isinstance(f.address, int) and f.module is not None
    assert cmod.implements_function("echo") and not cmod.implements_function("nope")
    with pytest.raises(FunctionNotFoundError, match=r"'c'.*'missing'"):
        cmod["missing"]
    # Names not declared in func_names are not served even if the code defines them.
    lib = cmod.get_function("echo").module
    assert lib.type_key == "library" and lib.native_address("KilnRunSequence")
    with pytest.raises(FunctionNotFoundError):
        lib["KilnRunSequence"]  # crt services are not packed functions


def test_library_services(cmod):
    lib = cmod.get_function("echo").module
    lib.set_num_threads(1)
    assert lib.get_num_threads() == 1
    lib.set_num_threads(0)
    from kiln.runtime import _ffi

    calls = (_ffi.KilnOpCall * 1)()
    vals = (_ffi.KilnValue * 2)()
    codes = (ctypes.c_int32 * 2)(0, 0)  # ints -> add_one fails: index 0 is reported
    calls[0].fn = lib.native_address("add_one")
    calls[0].args = vals
    calls[0].type_codes = codes
    calls[0].num_args = 2
    assert lib.run_sequence(calls, 1) == 0
    assert "add_one" in lib.last_error()


def test_query_imports_and_python_modules(cmod):
    class Py(Module):
        type_key = "py_test"

        def _get_local_function(self, name):
            return (lambda x: x * 2) if name == "double" else None

    root = Py()
    root.import_module(cmod)
    cmod_imports_before = cmod.imported_modules
    assert root["double"](21) == 42
    with pytest.raises(FunctionNotFoundError, match="py_test"):
        root.get_function("echo")
    assert root.get_function("echo", query_imports=True)(5) == 5
    assert root.implements_function("echo", query_imports=True)
    assert root.imported_modules == [cmod] and cmod.imported_modules == cmod_imports_before
    assert not root.is_binary_serializable and not root.is_dso_exportable
    with pytest.raises(KilnError, match="not binary-serializable"):
        root.save_to_binary()


def test_concurrent_calls_do_not_share_buffers(cmod):
    f = cmod["echo"]
    errors = []

    def work(k):
        for i in range(300):
            if f(k * 1000 + i) != k * 1000 + i:
                errors.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_time_evaluator(cmod):
    a = rt.ndarray.empty((64,), "float32")
    b = rt.ndarray.empty((64,), "float32")
    res = cmod.time_evaluator("add_one", rt.cpu(), number=5, repeat=3)(a, b)
    assert isinstance(res, benchmark.BenchmarkResult)
    assert len(res.results) == 3 and res.min <= res.median <= res.max and res.mean > 0
    assert "ms" in repr(res)


def test_measure_grows_number_for_min_repeat_ms():
    calls = []
    res = benchmark.measure(lambda: calls.append(1), number=1, repeat=2, min_repeat_ms=5)
    assert res.number > 1 and len(res.results) == 2
    assert res.std >= 0 and res.max >= res.min


def test_global_registry():
    name = "testing.kiln.add"
    registry.remove_global_func(name)

    @registry.register_func(name)
    def add(a, b):
        return a + b

    assert registry.get_global_func(name)(1, 2) == 3
    assert name in registry.list_global_func_names()
    with pytest.raises(KilnError, match="already registered"):
        registry.register_func(name, lambda: 0)
    registry.register_func(name, lambda: 0, override=True)
    registry.remove_global_func(name)
    assert registry.get_global_func(name, allow_missing=True) is None
    with pytest.raises(FunctionNotFoundError, match=name):
        registry.get_global_func(name)


def test_loader_registry_lists_builtin_and_registered():
    registry.register_loader("test_dummy_kind", lambda payload: Module(), override=True)
    try:
        loaders = rt.list_loaders()
        assert "test_dummy_kind" in loaders and "GraphExecutorFactory" in loaders
        assert registry.get_global_func("loadbinary_test_dummy_kind") is not None
    finally:
        registry.remove_global_func("loadbinary_test_dummy_kind")
