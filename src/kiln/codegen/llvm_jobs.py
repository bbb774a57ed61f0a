"""Compile many LLVM modules at once: worker processes fed while the IR is still being generated.

llvmlite holds one lock around every LLVM call of a process, so threads cannot run LLVM in
parallel. :func:`compile_all` therefore hands IR to persistent worker processes
(:mod:`kiln.codegen.llvm_worker`, started by path: no Kiln import, no NumPy) while the calling
thread goes on generating the next kernel's IR; with one job (or one module) it compiles
in-process. ``KILN_COMPILE_JOBS`` sets the number of workers (default: the CPUs this process
may run on, at most 8; ``1`` = never start a process).

Workers are started on first need, reused by later builds, and stopped at interpreter exit.
A worker that dies makes the build fail with a :class:`~kiln.runtime.errors.CompileError` that
names the kernel and carries the worker's last output; the next build starts a fresh one. A
forked child never talks to its parent's workers: it starts its own.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import struct
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any, Callable, Iterable

from ..runtime.errors import CompileError
from . import llvm_worker

__all__ = ["compile_jobs", "compile_all", "shutdown_workers"]

#: Most worker processes ever started, whatever the CPU count.
MAX_JOBS = 8


def compile_jobs() -> int:
    """The number of compile processes to use (``$KILN_COMPILE_JOBS`` or the usable CPUs, ≤ 8)."""
    raw = os.environ.get("KILN_COMPILE_JOBS", "").strip()
    if raw:
        try:
            return max(1, min(MAX_JOBS, int(raw)))
        except ValueError:
            raise CompileError(f"KILN_COMPILE_JOBS={raw!r} is not a positive integer") from None
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(MAX_JOBS, n))


def _worker_command() -> list[str]:
    # -P: the script's directory (kiln/codegen, which has an llvm.py) must not shadow imports
    return [sys.executable, "-P", llvm_worker.__file__]


class _Worker:
    """One ``llvm_worker.py`` process and the pipes to it."""

    def __init__(self) -> None:
        self.errfile: IO[bytes] = tempfile.TemporaryFile(prefix="kiln_llvm_worker_")
        self.proc = subprocess.Popen(_worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errfile)

    def compile(self, header: bytes, ir: bytes, label: str) -> bytes:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(b"K" + struct.pack("<I", len(header)) + header + struct.pack("<Q", len(ir)))
            self.proc.stdin.write(ir)
            self.proc.stdin.flush()
            head = self.proc.stdout.read(9)
            if len(head) != 9:
                raise EOFError
            (n,) = struct.unpack("<Q", head[1:])
            payload = self.proc.stdout.read(n)
            if len(payload) != n:
                raise EOFError
        except (OSError, EOFError):
            self.proc.kill()  # a half-written request leaves the pipe out of step: never reuse it
            self.proc.wait()
            raise CompileError(f"LLVM compile worker died while compiling {label} "
                               f"(exit code {self.proc.poll()}): {self.last_output()}") from None
        if head[:1] == b"E":
            raise CompileError(f"LLVM could not compile {label}: {payload.decode('utf-8', 'replace')}")
        return payload

    def last_output(self) -> str:
        try:
            self.errfile.seek(0)
            text = self.errfile.read().decode("utf-8", "replace").strip()
        except OSError:
            return "(no output)"
        return text[-2000:] or "(no output)"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.errfile.close()


_workers: list[_Worker] = []
_owner_pid = os.getpid()
# one compile_all at a time owns the workers (two threads building at once take turns)
_pool_lock = threading.Lock()


def _take_workers(n: int) -> list[_Worker]:
    global _owner_pid
    if _owner_pid != os.getpid():  # forked: the pipes belong to the parent; leave them to it
        _workers.clear()
        _owner_pid = os.getpid()
    _workers[:] = [w for w in _workers if w.alive()]
    while len(_workers) < n:
        _workers.append(_Worker())
    return _workers[:n]


def shutdown_workers() -> None:
    """Stop every compile worker of this process (they restart on the next parallel compile)."""
    with _pool_lock:
        if _owner_pid == os.getpid():
            for w in _workers:
                w.stop()
        _workers.clear()


atexit.register(shutdown_workers)


def compile_all(modules: Iterable[tuple[str, str]], spec: dict[str, Any], count: int,
                compile_here: Callable[[str], bytes]) -> list[bytes]:
    """Object files for ``modules``, in order.

    Parameters
    ----------
    modules : iterable of (label, IR text)
        Consumed lazily, so the caller's IR generation overlaps with compilation.
    spec : dict
        ``{"triple", "cpu", "features", "opt"}`` for :func:`kiln.codegen.llvm_worker.compile_object`.
    count : int
        How many modules ``modules`` yields (decides whether workers pay off).
    compile_here : callable
        In-process compile of one IR text (used with one job or one module).

    Raises
    ------
    CompileError
        If a module fails to compile or a worker dies (the message names the module).
    """
    jobs = min(compile_jobs(), count)
    if jobs <= 1:
        return [compile_here(ir) for _label, ir in modules]
    header = json.dumps(spec).encode("utf-8")
    with _pool_lock:
        workers = _take_workers(jobs)
        todo: queue.Queue[tuple[int, str, bytes] | None] = queue.Queue()
        results: dict[int, bytes] = {}
        errors: list[BaseException] = []

        def feed(w: _Worker) -> None:
            while True:
                item = todo.get()
                if item is None:
                    return
                i, label, ir = item
                if errors:
                    continue  # drain: the build has already failed
                try:
                    results[i] = w.compile(header, ir, label)
                except BaseException as err:  # noqa: BLE001 - re-raised in the calling thread
                    errors.append(err)

        threads = [threading.Thread(target=feed, args=(w,), name=f"kiln-llvm-feed-{k}", daemon=True)
                   for k, w in enumerate(workers)]
        for t in threads:
            t.start()
        n = 0
        try:
            for label, ir in modules:
                todo.put((n, label, ir.encode("utf-8")))
                n += 1
        finally:
            for _ in threads:
                todo.put(None)
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
    return [results[i] for i in range(n)]
