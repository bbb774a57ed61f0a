"""export_library -> load_module round trips (.so and .tar), checked in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest

import kiln.runtime as rt
from kiln.contrib import cc
from kiln.runtime.errors import KilnError

KERNELS = r"""
#include <kiln/c_runtime_api.h>

static int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

/* add_one(in, out): out = in + 1 (float32). */
KILN_DLL int32_t add_one(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  if (n != 2 || codes[0] != kKilnDLTensorHandle || codes[1] != kKilnDLTensorHandle) {
    KilnAPISetLastError("add_one: expected (DLTensor* in, DLTensor* out)");
    return -1;
  }
  const DLTensor* x = (const DLTensor*)args[0].v_handle;
  DLTensor* y = (DLTensor*)args[1].v_handle;
  const float* a = (const float*)((const char*)x->data + x->byte_offset);
  float* b = (float*)((char*)y->data + y->byte_offset);
  for (int64_t i = 0; i < numel(x); ++i) b[i] = a[i] + 1.0f;
  return 0;
}

/* mul_scalar(in, out, s): out = in * s, s an int or a float. */
KILN_DLL int32_t mul_scalar(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  if (n != 3 || codes[0] != kKilnDLTensorHandle || codes[1] != kKilnDLTensorHandle) {
    KilnAPISetLastError("mul_scalar: expected (DLTensor* in, DLTensor* out, scalar)");
    return -1;
  }
  double s;
  if (codes[2] == kKilnArgFloat) s = args[2].v_float64;
  else if (codes[2] == kKilnArgInt) s = (double)args[2].v_int64;
  else { KilnAPISetLastError("mul_scalar: scalar must be int or float"); return -1; }
  const DLTensor* x = (const DLTensor*)args[0].v_handle;
  DLTensor* y = (DLTensor*)args[1].v_handle;
  const float* a = (const float*)((const char*)x->data + x->byte_offset);
  float* b = (float*)((char*)y->data + y->byte_offset);
  for (int64_t i = 0; i < numel(x); ++i) b[i] = (float)(a[i] * s);
  return 0;
}
"""

ADDON = r"""
#include <kiln/c_runtime_api.h>
#ifndef ADDON_VALUE
#error "options were not applied"
#endif
KILN_DLL int32_t addon_value(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  rv->v_int64 = ADDON_VALUE;
  *rc = kKilnArgInt;
  return 0;
}
"""

CHECK = textwrap.dedent(
    """
    import sys
    import numpy as np
    import kiln.runtime as rt
    from kiln.runtime import ndarray as nd
    m = rt.load_module(sys.argv[1])
    x = np.arange(10, dtype="float32")
    a, b = nd.array(x), nd.empty((10,), "float32")
    m["add_one"](a, b)
    np.testing.assert_array_equal(b.numpy(), x + 1)
    m["mul_scalar"](a, b, 2.5)
    np.testing.assert_allclose(b.numpy(), x * 2.5)
    m["mul_scalar"](a, b, 3)
    np.testing.assert_array_equal(b.numpy(), x * 3)
    try:
        m["mul_scalar"](a, b, "x")
    except rt.KernelError as e:
        assert "scalar must be int or float" in str(e), e
    else:
        raise AssertionError("no KernelError")
    if len(sys.argv) > 2:
        assert m["addon_value"]() == int(sys.argv[2])
    print("OK", m.type_key)
    """
)


def run_fresh(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-c", CHECK, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    addon = d / "addon.c"
    addon.write_text(ADDON)
    mod = rt.csource_module(KERNELS, ["add_one", "mul_scalar"])
    so = mod.export_library(str(d / "k.so"), options=["-DADDON_VALUE=42"], addons=[str(addon)])
    tar = mod.export_library(str(d / "k.tar"), options=["-DADDON_VALUE=42"], addons=[str(addon)])
    return mod, so, tar


def test_in_process_then_export_so_fresh_process(exported):
    mod, so, _ = exported
    x = np.ones(10, dtype="float32")
    y = np.empty_like(x)
    mod["mul_scalar"](x, y, 4)
    np.testing.assert_array_equal(y, 4 * x)
    assert os.path.isfile(so)
    assert "OK library" in run_fresh(so, "42")


def test_export_tar_layout_and_fresh_process(exported, tmp_path):
    _, _, tar = exported
    with tarfile.open(tar) as tf:
        names = sorted(tf.getnames())
        man = json.load(tf.extractfile("kiln_manifest.json"))
    assert names == ["addon.c", "kiln_crt.c", "kiln_manifest.json", "lib0.c"]
    assert man["format"] == "kiln-library-tar" and man["version"] == 1
    assert man["modules"] == [{"file": "lib0.c", "type_key": "c", "functions": ["add_one", "mul_scalar"]}]
    assert man["blob"] is None and "-DADDON_VALUE=42" in man["options"]
    before = set(os.listdir(os.path.dirname(tar)))
    assert "OK library" in run_fresh(tar, "42")
    assert set(os.listdir(os.path.dirname(tar))) == before  # nothing written next to the input


def test_load_so_in_process(exported):
    _, so, _ = exported
    m = rt.load_module(so)
    assert m.type_key == "library" and m.imported_modules == []
    assert m.list_functions() == ["add_one", "addon_value", "mul_scalar"]
    assert m["addon_value"]() == 42


def test_load_tar_in_process_cleans_up(exported):
    import gc

    _, _, tar = exported
    m = rt.load_module(tar)
    workdir = os.path.dirname(m.path)
    assert m["addon_value"]() == 42 and os.path.isdir(workdir)
    del m
    gc.collect()
    assert not os.path.exists(workdir)


def test_workspace_dir_and_cross_compiler(tmp_path):
    mod = rt.csource_module(KERNELS, ["add_one", "mul_scalar"])
    ws = tmp_path / "ws"
    fcompile = cc.cross_compiler(cc.get_cc(), options=["-O1"])
    assert fcompile.output_format == "so" and fcompile.object_format == "o"
    assert isinstance(fcompile.get_target_triple(), str)
    out = mod.export_library(str(tmp_path / "x.so"), fcompile=fcompile, workspace_dir=str(ws))
    assert sorted(os.listdir(ws)) == ["lib0.c"]  # no blob for a lone DSO module
    a = rt.ndarray.array(np.arange(4, dtype="float32"))
    b = rt.ndarray.empty((4,), "float32")
    rt.load_module(out)["add_one"](a, b)
    np.testing.assert_array_equal(b.numpy(), np.arange(4) + 1)


def test_reexport_loaded_library_copies_file(exported, tmp_path):
    _, so, _ = exported
    m = rt.load_module(so)
    out = m.export_library(str(tmp_path / "copy.so"))
    assert open(out, "rb").read() == open(so, "rb").read()
    from kiln.runtime.module import Module

    class Root(Module):
        type_key = "test_root_unserializable"

    r = Root()
    r.import_module(m)
    with pytest.raises(KilnError, match="test_root_unserializable.*neither DSO-exportable nor binary-serializable"):
        r.export_library(str(tmp_path / "bad.so"))


def test_compile_error_reports_command_and_stderr(tmp_path):
    bad = rt.csource_module("int broken( {", ["broken"])
    with pytest.raises(rt.CompileError) as info:
        bad.export_library(str(tmp_path / "bad.so"))
    msg = str(info.value)
    assert "compilation failed" in msg and "lib0.c" in msg and "error" in msg
    assert info.value.command[0] and "error" in info.value.stderr


def test_export_into_missing_directory(tmp_path):
    mod = rt.csource_module(KERNELS, ["add_one"])
    with pytest.raises(rt.KilnFileNotFoundError, match="does not exist"):
        mod.export_library(str(tmp_path / "no" / "such" / "x.so"))
