"""The graph executor: runs a graph JSON against the kernels of a library module.

Two classes:

* :class:`GraphExecutor` — the engine. Created once per (graph, library, devices); it
  allocates one buffer per storage id, makes every entry a typed view of its buffer, binds
  every kernel's arguments once, and runs the whole op list with **one foreign call**
  (``KilnRunSequence``, the native loop compiled into every Kiln library) per run.
* :class:`GraphModule` — the user API (``set_input`` / ``run`` / ``get_output`` ...), a thin
  stateless wrapper around an engine; ``GraphModule(factory["default"](dev))`` is the usual
  way to get one. All state lives in the engine, so two wrappers of one engine agree.

Design notes (see ``docs/executor.md``):

* Kernel arguments are executor-owned ``DLTensor`` structs, one per entry (plus a 1-D twin
  for ``flatten_data`` kernels). The native call records point at these structs, so
  rebinding an entry (zero-copy input/output, shared params) only rewrites the struct's
  ``data`` field; the call records never change after creation. Rebinding is per *entry*,
  not per storage id, so other entries that share the storage keep their own memory.
* ``__nop`` outputs alias their input (same memory, own shape); an alias group is rebound
  together. ``__copy``, Python-implemented functions and control flow (``__if`` /
  ``__loop``: nested executors, :mod:`kiln.runtime.control_flow`) run from Python between
  native segments.
* One executor's ``run`` is not re-entrant (it owns its storage); different executors run
  concurrently, and the native call releases the GIL.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from . import _ffi
from . import dtype as _dtype
from .errors import DeviceError, FormatError, FunctionNotFoundError, InputError, KernelError, KilnError
from .dynamic_shapes import DynamicShapes, data_dim_sources
from .graph_json import Graph, load_graph_json

__all__ = ["GraphExecutor", "GraphModule", "create"]

LINKED_PARAM_LOOKUP = "_lookup_linked_param"  # exported by libraries built with link_params
_ALIGN = 64  # CPU arrays are 64-byte aligned; zero-copy buffers must be too (kernels assume it)
_OpCallP = ctypes.POINTER(_ffi.KilnOpCall)


_ND: Any = None


def _ndarray_mod():
    # Imported on first use (not at import time) so importing this module stays cheap.
    global _ND
    if _ND is None:
        from . import ndarray

        _ND = ndarray
    return _ND


class _EntryTensor:
    """The executor-owned DLTensor(s) of one entry; call records point at them.

    ``dl`` has the entry's full shape, ``flat`` (made only if a ``flatten_data`` kernel uses
    the entry) is the same memory as a 1-D tensor. Both must be rebound together.
    """

    __slots__ = ("dl", "shape", "flat", "flat_shape")

    def __init__(self, shape: Sequence[int], dtype: str, device: Any) -> None:
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.dl = _ffi.DLTensor()
        self.dl.device = _ffi.DLDevice(device.device_type, device.device_id)
        self.dl.ndim = len(shape)
        self.dl.dtype = _dtype.to_dl(dtype)
        self.dl.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        self.dl.strides = None
        self.flat: _ffi.DLTensor | None = None
        self.flat_shape: Any = None

    def flat_ptr(self) -> int:
        if self.flat is None:
            self.flat_shape = (ctypes.c_int64 * 1)(int(math.prod(self.shape[: self.dl.ndim])))
            self.flat = _ffi.DLTensor()
            ctypes.pointer(self.flat)[0] = self.dl  # copy every field, then make it 1-D
            self.flat.ndim = 1
            self.flat.shape = ctypes.cast(self.flat_shape, ctypes.POINTER(ctypes.c_int64))
        return ctypes.addressof(self.flat)

    def ptr(self) -> int:
        return ctypes.addressof(self.dl)

    def bind(self, arr: Any) -> None:
        """Point this entry at ``arr``'s memory (base pointer + byte offset, as DLPack does)."""
        h = arr.handle
        self.dl.data = h.data
        self.dl.byte_offset = h.byte_offset
        if self.flat is not None:
            self.flat.data = h.data
            self.flat.byte_offset = h.byte_offset


def _shape_taker(func: Any) -> Any:
    """The GPU module launcher behind a packed function (it takes ``shapes=``), or None."""
    inner = getattr(func, "_pyfunc", None) or func
    return inner if hasattr(inner, "takes_shapes") else None


@dataclass
class _Op:
    """A bound kernel node."""

    index: int  # position among op nodes
    nid: int
    name: str
    func_name: str
    kind: str  # "native", "py", "nop", "copy", "control"
    in_eids: tuple[int, ...]
    out_eids: tuple[int, ...]
    flatten: bool
    func: Any = None  # PackedFunction (native / py)
    call: Any = None  # KilnOpCall (native)
    keep: Any = None  # ctypes arrays the call record points into


class GraphExecutor:
    """The executor engine (storage, bound kernels, native dispatch). Use :class:`GraphModule`.

    Parameters
    ----------
    graph_json : str, dict or Graph
        The graph (validated by :func:`~kiln.runtime.graph_json.load_graph_json`).
    lib : Module
        Module holding the kernels (its imports are searched too).
    devices : sequence of Device
        Devices to run on. Entries are placed by ``attrs.device_index`` (DLPack device type
        codes); without it everything goes on ``devices[0]`` (default: ``kiln.cpu()``).
    prefilled : iterable of str, optional
        Arguments the caller overwrites completely before handing the executor to anyone
        (the factory's params). Their storage is not zero-filled first: for a ResNet-50
        that saves zeroing ~100 MB of weights only to copy over them. Every other storage
        starts zeroed.
    given_dims : iterable of str, optional
        Symbols of a dynamic graph whose values the caller sets (``self.dyn.set_given``) rather
        than the inputs' shapes: a nested graph of runtime control flow gets its parent's.
    """

    def __init__(self, graph_json: Any, lib: Any, devices: Sequence[Any] = (), prefilled: Iterable[str] = (),
                 given_dims: Iterable[str] = ()) -> None:
        from .device import Device, cpu

        self.graph: Graph = graph_json if isinstance(graph_json, Graph) else load_graph_json(graph_json)
        self.lib = lib
        devs = [d for d in devices]
        if not devs:
            devs = [cpu()]
        for d in devs:
            if not isinstance(d, Device):
                raise InputError(f"devices must be kiln Device objects, got {type(d).__name__}")
        self.devices: list[Any] = devs
        # Device code loads anywhere; its runtime is needed from here on, so say now what is missing.
        for m in lib.walk() if hasattr(lib, "walk") else ():
            need = getattr(m, "require_runtime", None)
            if need is not None and any(d.device_type == getattr(m, "device_type", None) for d in devs):
                need()
        g = self.graph
        # ---- names -------------------------------------------------------------------------
        self.arg_names: list[str] = [g.nodes[n].name for n in g.arg_nodes]
        self.arg_eid: dict[str, int] = {g.nodes[n].name: g.entry_id(n) for n in g.arg_nodes}
        self.params: set[str] = set()  # arg names that hold parameters (excluded from inputs)
        self.output_eids: list[int] = [g.entry_id(n, i) for n, i, _ in g.heads]
        self._shared_entries: set[int] = set()  # alias roots whose memory is a donor's
        self._host_views: dict[int, Any] = {}  # eid -> NumPy view of own host memory (set_input)
        self.linked: set[str] = set()  # params whose memory is constant data inside the library
        self._unset: set[str] = set(self.arg_names)  # arguments never given a value (run refuses)
        self._setup_storage({self.arg_eid[n] for n in prefilled if n in self.arg_eid})
        #: data-dependent symbol -> (entry, dim) its kernel writes (read by the segments and dyn)
        self.dim_sources = data_dim_sources(g)
        self._setup_ops()
        self._bind_linked_params()
        #: Symbols and actual shapes of a graph with dynamic dimensions (None when static).
        self.dyn: DynamicShapes | None = None
        if g.sym_shape is not None:
            self._check_dynamic_devices()
            self.dyn = DynamicShapes(g, self.tensors, self.arg_eid, self.dim_sources, frozenset(given_dims))

    def _check_dynamic_devices(self) -> None:
        """A dynamic graph's device kernels must take the actual shapes (GPU module functions
        with runtime extents do); a device function that cannot is refused, naming it."""
        for op in self.ops:
            if op.kind in ("nop", "copy") or all(self.entry_device[e].host_visible for e in op.in_eids + op.out_eids):
                continue
            if op.kind != "py" or _shape_taker(op.func) is None or op.flatten:
                raise DeviceError(f"graph node {op.nid} ({op.name!r}), function {op.func_name!r}: a graph with "
                                  "dynamic dimensions runs device code only through GPU module functions "
                                  "(CUDA, OpenCL); this node cannot take the actual shapes")

    # ---------------------------------------------------------------------------------------
    # storage
    def _entry_device(self, eid: int) -> Any:
        g = self.graph
        if g.device_index is None:
            return self.devices[0]
        code = g.device_index[eid]
        for d in self.devices:
            if d.device_type == code:
                return d
        from .device import Device, cpu

        if code == cpu().device_type:  # the host always exists: ops a build put there need no naming
            return cpu()

        name = Device(code).name if code > 0 else str(code)
        make = f"kiln.{name}()" if name in ("cuda", "opencl") else f"kiln.device({code})"
        raise DeviceError(
            f"graph entry {eid} is placed on device type {code} ({name}, attrs.device_index) but no such device "
            f"was given; devices: {[str(d) for d in self.devices]}. Create the executor with every device "
            f"the graph uses, e.g. factory['default'](kiln.cpu(), {make})"
        )

    def _alloc_storage(self, sid: int, nbytes: int, dev: Any, zeroed: bool) -> Any:
        """A buffer for storage ``sid``, zero-filled unless the caller overwrites it at once.

        Zeroed, not merely allocated: fresh memory may hold a freed executor's data (another
        model's inputs), which ``get_input`` or an output would otherwise hand to the user.
        """
        nd = _ndarray_mod()
        try:
            return (nd.zeros if zeroed else nd.empty)((max(nbytes, 1),), "uint8", dev)
        except MemoryError:
            raise DeviceError(
                f"graph JSON storage_id {sid}: cannot allocate {nbytes} bytes on {dev} (out of memory)"
            ) from None

    def _setup_storage(self, prefilled: set[int]) -> None:
        g = self.graph
        n = g.num_entries
        # Alias roots (a __nop output is its input's memory with its own shape), sizes and
        # devices of shared storage were all checked by the graph reader.
        root = list(g.alias_root)
        self.alias_root = root
        self.alias_group: dict[int, list[int]] = {}
        for e in range(n):
            self.alias_group.setdefault(root[e], []).append(e)
        self.entry_device = [self._entry_device(e) for e in range(n)]

        # One allocation per storage id, sized for its largest entry (aliases use their root's).
        sizes: dict[int, int] = {}
        sid_dev: dict[int, Any] = {}
        zeroed: set[int] = set()  # storages some entry may be read from before it is written
        for e in range(n):
            if root[e] == e and g.dltype[e] != _dtype.STRING:  # text lives in object arrays, not storage
                sid = g.storage_id[e]
                sid_dev[sid] = self.entry_device[e]
                sizes[sid] = max(sizes.get(sid, 0), g.entry_offset(e) + g.entry_bytes(e))
                if e not in prefilled:
                    zeroed.add(sid)
        self.storage: dict[int, Any] = {
            sid: self._alloc_storage(sid, sizes[sid], sid_dev[sid], sid in zeroed) for sid in sorted(sizes)
        }
        # own[e]: the entry's own memory (restored by set_input after a zero-copy binding);
        # arrays[e]: what the entry is bound to now (own view, user buffer, shared param).
        own: list[Any] = [None] * n
        for e in range(n):
            if root[e] == e and g.dltype[e] == _dtype.STRING:
                from .strings import empty_strings

                own[e] = empty_strings(g.shape[e], self.entry_device[e])
            elif root[e] == e:
                own[e] = self.storage[g.storage_id[e]]._create_view(g.shape[e], g.dltype[e], g.entry_offset(e))
        for e in range(n):
            if root[e] != e:
                own[e] = own[root[e]]._create_view(g.shape[e], g.dltype[e])
        self.own: list[Any] = own
        self.arrays: list[Any] = list(own)
        self.tensors = [_EntryTensor(g.shape[e], g.dltype[e], self.entry_device[e]) for e in range(n)]

    # ---------------------------------------------------------------------------------------
    # ops
    def _setup_ops(self) -> None:
        g = self.graph
        ops: list[_Op] = []
        for nid, node in enumerate(g.nodes):
            if not node.is_op:
                continue
            in_eids = tuple(g.entry_id(s, i) for s, i, _ in node.inputs)
            out_eids = tuple(g.node_entries(nid))
            op = _Op(len(ops), nid, node.name, node.func_name, "", in_eids, out_eids, node.flatten_data)
            if node.func_name in ("__nop", "__concat"):
                op.kind = "nop"  # no work: an alias, or a concatenation its inputs wrote in place
            elif node.func_name == "__copy":
                op.kind = "copy"
            elif node.subgraphs:
                from .control_flow import make_control_runner

                op.kind = "control"  # __if / __loop: nested executors, run from Python
                op.func = make_control_runner(self, nid, node, in_eids, out_eids)
            elif node.func_name == "__host":
                from .strings import make_host_runner

                op.kind = "host"  # string ops and friends: a registered Python function
                op.func = make_host_runner(self, nid, node, in_eids, out_eids)
            else:
                try:
                    f = self.lib.get_function(node.func_name, query_imports=True)
                except FunctionNotFoundError:
                    raise FunctionNotFoundError(
                        f"graph node {nid} ({node.name!r}): function {node.func_name!r} is not defined by "
                        f"the library module (type {getattr(self.lib, 'type_key', '?')!r}) or its imports"
                    ) from None
                op.func = f
                op.kind = "native" if getattr(f, "address", None) is not None else "py"
            if op.kind == "native":
                args = in_eids + out_eids
                values = (_ffi.KilnValue * max(len(args), 1))()
                codes = (ctypes.c_int32 * max(len(args), 1))(*([_ffi.TypeCode.DLTENSOR] * len(args)))
                for k, e in enumerate(args):
                    t = self.tensors[e]
                    values[k].v_handle = t.flat_ptr() if op.flatten else t.ptr()
                op.keep = (values, codes)
                op.call = _ffi.KilnOpCall(
                    op.func.address,
                    ctypes.cast(values, ctypes.POINTER(_ffi.KilnValue)),
                    ctypes.cast(codes, ctypes.POINTER(ctypes.c_int32)),
                    len(args),
                    0,
                )
            ops.append(op)
        self.ops = ops
        for e in range(g.num_entries):
            self.tensors[e].bind(self.arrays[e])
        self._build_segments()

    def _runner_for(self, op: _Op) -> tuple[Callable[[Any, int], int] | None, Any]:
        """The ``KilnRunSequence`` to use for a native op: its own library's, else any found."""
        # Any library's KilnRunSequence can call any kernel (it only follows function
        # pointers); the kernel's own library is preferred because it is surely loaded.
        cands = [getattr(op.func, "module", None)]
        for mod in self.lib.walk():
            cands += [mod, getattr(mod, "_lib", None)]  # a C source module compiles to ._lib
        for cand in cands:
            if cand is not None and hasattr(cand, "run_sequence"):
                try:
                    return cand.run_sequence_cfunc, cand
                except KilnError:
                    continue  # that library was linked without the Kiln crt
        return None, None

    def _build_segments(self) -> None:
        """Group consecutive native ops into one ``KilnOpCall`` array each.

        Python-level ops (``__copy``, Python functions) split the sequence; ``__nop`` does
        nothing at run time and does not split it.
        """
        segments: list[Callable[[], None]] = []
        pending: list[_Op] = []
        # a kernel deciding a data-dependent dim ends its segment: the dim is read from the
        # kernel's output, and every later entry re-shaped, before the next kernel runs
        decides: dict[int, list[str]] = {}
        for name, (eid, _) in self.dim_sources.items():
            decides.setdefault(eid, []).append(name)
        self.native_segments: list[tuple[Any, list[_Op]]] = []  # (calls array, ops); for introspection

        def flush() -> None:
            if not pending:
                return
            seg_ops = list(pending)
            pending.clear()
            runner, _ = self._runner_for(seg_ops[0])
            if runner is None:
                # A library without the Kiln crt: still correct, one foreign call per op.
                for op in seg_ops:
                    segments.append(self._make_slow_call(op))
                return
            calls = (_ffi.KilnOpCall * len(seg_ops))(*[op.call for op in seg_ops])
            self.native_segments.append((calls, seg_ops))
            n = len(seg_ops)
            ptr = ctypes.cast(calls, _OpCallP)

            def run_native(runner=runner, ptr=ptr, n=n, seg_ops=seg_ops, calls=calls) -> None:
                rc = runner(ptr, n)
                if rc != -1:
                    self._raise_kernel_error(seg_ops[rc])

            segments.append(run_native)

        #: op nid -> the data-dependent dims its kernel decides (read after it runs)
        self.decided_by: dict[int, list[str]] = {}
        for op in self.ops:
            names = [n for e in op.out_eids for n in decides.get(e, ())]
            if names:
                self.decided_by[op.nid] = names
            if op.kind == "native":
                pending.append(op)
                if names:
                    flush()
                    segments.append(functools.partial(self._take_data_dims, names))
            elif op.kind == "nop":
                continue
            else:
                flush()
                segments.append(self._make_py_call(op))
                if names:  # a runtime loop's scan outputs: it writes the iteration count like a kernel
                    segments.append(functools.partial(self._take_data_dims, names))
        flush()
        self.segments = segments

    def _take_data_dims(self, names: list[str]) -> None:
        assert self.dyn is not None  # a graph with data-dependent dims is dynamic
        self.dyn.take_data_dims(names)

    def _raise_kernel_error(self, op: _Op, cause: BaseException | None = None) -> None:
        if cause is not None:
            msg = f"{type(cause).__name__}: {cause}"
        else:
            m = getattr(op.func, "module", None)
            msg = m.last_error() if m is not None and hasattr(m, "last_error") else ""
            msg = msg or "no error message recorded"
        err = KernelError(f"graph node {op.nid} ({op.name!r}), function {op.func_name!r} failed: {msg}")
        if cause is not None:
            raise err from cause
        raise err

    def _make_slow_call(self, op: _Op) -> Callable[[], None]:
        cfunc = _ffi.PackedCFunc(op.func.address)
        values, codes = op.keep
        ret_v, ret_c = _ffi.KilnValue(), ctypes.c_int32()
        n = op.call.num_args

        def call() -> None:
            if cfunc(values, codes, n, ctypes.byref(ret_v), ctypes.byref(ret_c), None) != 0:
                self._raise_kernel_error(op)

        return call

    def _op_args(self, op: _Op) -> list[Any]:
        arrs = [self.arrays[e] for e in op.in_eids + op.out_eids]
        if op.flatten:
            arrs = [a._create_view((a.size,), a.dtype) for a in arrs]
        return arrs

    def _make_py_call(self, op: _Op) -> Callable[[], None]:
        if op.kind == "copy":
            src_e, dst_e = op.in_eids[0], op.out_eids[0]
            copy_box = _ndarray_mod().copy_box

            def copy() -> None:
                dyn = self.dyn  # set after the segments are built
                try:
                    if dyn is None or not dyn.is_dynamic(dst_e):
                        self.arrays[dst_e].copyfrom(self.arrays[src_e])
                    else:  # only the valid box moves; both sides have the upper-bound layout
                        copy_box(self.arrays[src_e], self.arrays[dst_e], dyn.shape(dst_e))
                except Exception as err:  # noqa: BLE001 - reported with the node's name
                    self._raise_kernel_error(op, err)

            return copy

        if op.kind in ("control", "host"):
            return op.func  # raises its own errors, naming the node (and the branch)

        func = op.func
        launcher = _shape_taker(func)
        if launcher is not None and launcher.takes_shapes and self.graph.sym_shape is not None:
            # the DLTensors' shape arrays hold the actual shapes (rewritten in place when the
            # symbols change), so one list of them serves every run
            func = functools.partial(launcher, shapes=[self.tensors[e].shape for e in op.in_eids + op.out_eids])

        def call() -> None:
            try:
                func(*self._op_args(op))
            except Exception as err:  # noqa: BLE001
                self._raise_kernel_error(op, err)

        return call

    def op_callable(self, op: _Op) -> Callable[[], None]:
        """A function that runs just ``op`` once (used by the debug executor)."""
        if op.kind == "nop":
            return lambda: None
        if op.kind == "native":
            runner, _ = self._runner_for(op)
            if runner is None:
                return self._make_slow_call(op)
            one = (_ffi.KilnOpCall * 1)(op.call)
            ptr = ctypes.cast(one, _OpCallP)

            def run_one(one=one) -> None:
                if runner(ptr, 1) != -1:
                    self._raise_kernel_error(op)

            return run_one
        return self._make_py_call(op)

    def op_repeater(self, op: _Op, number: int) -> Callable[[], None]:
        """A function that runs ``op`` ``number`` times back to back, natively when possible.

        Timing a tiny kernel through one Python call each would measure Python, not the kernel.
        """
        if op.kind == "native":
            runner, _ = self._runner_for(op)
            if runner is not None:
                calls = (_ffi.KilnOpCall * number)(*([op.call] * number))
                ptr = ctypes.cast(calls, _OpCallP)

                def run_many(calls=calls) -> None:
                    rc = runner(ptr, number)
                    if rc != -1:
                        self._raise_kernel_error(op)

                return run_many
        f = self.op_callable(op)

        def loop() -> None:
            for _ in range(number):
                f()

        return loop

    # ---------------------------------------------------------------------------------------
    # running and binding
    def _bind_linked_params(self) -> None:
        """Point every param the library carries itself (``link_params``) at that data.

        A library built with ``link_params=True`` exports ``_lookup_linked_param(name)``
        returning the address of a 64-byte aligned constant array (see
        ``docs/compiler.md``). Binding is zero copy; those params are then read-only.
        """
        try:
            lookup = self.lib.get_function(LINKED_PARAM_LOOKUP, query_imports=True)
        except FunctionNotFoundError:
            return
        nd = _ndarray_mod()
        g = self.graph
        for name in self.arg_names:
            addr = lookup(name)
            if not addr:
                continue
            eid = self.arg_eid[name]
            nbytes = g.entry_bytes(eid)
            if int(addr) % _ALIGN:
                raise FormatError(f"linked param {name!r} is not {_ALIGN}-byte aligned in the library")
            raw = (ctypes.c_ubyte * max(nbytes, 1)).from_address(int(addr))
            # every view of the data keeps its library mapped (ctypes arrays take attributes)
            setattr(raw, "_kiln_library", lookup)  # noqa: B010
            host = np.frombuffer(raw, dtype=np.uint8, count=nbytes)
            typed = host.view(_dtype.np_dtype(g.dltype[eid])).reshape(g.shape[eid])
            dev = self.entry_device[eid]
            if dev.host_visible:
                self.bind(eid, nd.from_dlpack(typed), permanent=True)
            else:  # device memory: the data must be copied there once
                self.arrays[eid].copyfrom(typed)
            self.linked.add(name)
            self.params.add(name)
            self.mark_set(name)

    def mark_set(self, name: str) -> None:
        """Record that argument ``name`` holds a value (set, bound zero copy, or a param)."""
        self._unset.discard(name)

    def unset_inputs(self) -> list[str]:
        """Names of the arguments never given a value, in ``arg_nodes`` order."""
        return [n for n in self.arg_names if n in self._unset]

    def require_inputs(self) -> None:
        """Raise :class:`InputError` unless every argument has been given a value.

        Running on inputs nobody set would compute on zeros (or, before storage was zeroed,
        on another model's leftovers) and return a plausible, wrong answer.
        """
        if self._unset:
            missing = self.unset_inputs()
            raise InputError(
                f"run(): input(s) {', '.join(repr(n) for n in missing)} not set; set every input with "
                "set_input(name, value) (or run(name=value)) before running; params count as set once "
                "loaded (load_params, the factory, share_params or linked params)"
            )

    def run(self) -> None:
        """Run every kernel once, in order.

        Raises
        ------
        InputError
            An argument has never been given a value (:meth:`require_inputs`).
        """
        if self._unset:
            self.require_inputs()
        if self.dyn is not None:
            self.dyn.prepare()
        for seg in self.segments:
            seg()

    def bind(self, eid: int, arr: Any, permanent: bool = False) -> None:
        """Point entry ``eid`` (and every ``__nop`` alias of it) at ``arr``'s memory.

        ``permanent`` makes ``arr`` the entry's own memory (shared params); otherwise the
        binding lasts until :meth:`unbind` (zero-copy).
        """
        g = self.graph
        members = self.alias_group[self.alias_root[eid]]
        too_big = [e for e in members if g.entry_bytes(e) > arr.nbytes]
        if too_big:
            raise InputError(
                f"entry {eid} is a '__nop' view of a larger tensor (entry {too_big[0]}, shape "
                f"{g.shape[too_big[0]]}); it cannot be bound to a buffer of {arr.nbytes} bytes"
            )
        for e in members:
            view = arr if e == eid else arr._create_view(g.shape[e], g.dltype[e])
            self.arrays[e] = view
            if permanent:
                self.own[e] = view
            self.tensors[e].bind(view)
        if permanent:
            self._host_views.clear()  # own memory changed
            self._release_unused_storage()

    def host_view(self, eid: int) -> np.ndarray | None:
        """Cached NumPy view of entry ``eid``'s own memory when it is host memory, else None."""
        hv = self._host_views.get(eid, False)
        if hv is False:
            own = self.own[eid]
            hv = own.numpy(copy=False) if self.entry_device[eid].host_visible else None
            self._host_views[eid] = hv
        return hv

    def unbind(self, eid: int) -> None:
        """Undo a zero-copy binding of ``eid``: point its alias group back at its own memory."""
        for e in self.alias_group[self.alias_root[eid]]:
            if self.arrays[e] is not self.own[e]:
                self.arrays[e] = self.own[e]
                self.tensors[e].bind(self.own[e])

    def _release_unused_storage(self) -> None:
        # A storage buffer nobody's own view uses any more (all its entries now share a
        # donor's params) is dropped, so sharing params really does not duplicate memory.
        g = self.graph
        shared = self._shared_entries
        used = {g.storage_id[e] for e in range(g.num_entries) if self.alias_root[e] == e and e not in shared}
        for sid in list(self.storage):
            if sid not in used:
                del self.storage[sid]

    def mark_shared(self, eid: int) -> None:
        """Record that ``eid``'s memory now belongs to another executor (shared params)."""
        self._shared_entries.add(self.alias_root[eid])


# ---------------------------------------------------------------------------------------------
# the user API


def _as_source(value: Any, what: str) -> tuple[Any, tuple[int, ...], str]:
    """Normalize a user value to (array-like to copy from, shape, dtype name)."""
    nd = _ndarray_mod()
    if isinstance(value, nd.NDArray):
        return value, tuple(value.shape), value.dtype
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "__dlpack__") and not isinstance(value, np.generic):
        try:
            arr = nd.from_dlpack(value)
        except KilnError:
            raise
        except Exception as err:  # noqa: BLE001
            raise InputError(f"{what}: cannot import {type(value).__name__} through DLPack: {err}") from err
        return arr, tuple(arr.shape), arr.dtype
    else:
        arr = np.asarray(value)
    try:
        dt = _dtype.canonical(arr.dtype)
    except InputError as err:
        raise InputError(f"{what}: {err}") from None
    return np.ascontiguousarray(arr), tuple(arr.shape), dt


class GraphModule:
    """Run a compiled graph: set inputs, run, read outputs.

    Parameters
    ----------
    module : GraphExecutor or GraphModule
        What ``factory["default"](dev)`` or :func:`create` returns.

    Examples
    --------
    >>> m = kiln.GraphModule(kiln.runtime.load_module("model.so")["default"](kiln.cpu()))
    >>> m.set_input("data", x); m.run(); y = m.get_output(0).numpy()

    Notes
    -----
    Inputs are the graph's argument nodes that are not parameters; parameters are those set
    by the factory, :meth:`load_params` or :meth:`share_params`. Input indices count inputs
    only, in ``arg_nodes`` order.
    """

    def __init__(self, module: Any) -> None:
        if isinstance(module, GraphModule):
            module = module.module
        if not isinstance(module, GraphExecutor):
            raise InputError(
                f"GraphModule expects the executor returned by factory['default'](dev) or "
                f"graph_executor.create(...), got {type(module).__name__}"
            )
        self.module: GraphExecutor = module
        #: how sequence / optional inputs and outputs map onto tensors (None: tensors only)
        self._values = _value_layouts(module)

    # ---- names / info ------------------------------------------------------------------------
    def _input_names(self) -> list[str]:
        ex = self.module
        return [n for n in ex.arg_names if n not in ex.params]

    def _valid_names(self) -> str:
        ex = self.module
        names = ", ".join(repr(n) for n in self._input_names()) or "none"
        if ex.params:
            names += f" (params: {', '.join(repr(n) for n in sorted(ex.params))})"
        return names

    def _resolve_input(self, key: str | int, allow_params: bool = True) -> tuple[str, int]:
        ex = self.module
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            names = self._input_names()
            if not 0 <= int(key) < len(names):
                raise InputError(f"input index {int(key)} is out of range: the graph has {len(names)} input(s)")
            name = names[int(key)]
            return name, ex.arg_eid[name]
        if not isinstance(key, str):
            raise InputError(f"input key must be a name (str) or an index (int), got {type(key).__name__}")
        if key not in ex.arg_eid or (not allow_params and key in ex.params):
            raise InputError(f"unknown input {key!r}; valid inputs: {self._valid_names()}")
        return key, ex.arg_eid[key]

    def get_num_inputs(self) -> int:
        """Number of real inputs (argument nodes that are not parameters)."""
        return len(self._input_names())

    def get_num_outputs(self) -> int:
        """Number of graph outputs (``heads``; a sequence / optional output counts once)."""
        if self._values is not None:
            return len(self._values.outputs)
        return len(self.module.output_eids)

    def get_input_index(self, name: str) -> int:
        """Index of input ``name`` among the real inputs, or -1 if there is none (or it is a param)."""
        names = self._input_names()
        return names.index(name) if name in names else -1

    def get_input_info(self) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
        """Shapes and dtypes of the real inputs.

        Returns
        -------
        shape_dict : dict of str to tuple of int
        dtype_dict : dict of str to str
            Both keyed by input name, in input order. Entry ids: :meth:`get_input_entry_ids`.
        """
        ex, g = self.module, self.module.graph
        names = self._input_names()
        return (
            {n: g.shape[ex.arg_eid[n]] for n in names},
            {n: g.dltype[ex.arg_eid[n]] for n in names},
        )

    def get_input_entry_ids(self) -> dict[str, int]:
        """Graph entry id of every real input, keyed by name."""
        return {n: self.module.arg_eid[n] for n in self._input_names()}

    def get_output_info(self) -> tuple[list[tuple[int, ...]], list[str]]:
        """Shapes and dtypes of the outputs, in output order."""
        g = self.module.graph
        return [g.shape[e] for e in self.module.output_eids], [g.dltype[e] for e in self.module.output_eids]

    # ---- inputs ------------------------------------------------------------------------------
    def _check(self, name: str, eid: int, shape: tuple[int, ...], dt: str, what: str) -> None:
        g = self.module.graph
        if shape != g.shape[eid]:
            raise InputError(f"{what} {name!r}: shape {shape} does not match the graph's {g.shape[eid]}")
        if dt != g.dltype[eid]:
            raise InputError(f"{what} {name!r}: dtype {dt} does not match the graph's {g.dltype[eid]}")

    def _copy_in(self, name: str, eid: int, value: Any, what: str = "input") -> None:
        ex = self.module
        if ex.graph.dltype[eid] == _dtype.STRING:
            from .strings import set_string_input

            set_string_input(ex, name, eid, value, what)
            return
        if ex.dyn is not None and ex.dyn.is_dynamic(eid):
            self._copy_in_dynamic(name, eid, value, what)
            return
        if name in ex.linked:
            # The linked data is read-only library memory: the first overwrite gives this
            # entry memory of its own (the other linked params stay zero copy).
            g = ex.graph
            ex.bind(eid, _ndarray_mod().empty(g.shape[eid], g.dltype[eid], ex.entry_device[eid]),
                    permanent=True)
            ex.linked.discard(name)
        if type(value) is np.ndarray:
            # Fast path (the common case): NumPy into host memory the executor owns.
            hv = ex.host_view(eid)
            if hv is not None and value.shape == hv.shape and value.dtype == hv.dtype:
                ex.unbind(eid)
                np.copyto(hv, value, casting="no")
                ex.mark_set(name)
                return
        src, shape, dt = _as_source(value, f"{what} {name!r}")
        self._check(name, eid, shape, dt, what)
        ex.unbind(eid)  # a copying set_input after a zero-copy one writes our own memory again
        ex.arrays[eid].copyfrom(src)
        ex.mark_set(name)

    def _copy_in_dynamic(self, name: str, eid: int, value: Any, what: str) -> None:
        """Copy a dynamic input into the valid sub-box of its upper-bound storage."""
        ex = self.module
        dyn = ex.dyn
        assert dyn is not None
        if type(value) is not np.ndarray:
            src, _, _ = _as_source(value, f"{what} {name!r}")
            value = src.numpy() if hasattr(src, "numpy") else np.asarray(src)
        want = _dtype.np_dtype(ex.graph.dltype[eid])
        if value.dtype != want:
            raise InputError(f"{what} {name!r}: dtype {value.dtype} does not match the graph's {ex.graph.dltype[eid]}")
        dyn.bind_input(name, eid, value.shape)
        ex.unbind(eid)
        hv = ex.host_view(eid)
        if hv is None:  # device memory: the valid box goes over, run by run
            _ndarray_mod().copy_box(np.ascontiguousarray(value), ex.arrays[eid], value.shape)
        else:
            hv[tuple(slice(0, a) for a in value.shape)] = value
        ex.mark_set(name)

    def _dynamic_copy(self, eid: int) -> Any:
        """A compact copy of a dynamic entry's valid data (its actual shape)."""
        ex = self.module
        assert ex.dyn is not None
        hv = ex.host_view(eid)
        box = ex.dyn.shape(eid)
        if hv is None:  # device memory: only the valid box comes over
            out = np.empty(box, _dtype.np_dtype(ex.graph.dltype[eid]))
            _ndarray_mod().copy_box(ex.arrays[eid], out, box)
            return _ndarray_mod().array(out)
        return _ndarray_mod().array(np.ascontiguousarray(hv[tuple(slice(0, a) for a in box)]))

    def get_input_dims(self) -> dict[str, tuple[int | str, ...]]:
        """Dims of every real input: ints, and symbolic dims as expressions (``"seq"``).

        A static graph gives its shapes. The symbols' ranges are :attr:`dim_ranges`.
        """
        ex, g = self.module, self.module.graph
        dims = g.sym_shape if g.sym_shape is not None else g.shape
        return {n: tuple(dims[ex.arg_eid[n]]) for n in self._input_names()}

    def get_output_dims(self) -> list[tuple[int | str, ...]]:
        """Dims of every output, symbolic dims as expressions (see :meth:`get_input_dims`)."""
        g = self.module.graph
        dims = g.sym_shape if g.sym_shape is not None else g.shape
        return [tuple(dims[e]) for e in self.module.output_eids]

    @property
    def dim_ranges(self) -> dict[str, tuple[int, int]]:
        """``{symbol: (lo, hi)}`` of a graph with dynamic dimensions (empty when static)."""
        return dict(self.module.graph.dim_ranges)

    def set_input(self, key: str | int | None = None, value: Any = None, **params: Any) -> None:
        """Copy input values into the executor.

        Parameters
        ----------
        key : str or int, optional
            Input name or index (params may be set by name too).
        value : array-like
            NumPy array, NDArray, or any DLPack tensor; its shape and dtype must match.
        **params
            More ``name=value`` inputs.

        Raises
        ------
        InputError
            Unknown name (the message lists the valid names), index out of range, shape or
            dtype mismatch.
        """
        seqs = self._values.inputs if self._values is not None else {}
        if key is not None and isinstance(key, str) and key in seqs:
            from .sequences import set_structured  # a list / None for a sequence / optional input

            set_structured(self, key, seqs[key], value)
        elif key is not None:
            if value is None:
                raise InputError(f"set_input({key!r}): no value given")
            name, eid = self._resolve_input(key)
            self._copy_in(name, eid, value)
        for k in [k for k in params if k in seqs]:
            self.set_input(k, params.pop(k))
        # Check every name first so a typo does not leave half the inputs set.
        resolved = [(self._resolve_input(k), v) for k, v in params.items()]
        for (name, eid), v in resolved:
            self._copy_in(name, eid, v)

    def get_input(self, key: str | int, out: Any = None) -> Any:
        """The executor's array of input (or param) ``key``; copied into ``out`` if given.

        Without ``out`` this is the executor's own array (not a copy): later ``set_input``
        calls change it. It reads as zeros until the input is set; writing into it directly
        does not count as setting the input (:meth:`run` still asks for ``set_input``).
        """
        name, eid = self._resolve_input(key)
        arr = self.module.arrays[eid]
        dyn = self.module.dyn
        if dyn is not None and dyn.is_dynamic(eid):
            arr = self._dynamic_copy(eid)  # the valid sub-box, as the user set it
        if out is None:
            return arr
        return self._copy_out(arr, out, f"input {name!r}")

    def set_input_zero_copy(self, key: str | int, value: Any) -> None:
        """Make input ``key`` read directly from ``value``'s memory (no copy).

        Parameters
        ----------
        key : str or int
            Input name or index (a param name also works).
        value : NDArray or DLPack tensor
            Compact, 64-byte aligned, on the entry's device, with exactly the entry's shape
            and dtype. The caller keeps it alive and unchanged while running; the executor
            holds a reference until the next ``set_input``/zero-copy call for this input.

        Raises
        ------
        InputError
            On a shape, dtype, device, layout or alignment mismatch.
        """
        name, eid = self._resolve_input(key)
        arr = self._zero_copy_array(value, name, eid, "input")
        self.module.bind(eid, arr)
        self.module.mark_set(name)

    def set_output_zero_copy(self, index: int, value: Any) -> None:
        """Make output ``index`` be written directly into ``value``'s memory (no copy).

        Same requirements on ``value`` as :meth:`set_input_zero_copy`. Other entries that
        share the output's storage id keep using the executor's memory: rebinding is per
        entry, never per storage id.
        """
        ex = self.module
        if not isinstance(index, (int, np.integer)) or not 0 <= int(index) < len(ex.output_eids):
            raise InputError(f"output index {index!r} is out of range: the graph has {len(ex.output_eids)} output(s)")
        eid = ex.output_eids[int(index)]
        root = ex.alias_root[eid]
        if root in ex.arg_eid.values():
            raise InputError(
                f"output {index} is (an alias of) a graph input; it cannot be bound zero-copy — "
                "bind the input with set_input_zero_copy instead"
            )
        arr = self._zero_copy_array(value, f"output {index}", eid, "output")
        ex.bind(eid, arr)

    def _zero_copy_array(self, value: Any, name: str, eid: int, what: str) -> Any:
        nd = _ndarray_mod()
        ex = self.module
        if ex.graph.dltype[eid] == _dtype.STRING:
            raise InputError(f"zero-copy {what} {name}: string tensors are Python objects, not memory to bind; "
                             "use set_input / get_output (they copy)")
        if ex.dyn is not None and ex.dyn.is_dynamic(eid):
            raise InputError(
                f"zero-copy {what} {name}: it has dynamic dimensions {ex.dyn.dims(eid)}; zero-copy binding "
                "needs a static shape (use set_input / get_output, which copy)"
            )
        if isinstance(value, nd.NDArray):
            arr = value
        elif hasattr(value, "__dlpack__"):
            try:
                arr = nd.from_dlpack(value)
            except KilnError:
                raise
            except Exception as err:  # noqa: BLE001
                raise InputError(f"zero-copy {what} {name}: cannot import through DLPack: {err}") from err
        else:
            raise InputError(
                f"zero-copy {what} {name}: needs an NDArray or a DLPack tensor, got {type(value).__name__}"
            )
        self._check(name, eid, tuple(arr.shape), arr.dtype, f"zero-copy {what}")
        dev = ex.entry_device[eid]
        if arr.device != dev:
            raise InputError(f"zero-copy {what} {name}: array is on {arr.device}, the graph entry is on {dev}")
        h = arr.handle
        if h.strides and arr.ndim:
            expect, acc = [], 1
            for d in reversed(arr.shape):
                expect.append(acc)
                acc *= d
            got = [h.strides[i] for i in range(arr.ndim)]
            if any(s != x for s, x, d in zip(got, reversed(expect), arr.shape) if d > 1):
                raise InputError(f"zero-copy {what} {name}: array is not compact row-major (strides {got})")
        addr = (h.data or 0) + h.byte_offset
        # device memory (OpenCL buffers) is a handle plus byte offset, not an address
        if dev.host_visible and addr % _ALIGN:
            raise InputError(
                f"zero-copy {what} {name}: data address 0x{addr:x} is not {_ALIGN}-byte aligned; "
                "allocate with kiln.nd.empty/array or use set_input (copies)"
            )
        return arr

    # ---- run / outputs ------------------------------------------------------------------------
    def run(self, **inputs: Any) -> None:
        """Set ``inputs`` (if any, as in :meth:`set_input`) and run the graph once.

        Raises
        ------
        InputError
            An input was never set (the message names every such input). Inputs stay set
            across runs; params count as set once loaded.
        KernelError
            Naming the failing node, its function and the library's error message.
        """
        if inputs:
            self.set_input(**inputs)
        self.module.run()

    def _copy_out(self, arr: Any, out: Any, what: str) -> Any:
        nd = _ndarray_mod()
        if isinstance(out, nd.NDArray):
            if tuple(out.shape) != tuple(arr.shape) or out.dtype != arr.dtype:
                raise InputError(
                    f"{what}: out has shape {tuple(out.shape)} dtype {out.dtype}, "
                    f"expected {tuple(arr.shape)} {arr.dtype}"
                )
            out.copyfrom(arr)
            return out
        if isinstance(out, np.ndarray):
            if out.shape != tuple(arr.shape) or out.dtype != _dtype.np_dtype(arr.dtype):
                raise InputError(
                    f"{what}: out has shape {out.shape} dtype {out.dtype}, expected {tuple(arr.shape)} {arr.dtype}"
                )
            out[...] = arr.numpy()
            return out
        raise InputError(f"{what}: out must be an NDArray or a NumPy array, got {type(out).__name__}")

    def get_output(self, index: int, out: Any = None) -> Any:
        """Output ``index`` as a new NDArray (a copy), or copied into ``out``.

        Parameters
        ----------
        index : int
            Output position in ``heads``.
        out : NDArray or numpy.ndarray, optional
            Destination with the output's shape and dtype.

        A sequence output is returned as a list of NDArrays, an optional one as ``None`` or
        its value (``docs/sequences.md``); ``out`` is for tensor outputs only.
        """
        ex = self.module
        if self._values is not None and isinstance(index, (int, np.integer)):
            if not 0 <= int(index) < len(self._values.outputs):
                raise InputError(f"output index {index!r} is out of range: the graph has "
                                 f"{len(self._values.outputs)} output(s)")
            layout = self._values.outputs[int(index)]
            if layout.kind != "tensor":
                from .sequences import get_structured  # a list of NDArrays, or None

                if out is not None:
                    raise InputError(f"output {index} is a {layout.describe()}; out= is for tensor outputs")
                return get_structured(self, layout)
            index = int(layout.slot)
        if not isinstance(index, (int, np.integer)) or not 0 <= int(index) < len(ex.output_eids):
            raise InputError(f"output index {index!r} is out of range: the graph has {len(ex.output_eids)} output(s)")
        eid = ex.output_eids[int(index)]
        if ex.dyn is not None and ex.dyn.is_dynamic(eid):
            arr = self._dynamic_copy(eid)
            return arr if out is None else self._copy_out(arr, out, f"output {index}")
        arr = ex.arrays[eid]
        if out is None:
            return arr.copyto(arr.device)
        return self._copy_out(arr, out, f"output {index}")

    # ---- params ------------------------------------------------------------------------------
    def _param_dict(self, params: Any) -> Mapping[str, Any]:
        if isinstance(params, (bytes, bytearray, memoryview)):
            from .params import load_param_dict

            return load_param_dict(bytes(params))
        if isinstance(params, Mapping):
            return params
        raise InputError(f"params must be bytes (save_param_dict) or a dict, got {type(params).__name__}")

    def load_params(self, params: bytes | Mapping[str, Any]) -> None:
        """Load parameters (copies) and mark them as params.

        Parameters
        ----------
        params : bytes or dict
            Bytes from :func:`~kiln.runtime.save_param_dict`, or a name -> array dict.

        Raises
        ------
        InputError
            A name is not an argument of the graph (message lists the valid names), or a
            shape/dtype mismatch.
        """
        ex = self.module
        d = self._param_dict(params)
        unknown = [k for k in d if k not in ex.arg_eid]
        if unknown:
            raise InputError(
                f"load_params: {unknown} are not inputs or params of the graph; valid names: "
                f"{', '.join(repr(n) for n in ex.arg_names) or 'none'}"
            )
        for k, v in d.items():
            self._copy_in(k, ex.arg_eid[k], v, "param")
            ex.params.add(k)

    def share_params(
        self, other: "GraphModule | GraphExecutor", params_bytes: bytes | Mapping[str, Any] | Iterable[str]
    ) -> None:
        """Use ``other``'s parameter memory for the params named in ``params_bytes`` (no copy).

        Parameters
        ----------
        other : GraphModule or GraphExecutor
            An executor of the same graph that holds the params (e.g. from the factory).
        params_bytes : bytes, dict or iterable of str
            Names the params to share (the values in bytes/dicts are not used).

        Notes
        -----
        This executor keeps references to the donor's arrays, not to the donor, so the
        memory stays valid after the donor is deleted. The param buffers of this executor
        are freed. Writing a shared param (``set_input``/``load_params``) writes the
        shared memory, i.e. changes it for every executor that shares it.
        """
        ex = self.module
        donor = other.module if isinstance(other, GraphModule) else other
        if not isinstance(donor, GraphExecutor):
            raise InputError(f"share_params: expected a GraphModule, got {type(other).__name__}")
        if isinstance(params_bytes, (bytes, bytearray, memoryview, Mapping)):
            names = list(self._param_dict(params_bytes))
        else:
            names = [str(n) for n in params_bytes]
        plan = []
        for name in names:
            if name not in ex.arg_eid:
                raise InputError(f"share_params: {name!r} is not a param of this graph; valid names: {ex.arg_names}")
            if name not in donor.arg_eid:
                raise InputError(f"share_params: the donor graph has no param {name!r}")
            eid, deid = ex.arg_eid[name], donor.arg_eid[name]
            src = donor.own[deid]
            self._check(name, eid, tuple(src.shape), src.dtype, "shared param")
            if src.device != ex.entry_device[eid]:
                raise InputError(
                    f"share_params: param {name!r} is on {src.device}, this executor needs it on {ex.entry_device[eid]}"
                )
            plan.append((name, eid, src))
        for name, eid, src in plan:
            ex.mark_shared(eid)
            ex.bind(eid, src, permanent=True)
            ex.params.add(name)
            ex.mark_set(name)

    # ---- benchmark -----------------------------------------------------------------------------
    def benchmark(
        self,
        device: Any = None,
        func_name: str = "run",
        repeat: int = 5,
        number: int = 5,
        min_repeat_ms: float | None = None,
        end_to_end: bool = False,
        **inputs: Any,
    ) -> Any:
        """Time the graph.

        Parameters
        ----------
        device : Device, optional
            Device synchronized after each repeat.
        func_name : str
            Only ``"run"`` is supported.
        repeat, number : int
            Repeats, and calls per repeat (each result is a per-call mean).
        min_repeat_ms : float, optional
            Grow ``number`` until one repeat lasts this long (default 0).
        end_to_end : bool
            Time ``set_input`` (host copies of the current inputs) + ``run`` + ``get_output``
            of every output, i.e. including transfers.
        **inputs
            Set before timing.

        Returns
        -------
        BenchmarkResult
            Seconds per call (``.mean``, ``.median``, ``.min``, ``.max``, ``.std``).
        """
        from .benchmark import measure
        from .module import _device_sync

        if func_name != "run":
            raise InputError(f"benchmark: func_name must be 'run', got {func_name!r}")
        if inputs:
            self.set_input(**inputs)
        if end_to_end:
            host = {n: self.module.arrays[self.module.arg_eid[n]].numpy() for n in self._input_names()}
            n_out = self.get_num_outputs()

            def fn() -> None:
                self.set_input(**host)
                self.run()
                for i in range(n_out):
                    self.get_output(i).numpy()

        else:
            fn = self.run
        return measure(
            fn, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms or 0, sync=_device_sync(device)
        )

    def __getitem__(self, name: str) -> Callable[..., Any]:
        """TVM-style access: ``m["set_input"](...)``, ``m["run"]()``..."""
        if name.startswith("_") or not callable(getattr(self, name, None)):
            raise FunctionNotFoundError(f"GraphModule has no function {name!r}")
        return getattr(self, name)

    def __repr__(self) -> str:
        g = self.module.graph
        return (
            f"<{type(self).__name__}: {len(self.module.ops)} ops, {self.get_num_inputs()} inputs, "
            f"{len(self.module.params)} params, {self.get_num_outputs()} outputs, "
            f"devices={[str(d) for d in self.module.devices]}, entries={g.num_entries}>"
        )


def _value_layouts(ex: GraphExecutor) -> Any:
    """The graph's ``kiln_values`` layouts (:mod:`.sequences`), read once per executor."""
    if "_value_layouts" not in ex.__dict__:
        from .sequences import layouts_of

        ex.__dict__["_value_layouts"] = layouts_of(ex.graph)
    return ex.__dict__["_value_layouts"]


def create(graph_json: str | Mapping[str, Any], lib: Any, *devices: Any) -> GraphModule:
    """Create a :class:`GraphModule` from a graph JSON and a module holding its kernels.

    Parameters
    ----------
    graph_json : str or dict
        The graph JSON.
    lib : Module
        Module (or its imports) defining every ``func_name``.
    *devices : Device
        Devices to run on (default ``kiln.cpu()``); a single list is accepted too.

    Returns
    -------
    GraphModule
        Without params: every argument node is an input until params are loaded.
    """
    if len(devices) == 1 and isinstance(devices[0], (list, tuple)):
        devices = tuple(devices[0])
    return GraphModule(GraphExecutor(graph_json, lib, devices))
