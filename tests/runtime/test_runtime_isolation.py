"""The runtime loads and runs an exported library with every compiler dependency unimportable."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import kiln.runtime as rt
from tests.runtime.import_blocker import COMPILER_SIDE, blocker_prelude

KERNEL = r"""
#include <kiln/c_runtime_api.h>
KILN_DLL int32_t add_one(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  DLTensor* x = (DLTensor*)args[0].v_handle;
  DLTensor* y = (DLTensor*)args[1].v_handle;
  int64_t size = 1;
  for (int i = 0; i < x->ndim; ++i) size *= x->shape[i];
  for (int64_t i = 0; i < size; ++i) ((float*)y->data)[i] = ((float*)x->data)[i] + 1.0f;
  return 0;
}
"""

BLOCKED = COMPILER_SIDE

SCRIPT = blocker_prelude(BLOCKED) + textwrap.dedent(
    """
    for b in BLOCKED:
        try:
            __import__(b)
        except ImportError:
            pass
        else:
            raise SystemExit(f"blocker failed for {b}")

    import numpy as np
    import kiln
    import kiln.runtime as rt
    from kiln.runtime import ndarray as nd
    m = kiln.load_module(sys.argv[1])
    x = np.arange(5, dtype="float32")
    a, b = nd.array(x), nd.empty((5,), "float32")
    m["add_one"](a, b)
    np.testing.assert_array_equal(b.numpy(), x + 1)
    leaked = sorted(n for n in sys.modules if any(n == b or n.startswith(b + ".") for b in BLOCKED))
    assert not leaked, leaked
    print("ISOLATED OK")
    """
)


def test_load_and_run_without_compiler_dependencies(tmp_path):
    path = rt.csource_module(KERNEL, ["add_one"]).export_library(str(tmp_path / "iso.so"))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, path], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ISOLATED OK" in proc.stdout, proc.stdout + proc.stderr
