"""Shared fixtures of the executor tests: one C kernel module (compiled once) and graph builders.

The graphs are written by hand in the graph JSON layout so that these tests depend on the
runtime only, not on the compiler.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kiln

# Every kernel reads DLTensor* from args[i].v_handle, as the ABI header prescribes. Element
# counts come from the first argument's shape, so one kernel serves every shape.
KERNELS_C = r"""
#include <kiln/c_runtime_api.h>

static int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}
#define F32(i) ((float*)((char*)((DLTensor*)args[i].v_handle)->data + ((DLTensor*)args[i].v_handle)->byte_offset))
#define T(i) ((DLTensor*)args[i].v_handle)
#define SIG(name) KILN_DLL int32_t name(KilnValue* args, int32_t* type_codes, int32_t num_args, \
                                        KilnValue* ret, int32_t* ret_code, void* resource)

SIG(add_one) {
  if (num_args != 2 || type_codes[0] != kKilnDLTensorHandle) { KilnAPISetLastError("add_one: bad args"); return -1; }
  float* x = F32(0); float* y = F32(1); int64_t n = numel(T(0));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] + 1.0f;
  return 0;
}
SIG(mul_two) {
  float* x = F32(0); float* y = F32(1); int64_t n = numel(T(0));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 2.0f;
  return 0;
}
SIG(add) {
  float* a = F32(0); float* b = F32(1); float* y = F32(2); int64_t n = numel(T(0));
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
  return 0;
}
/* Two outputs: x + 1 and x * 2. */
SIG(two_out) {
  float* x = F32(0); float* y1 = F32(1); float* y2 = F32(2); int64_t n = numel(T(0));
  for (int64_t i = 0; i < n; ++i) { y1[i] = x[i] + 1.0f; y2[i] = x[i] * 2.0f; }
  return 0;
}
/* Only accepts 1-D tensors: exercises flatten_data. */
SIG(neg_flat) {
  if (T(0)->ndim != 1 || T(1)->ndim != 1) { KilnAPISetLastError("neg_flat: expected 1-D tensors"); return -1; }
  float* x = F32(0); float* y = F32(1); int64_t n = T(0)->shape[0];
  for (int64_t i = 0; i < n; ++i) y[i] = -x[i];
  return 0;
}
SIG(always_fail) {
  KilnAPISetLastError("boom: intentional failure");
  return -1;
}
"""

KERNEL_NAMES = ["add_one", "mul_two", "add", "two_out", "neg_flat", "always_fail"]


@pytest.fixture(scope="session")
def clib() -> Any:
    """The C source module holding every test kernel, compiled once per session."""
    mod = kiln.runtime.csource_module(KERNELS_C, KERNEL_NAMES)
    mod.get_function("add_one")  # compile now, outside any test's timing or threads
    return mod


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
