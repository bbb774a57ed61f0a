"""Kiln as an ONNX backend (``onnx.backend.base.Backend``).

    from kiln.frontend.onnx_backend import KilnBackend      # or: prepare, run_model, run_node
    rep = KilnBackend.prepare(model, "CPU")
    outputs = rep.run([x, y])                               # list / dict / single array

``prepare`` only checks and analyses the model. Compilation happens lazily in ``rep.run``: the
values of some inputs decide shapes (``Reshape`` shape, ``Slice`` starts/ends, ``TopK`` k,
``Resize`` scales/sizes, reduction axes, ``Pad`` pads, ...), and they are only known then.
Such inputs are found by a backward walk from the shape-determining operands of every node
(stopping at ``Shape``/``Size``, whose outputs depend on shapes only) and passed to
``kiln.frontend.from_onnx(..., freeze={name: value})`` as compile-time constants; all other inputs
stay runtime inputs of the compiled module. If the frontend still asks for a constant, the
compile is retried once with every non-floating-point input frozen. Compiled modules are cached
per (input signature, frozen values).

Target: ``llvm`` unless ``$KILN_ONNX_BACKEND_TARGET`` (or ``prepare(..., target=...)``) says
otherwise. Only CPU devices are supported. Generated kernels are cached by the code generator
(``$KILN_CACHE_DIR``), so recompiling the same kernels is cheap.

Exceptions raised while compiling/running carry a note (``e.__notes__``) naming the stage that
failed: ``import`` (frontend), ``build``, ``load`` or ``run``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

__all__ = ["KilnBackend", "KilnBackendRep", "prepare", "run_model", "run_node",
           "supports_device", "shape_inputs", "STAGE_NOTE"]

STAGE_NOTE = "[kiln onnx backend] failed stage: "

# Operands (input indices) whose *values* decide output shapes or attributes, per op type.
# Values that reach one of them must be compile-time constants for a static-shape compiler.
_SHAPE_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,),
    "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3), "Range": (0, 1, 2), "Split": (1,),
    "Squeeze": (1,), "Unsqueeze": (1,), "TopK": (1,), "Resize": (1, 2, 3), "Upsample": (1,),
    "ReduceMean": (1,), "ReduceSum": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
    "Clip": (1, 2), "Dropout": (1, 2), "OneHot": (1,), "CumSum": (1,), "Trilu": (1,),
    "CenterCropPad": (1,), "Col2Im": (1, 2), "MaxUnpool": (2,), "DFT": (1, 2), "STFT": (1, 3),
    "NonMaxSuppression": (2, 3, 4), "RandomNormalLike": (), "Bernoulli": (),
    # Loops are unrolled at import: the trip count and condition decide the graph.
    "Loop": (0, 1),
    # A sequence's structure is fixed at compile time (docs/sequences.md): positions and split
    # sizes decide it.
    "SplitToSequence": (1,), "SequenceAt": (1,), "SequenceInsert": (2,), "SequenceErase": (1,),
}
# Ops whose outputs depend on the operands' shapes only, never on their values.
_SHAPE_ONLY = {"Shape", "Size"}


def shape_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs whose values decide shapes (directly or through other nodes), in input order."""
    graph = model.graph
    producer: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        for out in node.output:
            if out:
                producer[out] = node
    need: set[str] = set()
    stack: list[str] = []
    for node in graph.node:
        for i in _SHAPE_OPERANDS.get(node.op_type, ()):
            if i < len(node.input) and node.input[i]:
                stack.append(node.input[i])
    while stack:
        name = stack.pop()
        if name in need:
            continue
        need.add(name)
        node = producer.get(name)
        if node is not None and node.op_type not in _SHAPE_ONLY:
            stack.extend(x for x in node.input if x)
    return [i.name for i in graph.input if i.name in need]


def _is_float(arr: np.ndarray) -> bool:
    return arr.dtype.kind == "f" or arr.dtype.name in ("bfloat16", "float16") or \
        "float8" in arr.dtype.name


def _annotate(exc: BaseException, stage: str) -> None:
    notes = getattr(exc, "__notes__", None) or []
    if not any(n.startswith(STAGE_NOTE) for n in notes):
        exc.add_note(STAGE_NOTE + stage)


def _default_target() -> str:
    return os.environ.get("KILN_ONNX_BACKEND_TARGET") or "llvm"


class _Compiled:
    __slots__ = ("module", "runtime_inputs", "frozen", "num_outputs")

    def __init__(self, module, runtime_inputs, frozen, num_outputs):
        self.module = module
        self.runtime_inputs = runtime_inputs
        self.frozen = frozen
        self.num_outputs = num_outputs


class KilnBackendRep(BackendRep):
    """A prepared model; compiles on the first ``run`` for each input signature."""

    def __init__(self, model: onnx.ModelProto, device: str = "CPU", *, target: str | None = None,
                 opt_level: int = 3, freeze: Sequence[str] = (), **kwargs: Any) -> None:
        self.model = model
        self.device = Device(device)
        self.target = target or _default_target()
        self.opt_level = opt_level
        self.build_kwargs = kwargs
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.all_input_names = [i.name for i in model.graph.input]
        self.output_names = [o.name for o in model.graph.output]
        # inputs frozen into the compiled module (values decide shapes), plus any asked for
        self.freeze_names = list(dict.fromkeys(
            [n for n in shape_inputs(model) if n in self.input_names] + list(freeze)))
        self._cache: dict[tuple, _Compiled] = {}
        self._refrozen: list[str] = []  # inputs a retry had to freeze (their values key the cache)
        self.compile_count = 0  # how many times the model was compiled (tests/introspection)
        self.last_frozen: list[str] = []  # inputs frozen in the module the last run used

    # -- inputs --------------------------------------------------------------------------
    def _feeds(self, inputs: Any) -> dict[str, Any]:
        if isinstance(inputs, Mapping):
            items = dict(inputs)
            unknown = set(items) - set(self.all_input_names)
            if unknown:
                raise ValueError(f"unknown input(s) {sorted(unknown)}; the model's inputs are "
                                 f"{self.input_names}")
        else:
            if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
                inputs = [inputs]
            inputs = list(inputs)
            if len(inputs) == len(self.input_names):
                names = self.input_names
            elif len(inputs) == len(self.all_input_names):
                names = self.all_input_names
            else:
                raise ValueError(f"the model takes {len(self.input_names)} input(s) "
                                 f"{self.input_names}, got {len(inputs)}")
            items = dict(zip(names, inputs))
        feeds: dict[str, Any] = {}  # arrays; lists of arrays (sequences); None (absent optionals)
        for name, value in items.items():
            if isinstance(value, onnx.TensorProto):
                value = numpy_helper.to_array(value)
            if isinstance(value, dict):
                raise NotImplementedError(
                    f"input {name!r}: Kiln's ONNX backend takes tensors, sequences (lists) and "
                    f"optionals (None) only, got a map")
            if value is None or isinstance(value, (list, tuple)):
                # a sequence (list) / an absent optional (None): see _seq_feed
                feeds[name] = _seq_feed(name, value)
                continue
            feeds[name] = np.asarray(value)
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ValueError(f"missing input(s) {missing}")
        return feeds

    # -- compile -------------------------------------------------------------------------
    def _key(self, feeds: dict[str, np.ndarray], freeze: Sequence[str]) -> tuple:
        parts = []
        for name in sorted(feeds):
            a = feeds[name]
            if not isinstance(a, np.ndarray):  # a sequence's structure / an absent optional
                parts.append((name, _seq_key(a, name in freeze)))
                continue
            if name in freeze:
                digest = hashlib.sha1(_value_bytes(a)).hexdigest()
                parts.append((name, a.shape, str(a.dtype), digest))
            else:
                parts.append((name, a.shape, str(a.dtype)))
        return tuple(parts)

    def _build(self, feeds: dict[str, np.ndarray], freeze: Sequence[str]) -> _Compiled:
        import kiln
        from kiln.frontend import from_onnx

        # an absent optional is compiled in as "nothing" (its structure, like a sequence's
        # length, is fixed at compile time)
        frozen = {n: feeds[n] for n in feeds if n in freeze or feeds[n] is None}
        runtime = [n for n in feeds if n not in frozen]
        shape: dict[str, Any] = {n: _seq_shape(feeds[n]) for n in runtime}
        dtype = {n: str(feeds[n].dtype) for n in runtime if isinstance(feeds[n], np.ndarray)}
        try:
            graph, params = from_onnx(self.model, shape=shape or None, dtype=dtype or None,
                                      freeze=frozen or None)
        except Exception as e:
            _annotate(e, "import")
            raise
        try:
            factory = kiln.build(graph, target=self.target, params=params,
                                 opt_level=self.opt_level, **self.build_kwargs)
        except Exception as e:
            _annotate(e, "build")
            raise
        try:
            module = kiln.GraphModule(factory["default"](kiln.cpu(self.device.device_id)))
            num_outputs = module.get_num_outputs()
        except Exception as e:
            _annotate(e, "load")
            raise
        if num_outputs != len(self.output_names):
            err = RuntimeError(f"the compiled module has {num_outputs} output(s), the model "
                               f"{len(self.output_names)} {self.output_names}")
            _annotate(err, "build")
            raise err
        self.compile_count += 1
        return _Compiled(module, runtime, frozen, num_outputs)

    def _compiled(self, feeds: dict[str, np.ndarray]) -> _Compiled:
        freeze = [n for n in dict.fromkeys(self.freeze_names + self._refrozen) if n in feeds]
        key = self._key(feeds, freeze)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        try:
            compiled = self._build(feeds, freeze)
        except Exception as first:
            # The frontend wants more constants than the static analysis found: retry once with
            # every non-floating-point input frozen (never float data: that would compile the
            # whole model away into constants).
            more = [n for n in self.input_names if n in feeds and n not in freeze
                    and isinstance(feeds[n], np.ndarray) and not _is_float(feeds[n])]
            if not more or not _wants_constant(first):
                raise
            freeze = freeze + more
            key = self._key(feeds, freeze)
            # later runs must key on these inputs' values too (else another value would hit
            # a module compiled for this one); freeze_names keeps only the static analysis'
            self._refrozen = list(dict.fromkeys(self._refrozen + more))
            try:
                compiled = self._build(feeds, freeze)
            except Exception:  # noqa: BLE001 - the first attempt's error is the one to report
                raise first from None
        self._cache[key] = compiled
        self._cache[self._key(feeds, [n for n in dict.fromkeys(self.freeze_names + self._refrozen)
                                      if n in feeds])] = compiled
        return compiled

    # -- run -----------------------------------------------------------------------------
    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        feeds = self._feeds(inputs)
        compiled = self._compiled(feeds)
        self.last_frozen = list(compiled.frozen)
        try:
            m = compiled.module
            for name in compiled.runtime_inputs:
                v = feeds[name]
                m.set_input(name, [_c_contiguous(a) for a in v] if isinstance(v, list) else _c_contiguous(v))
            m.run()
            outputs = [_to_numpy(m.get_output(i)) for i in range(compiled.num_outputs)]
        except Exception as e:
            _annotate(e, "run")
            raise
        return namedtupledict("Outputs", self.output_names)(*outputs)


def _seq_feed(name: str, value: Any) -> list[np.ndarray] | None:
    """A sequence feed as a list of arrays (``None``: an absent optional)."""
    if value is None:
        return None
    out = []
    for k, v in enumerate(value):
        if isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        if v is None or isinstance(v, (list, tuple, dict)):
            raise NotImplementedError(f"input {name!r}: element {k} is a {type(v).__name__}; Kiln "
                                      f"takes sequences of tensors only")
        out.append(np.asarray(v))
    return out


def _seq_key(v: list[np.ndarray] | None, frozen: bool) -> tuple:
    """Cache key part of a sequence / absent optional: its structure (and values if frozen)."""
    if v is None:
        return ("none",)
    parts = tuple((a.shape, str(a.dtype)) for a in v)
    if frozen:
        return ("seq", parts, hashlib.sha1(b"".join(_value_bytes(a) for a in v)).hexdigest())
    return ("seq", parts)


def _seq_shape(v: Any) -> Any:
    """``from_onnx(shape=...)`` for a runtime feed: dims, or one dims per sequence element."""
    return [tuple(a.shape) for a in v] if isinstance(v, list) else tuple(v.shape)


def _to_numpy(v: Any) -> Any:
    """An output as NumPy: a list for a sequence, None for an absent optional."""
    if v is None:
        return None
    if isinstance(v, list):
        return [x.numpy() for x in v]
    return v.numpy()


def _value_bytes(a: np.ndarray) -> bytes:
    """The bytes that identify ``a``'s values (an object array's tobytes() would be pointers)."""
    if a.dtype.kind in "OU":
        return "\0".join(f"{len(str(s))}:{s}" for s in a.reshape(-1)).encode("utf-8", "surrogatepass")
    return _c_contiguous(a).tobytes()


def _c_contiguous(a: np.ndarray) -> np.ndarray:
    # (np.ascontiguousarray would turn a 0-d array into shape (1,))
    return a if a.flags.c_contiguous else np.array(a, order="C")


def _wants_constant(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return any(w in msg for w in ("constant", "freeze", "frozen", "static", "known at compile"))


class KilnBackend(Backend):
    """ONNX backend that compiles models with Kiln (CPU; target ``llvm`` by default)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto | str | bytes, device: str = "CPU",
                **kwargs: Any) -> KilnBackendRep:
        """Check ``model`` and return a rep that compiles lazily on its first ``run``.

        Keyword arguments: ``target`` (default ``llvm`` / ``$KILN_ONNX_BACKEND_TARGET``),
        ``opt_level`` (3), ``freeze`` (names of extra inputs to make compile-time constants);
        others go to ``kiln.build``.
        """
        from kiln.frontend.onnx import load_onnx
        from kiln.runtime.errors import DeviceError

        # the frontend's loader: undecodable bytes / a missing file are Kiln errors here too
        model = load_onnx(model)
        if not cls.supports_device(device):
            raise DeviceError(f"Kiln's ONNX backend does not support device {device!r} "
                              "(CPU only)")
        super().prepare(model, device, **kwargs)  # onnx.checker.check_model
        return KilnBackendRep(model, device, **kwargs)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node: wraps it in a model (``opset_version=`` picks the opset)."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info, **kwargs)
        opset = kwargs.pop("opset_version", None)
        names = [n for n in node.input if n]
        if isinstance(inputs, Mapping):
            feeds = {n: np.asarray(inputs[n]) for n in names}
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) != len(names):
                raise ValueError(f"node {node.op_type} has {len(names)} input(s), got "
                                 f"{len(inputs)}")
            feeds = {n: np.asarray(v) for n, v in zip(names, inputs)}
        graph_inputs = [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()]
        if outputs_info is not None:
            graph_outputs = [helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
                for n, (dt, shape) in zip(node.output, outputs_info)]
        else:
            graph_outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
        graph = helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs,
                                  graph_outputs)
        opsets = [helper.make_opsetid(node.domain or "", opset)] if opset else None
        model = helper.make_model(graph, opset_imports=opsets, producer_name="kiln.run_node")
        if outputs_info is None:  # give the outputs their types, as a model needs them
            inferred = onnx.shape_inference.infer_shapes(model)
            vi = {v.name: v for v in list(inferred.graph.value_info) +
                  list(inferred.graph.output)}
            for out in model.graph.output:
                if out.name in vi and vi[out.name].type.HasField("tensor_type"):
                    out.type.CopyFrom(vi[out.name].type)
        return cls.prepare(model, device, **kwargs).run(feeds)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type == DeviceType.CPU
        except Exception:  # noqa: BLE001 - onnx's Device() parser raises bare exceptions; unsupported
            return False


prepare = KilnBackend.prepare
run_model = KilnBackend.run_model
run_node = KilnBackend.run_node
supports_device = KilnBackend.supports_device
