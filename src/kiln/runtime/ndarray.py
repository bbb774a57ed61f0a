"""NDArray: a dense tensor on a Kiln device, described by a DLPack ``DLTensor``.

An NDArray is a thin Python object around a ctypes ``DLTensor`` (``.handle``) that kernels
receive by pointer. Memory comes from the device's :class:`~kiln.runtime.device.DeviceAPI`
(64-byte aligned) or, for :func:`from_dlpack`, from another framework without a copy.
Creation is a handful of attribute stores, because the graph executor makes hundreds.

Data pointer convention: on host-visible devices ``handle.data`` already points at element 0
and ``handle.byte_offset`` is 0, so kernels that ignore ``byte_offset`` stay correct; on other
devices ``data`` is an opaque allocation handle and views use ``byte_offset``.
"""

from __future__ import annotations

import ctypes
import math
import operator
from typing import Any, Iterable

import numpy as np

from . import dlpack as _dlpack
from ._ffi import DLDevice, DLTensor
from .device import ALLOC_ALIGNMENT, Device, cpu, device as _to_device, get_device_api
from .dtype import SUB_BYTE_DTYPES, canonical, itemsize, np_dtype, to_dl
from .errors import DeviceError, InputError

__all__ = ["NDArray", "array", "empty", "zeros", "from_dlpack"]

_CPU = cpu(0)


def _normalize_shape(shape: int | Iterable[int]) -> tuple[int, ...]:
    try:
        if hasattr(shape, "__index__"):  # a single int (Python or NumPy) means a 1-d shape
            dims: tuple[int, ...] = (operator.index(shape),)
        else:
            dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise InputError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise InputError(f"shape dimensions must be >= 0, got {dims}")
    return dims


class _Allocation:
    """Owns one device allocation; frees it when the last NDArray (or view) using it dies."""

    __slots__ = ("api", "device", "ptr", "__weakref__")

    def __init__(self, api: Any, dev: Device, ptr: int) -> None:
        self.api, self.device, self.ptr = api, dev, ptr

    def __del__(self) -> None:
        try:
            self.api.free_data_space(self.device, self.ptr)
        except Exception:  # noqa: BLE001 # pragma: no cover - never raise from a finalizer (e.g. at shutdown)
            pass


class NDArray:
    """A dense, C-contiguous tensor on a device.

    Create with :func:`array`, :func:`empty` or :func:`from_dlpack`, not directly.

    Attributes
    ----------
    handle : DLTensor
        The ctypes DLTensor describing this array; pass ``ctypes.byref(arr.handle)`` (or
        :meth:`_dltensor_ptr`) to kernels. It stays valid as long as the NDArray lives.
    """

    __slots__ = ("handle", "_shape", "_dtype", "_device", "_owner", "_shape_arr", "_nbytes", "_host", "__weakref__")

    handle: DLTensor

    @classmethod
    def _make(
        cls,
        data: int,
        byte_offset: int,
        shape: tuple[int, ...],
        dtype: str,
        dev: Device,
        owner: Any,
        host: bool,
    ) -> "NDArray":
        """Wrap existing memory (no checks: callers guarantee ``shape``/``dtype`` fit)."""
        self = object.__new__(cls)
        dl = to_dl(dtype)
        ndim = len(shape)
        shape_arr = (ctypes.c_int64 * ndim)(*shape)
        h = DLTensor()
        h.data = data
        h.device = DLDevice(dev.device_type, dev.device_id)
        h.ndim = ndim
        h.dtype = dl
        h.shape = shape_arr
        h.strides = None  # compact row-major
        h.byte_offset = byte_offset
        self.handle = h
        self._shape = shape
        self._dtype = dtype
        self._device = dev
        self._owner = owner  # keeps the memory alive (allocation, producer, ...)
        self._shape_arr = shape_arr
        self._nbytes = math.prod(shape) * itemsize(dtype)  # sub-byte types: one element per byte
        self._host = host
        return self

    # ----------------------------------------------------------------- properties
    @property
    def shape(self) -> tuple[int, ...]:
        """Shape as a tuple of ints."""
        return self._shape

    @property
    def dtype(self) -> str:
        """Kiln dtype name ("float32", "bfloat16", "bool", ...)."""
        return self._dtype

    @property
    def device(self) -> Device:
        """Device holding the data."""
        return self._device

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self._shape)

    @property
    def nbytes(self) -> int:
        """Size of the data in bytes."""
        return self._nbytes

    @property
    def data_ptr(self) -> int:
        """Address of element 0 (``handle.data + handle.byte_offset``)."""
        return (self.handle.data or 0) + self.handle.byte_offset

    @property
    def is_aligned(self) -> bool:
        """Whether element 0 is 64-byte aligned (always true for memory Kiln allocated)."""
        return self.data_ptr % ALLOC_ALIGNMENT == 0

    def _dltensor_ptr(self) -> int:
        """Address of :attr:`handle` (a ``DLTensor*``), valid while this NDArray lives."""
        return ctypes.addressof(self.handle)

    # ----------------------------------------------------------------- host access
    def _host_view(self) -> np.ndarray:
        """NumPy view of host-visible memory; the view keeps this NDArray alive."""
        buf = (ctypes.c_char * self._nbytes).from_address(self.data_ptr)
        buf._kiln_owner = self  # numpy's base is ``buf``; this ties the NDArray's memory to it
        return np.frombuffer(buf, dtype=np_dtype(self._dtype)).reshape(self._shape)

    def numpy(self, copy: bool = True) -> np.ndarray:
        """Return the contents as a NumPy array.

        Parameters
        ----------
        copy : bool, optional
            For host-visible devices, False returns a view sharing memory with this array
            (it keeps the NDArray alive). Other devices always copy.

        Returns
        -------
        numpy.ndarray
        """
        if self._host:
            view = self._host_view()
            return view.copy() if copy else view
        out = np.empty(self._shape, dtype=np_dtype(self._dtype))
        if self._nbytes:
            api = get_device_api(self._device.device_type)
            h = self.handle
            api.copy_data_from_to(h.data or 0, h.byte_offset, out.ctypes.data, 0, self._nbytes, self._device, _CPU)
            api.stream_sync(self._device, None)
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False and not self._host:
            raise ValueError(f"an NDArray on {self._device} cannot be viewed by NumPy without a copy")
        out = self.numpy(copy=bool(copy))
        return out if dtype is None else out.astype(dtype, copy=False)

    # ----------------------------------------------------------------- copies
    def copyfrom(self, source: Any) -> "NDArray":
        """Copy data from ``source`` into this array.

        Parameters
        ----------
        source : NDArray, numpy.ndarray, DLPack object or array-like
            Must have the same shape and dtype (array-likes such as lists are converted to this
            array's dtype). Non-contiguous NumPy arrays are fine.

        Returns
        -------
        NDArray
            ``self``.

        Raises
        ------
        InputError
            On a shape or dtype mismatch.
        """
        if not isinstance(source, (NDArray, np.ndarray)) and hasattr(source, "__dlpack__"):
            source = from_dlpack(source)
        if isinstance(source, NDArray):
            self._check_same(source.shape, source.dtype, "copyfrom")
            _copy_between(source, self)
            return self
        npdt = np_dtype(self._dtype)
        if not isinstance(source, np.ndarray):
            source = np.asarray(source, dtype=npdt)
        elif source.dtype != npdt:
            if source.dtype.name != self._dtype:  # same name = only byte order differs
                raise InputError(
                    f"copyfrom: dtype mismatch, array is {self._dtype} but source is {source.dtype.name}"
                )
            source = source.astype(npdt)
        self._check_same(source.shape, self._dtype, "copyfrom")
        if self._host:
            np.copyto(self._host_view(), source, casting="no")
        elif self._nbytes:
            source = np.asarray(source, order="C")  # ascontiguousarray would make 0-d 1-d
            api = get_device_api(self._device.device_type)
            h = self.handle
            api.copy_data_from_to(source.ctypes.data, 0, h.data or 0, h.byte_offset, self._nbytes, _CPU, self._device)
            api.stream_sync(self._device, None)  # ``source`` may be a temporary
        return self

    def copyto(self, target: "Device | NDArray | str") -> "NDArray":
        """Copy this array to a device (new array) or into an existing NDArray.

        Parameters
        ----------
        target : Device, str or NDArray
            Destination device, or an array of the same shape and dtype.

        Returns
        -------
        NDArray
            The destination array.

        Raises
        ------
        InputError
            On a shape/dtype mismatch or an unusable target.
        """
        if isinstance(target, NDArray):
            target._check_same(self._shape, self._dtype, "copyto")
            _copy_between(self, target)
            return target
        if isinstance(target, (Device, str)):
            out = empty(self._shape, self._dtype, _to_device(target))
            _copy_between(self, out)
            return out
        raise InputError(f"copyto expects a Device or an NDArray, got {type(target).__name__}")

    def _check_same(self, shape: tuple[int, ...], dtype: str, what: str) -> None:
        if tuple(shape) != self._shape or dtype != self._dtype:
            raise InputError(
                f"{what}: expected shape {self._shape} dtype {self._dtype}, got shape {tuple(shape)} dtype {dtype}"
            )

    # ----------------------------------------------------------------- views
    def _create_view(self, shape: int | Iterable[int], dtype: Any = None, byte_offset: int = 0) -> "NDArray":
        """Return an array of another shape/dtype over this array's memory (no copy).

        Parameters
        ----------
        shape : int or sequence of int
        dtype : optional
            Defaults to this array's dtype.
        byte_offset : int, optional
            Start of the view, in bytes from element 0 of this array.

        Raises
        ------
        InputError
            If the view would not fit inside this array.
        """
        shape = _normalize_shape(shape)
        dt = self._dtype if dtype is None else canonical(dtype)
        need = math.prod(shape) * itemsize(dt)
        byte_offset = operator.index(byte_offset)
        if byte_offset < 0 or byte_offset + need > self._nbytes:
            raise InputError(
                f"view of shape {shape} {dt} at byte offset {byte_offset} needs {need} bytes, "
                f"which does not fit in this array's {self._nbytes} bytes"
            )
        h = self.handle
        if self._host:  # fold the offset into the pointer (see module docstring)
            data, off = self.data_ptr + byte_offset, 0
        else:
            data, off = h.data or 0, h.byte_offset + byte_offset
        return NDArray._make(data, off, shape, dt, self._device, self._owner, self._host)

    # ----------------------------------------------------------------- DLPack
    def __dlpack__(
        self,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """Export as a legacy ``"dltensor"`` DLPack capsule (zero-copy unless asked otherwise).

        Parameters
        ----------
        stream : optional
            Consumer stream; Kiln's own devices execute synchronously, so it is ignored.
        max_version : tuple, optional
            Highest DLPack version the consumer understands. None (or < 1.0) gives a legacy
            ``"dltensor"`` capsule; >= (1, 0) gives a ``"dltensor_versioned"`` one, as the
            protocol asks (NumPy treats legacy capsules as read-only).
        dl_device : tuple, optional
            Device the consumer wants; a different one means a copy to it.
        copy : bool, optional
            True forces a copy, False forbids one (``BufferError`` if it would be needed).
        """
        if self._dtype in SUB_BYTE_DTYPES:
            # DLPack packs sub-byte elements (bits < 8); Kiln holds one per byte (ml_dtypes' layout)
            raise BufferError(f"a {self._dtype} array cannot be exported through DLPack: DLPack packs "
                              f"{self._dtype} elements several to a byte, Kiln stores one per byte; use "
                              f".numpy() (an ml_dtypes array) instead")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            if copy is False:
                raise BufferError(f"exporting to device {tuple(dl_device)} needs a copy but copy=False")
            return self.copyto(Device(*dl_device)).__dlpack__(max_version=max_version)
        if copy:
            return self.copyto(self._device).__dlpack__(max_version=max_version)
        if max_version is not None and max_version[0] >= 1:
            return _dlpack.export_capsule_versioned(self.handle, self)
        return _dlpack.export_capsule(self.handle, self)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)`` of the data, per the DLPack protocol."""
        return (self._device.device_type, self._device.device_id)

    # ----------------------------------------------------------------- misc
    def __repr__(self) -> str:
        head = f"<kiln.NDArray shape={self._shape} dtype={self._dtype} device={self._device}>"
        if self._host:
            return head + "\n" + np.array2string(self._host_view(), threshold=64, edgeitems=3)
        return head

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d NDArray")
        return self._shape[0]


def _copy_between(src: NDArray, dst: NDArray) -> None:
    """Copy all bytes of ``src`` into ``dst`` (same nbytes), picking the right device API."""
    n = src.nbytes
    if not n:
        return
    if src._host and dst._host:
        ctypes.memmove(dst.data_ptr, src.data_ptr, n)
        return
    sdev, ddev = src.device, dst.device
    if sdev.device_type == ddev.device_type or dst._host:
        api = get_device_api(sdev.device_type)
    elif src._host:
        api = get_device_api(ddev.device_type)
    else:
        # Two different non-host devices: stage through host memory.
        dst.copyfrom(src.numpy())
        return
    sh, dh = src.handle, dst.handle
    api.copy_data_from_to(sh.data or 0, sh.byte_offset, dh.data or 0, dh.byte_offset, n, sdev, ddev)
    if dst._host:
        api.stream_sync(sdev, None)  # host code may read dst right away


#: Above this many contiguous runs a valid box is copied with its whole padded storage: one
#: transfer of the upper bound costs less than thousands of small driver calls.
MAX_BOX_RUNS = 64


def box_runs(shape: tuple[int, ...], box: tuple[int, ...]) -> tuple[list[int], int] | None:
    """The contiguous runs of the sub-box ``box`` (``[0, box[i])`` per dim) of a C-contiguous
    array of ``shape``: the start of every run (in elements of the padded array) and the
    length of each (the compact copy is the runs back to back). ``None`` when there are more
    than :data:`MAX_BOX_RUNS` runs.

    The dims after the last one the box cuts are whole, so a run is that dim's valid prefix
    times their size; the dims before it are iterated.
    """
    cut = max((i for i, (b, n) in enumerate(zip(box, shape)) if b != n), default=0)
    inner = math.prod(shape[cut + 1:])
    count = math.prod(box[:cut])
    if count > MAX_BOX_RUNS:
        return None
    run = box[cut] * inner if shape else 1
    if not run:
        return [], 0
    starts = [0]
    for k in range(cut - 1, -1, -1):  # outer dims wrap the inner ones: starts stay ascending
        stride = math.prod(shape[k + 1:])
        starts = [s + i * stride for i in range(box[k]) for s in starts]
    return starts, run


def copy_box(src: "NDArray | np.ndarray", dst: "NDArray | np.ndarray", box: tuple[int, ...]) -> None:
    """Copy the valid sub-box ``box`` of a padded array between a device and the host.

    Each side is either the padded storage (an :class:`NDArray` of the upper-bound shape) or a
    compact C-contiguous NumPy array of shape ``box``; at least one side is padded. Only the
    valid data moves (one driver call per contiguous run, see :func:`box_runs`); the padding of
    a padded destination is left as it was, which every kernel reading it allows (reads stop at
    the runtime extents). With too many runs the whole storage goes over once.
    """
    padded = src if isinstance(src, NDArray) else dst
    assert isinstance(padded, NDArray)
    shape, box = padded.shape, tuple(box)
    runs = box_runs(shape, box)
    if runs is None or shape == box:
        _copy_box_whole(src, dst, box)
        return
    starts, run = runs
    size = itemsize(padded.dtype)

    def where(a: "NDArray | np.ndarray") -> tuple[int, int, Device, bool]:
        if isinstance(a, np.ndarray):
            return a.ctypes.data, 0, _CPU, False
        h = a.handle
        return (h.data or 0), h.byte_offset, a.device, True

    sp, so, sdev, s_padded = where(src)
    dp, do, ddev, d_padded = where(dst)
    api = get_device_api((sdev if not sdev.host_visible else ddev).device_type)
    for k, start in enumerate(starts):
        s_at = (start if s_padded else k * run) * size
        d_at = (start if d_padded else k * run) * size
        api.copy_data_from_to(sp, so + s_at, dp, do + d_at, run * size, sdev, ddev)
    api.stream_sync(sdev if not sdev.host_visible else ddev, None)  # a host side may be read or freed next


def _copy_box_whole(src: "NDArray | np.ndarray", dst: "NDArray | np.ndarray", box: tuple[int, ...]) -> None:
    cut = tuple(slice(0, b) for b in box)
    if isinstance(src, NDArray) and isinstance(dst, NDArray):
        dst.copyfrom(src)
    elif isinstance(dst, NDArray):  # compact host data into padded storage: stage the upper bound
        staged = np.zeros(dst.shape, np_dtype(dst.dtype))
        staged[cut] = src
        dst.copyfrom(staged)
    else:
        assert isinstance(src, NDArray)
        dst[...] = src.numpy()[cut]


def _resolve_device(dev: Any) -> Device:
    if dev is None:
        return _CPU
    if isinstance(dev, Device):
        return dev
    if isinstance(dev, (str, int)):
        return _to_device(dev)
    raise InputError(f"expected a Device, device name or None, got {type(dev).__name__}")


def empty(shape: int | Iterable[int], dtype: Any = "float32", device: Device | str | None = None) -> NDArray:
    """Allocate an uninitialized array.

    Parameters
    ----------
    shape : int or sequence of int
    dtype : str or numpy dtype, optional
    device : Device or str, optional
        Defaults to ``cpu(0)``.

    Returns
    -------
    NDArray
        64-byte aligned on host-visible devices.

    Raises
    ------
    InputError
        For a bad shape or unsupported dtype.
    DeviceError
        If the device has no registered DeviceAPI.
    """
    return _allocate(shape, dtype, device, zeroed=False)


def _allocate(shape: int | Iterable[int], dtype: Any, device: Device | str | None, zeroed: bool) -> NDArray:
    shape = _normalize_shape(shape)
    dt = canonical(dtype)
    dev = _resolve_device(device)
    if dt == "string":
        from .strings import empty_strings  # an object array of str, not device memory

        return empty_strings(shape, dev)
    api = get_device_api(dev.device_type)
    nbytes = math.prod(shape) * itemsize(dt)
    if zeroed and hasattr(api, "alloc_zeroed_data_space"):
        raw = api.alloc_zeroed_data_space(dev, nbytes, ALLOC_ALIGNMENT, dt)
    else:
        raw = api.alloc_data_space(dev, nbytes, ALLOC_ALIGNMENT, dt)
    # A plug-in must hand back a non-negative int; 0 (NULL) only for an empty allocation.
    if not hasattr(raw, "__index__") or raw < 0 or (raw == 0 and nbytes):
        raise DeviceError(f"{type(api).__name__}.alloc_data_space returned {raw!r} for {nbytes} bytes on {dev}")
    ptr = operator.index(raw)
    arr = NDArray._make(ptr, 0, shape, dt, dev, _Allocation(api, dev, ptr), bool(getattr(api, "host_visible", False)))
    if zeroed and not hasattr(api, "alloc_zeroed_data_space") and nbytes:
        arr.copyfrom(np.zeros(shape, dtype=np_dtype(dt)))  # a duck-typed API without the method
    return arr


def zeros(shape: int | Iterable[int], dtype: Any = "float32", device: Device | str | None = None) -> NDArray:
    """Allocate an array filled with zeros.

    Same parameters, result and errors as :func:`empty`. Use it where stale bytes must not
    be observable (executor storage): an allocation can reuse memory another array freed.
    On the CPU the zeros come from ``calloc`` and cost (almost) nothing until touched.
    """
    return _allocate(shape, dtype, device, zeroed=True)


def array(obj: Any, device: Device | str | None = None, dtype: Any = None) -> NDArray:
    """Copy array-like data into a new NDArray.

    Parameters
    ----------
    obj : numpy.ndarray, NDArray, DLPack object, list or scalar
    device : Device or str, optional
        Destination device (default ``cpu(0)``).
    dtype : optional
        Convert to this dtype; default keeps the source dtype.

    Returns
    -------
    NDArray

    Raises
    ------
    InputError
        If the data's dtype is not supported.

    Examples
    --------
    >>> import numpy as np, kiln
    >>> kiln.nd.array(np.ones((2, 2), "float32")).shape
    (2, 2)
    """
    dev = _resolve_device(device)
    want = None if dtype is None else canonical(dtype)
    if not isinstance(obj, (NDArray, np.ndarray)) and hasattr(obj, "__dlpack__"):
        obj = from_dlpack(obj)
    if isinstance(obj, NDArray):
        if want is None or want == obj.dtype:
            return obj.copyto(dev)
        obj = obj.numpy(copy=False)
    try:
        arr = np.asarray(obj) if want is None else np.asarray(obj, dtype=np_dtype(want))
    except (TypeError, ValueError) as e:
        raise InputError(f"cannot convert {type(obj).__name__} to an array: {e}") from None
    out = empty(arr.shape, canonical(arr.dtype), dev)
    return out.copyfrom(arr)


def from_dlpack(obj: Any) -> NDArray:
    """Wrap a DLPack tensor (NumPy array, torch tensor, capsule, ...) as an NDArray, zero-copy.

    The producer is kept alive and its deleter runs when the NDArray (and its views) are freed.
    The data may be unaligned; check :attr:`NDArray.is_aligned`.

    Parameters
    ----------
    obj : object with ``__dlpack__``, or a ``"dltensor"`` PyCapsule

    Returns
    -------
    NDArray
        Shares memory with ``obj``.

    Raises
    ------
    InputError
        For non-contiguous tensors, unsupported dtypes, or an already consumed capsule.
    """
    if isinstance(obj, NDArray):
        return obj
    ft = _dlpack.consume(obj)
    dev = ft.device
    host = dev.host_visible
    if host:
        data, off = ft.data + ft.byte_offset, 0
    else:
        data, off = ft.data, ft.byte_offset
    return NDArray._make(data, off, ft.shape, ft.dtype, dev, ft.owner, host)
