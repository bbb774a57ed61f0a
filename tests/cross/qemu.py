"""Run cross-compiled Kiln libraries under qemu-user: toolchains, a C graph runner, plans.

A library built for AArch64 or RISC-V cannot be loaded by this (x86-64) Python, so the tests
run it from C: ``graph_runner.c`` (next to this file) is cross-compiled with the target's gcc,
started under ``qemu-<arch> -L <sysroot>``, dlopens the library and calls its kernels in graph
order. What to call is a *plan* written here from the factory's graph JSON
(``docs/graph_json_format.md``): one buffer per storage id, one DLTensor per entry (a
``__nop`` entry views its input's buffer), the calls, the files to load (inputs, params) and
to save (outputs). Nothing here assumes the host's ISA: each toolchain is looked up by name
and a test skips, naming the missing tool, where one is absent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pytest

from kiln.runtime import dtype as _dtype
from kiln.runtime import include_path

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER_SOURCE = os.path.join(HERE, "graph_runner.c")
#: The C API example (``docs/c_api.md``): dlopens a model library and runs it through ``kiln_model.h``.
EXAMPLE_SOURCE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "c", "run_model.c")


@dataclass(frozen=True)
class Toolchain:
    """What building for, and running on, one foreign architecture takes."""

    name: str
    #: Kiln target string for this machine.
    target: str
    gcc: str
    qemu: str
    #: Debian multiarch sysroot (``qemu -L``: the dynamic loader and libc).
    sysroot: str
    #: Debian package of the compiler (named in skip reasons).
    package: str
    qemu_args: tuple[str, ...] = ()
    #: ELF ``e_machine`` the library must have.
    machine: int = 0


AARCH64 = Toolchain("aarch64", "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", "aarch64-linux-gnu-gcc",
                    "qemu-aarch64", "/usr/aarch64-linux-gnu", "gcc-aarch64-linux-gnu",
                    ("-cpu", "cortex-a72"), machine=183)
RV64GC = Toolchain("rv64gc", "llvm -mtriple=riscv64-linux-gnu -mcpu=generic-rv64 -mattr=+m,+a,+f,+d,+c",
                   "riscv64-linux-gnu-gcc", "qemu-riscv64", "/usr/riscv64-linux-gnu", "gcc-riscv64-linux-gnu",
                   ("-cpu", "rv64"), machine=243)
#: RV64GCV: the vector extension at the VLEN every ``V`` implementation guarantees (128 bits).
RV64GCV = Toolchain("rv64gcv", "llvm -mtriple=riscv64-linux-gnu -mcpu=generic-rv64 -mattr=+m,+a,+f,+d,+c,+v",
                    "riscv64-linux-gnu-gcc", "qemu-riscv64", "/usr/riscv64-linux-gnu", "gcc-riscv64-linux-gnu",
                    ("-cpu", "rv64,v=true,vlen=128,elen=64,vext_spec=v1.0"), machine=243)
TOOLCHAINS = (AARCH64, RV64GC, RV64GCV)


def missing_tools(tc: Toolchain) -> list[str]:
    """The tools ``tc`` needs that this machine lacks, each with what provides it."""
    out = []
    if shutil.which(tc.gcc) is None:
        out.append(f"{tc.gcc} (apt-get install {tc.package})")
    if shutil.which(tc.qemu) is None:
        out.append(f"{tc.qemu} (apt-get install qemu-user)")
    if not os.path.isfile(os.path.join(tc.sysroot, "lib", "libc.so.6")):
        out.append(f"{tc.sysroot}/lib/libc.so.6 (apt-get install {tc.package})")
    return out


def require(tc: Toolchain) -> None:
    """Skip the calling test, naming what is missing, unless ``tc`` can build and run here."""
    missing = missing_tools(tc)
    if missing:
        pytest.skip(f"cross toolchain for {tc.name} not installed: {', '.join(missing)}")


def qemu_version(tc: Toolchain) -> tuple[int, ...]:
    """``(major, minor, ...)`` of ``tc``'s qemu (``()`` if it cannot be told)."""
    try:
        out = subprocess.run([tc.qemu, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    m = re.search(r"version (\d+(?:\.\d+)*)", out)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def emulator_bug(tc: Toolchain) -> str | None:
    """Why ``tc``'s qemu cannot run whole models correctly, or ``None``.

    QEMU before 8.0 aborts translating the RVV round-toward-zero conversions
    (``vfcvt.rtz.x.f.v``, which the vectorised ``exp`` / ``erf`` / ``tanh`` use) with
    ``decode_save_opc: Assertion `ctx->insn_start != NULL'`` (QEMU issue 1441); Debian 12 ships 7.2.
    """
    if tc.name == "rv64gcv" and qemu_version(tc) < (8, 0):
        return (f"{tc.qemu} {'.'.join(map(str, qemu_version(tc)))} aborts on RVV rtz conversions "
                "(QEMU issue 1441, fixed in 8.0)")
    return None


def elf_machine(path: str) -> int:
    """``e_machine`` of an ELF file (183 AArch64, 243 RISC-V, 62 x86-64)."""
    with open(path, "rb") as f:
        head = f.read(20)
    assert head[:4] == b"\x7fELF", f"{path} is not ELF"
    return int.from_bytes(head[18:20], "little")


def build_program(tc: Toolchain, source: str, workdir: str) -> str:
    """The C program ``source`` compiled for ``tc`` into ``workdir``."""
    exe = os.path.join(workdir, f"{os.path.splitext(os.path.basename(source))[0]}_{tc.name}")
    cmd = [tc.gcc, "-O2", "-std=gnu11", "-I", include_path(), source, "-o", exe, "-ldl"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    return exe


def run_qemu(tc: Toolchain, argv: Sequence[str], timeout: float, cpu: Sequence[str] | None = None,
          ) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``argv`` (a program built for ``tc``) under qemu; the process and its wall time.

    ``cpu`` replaces ``tc.qemu_args`` (e.g. to emulate a CPU without a feature).
    """
    # One kernel thread: the pool's workers would only contend for this machine's cores.
    env = dict(os.environ, QEMU_LD_PREFIX=tc.sysroot, KILN_NUM_THREADS="1")
    cmd = [tc.qemu, *(tc.qemu_args if cpu is None else cpu), "-L", tc.sysroot, *argv]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return proc, time.perf_counter() - t0


@dataclass
class Plan:
    """A plan file and where the runner writes the outputs."""

    path: str
    outputs: list[tuple[str, str, tuple[int, ...]]]  # (file, dtype, shape) per graph output

    def read_outputs(self) -> list[np.ndarray]:
        """The outputs the runner wrote."""
        return [np.fromfile(p, dtype=_dtype.np_dtype(dt)).reshape(shape) for p, dt, shape in self.outputs]


def write_plan(factory: Any, inputs: Mapping[str, np.ndarray], workdir: str) -> Plan:
    """Write the plan that runs ``factory``'s graph on ``inputs`` (see the module docstring).

    Every argument node must be a param or in ``inputs``.
    """
    g = json.loads(factory.get_graph_json())
    params = {k: v.numpy() for k, v in factory.get_graph_params().items()}
    nodes, row = g["nodes"], g["node_row_ptr"]
    dtypes, shapes = g["attrs"]["dltype"][1], [tuple(s) for s in g["attrs"]["shape"][1]]
    sids = list(g["attrs"]["storage_id"][1])

    def nbytes(e: int) -> int:
        return int(np.prod(shapes[e], dtype=np.int64)) * _dtype.itemsize(dtypes[e])

    # A __nop output views its input's memory: it takes that entry's storage.
    for nid, n in enumerate(nodes):
        if n["op"] == "tvm_op" and n["attrs"]["func_name"] == "__nop":
            src = n["inputs"][0]
            sids[row[nid]] = sids[row[src[0]] + src[1]]
    storages = sorted(set(sids))
    buf_of = {s: i for i, s in enumerate(storages)}
    size = [0] * len(storages)
    for e, s in enumerate(sids):
        size[buf_of[s]] = max(size[buf_of[s]], nbytes(e))

    tensors: list[str] = []

    def tensor(e: int, flat: bool) -> int:
        dl = _dtype.to_dl(dtypes[e])
        shape = (int(np.prod(shapes[e], dtype=np.int64)),) if flat else shapes[e]
        tensors.append(" ".join(map(str, [buf_of[sids[e]], len(shape), *shape, dl.code, dl.bits, dl.lanes])))
        return len(tensors) - 1

    entry_tensor = [tensor(e, False) for e in range(len(sids))]
    calls = []
    for nid, n in enumerate(nodes):
        if n["op"] != "tvm_op" or n["attrs"]["func_name"] == "__nop":
            continue
        fname = n["attrs"]["func_name"]
        assert fname != "__copy", "graph_runner runs CPU graphs only"
        flat = str(n["attrs"].get("flatten_data", "0")) == "1"
        eids = [row[i[0]] + i[1] for i in n["inputs"]] + list(range(row[nid], row[nid + 1]))
        args = [tensor(e, True) if flat else entry_tensor[e] for e in eids]
        calls.append(f"{fname} {len(args)} {' '.join(map(str, args))}")
    loads = []
    for nid in g["arg_nodes"]:
        name, e = nodes[nid]["name"], row[nid]
        value = params[name] if name in params else inputs[name]
        arr = np.ascontiguousarray(value, dtype=_dtype.np_dtype(dtypes[e]))
        assert arr.shape == shapes[e], f"{name}: shape {arr.shape}, graph wants {shapes[e]}"
        p = os.path.join(workdir, f"arg{nid}.bin")
        arr.tofile(p)
        loads.append(f"{buf_of[sids[e]]} {arr.nbytes} {p}")
    saves, outputs = [], []
    for k, head in enumerate(g["heads"]):
        e = row[head[0]] + head[1]
        p = os.path.join(workdir, f"out{k}.bin")
        saves.append(f"{buf_of[sids[e]]} {nbytes(e)} {p}")
        outputs.append((p, dtypes[e], shapes[e]))
    lines = ["KILNPLAN 1", f"buffers {len(size)}", *map(str, size), f"tensors {len(tensors)}", *tensors,
             f"calls {len(calls)}", *calls, f"load {len(loads)}", *loads, f"save {len(saves)}", *saves]
    path = os.path.join(workdir, "plan.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return Plan(path, outputs)


@dataclass
class QemuRun:
    """Outputs and timings of one run under qemu."""

    outputs: list[np.ndarray]
    run_ms: float  # best kernel-sequence time the runner measured (emulated)
    wall_s: float  # the whole qemu process: load, read the plan, run


def run_plan(tc: Toolchain, library: str, runner: str, plan: Plan, repeat: int = 1,
             timeout: float = 1800) -> QemuRun:
    """Run ``plan`` on ``library`` with ``graph_runner`` under ``tc``'s qemu; the outputs it wrote."""
    proc, wall = run_qemu(tc, [runner, os.path.abspath(library), plan.path, str(repeat)], timeout)
    assert proc.returncode == 0, f"graph_runner exited {proc.returncode}\n{proc.stdout}{proc.stderr}"
    ms = float(proc.stdout.split("run_ms", 1)[1].split()[0])
    return QemuRun(plan.read_outputs(), ms, wall)


def graph_io(factory: Any) -> tuple[list[str], list[tuple[str, tuple[int, ...]]]]:
    """Argument names in graph order less the factory's params (the C API's inputs, plus any params
    linked into the code), and (dtype, shape) per output."""
    g = json.loads(factory.get_graph_json())
    params = factory.get_graph_params()
    names = [g["nodes"][nid]["name"] for nid in g["arg_nodes"]]
    row, attrs = g["node_row_ptr"], g["attrs"]
    outs = []
    for nid, idx, *_ in g["heads"]:
        e = row[nid] + idx
        outs.append((attrs["dltype"][1][e], tuple(attrs["shape"][1][e])))
    return [n for n in names if n not in params], outs


def run_model(tc: Toolchain, library: str | None, program: str, factory: Any, inputs: Mapping[str, np.ndarray],
              workdir: str, repeat: int = 1, timeout: float = 1800) -> QemuRun:
    """Run ``library`` with the C API example (``run_model``) under ``tc``'s qemu.

    ``library`` ``None``: ``program`` is the example built with the model's static archive.
    ``factory`` (any build of the same graph) gives the input order and the outputs' types.
    ``run_ms`` is the example's median over ``repeat`` runs (the single run's share of the
    wall time when ``repeat`` is 1: the example prints no latency then).
    """
    names, outs = graph_io(factory)
    files = []
    # params linked into the code (link_params) are argument nodes too, but not the C API's inputs
    for i, n in enumerate(n for n in names if n in inputs):
        p = os.path.join(workdir, f"in{i}.bin")
        np.ascontiguousarray(inputs[n]).tofile(p)
        files.append(p)
    prefix = os.path.join(workdir, f"out_{tc.name}_")
    lib = [] if library is None else [os.path.abspath(library)]
    argv = [program, *lib, *files, "--out", prefix, "--repeat", str(repeat)]
    proc, wall = run_qemu(tc, argv, timeout)
    assert proc.returncode == 0, f"run_model exited {proc.returncode}\n{proc.stdout}{proc.stderr}"
    ms = float("nan")
    if "median latency:" in proc.stdout:
        ms = float(proc.stdout.split("median latency:", 1)[1].split()[0])
    got = [np.fromfile(f"{prefix}{i}.bin", dtype=_dtype.np_dtype(dt)).reshape(shape)
           for i, (dt, shape) in enumerate(outs)]
    return QemuRun(got, ms, wall)


def host_outputs(factory: Any, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``factory`` (built for this machine) with the Python graph executor."""
    import kiln

    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    for k, v in inputs.items():
        m.set_input(k, v)
    m.run()
    return [m.get_output(i).numpy() for i in range(m.get_num_outputs())]


def assert_close(got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float = 1e-4,
                 atol: float = 1e-5) -> float:
    """Compare output lists; returns the largest absolute difference."""
    assert len(got) == len(want)
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"output {i}: shape {g.shape} vs {w.shape}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"output {i}")
        if g.size:
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))))
    return worst
