"""A compiled library, from file to a graph module that runs, for ``run``, ``bench`` and ``demo``.

Owns: finding the executor factory in a loaded library, creating the graph module on the
devices its graph is placed on, the kernel thread count, and seeded random inputs. Runtime and
NumPy only: these commands work on a deploy-only machine.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from ..runtime.errors import InputError, KilnError
from .args import model_kind, require_file

__all__ = ["load_factory", "executor_devices", "create_graph_module", "set_threads", "random_inputs"]


def load_factory(path: str) -> Any:
    """Load a compiled model library and return its executor factory module.

    Raises
    ------
    InputError
        If ``path`` is an ONNX model, or a library without a compiled model in it.
    KilnFileNotFoundError
        If the file does not exist.
    """
    from ..runtime import load_module
    from ..runtime.executor_factory import TYPE_KEY

    require_file(path, "library")
    if model_kind(path) == "onnx":
        raise InputError(f"{path} is an ONNX model, not a compiled library; "
                         f"build it first: kiln build {path} -o model.so")
    for m in load_module(path)._walk():
        if m.type_key == TYPE_KEY:
            return m
    raise InputError(f"{path} holds no compiled model (no {TYPE_KEY} module); it is a plain kernel library")


def executor_devices(graph_json: Any) -> list[Any]:
    """The devices a compiled graph runs on: the CPU first, then one per other device type in
    ``attrs.device_index`` (e.g. ``[cpu(0), opencl(0)]`` for a heterogeneous OpenCL build)."""
    from ..runtime import cpu, device
    from ..runtime.graph_json import Graph, load_graph_json

    g = graph_json if isinstance(graph_json, Graph) else load_graph_json(graph_json)
    devs = [cpu()]
    for code in sorted(set(g.device_index or ())):
        if code != devs[0].device_type:
            devs.append(device(code, 0))
    return devs


def create_graph_module(factory: Any, debug: bool = False) -> Any:
    """``GraphModule(factory["default"](*devices))`` (or the debug executor) on the devices the
    graph is placed on (see :func:`executor_devices`); linked params are bound by the executor."""
    from ..runtime import GraphModule

    devs = executor_devices(factory.get_graph_json())
    return factory.debug_create(*devs) if debug else GraphModule(factory[factory.mod_name](*devs))


def set_threads(n: int | None, *modules: Any) -> int | None:
    """Set the kernel thread count and report the count in effect.

    ``KILN_NUM_THREADS`` is set for libraries loaded later, and ``set_num_threads`` is called on
    every loaded library module under ``modules``.

    Returns
    -------
    int or None
        The count in effect, from the first library that reports one; None if none does.

    Raises
    ------
    InputError
        If ``n`` is less than 1.
    """
    if n is not None:
        if n < 1:
            raise InputError(f"--threads must be >= 1, got {n}")
        os.environ["KILN_NUM_THREADS"] = str(n)
    effective = None
    for root in modules:
        if root is None:
            continue
        for m in root._walk():
            setter = getattr(m, "set_num_threads", None)
            if setter is None:
                continue
            try:
                if n is not None:
                    setter(n)
                if effective is None:
                    effective = int(m.get_num_threads())
            except KilnError:  # a module that cannot report its threads does not stop the others
                continue
    return effective


def input_shapes(m: Any, given: Mapping[str, Sequence[int | str]] | None = None) -> dict[str, tuple[int, ...]]:
    """Every input's shape for a run: a dynamic library's symbols take their values from the
    shapes in ``given`` (arrays' shapes or ``--input-shape`` values), else their upper bounds."""
    from ..runtime import sym

    shapes, _ = m.get_input_info()
    ranges = m.dim_ranges
    if not ranges:
        return dict(shapes)
    dims = m.get_input_dims()
    env = {n: hi for n, (_, hi) in ranges.items()}
    for name, shape in (given or {}).items():
        for d, a in zip(dims.get(name, ()), shape):
            if isinstance(d, str) and d in ranges:
                env[d] = int(a)
    return {n: tuple(d if isinstance(d, int) else sym.evaluate(d, env) for d in ds) for n, ds in dims.items()}


def random_inputs(shapes: Mapping[str, Sequence[int]], dtypes: Mapping[str, str], seed: int = 0
                  ) -> dict[str, np.ndarray]:
    """Deterministic random inputs: normal floats, small non-negative ints, random bools."""
    from ..runtime.dtype import np_dtype

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        dt = dtypes.get(name, "float32")
        npdt = np_dtype(dt)
        shape = tuple(int(d) for d in shape)
        arr: np.ndarray
        if dt == "bool":
            arr = rng.random(shape) < 0.5
        elif np.issubdtype(npdt, np.integer):
            arr = rng.integers(0, 10, size=shape)
        else:
            arr = rng.standard_normal(shape)
        out[name] = np.asarray(arr).astype(npdt)
    return out
