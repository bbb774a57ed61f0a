"""String tensors and the executor-level string ops (``docs/strings.md``).

A string tensor (dtype ``"string"``) is a :class:`StringNDArray`: an :class:`NDArray` whose
elements are Python ``str`` held in a C-contiguous NumPy object array in host memory. Its
``handle`` is a DLTensor without data, kept only so the executor's bookkeeping works the same
for every entry; no generated kernel ever receives a string tensor. String tensors live on the
host CPU only and cannot be exported through DLPack or bound zero copy.

String ops (concatenation, regular expressions, Unicode case mapping, ...) are **host ops**:
plain Python functions of a small registry (:func:`register_host_op`), run by the graph
executor between native segments as graph-JSON nodes with the reserved function ``__host``
(``attrs.host_op`` names the op, ``attrs.host_attrs`` holds its attributes as JSON text).
Generated C/LLVM code cannot reasonably run regular expressions or Unicode case mapping, and
string data has no fixed-size layout a kernel could index.

Runtime layer: imports NumPy and the standard library only.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from .device import Device
from .dtype import STRING
from .errors import DeviceError, FormatError, InputError, KernelError, KilnError
from .ndarray import NDArray

if TYPE_CHECKING:
    from .graph_executor import GraphExecutor
    from .graph_json import GraphNode

__all__ = [
    "StringNDArray",
    "STRING",
    "HOST_FUNC",
    "empty_strings",
    "to_string_array",
    "register_host_op",
    "get_host_op",
    "host_ops",
    "make_host_runner",
    "check_regex",
    "split_strings",
    "normalize_strings",
    "label_encode",
    "cast_strings",
    "set_string_input",
]

#: The reserved graph-JSON function of a host op node.
HOST_FUNC = "__host"

_CPU_TYPE = 1  # kDLCPU: string tensors live in host memory only


def _check_device(dev: Device, what: str) -> None:
    if dev.device_type != _CPU_TYPE:
        raise DeviceError(f"{what}: string tensors live on the host CPU only, not on {dev}")


def to_string_array(value: Any, what: str = "value") -> np.ndarray:
    """Convert text data to a C-contiguous NumPy object array of ``str``.

    Parameters
    ----------
    value : numpy.ndarray, StringNDArray, list, str
        NumPy ``str_`` (``<U``) or ``object`` arrays of ``str`` (``bytes`` elements are
        decoded as UTF-8), nested lists, a single ``str``.
    what : str
        How to name the value in errors (``"input 'x'"``).

    Returns
    -------
    numpy.ndarray
        A new object array (never a view of ``value``).

    Raises
    ------
    InputError
        An element that is not text, or bytes that are not UTF-8.
    """
    if isinstance(value, StringNDArray):
        return value.numpy()
    if isinstance(value, NDArray):
        raise InputError(f"{what}: expected string data, got a {value.dtype} NDArray")
    arr = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=object)
    if arr.dtype.kind not in "OUS":
        raise InputError(f"{what}: expected string data (a NumPy array of dtype object or str_), got dtype {arr.dtype}")
    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i in range(flat_in.size):
        x = flat_in[i]
        if isinstance(x, (bytes, np.bytes_)):
            try:
                x = bytes(x).decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(f"{what}: element {i} is bytes that are not UTF-8 ({err})") from None
        elif not isinstance(x, str):
            raise InputError(f"{what}: element {i} is a {type(x).__name__}, expected str")
        flat_out[i] = str(x)
    return out


class StringNDArray(NDArray):
    """A string tensor in host memory: an :class:`NDArray` over a NumPy object array of ``str``.

    Create with :func:`empty_strings` or ``kiln.nd.array(np.array([...], dtype=object))``.
    Views (:meth:`_create_view`, used for reshapes) share the object array.
    """

    __slots__ = ("_objs",)

    _objs: np.ndarray

    @classmethod
    def _wrap(cls, objs: np.ndarray, dev: Device) -> "StringNDArray":
        # no native memory (data NULL): kernels never see a string tensor
        self = cls._make(0, 0, tuple(int(d) for d in objs.shape), STRING, dev, None, True)
        assert isinstance(self, StringNDArray)
        self._objs = objs
        return self

    def _host_view(self) -> np.ndarray:
        return self._objs

    def numpy(self, copy: bool = True) -> np.ndarray:
        """The elements as a NumPy object array of ``str`` (a copy unless ``copy=False``)."""
        return self._objs.copy() if copy else self._objs

    def copyfrom(self, source: Any) -> "StringNDArray":
        """Copy string data (same shape) into this array; see :func:`to_string_array`."""
        objs = to_string_array(source, "copyfrom")
        self._check_same(objs.shape, STRING, "copyfrom")
        self._objs[...] = objs
        return self

    def copyto(self, target: Any) -> "StringNDArray":
        """Copy to a new string array on ``target`` (the CPU) or into a string NDArray."""
        if isinstance(target, NDArray):
            if not isinstance(target, StringNDArray):
                raise InputError(f"copyto: cannot copy a string tensor into a {target.dtype} array")
            return target.copyfrom(self)
        from .device import device as _to_device

        dev = _to_device(target) if isinstance(target, str) else target
        if not isinstance(dev, Device):
            raise InputError(f"copyto expects a Device or an NDArray, got {type(target).__name__}")
        _check_device(dev, "copyto")
        return StringNDArray._wrap(self._objs.copy(), dev)

    def _create_view(self, shape: int | Iterable[int], dtype: Any = None, byte_offset: int = 0) -> "StringNDArray":
        dims = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
        if (dtype is not None and dtype != STRING) or byte_offset or math.prod(dims) != self.size:
            shape_now = self.shape
            raise InputError(
                f"a string tensor of shape {shape_now} can only be viewed as another string "
                f"shape with as many elements, not as {dims} {dtype or STRING} at offset {byte_offset}"
            )
        return StringNDArray._wrap(self._objs.reshape(dims), self.device)

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        raise InputError(
            "string tensors cannot be exported through DLPack (DLPack has no string type); "
            "use .numpy() for an object array of str"
        )

    @property
    def is_aligned(self) -> bool:
        """Always False: a string tensor has no native memory to bind zero copy."""
        return False


def empty_strings(shape: Sequence[int], dev: Device | None = None) -> StringNDArray:
    """A string tensor of ``shape`` filled with ``""`` on the host CPU.

    Raises
    ------
    DeviceError
        ``dev`` is not the CPU.
    """
    from .device import cpu

    dev = dev if dev is not None else cpu()
    _check_device(dev, "string tensor")
    objs = np.empty(tuple(shape), dtype=object)
    objs.fill("")
    return StringNDArray._wrap(objs, dev)


# ----------------------------------------------------------------------------- host ops
HostFn = Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]]
_HOST_OPS: dict[str, HostFn] = {}


def register_host_op(name: str) -> Callable[[HostFn], HostFn]:
    """Decorator: register ``fn(inputs, attrs) -> outputs`` as host op ``name``.

    ``inputs`` are NumPy arrays (object arrays of ``str`` for string tensors), ``attrs`` the
    node's ``host_attrs``; the outputs must have the graph's output shapes and dtypes.
    """

    def deco(fn: HostFn) -> HostFn:
        _HOST_OPS[name] = fn
        return fn

    return deco


def get_host_op(name: str) -> HostFn:
    """The host op ``name``; FormatError (naming the known ones) if there is none."""
    fn = _HOST_OPS.get(name)
    if fn is None:
        raise FormatError(f"unknown host op {name!r}; this runtime knows {', '.join(sorted(_HOST_OPS))}")
    return fn


def host_ops() -> list[str]:
    """Names of the registered host ops."""
    return sorted(_HOST_OPS)


def _strs(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=object)


@register_host_op("string_concat")
def _string_concat(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    a, b = _strs(xs[0]), _strs(xs[1])
    # object arrays add element-wise with str.__add__ (broadcasting included); 0-d operands
    # give a bare str, which asarray makes an array again
    out = np.asarray(np.add(a, b), dtype=object)
    return [out.reshape(np.broadcast_shapes(a.shape, b.shape))]


@register_host_op("string_equal")
def _string_equal(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    a, b = np.broadcast_arrays(_strs(xs[0]), _strs(xs[1]))
    return [np.asarray(a == b, dtype=bool).reshape(a.shape)]


# RE2 and Python's ``re`` agree on the common syntax; these constructs differ and are refused
# rather than silently run with other semantics: Python-only look-around, atomic groups,
# conditionals, comments and back-references (RE2 reads \1 as an octal escape), possessive
# quantifiers (Python 3.11+ only), RE2-only \C \Q..\E \pN \z and POSIX classes [[:alpha:]]
# (a plain set in Python), and {,n} (a literal in RE2, {0,n} in Python).
_RE2_MISMATCH = re.compile(r"\\[0-9]|\(\?[=!<>(#]|\(\?P=|\\[CQEpPzZ]|[*+?}]\+|\{,|\[:[a-z]+:\]")
# RE2's \w \d \s \b are ASCII-only: so are Python's with re.ASCII. RE2 folds case over all of
# Unicode, Python with re.ASCII over ASCII only: a case-insensitive pattern with non-ASCII text
# would differ, and is refused.
_CASE_FLAG = re.compile(r"\(\?[a-zA-Z]*i[a-zA-Z]*[:)]")


def check_regex(pattern: str) -> "re.Pattern[str]":
    """Compile an RE2 ``pattern`` with Python's ``re``; refuse syntax whose meaning differs.

    Raises
    ------
    InputError
        Syntax that RE2 and Python's ``re`` read differently (look-around, back-references,
        ``\\C``, ``\\Q...\\E``, ``\\pN``, possessive quantifiers, POSIX classes, case-insensitive
        non-ASCII patterns, ...) or a pattern neither accepts. ``\\w \\d \\s \\b`` are ASCII-only, as
        in RE2.
    """
    m = _RE2_MISMATCH.search(pattern)
    if m is not None:
        raise InputError(
            f"regular expression {pattern!r} uses {m.group(0)!r} at offset {m.start()}, syntax that "
            "RE2 (ONNX's regex dialect) and Python's re read differently; Kiln refuses it"
        )
    if _CASE_FLAG.search(pattern) and not pattern.isascii():
        raise InputError(
            f"regular expression {pattern!r} matches case-insensitively with non-ASCII text; RE2 "
            "(ONNX's regex dialect) and Python's re fold the case of such text differently"
        )
    try:
        return re.compile(pattern, re.ASCII)
    except re.error as err:
        raise InputError(f"invalid regular expression {pattern!r}: {err}") from None


@register_host_op("regex_full_match")
def _regex_full_match(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    rx = check_regex(attrs["pattern"])
    x = _strs(xs[0])
    out = np.fromiter((rx.fullmatch(s) is not None for s in x.reshape(-1)), dtype=bool, count=x.size)
    return [out.reshape(x.shape)]


def _case(s: str, action: str) -> str:
    return s.lower() if action == "LOWER" else s.upper() if action == "UPPER" else s


def normalize_strings(
    x: np.ndarray, case_change_action: str, is_case_sensitive: bool, stopwords: Sequence[str]
) -> np.ndarray:
    """ONNX StringNormalizer on a 1-D or ``[1, C]`` string array (the output may be shorter).

    Stopwords are removed first (case-insensitively unless ``is_case_sensitive``), then the
    case is changed. An input whose every element is a stopword gives ``[""]`` (``[[""]]``).
    """
    x = _strs(x)
    flat = list(x.reshape(-1))
    if stopwords:
        if is_case_sensitive:
            stop = set(stopwords)
            flat = [s for s in flat if s not in stop]
        else:
            stop = {w.casefold() for w in stopwords}
            flat = [s for s in flat if s.casefold() not in stop]
    flat = [_case(s, case_change_action) for s in flat] or [""]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape((1, len(flat)) if x.ndim == 2 else (len(flat),))


@register_host_op("string_normalizer")
def _string_normalizer(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    out = normalize_strings(
        xs[0], attrs["case_change_action"], bool(attrs["is_case_sensitive"]), attrs.get("stopwords", [])
    )
    if out.shape != xs[0].shape:  # the compiler only emits a host node when nothing is dropped
        raise KernelError(f"string_normalizer: stopwords changed the shape {xs[0].shape} -> {out.shape}")
    return [out]


def split_strings(x: np.ndarray, delimiter: str, maxsplit: int | None) -> tuple[np.ndarray, np.ndarray]:
    """ONNX StringSplit: ``(Y, Z)``; ``Y`` padded with ``""`` to the most substrings of any element.

    An empty ``delimiter`` splits on runs of whitespace (and drops empty pieces), as
    ``str.split()`` does; ``maxsplit`` limits the number of splits per element.
    """
    x = _strs(x)
    ms = -1 if maxsplit is None else int(maxsplit)
    parts = [s.split(delimiter or None, ms) for s in x.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    y = np.empty((len(parts), width), dtype=object)
    y.fill("")
    for i, p in enumerate(parts):
        y[i, : len(p)] = p
    z = np.array([len(p) for p in parts], dtype=np.int64)
    return y.reshape(x.shape + (width,)), z.reshape(x.shape)


def label_encode(x: np.ndarray, keys: np.ndarray, values: np.ndarray, default: Any) -> np.ndarray:
    """ai.onnx.ml LabelEncoder: ``values[k]`` where ``x == keys[k]``, else ``default``.

    Float keys match NaN to NaN (as ONNX asks); the first of repeated keys wins.
    """
    table: dict[Any, Any] = {}
    nan_value = None
    for k, v in zip(keys.reshape(-1).tolist(), values.reshape(-1).tolist()):
        if isinstance(k, float) and math.isnan(k):
            nan_value = v if nan_value is None else nan_value
        else:
            table.setdefault(k, v)
    out = []
    for e in x.reshape(-1).tolist():
        if isinstance(e, float) and math.isnan(e):
            out.append(default if nan_value is None else nan_value)
        else:
            out.append(table.get(e, default))
    return np.asarray(out, dtype=values.dtype).reshape(x.shape)


@register_host_op("label_encoder")
def _label_encoder(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    vdt = STRING if attrs["values_dtype"] == STRING else attrs["values_dtype"]
    npdt = np.dtype(object) if vdt == STRING else np.dtype(vdt)
    keys = np.asarray(attrs["keys"], dtype=object if attrs["keys_dtype"] == STRING else attrs["keys_dtype"])
    values = np.asarray(attrs["values"], dtype=npdt)
    return [label_encode(xs[0], keys, values, np.asarray(attrs["default"], dtype=npdt).item())]


def cast_strings(x: np.ndarray, to: str) -> np.ndarray:
    """ONNX Cast to or from strings: NumPy's text form of numbers, NumPy's parsing of text.

    Numbers become their shortest round-trip text (``"0.1"``, ``"nan"``, ``"inf"``, ``"-3"``);
    text becomes numbers as NumPy parses it (``"1e3"``, ``"NaN"``, ``"-INF"``), bool from
    ``"True"``/``"False"``/``"1"``/``"0"``. Text that is not a number raises InputError.
    """
    if to == STRING:
        if x.dtype == object:
            return to_string_array(x, "Cast input")
        out = np.empty(x.shape, dtype=object)
        out.reshape(-1)[:] = [str(v) for v in x.reshape(-1)]
        return out
    flat = [str(v).strip() for v in np.asarray(x, dtype=object).reshape(-1)]
    try:
        if to == "bool":
            table = {"true": True, "false": False, "1": True, "0": False}
            vals = np.array([table[v.lower()] for v in flat], dtype=bool)
        else:
            vals = np.array(flat, dtype=np.str_).astype(np.dtype(to)) if flat else np.empty(0, np.dtype(to))
    except (KeyError, ValueError, OverflowError) as err:
        raise InputError(f"Cast to {to}: an element is not a {to} number ({err})") from None
    return vals.reshape(x.shape)


@register_host_op("cast_string")
def _cast_string(xs: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    return [cast_strings(xs[0], attrs["dtype"])]


# ----------------------------------------------------------------------------- executor hook
class _HostRunner:
    """Runs one ``__host`` node: reads its input entries, calls the op, writes its outputs."""

    def __init__(
        self, parent: "GraphExecutor", nid: int, node: "GraphNode", in_eids: tuple[int, ...], out_eids: tuple[int, ...]
    ) -> None:
        self.parent, self.nid, self.name = parent, nid, node.name
        name = node.attrs.get("host_op")
        if not isinstance(name, str):
            raise FormatError(f"graph node {nid} ({node.name!r}): '__host' needs attrs.host_op (a string)")
        self.op = name
        self.fn = get_host_op(name)
        raw = node.attrs.get("host_attrs", "{}")
        try:
            attrs = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            attrs = None
        if not isinstance(attrs, dict):
            raise FormatError(f"graph node {nid} ({node.name!r}): attrs.host_attrs must be a JSON object in a string")
        self.attrs: dict[str, Any] = attrs
        if name == "regex_full_match":
            check_regex(str(attrs.get("pattern", "")))  # a bad pattern fails at load, not at the first run
        off = [e for e in in_eids + out_eids if not parent.entry_device[e].host_visible]
        if off:
            raise DeviceError(
                f"graph node {nid} ({node.name!r}): host op {name!r} runs on the CPU only; "
                f"entry {off[0]} is on {parent.entry_device[off[0]]}"
            )
        self.in_eids, self.out_eids = in_eids, out_eids

    def __call__(self) -> None:
        p = self.parent
        g = p.graph
        try:
            xs = [p.arrays[e].numpy(copy=False) for e in self.in_eids]
            outs = self.fn(xs, self.attrs)
            for e, o in zip(self.out_eids, outs):
                o = np.asarray(o)
                if o.shape != tuple(g.shape[e]):
                    raise KernelError(f"gave shape {o.shape}, the graph says {tuple(g.shape[e])}")
                p.arrays[e].copyfrom(o if g.dltype[e] == STRING else o.astype(p.arrays[e].numpy(copy=False).dtype))
        except KilnError as err:
            raise KernelError(f"graph node {self.nid} ({self.name!r}), host op {self.op!r} failed: {err}") from err
        except Exception as err:  # noqa: BLE001 - reported with the node's name
            raise KernelError(
                f"graph node {self.nid} ({self.name!r}), host op {self.op!r} failed: {type(err).__name__}: {err}"
            ) from err


def make_host_runner(
    parent: "GraphExecutor", nid: int, node: "GraphNode", in_eids: tuple[int, ...], out_eids: tuple[int, ...]
) -> Callable[[], None]:
    """The callable that runs host-op node ``nid`` of ``parent`` once.

    Raises
    ------
    FormatError
        An unknown host op or malformed ``host_attrs``.
    DeviceError
        An entry of the node is not in host memory.
    """
    return _HostRunner(parent, nid, node, in_eids, out_eids)


def set_string_input(ex: "GraphExecutor", name: str, eid: int, value: Any, what: str = "input") -> None:
    """Copy user text data into string entry ``eid`` of ``ex`` (checked: shape, element types)."""
    if isinstance(value, NDArray) and not isinstance(value, StringNDArray):
        raise InputError(f"{what} {name!r}: dtype {value.dtype} does not match the graph's string")
    if isinstance(value, np.ndarray) and value.dtype.kind not in "OUS":
        raise InputError(
            f"{what} {name!r}: dtype {value.dtype} does not match the graph's string "
            "(pass a NumPy array of dtype object holding str, or of dtype str_)"
        )
    objs = to_string_array(value, f"{what} {name!r}")
    want = tuple(ex.graph.shape[eid])
    if objs.shape != want:
        raise InputError(f"{what} {name!r}: shape {objs.shape} does not match the graph's {want}")
    ex.unbind(eid)
    ex.arrays[eid].copyfrom(objs)
    ex.mark_set(name)
