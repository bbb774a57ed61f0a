"""LLVM IR text → optimised object code, in this process or as a compile worker process.

This file imports only the standard library and llvmlite, so that :mod:`kiln.codegen.llvm_jobs`
can start it by path (``python llvm_worker.py``) as a compile server in a few tens of
milliseconds, without importing Kiln or NumPy. llvmlite serialises every LLVM call in a process
behind one lock, so compiling kernels in parallel needs processes, not threads.

Protocol on stdin / stdout (all integers little-endian):

* request: ``b"K"``, u32 header length, UTF-8 JSON header ``{"triple", "cpu", "features",
  "opt"}``, u64 IR length, the IR text (UTF-8);
* reply: ``b"O"`` (object file follows) or ``b"E"`` (UTF-8 error message follows), u64 length,
  payload.

End of input ends the server.
"""

from __future__ import annotations

import json
import struct
import sys
import threading
from typing import Any, BinaryIO

import llvmlite.binding as llvm

__all__ = ["init_llvm", "make_target_machine", "optimize", "compile_object", "serve"]

_LOCK = threading.RLock()
_INIT = {"native": False, "all": False}


def init_llvm(triple: str) -> None:
    """Initialise LLVM's native target, and every target when ``triple`` is not the host's."""
    with _LOCK:
        if not _INIT["native"]:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _INIT["native"] = True
        if triple != llvm.get_process_triple() and not _INIT["all"]:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _INIT["all"] = True


def make_target_machine(triple: str, cpu: str, features: str, opt: int) -> Any:
    """A PIC ``TargetMachine`` for ``triple`` / ``cpu`` / comma-separated ``features``.

    Raises
    ------
    ValueError
        If LLVM cannot target ``triple``.
    """
    init_llvm(triple)
    try:
        t = llvm.Target.from_triple(triple)
    except RuntimeError as err:
        raise ValueError(f"LLVM cannot target {triple!r}: {err}") from None
    opt = max(0, min(3, int(opt)))
    return t.create_target_machine(cpu=cpu, features=features, opt=opt, reloc="pic", codemodel="default")


def optimize(ir_text: str, tm: Any, opt: int) -> Any:
    """Parse, verify and optimise IR at ``-O<opt>``; returns the llvmlite ``ModuleRef``.

    Raises
    ------
    ValueError
        If the IR does not parse or verify.
    """
    with _LOCK:
        try:
            mod = llvm.parse_assembly(ir_text)
            mod.verify()
        except RuntimeError as err:
            raise ValueError(f"LLVM codegen produced invalid IR: {err}") from None
        opt = max(0, min(3, int(opt)))
        pto = llvm.create_pipeline_tuning_options(speed_level=opt)
        pto.loop_vectorization = opt >= 2
        pto.slp_vectorization = opt >= 2
        pto.loop_unrolling = opt >= 2
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        return mod


def compile_object(ir_text: str, triple: str, cpu: str, features: str, opt: int) -> bytes:
    """The relocatable object file for ``ir_text`` (see :func:`optimize`)."""
    tm = make_target_machine(triple, cpu, features, opt)
    mod = optimize(ir_text, tm, opt)
    with _LOCK:
        return bytes(tm.emit_object(mod))


def _read_exact(f: BinaryIO, n: int) -> bytes:
    buf = f.read(n)
    if buf is None or len(buf) != n:
        raise EOFError
    return buf


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """Answer compile requests from ``inp`` on ``out`` until end of input (see the module doc)."""
    while True:
        tag = inp.read(1)
        if not tag:
            return
        if tag != b"K":
            raise SystemExit(f"llvm_worker: bad request tag {tag!r}")
        (hlen,) = struct.unpack("<I", _read_exact(inp, 4))
        header = json.loads(_read_exact(inp, hlen).decode("utf-8"))
        (irlen,) = struct.unpack("<Q", _read_exact(inp, 8))
        ir_text = _read_exact(inp, irlen).decode("utf-8")
        try:
            payload = compile_object(ir_text, header["triple"], header["cpu"], header["features"], header["opt"])
            status = b"O"
        except Exception as err:  # noqa: BLE001 - every failure goes back to the client as a message
            payload, status = f"{type(err).__name__}: {err}".encode(), b"E"
        out.write(status + struct.pack("<Q", len(payload)))
        out.write(payload)
        out.flush()


if __name__ == "__main__":  # pragma: no cover - exercised through llvm_jobs in a subprocess
    try:
        serve(sys.stdin.buffer, sys.stdout.buffer)
    except EOFError:
        pass
