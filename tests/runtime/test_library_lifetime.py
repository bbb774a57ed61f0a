"""A loaded library is unmapped when its module is collected, and not a moment earlier.

Counting runs in a fresh interpreter so that the library owning the process-wide thread
pool (which is never unmapped, see ``kiln.runtime.shared_crt``) is known: the first one.
"""

from __future__ import annotations

import gc
import os
import shutil

import numpy as np
import pytest

import kiln.runtime as rt
from kiln.contrib import cc
from kiln.runtime.errors import FormatError
from tests.runtime import library_support as support

# Loads `argv[2]` copies of the library `argv[1]` (.so copies are deleted after loading, as a
# .tar's temporary build directory is), runs each, drops it, and prints how many distinct
# deleted library files are still mapped.
LOAD_MANY = """
    import gc, os, shutil, sys, tempfile
    import numpy as np
    import kiln.runtime as rt

    src, count = sys.argv[1], int(sys.argv[2])
    work = tempfile.mkdtemp()

    def mapped_deleted():
        with open("/proc/self/maps") as f:
            return {line.split(None, 5)[5].strip() for line in f
                    if line.rstrip().endswith("(deleted)") and ".so" in line}

    x = np.arange(64, dtype="float32")
    for i in range(count):
        path = src
        if src.endswith(".so"):
            path = os.path.join(work, f"copy{i}.so")
            shutil.copyfile(src, path)
        m = rt.GraphModule(rt.load_module(path)["default"](rt.cpu()))
        if path != src:
            os.remove(path)
        m.run(x=x)
        assert (m.get_output(0).numpy() == x + 1).all()
        del m
        gc.collect()
    print(len(mapped_deleted()))
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("lifetime")
    return {"so": support.export(d / "m.so"), "tar": support.export(d / "m.tar")}


def test_hundred_so_loads_leave_one_library_mapped(libs):
    # Before: every load stayed mapped (100 deleted files). Now: only the pool owner.
    assert int(support.run_fresh(LOAD_MANY, libs["so"], "100")) == 1


def test_tar_loads_are_unmapped(libs):
    # Each .tar load compiles (~0.5 s), so CI does 8; `bench/bench_soak.py --tar-loads 100`
    # is the long form.
    assert int(support.run_fresh(LOAD_MANY, libs["tar"], "8")) == 1


def _mapped(path: str) -> bool:
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(real) or line.rstrip().endswith(real + " (deleted)") for line in f)


def _second_library(libs, tmp_path) -> str:
    """A private copy: never the pool owner, even if it is the first load of this process."""
    first = tmp_path / "first.so"
    shutil.copyfile(libs["so"], first)
    rt.load_module(str(first))  # makes sure an owner exists (this one, or an earlier one)
    path = str(tmp_path / "second.so")
    shutil.copyfile(libs["so"], path)
    return path


def test_executor_keeps_library_mapped(libs, tmp_path):
    path = _second_library(libs, tmp_path)
    m = rt.GraphModule(rt.load_module(path)["default"](rt.cpu()))
    gc.collect()
    assert _mapped(path)  # the executor holds the kernels: the library must stay
    x = np.arange(64, dtype="float32")
    m.run(x=x)
    np.testing.assert_array_equal(m.get_output(0).numpy(), x + 1)
    del m
    gc.collect()
    assert not _mapped(path)


def test_packed_function_keeps_library_mapped(libs, tmp_path):
    path = _second_library(libs, tmp_path)
    f = rt.load_module(path).get_function("par_add_one", query_imports=True)
    gc.collect()
    assert _mapped(path)
    x = np.arange(64, dtype="float32")
    y = rt.ndarray.empty((64,), "float32")
    f(rt.ndarray.array(x), y)
    np.testing.assert_array_equal(y.numpy(), x + 1)
    del f
    gc.collect()
    assert not _mapped(path)


def test_linked_param_keeps_library_mapped(tmp_path):
    # A linked param is library data: an array of it must keep the library mapped.
    path = support.export(tmp_path / "linked.so", linked_param=True)
    shutil.copyfile(path, tmp_path / "first.so")
    rt.load_module(str(tmp_path / "first.so"))  # makes sure `path` is not the pool owner
    m = rt.GraphModule(rt.load_module(path)["default"](rt.cpu()))
    m.run()
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.arange(64, dtype="float32") + 1)
    w = m.get_input("w")  # the executor's own array: the library's data, zero copy
    del m
    gc.collect()
    assert _mapped(path)  # checked before reading w: reading unmapped memory would crash
    np.testing.assert_array_equal(w.numpy(), np.arange(64, dtype="float32"))
    del w
    gc.collect()
    assert not _mapped(path)


def test_unloadable_library_error_is_format_error(tmp_path):
    bad = tmp_path / "garbage.so"
    bad.write_bytes(b"\x7fELF" + bytes(60))
    with pytest.raises(FormatError, match="garbage.so.*cannot load as a shared library"):
        rt.LibraryModule(str(bad))


def test_undecodable_loader_message_is_format_error(tmp_path):
    # A library needing "libkiln\xff.so": dlerror() quotes that name, and ctypes's UTF-8
    # decoding of the message used to escape as a bare UnicodeDecodeError.
    dep_src = tmp_path / "dep.c"
    dep_src.write_text("int kiln_dep_value(void) { return 1; }\n")
    dep = str(tmp_path / "libkilnz.so")
    cc.create_shared(dep, [str(dep_src)], options=["-Wl,-soname,libkilnz.so"])
    main_src = tmp_path / "main.c"
    main_src.write_text("int kiln_dep_value(void);\nint kiln_main_value(void) { return kiln_dep_value(); }\n")
    lib = tmp_path / "needs_bad_name.so"
    cc.create_shared(str(lib), [str(main_src), dep])
    data = lib.read_bytes()
    assert data.count(b"libkilnz.so") == 1
    lib.write_bytes(data.replace(b"libkilnz.so", b"libkiln\xff.so"))
    with pytest.raises(FormatError, match="needs_bad_name.so.*cannot load as a shared library"):
        rt.LibraryModule(str(lib))
