"""Fixtures for the CUDA tests.

* ``mock_cuda`` — a stand-in ``libcuda.so`` compiled from ``mock_libcuda.c`` (host memory,
  recorded launches) and selected with ``KILN_CUDA_LIBRARY``: exercises the runtime's driver
  plumbing on machines without a GPU. Skips when no C compiler is available.
* ``no_cuda`` — ``KILN_CUDA_LIBRARY`` pointed at a missing file: the "driver not installed" case.
* ``needs_nvrtc`` — skips when neither NVRTC nor nvcc is installed (compiling needs no GPU).
* ``needs_gpu`` — skips unless a real CUDA driver and device are present.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _reset() -> None:
    from kiln.runtime import cuda_driver as rc

    rc._reset_driver()


@pytest.fixture(scope="session")
def mock_libcuda_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the mock CUDA driver")
    out = str(tmp_path_factory.mktemp("mockcuda") / "libcuda_mock.so")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", out, os.path.join(HERE, "mock_libcuda.c")], check=True)
    return out


@pytest.fixture
def mock_cuda(mock_libcuda_path: str, monkeypatch: pytest.MonkeyPatch):
    """The mock driver, freshly selected; yields its ctypes handle (mock_* introspection)."""
    monkeypatch.setenv("KILN_CUDA_LIBRARY", mock_libcuda_path)
    monkeypatch.delenv("KILN_MOCK_CUDA_DEVICES", raising=False)
    monkeypatch.delenv("KILN_MOCK_CUDA_VERSION", raising=False)
    _reset()
    lib = ctypes.CDLL(mock_libcuda_path)  # same handle the runtime gets (dlopen refcounts)
    yield lib
    lib.mock_set_launch_hook(None)
    _reset()


@pytest.fixture
def no_cuda(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A process view in which the CUDA driver is not installed."""
    monkeypatch.setenv("KILN_CUDA_LIBRARY", str(tmp_path / "libcuda_absent.so.1"))
    _reset()
    yield
    _reset()


@pytest.fixture
def needs_nvrtc() -> None:
    from kiln.contrib.nvrtc import find_nvrtc

    if find_nvrtc() is None and shutil.which("nvcc") is None:
        pytest.skip("neither NVRTC (pip install nvidia-cuda-nvrtc-cu12) nor nvcc is installed")


@pytest.fixture
def needs_gpu() -> None:
    _reset()
    from kiln.runtime.cuda_driver import is_available

    if not is_available():
        pytest.skip("no CUDA GPU: libcuda.so.1 missing or no device visible")
