"""Runtime modules and packed functions (modeled on TVM's ``runtime.Module``).

A :class:`Module` is a named bag of functions plus a list of imported modules. Concrete
kinds: :class:`~kiln.runtime.library_module.LibraryModule` (a loaded ``.so``),
:class:`~kiln.runtime.csource.CSourceModule` (C code, compiled on first use), and
Python-implemented modules such as the executor factory, which subclass :class:`Module`
and implement :meth:`Module._get_local_function` and :meth:`Module.save_to_binary`.

:class:`PackedFunction` calls a function with the packed C signature of
``c_runtime_api.h`` (or wraps a Python callable behind the same interface).
"""

from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from . import _ffi
from .errors import FunctionNotFoundError, InputError, KernelError, KilnError
from .registry import list_loaders, register_loader

if TYPE_CHECKING:  # pragma: no cover
    from .benchmark import BenchmarkResult

__all__ = [
    "Module",
    "PackedFunction",
    "load_module",
    "register_loader",
    "list_loaders",
]

_TC = _ffi.TypeCode
_KilnValue = _ffi.KilnValue
_Int32 = ctypes.c_int32
# A C function returning int32 whose arguments ctypes passes without conversion checks.
_RawCFunc = ctypes.CFUNCTYPE(ctypes.c_int32)

# Resolved on first call so that importing this module does not import ndarray.py.
_NDArray: Any = None
_from_dlpack: Any = None


def _bind_ndarray() -> None:
    global _NDArray, _from_dlpack
    from . import ndarray as _nd

    _NDArray = _nd.NDArray
    _from_dlpack = _nd.from_dlpack


class PackedFunction:
    """A callable with Kiln's packed calling convention.

    Parameters
    ----------
    name : str
        Function name (used in error messages).
    address : int, optional
        Address of a C function with the ``KilnBackendPackedCFunc`` signature.
    module : Module, optional
        The module the function lives in; holding it keeps a loaded library mapped.
    pyfunc : callable, optional
        A Python implementation instead of a C pointer (arguments are passed through as is).
    last_error : callable, optional
        Returns the library's last error text; used when the C function fails.

    Notes
    -----
    Arguments are packed as: NDArray -> its ``DLTensor*``; any other object with
    ``__dlpack__`` (NumPy arrays included) -> zero-copy DLTensor; ``bool``/``int``/NumPy
    integers -> int64; ``float``/NumPy floats -> double; ``str`` -> string; ``None`` -> null;
    ``ctypes.c_void_p`` -> opaque handle. The argument buffers are allocated once per arity
    and reused, so a call costs one foreign call plus the packing loop.
    """

    __slots__ = ("name", "address", "module", "_cfunc", "_pyfunc", "_last_error", "_pool", "__weakref__")

    def __init__(
        self,
        name: str,
        address: int | None = None,
        module: "Module | None" = None,
        pyfunc: Callable[..., Any] | None = None,
        last_error: Callable[[], str] | None = None,
    ) -> None:
        if (address is None) == (pyfunc is None):
            raise KilnError("PackedFunction needs exactly one of a C address or a Python callable")
        self.name = name
        self.address = address
        self.module = module
        self._pyfunc = pyfunc
        self._cfunc: Any = None  # a ctypes function pointer once the address is known
        if address is not None:
            # No argtypes: ctypes then skips per-argument converters, which halves the call
            # cost; every argument below is already a ctypes array/byref/int/None.
            self._cfunc = _RawCFunc(address)
            self._cfunc.argtypes = None
        self._last_error = last_error
        # Free (values, codes, ret_value, ret_code) buffers keyed by arity. list.pop/append are
        # atomic under the GIL, so concurrent callers never share buffers: a second caller
        # simply allocates its own while the first is inside C (ctypes drops the GIL).
        self._pool: dict[int, list[tuple[Any, ...]]] = {}

    def _buffers(self, n: int) -> tuple[Any, ...]:
        free = self._pool.get(n)
        if free:
            try:
                return free.pop()
            except IndexError:
                pass
        rv, rc = _KilnValue(), _Int32()
        return ((_KilnValue * max(n, 1))(), (_Int32 * max(n, 1))(), rv, rc, ctypes.byref(rv), ctypes.byref(rc))

    def __call__(self, *args: Any) -> Any:
        if self._pyfunc is not None:
            return self._pyfunc(*args)
        if _NDArray is None:
            _bind_ndarray()
        n = len(args)
        buf = self._buffers(n)
        values, codes, ret_val, ret_code, p_ret_val, p_ret_code = buf
        keep: list[Any] | None = None  # temporaries that must outlive the call
        for i, a in enumerate(args):
            v = values[i]
            if isinstance(a, _NDArray):
                v.v_handle = a._dltensor_ptr()
                codes[i] = _TC.DLTENSOR
            elif isinstance(a, (int, np.integer)):  # bool is an int
                v.v_int64 = int(a)
                codes[i] = _TC.INT
            elif isinstance(a, (float, np.floating)):
                v.v_float64 = float(a)
                codes[i] = _TC.FLOAT
            elif a is None:
                v.v_handle = None
                codes[i] = _TC.NULL
            elif isinstance(a, str):
                b = a.encode("utf-8")
                keep = keep or []
                keep.append(b)
                v.v_str = b
                codes[i] = _TC.STR
            elif isinstance(a, np.bool_):
                v.v_int64 = int(a)
                codes[i] = _TC.INT
            elif hasattr(a, "__dlpack__"):
                try:
                    arr = _from_dlpack(a)
                except KilnError:
                    raise
                except Exception as err:  # noqa: BLE001
                    raise InputError(
                        f"{self.name}: argument {i} ({type(a).__name__}) cannot be passed as a tensor: {err}"
                    ) from err
                keep = keep or []
                keep.append(arr)
                v.v_handle = arr._dltensor_ptr()
                codes[i] = _TC.DLTENSOR
            elif isinstance(a, ctypes.c_void_p):
                v.v_handle = a.value
                codes[i] = _TC.HANDLE
            else:
                raise InputError(
                    f"{self.name}: argument {i} has unsupported type {type(a).__name__}; expected an "
                    "NDArray, a DLPack tensor, int, float, str or None"
                )
        ret_code.value = _TC.NULL
        rc = self._cfunc(values, codes, n, p_ret_val, p_ret_code, None)
        del keep
        self._pool.setdefault(n, []).append(buf)
        if rc != 0:
            msg = self._last_error() if self._last_error is not None else ""
            raise KernelError(f"kernel {self.name!r} failed (code {rc}): {msg or 'no error message recorded'}")
        return _decode_return(ret_val, ret_code.value)

    def __repr__(self) -> str:
        where = f"at 0x{self.address:x}" if self.address is not None else "(python)"
        return f"<PackedFunction {self.name} {where}>"


def _decode_return(val: Any, code: int) -> Any:
    if code == _TC.NULL:
        return None
    if code in (_TC.INT, _TC.UINT):
        return val.v_int64
    if code == _TC.FLOAT:
        return val.v_float64
    if code == _TC.STR:
        return val.v_str.decode("utf-8") if val.v_str is not None else None
    if code == _TC.HANDLE:
        return val.v_handle
    raise KernelError(f"kernel returned a value of unsupported type code {code}")


class Module:
    """Base class of every runtime module.

    Subclasses set the class attribute :attr:`type_key` and override
    :meth:`_get_local_function`; serializable ones override :meth:`save_to_binary` and
    register a loader with :func:`~kiln.runtime.registry.register_loader`; DSO-exportable
    ones (code that is compiled into the exported library) override :attr:`is_dso_exportable`
    and :meth:`save`.
    """

    type_key: str = "module"

    def __init__(self) -> None:
        self._imports: list[Module] = []

    # ---- imports -------------------------------------------------------------------
    def _import_list(self) -> list["Module"]:
        # Subclasses that forget super().__init__() still work.
        try:
            return self._imports
        except AttributeError:
            self._imports = []
            return self._imports

    @property
    def imported_modules(self) -> list["Module"]:
        """The modules imported by this one (a copy, in import order)."""
        return list(self._import_list())

    def import_module(self, module: "Module") -> None:
        """Add ``module`` to this module's imports (cycles are allowed)."""
        if not isinstance(module, Module):
            raise InputError(f"import_module expects a Module, got {type(module).__name__}")
        self._import_list().append(module)

    def walk(self, follow: Callable[["Module"], bool] | None = None) -> Iterator["Module"]:
        """This module and every module it imports, transitively, each once.

        The order is depth-first pre-order with imports in import order — the order in which
        :meth:`get_function` with ``query_imports=True`` searches, and the DFS that numbers
        module-blob entries (``docs/module_blob_format.md``, which adds DSO grouping). Cycles
        are allowed: a module seen before is skipped, together with its imports.

        Parameters
        ----------
        follow : callable, optional
            ``follow(import)`` decides whether an import is visited (and its own imports
            searched); by default every import is.

        Yields
        ------
        Module
            This module first. The tree is read lazily, so imports added during the walk to
            modules not yet reached are seen.

        Examples
        --------
        >>> [m.type_key for m in factory.walk()]
        ['GraphExecutorFactory', 'library']
        """
        seen: set[int] = set()
        stack: list[Module] = [self]
        while stack:
            m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield m
            children = m._import_list()
            stack.extend(reversed(children if follow is None else [c for c in children if follow(c)]))

    # Old private name; cli/library.py still calls it (to be switched to walk()).
    _walk = walk

    # ---- functions -----------------------------------------------------------------
    def _get_local_function(self, name: str) -> "PackedFunction | Callable[..., Any] | None":
        """Return the function ``name`` defined by this module itself, or ``None``."""
        return None

    def get_function(self, name: str, query_imports: bool = False) -> PackedFunction:
        """Return the function ``name``.

        Parameters
        ----------
        name : str
            Function name.
        query_imports : bool
            Also search imported modules (depth-first, in import order).

        Raises
        ------
        FunctionNotFoundError
            Naming the function and the module's type key.
        """
        mods: Iterator[Module] = self.walk() if query_imports else iter((self,))
        for m in mods:
            f = m._get_local_function(name)
            if f is not None:
                if not isinstance(f, PackedFunction):
                    f = PackedFunction(name, pyfunc=f, module=m)
                return f
        scope = " or its imports" if query_imports else ""
        raise FunctionNotFoundError(f"module of type {self.type_key!r}{scope} has no function {name!r}")

    def implements_function(self, name: str, query_imports: bool = False) -> bool:
        """Whether :meth:`get_function` would find ``name``."""
        mods: Iterator[Module] = self.walk() if query_imports else iter((self,))
        return any(m._get_local_function(name) is not None for m in mods)

    def __getitem__(self, name: str) -> PackedFunction:
        if not isinstance(name, str):
            raise InputError(f"function name must be a str, got {type(name).__name__}")
        return self.get_function(name)

    # ---- serialization -------------------------------------------------------------
    @property
    def is_binary_serializable(self) -> bool:
        """Whether :meth:`save_to_binary` works (the module can live in a library's blob)."""
        return type(self).save_to_binary is not Module.save_to_binary

    @property
    def is_runnable(self) -> bool:
        """Whether functions of this module can be called in this process."""
        return True

    @property
    def is_dso_exportable(self) -> bool:
        """Whether :meth:`save` writes code that is compiled into an exported library."""
        return False

    def save_to_binary(self) -> bytes:
        """Serialize the module for the library blob (loaded by ``loadbinary_<type_key>``)."""
        raise KilnError(f"module of type {self.type_key!r} is not binary-serializable")

    def save(self, path: str | os.PathLike, fmt: str = "") -> None:
        """Save the module to a file (source or object code, depending on the kind)."""
        raise KilnError(f"module of type {self.type_key!r} does not support save()")

    def get_source(self, fmt: str = "") -> str:
        """Return the module's source code in ``fmt``, or ``""`` if it has none."""
        return ""

    def export_library(
        self,
        file_name: str | os.PathLike,
        fcompile: Callable[..., Any] | None = None,
        workspace_dir: str | os.PathLike | None = None,
        cc: str | None = None,
        options: Sequence[str] | None = None,
        addons: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Export this module and its imports as one shared library (``.so``) or ``.tar``.

        See :func:`kiln.runtime.export.export_library`.
        """
        from .export import export_library

        return export_library(
            self, file_name, fcompile=fcompile, workspace_dir=workspace_dir, cc=cc,
            options=options, addons=addons, **kwargs,
        )

    # ---- benchmarking --------------------------------------------------------------
    def time_evaluator(
        self, func_name: str, dev: Any = None, number: int = 10, repeat: int = 1, min_repeat_ms: float = 0,
    ) -> Callable[..., "BenchmarkResult"]:
        """Return ``f(*args) -> BenchmarkResult`` timing ``self[func_name](*args)``.

        Parameters
        ----------
        func_name : str
            Function to time (imports are searched too).
        dev : Device, optional
            Device whose stream is synchronized after each repeat (CPU: nothing to do).
        number, repeat, min_repeat_ms
            See :func:`kiln.runtime.benchmark.measure`.
        """
        from .benchmark import measure

        f = self.get_function(func_name, query_imports=True)
        sync = _device_sync(dev)

        def evaluator(*args: Any) -> "BenchmarkResult":
            return measure(lambda: f(*args), number=number, repeat=repeat, min_repeat_ms=min_repeat_ms, sync=sync)

        return evaluator

    def __repr__(self) -> str:
        return f"Module(type_key={self.type_key!r}, imports={len(self._import_list())})"


def _device_sync(dev: Any) -> Callable[[], Any] | None:
    if dev is None:
        return None
    dtype = getattr(dev, "device_type", 1)
    if dtype == 1:  # CPU work is synchronous
        return None
    from .device import get_device_api

    api = get_device_api(dtype)
    return lambda: api.stream_sync(dev, None)


def load_module(path: str | os.PathLike, fmt: str = "") -> Module:
    """Load a library exported by :meth:`Module.export_library` (``.so`` or ``.tar``).

    See :func:`kiln.runtime.export.load_module`.
    """
    from .export import load_module as _load

    return _load(path, fmt)
