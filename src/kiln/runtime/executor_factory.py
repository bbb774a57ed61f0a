"""The executor factory: graph JSON + kernel library + params, as one exportable module.

``kiln.build`` returns an :class:`ExecutorFactoryModule`. It is a :class:`~kiln.runtime.Module`
(type key ``"GraphExecutorFactory"``) whose single import is the kernel library, so
``factory.export_library("m.so")`` writes one file holding the kernels (compiled into the
library) and the graph + params (this module's :meth:`~ExecutorFactoryModule.save_to_binary`
payload in the module blob). ``load_module("m.so")["default"](dev)`` restores it.

Binary payload (little-endian), see ``docs/executor.md``::

    u64 len, graph JSON (UTF-8)
    u64 len, module name (UTF-8)
    u64 len, params (the save_param_dict format)

:func:`read_factory_payload` parses it without building a module (``kiln inspect`` uses it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from .binary import Reader, Writer
from .errors import InputError
from .graph_json import Graph, load_graph_json
from .module import Module
from .registry import register_loader

__all__ = [
    "ExecutorFactoryModule",
    "FactoryPayload",
    "read_factory_payload",
    "write_factory_payload",
    "factory_payload_chunks",
    "loadbinary_GraphExecutorFactory",
    "TYPE_KEY",
]

TYPE_KEY = "GraphExecutorFactory"


def _to_ndarrays(params: Mapping[str, Any] | None) -> dict[str, Any]:
    from . import ndarray as nd

    out: dict[str, Any] = {}
    for k, v in (params or {}).items():
        if not isinstance(k, str):
            raise InputError(f"param names must be strings, got {k!r}")
        out[k] = v if isinstance(v, nd.NDArray) else nd.array(v)
    return out


class ExecutorFactoryModule(Module):
    """A compiled model: graph JSON, kernel library and parameters.

    Parameters
    ----------
    graph_json : str
        The graph (validated now, so a bad graph fails at build time, not at deploy time).
    lib : Module or None
        The kernels; becomes this module's import. ``None`` is used by the loader, which
        attaches the library as an import afterwards.
    params : dict of str to array-like, optional
        Parameter values (NDArray, NumPy or DLPack), keyed by argument-node name.
    mod_name : str
        Name of the creation function (``factory[mod_name](dev)``).

    Examples
    --------
    >>> factory = kiln.runtime.ExecutorFactoryModule(graph_json, lib, params)
    >>> m = kiln.GraphModule(factory["default"](kiln.cpu()))
    >>> graph_json, lib, params = factory
    """

    type_key = TYPE_KEY

    def __init__(
        self,
        graph_json: str,
        lib: Module | None,
        params: Mapping[str, Any] | None = None,
        mod_name: str = "default",
    ) -> None:
        super().__init__()
        if not isinstance(mod_name, str) or not mod_name:
            raise InputError(f"mod_name must be a non-empty string, got {mod_name!r}")
        if isinstance(graph_json, Graph):
            self._graph = graph_json
        else:
            self._graph = load_graph_json(graph_json)
        self.graph_json: str = self._graph.json_text
        self.mod_name = mod_name
        self.params: dict[str, Any] = _to_ndarrays(params)
        #: Names of params taken out by :meth:`remove_params` (to be given as a params file).
        self.removed_params: tuple[str, ...] = ()
        arg_names = {self._graph.nodes[n].name for n in self._graph.arg_nodes}
        unknown = sorted(k for k in self.params if k not in arg_names)
        if unknown:
            raise InputError(
                f"ExecutorFactoryModule: params {unknown} are not argument nodes of the graph; "
                f"arguments: {sorted(arg_names)}"
            )
        if lib is not None:
            self.import_module(lib)

    # ---- accessors ------------------------------------------------------------------------
    def get_graph_json(self) -> str:
        """The graph JSON text."""
        return self.graph_json

    def get_graph_params(self) -> dict[str, Any]:
        """The parameters as a dict of name to NDArray (the factory's own arrays)."""
        return dict(self.params)

    get_params = get_graph_params

    def get_lib(self) -> Module | None:
        """The kernel library (this module's first import)."""
        imports = self.imported_modules
        return imports[0] if imports else None

    @property
    def lib(self) -> Module | None:
        """Alias of :meth:`get_lib`."""
        return self.get_lib()

    def __iter__(self) -> Iterator[Any]:
        """``graph_json, lib, params = factory`` (as TVM's build result unpacks)."""
        return iter((self.graph_json, self.get_lib(), self.get_graph_params()))

    # ---- executors ------------------------------------------------------------------------
    def create(self, *devices: Any) -> Any:
        """Create an executor with the params loaded (what ``factory[mod_name](*devices)`` does).

        Parameters
        ----------
        *devices : Device
            Devices to run on (default ``kiln.cpu()``).

        Returns
        -------
        GraphModule
            Wrap it again with ``kiln.GraphModule(...)`` if you like; both work.
        """
        from .graph_executor import GraphExecutor, GraphModule

        lib = self._require_lib()
        if len(devices) == 1 and isinstance(devices[0], (list, tuple)):
            devices = tuple(devices[0])
        # The params are copied in right away: their storage need not be zeroed first.
        m = GraphModule(GraphExecutor(self._graph, lib, devices, prefilled=self.params))
        if self.params:
            m.load_params(self.params)
        return m

    def debug_create(self, mod_name: str | None = None, *devices: Any, dump_root: str | None = None) -> Any:
        """Create a :class:`~kiln.runtime.debug_executor.GraphModuleDebug` with the params loaded.

        Parameters
        ----------
        mod_name : str, optional
            Must be this factory's name (kept for TVM compatibility).
        *devices : Device
        dump_root : str, optional
            Directory for dumps (default: a new temporary directory).
        """
        from .debug_executor import GraphModuleDebug
        from .graph_executor import GraphExecutor

        if mod_name is not None and not isinstance(mod_name, str):
            # debug_create(dev) without a name
            devices = (mod_name,) + devices
            mod_name = None
        if mod_name is not None and mod_name != self.mod_name:
            raise InputError(f"debug_create: this factory's module is {self.mod_name!r}, not {mod_name!r}")
        if len(devices) == 1 and isinstance(devices[0], (list, tuple)):
            devices = tuple(devices[0])
        m = GraphModuleDebug(GraphExecutor(self._graph, self._require_lib(), devices, prefilled=self.params),
                             dump_root=dump_root)
        if self.params:
            m.load_params(self.params)
        return m

    def remove_params(self) -> "ExecutorFactoryModule":
        """A factory with the same graph and library but no params (ship weights separately)."""
        bare = ExecutorFactoryModule(self._graph, self.get_lib(), None, self.mod_name)
        # Still weights, not inputs, for the library's C API (its tables are written at export).
        bare.removed_params = self.removed_params + tuple(self.params)
        return bare

    def _require_lib(self) -> Module:
        lib = self.get_lib()
        if lib is None:
            raise InputError("this executor factory has no kernel library (no imported module)")
        return lib

    def _get_local_function(self, name: str) -> Callable[..., Any] | None:
        if name == self.mod_name:
            return self.create
        table: dict[str, Callable[..., Any]] = {
            "get_graph_json": self.get_graph_json,
            "get_graph_params": self.get_graph_params,
            "get_params": self.get_graph_params,
            "get_lib": self.get_lib,
            "debug_create": self.debug_create,
            "remove_params": self.remove_params,
        }
        return table.get(name)

    # ---- serialization --------------------------------------------------------------------
    def save_to_binary(self) -> bytes:
        """Graph JSON, module name and params (``save_param_dict`` bytes), each u64-length-prefixed."""
        return write_factory_payload(FactoryPayload(self.graph_json, self.mod_name, self.params))

    def save_to_binary_chunks(self) -> list[bytes | memoryview]:
        """:meth:`save_to_binary`'s bytes as a list of buffers (tensor data not copied).

        The module blob writer (:func:`kiln.runtime.blob.serialize_chunks`) prefers this to
        :meth:`save_to_binary`, so exporting a model with hundreds of megabytes of weights
        does not join them into one ``bytes`` first.
        """
        return factory_payload_chunks(FactoryPayload(self.graph_json, self.mod_name, self.params))

    def __repr__(self) -> str:
        return (
            f"ExecutorFactoryModule(mod_name={self.mod_name!r}, nodes={len(self._graph.nodes)}, "
            f"params={len(self.params)}, lib={type(self.get_lib()).__name__})"
        )


@dataclass(frozen=True)
class FactoryPayload:
    """The contents of a ``GraphExecutorFactory`` payload.

    Attributes
    ----------
    graph_json : str
        The graph JSON text (not yet validated).
    mod_name : str
        Name of the creation function.
    params : dict of str to NDArray
        The parameters, on the CPU, in file order.
    """

    graph_json: str
    mod_name: str
    params: dict[str, Any]


def factory_payload_chunks(p: FactoryPayload) -> list[bytes | memoryview]:
    """Serialize ``p`` as a list of buffers whose concatenation is :func:`write_factory_payload`'s output.

    Parameters
    ----------
    p : FactoryPayload
        The arrays in ``p.params`` must stay unchanged until the buffers are consumed:
        their data is referenced, not copied.

    Returns
    -------
    list of bytes or memoryview
    """
    from .params import save_param_dict_chunks

    params = save_param_dict_chunks(p.params)
    w = Writer()
    w.string(p.graph_json)
    w.string(p.mod_name)
    # The params length prefix is the sum of the pieces: no need to join them to measure it.
    w.u64(sum(memoryview(c).nbytes for c in params))
    for c in params:
        w.raw(c)
    return w.chunks()


def write_factory_payload(p: FactoryPayload) -> bytes:
    """Serialize ``p``: graph JSON, module name and ``save_param_dict`` bytes, each u64-length-prefixed."""
    return b"".join(factory_payload_chunks(p))


def read_factory_payload(data: bytes | bytearray | memoryview,
                         where: str = "GraphExecutorFactory payload") -> FactoryPayload:
    """Parse a ``GraphExecutorFactory`` payload without creating a module or loading kernels.

    Parameters
    ----------
    data : bytes-like
        The payload, as :meth:`ExecutorFactoryModule.save_to_binary` writes it.
    where : str
        Names the payload in error messages.

    Returns
    -------
    FactoryPayload

    Raises
    ------
    FormatError
        If a field is truncated, a string is not UTF-8, bytes trail the params, or the
        params section is corrupt (its offsets then count from the start of that section).
    """
    from .params import load_param_dict

    r = Reader(data, where)
    graph_json = r.string("graph JSON")
    mod_name = r.string("module name")
    n = r.u64("length of params")
    section = f"{where}, params section at offset {r.pos}"
    params = load_param_dict(r.view(n, "params"), where=section) if n else {}
    r.expect_end("the params")
    return FactoryPayload(graph_json, mod_name, params)


def loadbinary_GraphExecutorFactory(payload: bytes) -> ExecutorFactoryModule:
    """Loader registered for type key ``"GraphExecutorFactory"`` (the module blob calls it).

    The kernel library is attached afterwards as the module's import by the blob loader.

    Raises
    ------
    FormatError
        On a truncated payload or a bad graph / params section.
    """
    p = read_factory_payload(payload)
    return ExecutorFactoryModule(p.graph_json, None, p.params, p.mod_name)


register_loader(TYPE_KEY, loadbinary_GraphExecutorFactory, override=True)
