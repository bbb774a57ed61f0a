"""Devices and the DeviceAPI registry.

A :class:`Device` is a plain value (DLPack device type + ordinal). Everything a device can *do*
(allocate, copy, synchronize) lives in a :class:`DeviceAPI` registered for its device type with
:func:`register_device_api`. Only the CPU API is built in; every other device is a plug-in
(:mod:`kiln.runtime.plugins`: CUDA and OpenCL are described there like any third-party
package), whose module is imported the first time its device type or name is used. This
module names no back end, so ``cuda()`` works (and ``.exist`` answers False) on a machine
without a driver, and a new device needs no edit here.
"""

from __future__ import annotations

import abc
import ctypes
import enum
import operator
import os
import platform
import re
import threading
from typing import Any

import numpy as np

from . import plugins as _plugins
from .errors import DeviceError

__all__ = [
    "DeviceType",
    "Device",
    "DeviceAPI",
    "CPUDeviceAPI",
    "register_device_api",
    "get_device_api",
    "list_device_apis",
    "device",
    "cpu",
    "cuda",
    "opencl",
    "ALLOC_ALIGNMENT",
]

#: Alignment (bytes) of every host allocation Kiln makes; kernels may rely on it for SIMD loads.
ALLOC_ALIGNMENT = 64


class DeviceType(enum.IntEnum):
    """DLPack ``DLDeviceType`` codes."""

    CPU = 1
    CUDA = 2
    CUDA_HOST = 3
    OPENCL = 4
    VULKAN = 7
    METAL = 8
    ROCM = 10
    EXT_DEV = 12


# DLPack's names of the device types no plug-in describes (plug-ins' names -- cuda, opencl,
# third-party -- come from their descriptors, see _type_name); register_device_api adds more.
_TYPE_NAMES: dict[int, str] = {
    1: "cpu",
    3: "cuda_host",
    7: "vulkan",
    8: "metal",
    10: "rocm",
    12: "ext_dev",
}
# Names ``device()`` accepts besides the plug-ins' (canonical names plus TVM's CPU aliases).
_NAME_TYPES: dict[str, int] = {name: t for t, name in _TYPE_NAMES.items()}
_NAME_TYPES.update({"llvm": 1, "c": 1})


def _type_name(dt: int) -> str | None:
    """Display name of device type ``dt``: registered or DLPack's, else the plug-in's, else None."""
    name = _TYPE_NAMES.get(dt)
    if name is None:
        found = _plugins.find_device_type(dt)
        name = None if found is None else found[1].name.lower()
    return name


def _name_type(name: str) -> int | None:
    """Device type code of a (lower-case) device name or alias, None if nobody declares it."""
    dt = _NAME_TYPES.get(name)
    if dt is None:
        found = _plugins.find_device_name(name)
        dt = None if found is None else found[1].type_code
    return dt

# TVM's integer DeviceAttrKind codes, so ``get_attr(dev, 0)`` means ``"exist"``.
_ATTR_KINDS: tuple[str, ...] = (
    "exist",
    "max_threads_per_block",
    "warp_size",
    "max_shared_memory_per_block",
    "compute_version",
    "device_name",
    "max_clock_rate",
    "multi_processor_count",
    "max_thread_dimensions",
    "max_registers_per_block",
    "gcn_arch",
    "api_version",
    "driver_version",
    "l2_cache_size_bytes",
    "total_global_memory",
    "available_global_memory",
)


def _attr_name(kind: str | int) -> str:
    if isinstance(kind, str):
        return kind
    try:
        return _ATTR_KINDS[operator.index(kind)]
    except (IndexError, TypeError):
        raise DeviceError(f"unknown device attribute {kind!r}; known: {', '.join(_ATTR_KINDS)}") from None


class Device:
    """A device: DLPack device type plus device ordinal. Immutable and hashable.

    Parameters
    ----------
    device_type : int
        DLPack device type code (see :class:`DeviceType`); codes of plug-in devices are allowed.
    device_id : int, optional
        Ordinal of the device among those of its type.

    Examples
    --------
    >>> import kiln
    >>> str(kiln.cpu())
    'cpu(0)'
    """

    __slots__ = ("device_type", "device_id")

    device_type: int
    device_id: int

    def __init__(self, device_type: int, device_id: int = 0) -> None:
        try:
            dt, di = operator.index(device_type), operator.index(device_id)
        except TypeError:
            raise DeviceError(
                f"Device needs integer device_type and device_id, got {device_type!r}, {device_id!r}"
            ) from None
        if dt <= 0 or di < 0:
            raise DeviceError(f"invalid device (device_type={dt}, device_id={di})")
        # object.__setattr__ because __setattr__ is blocked to keep Device immutable (hashable).
        object.__setattr__(self, "device_type", int(dt))
        object.__setattr__(self, "device_id", int(di))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Device is immutable")

    def __reduce__(self) -> tuple:
        return (Device, (self.device_type, self.device_id))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Device):
            return NotImplemented
        return self.device_type == other.device_type and self.device_id == other.device_id

    def __hash__(self) -> int:
        return hash((self.device_type, self.device_id))

    @property
    def name(self) -> str:
        """Device type name ("cpu", "cuda", "opencl", a plug-in's registered name, ...)."""
        return _type_name(self.device_type) or f"device{self.device_type}"

    def __str__(self) -> str:
        return f"{self.name}({self.device_id})"

    __repr__ = __str__

    def _dlpack(self) -> tuple[int, int]:
        return (self.device_type, self.device_id)

    @property
    def host_visible(self) -> bool:
        """True when this device's memory can be read and written by host code directly."""
        api = _lookup_api(self.device_type)
        return bool(api is not None and getattr(api, "host_visible", False))

    @property
    def exist(self) -> bool:
        """Whether the device is present; False when no DeviceAPI is registered for its type."""
        api = _lookup_api(self.device_type)
        if api is None:
            return False
        try:
            return bool(api.get_attr(self, "exist"))
        except DeviceError:  # a driver that cannot even be queried means "not there"
            return False

    def get_attr(self, kind: str | int) -> Any:
        """Query a device attribute (``"exist"``, ``"device_name"``, ...) or None if unknown.

        Parameters
        ----------
        kind : str or int
            Attribute name, or TVM's integer ``DeviceAttrKind`` code.

        Returns
        -------
        Any
            The attribute value reported by the device's API, None when it does not know it.
        """
        return get_device_api(self.device_type).get_attr(self, _attr_name(kind))

    @property
    def device_name(self) -> str | None:
        """Human-readable device name, if the API reports one."""
        return self.get_attr("device_name")

    @property
    def max_threads_per_block(self) -> int | None:
        """Maximum threads per block (GPUs), None where meaningless."""
        return self.get_attr("max_threads_per_block")

    @property
    def warp_size(self) -> int | None:
        """Warp / wavefront size (GPUs), None where meaningless."""
        return self.get_attr("warp_size")

    @property
    def multi_processor_count(self) -> int | None:
        """Number of compute units (cores for CPU)."""
        return self.get_attr("multi_processor_count")

    def sync(self, stream: Any = None) -> None:
        """Wait until all work queued on ``stream`` (default stream if None) has finished."""
        get_device_api(self.device_type).stream_sync(self, stream)


class DeviceAPI(abc.ABC):
    """What a device can do. Subclass it and register it with :func:`register_device_api`.

    Pointers are plain ints. For devices whose memory is not host-addressable they are opaque
    handles (e.g. ``cl_mem``): Kiln never does arithmetic on them and passes byte offsets
    separately, so an implementation may hand out any unique non-zero int.

    Attributes
    ----------
    host_visible : bool
        True when pointers returned by :meth:`alloc_data_space` are host addresses that
        ordinary host code may read and write (CPU, CUDA host memory). Kiln then copies with
        ``memmove`` and shows NumPy views; otherwise every transfer goes through
        :meth:`copy_data_from_to` with the CPU device on one side.
    """

    host_visible: bool = False

    def set_device(self, dev: Device) -> None:
        """Make ``dev`` current for the calling thread (no-op by default)."""

    @abc.abstractmethod
    def get_attr(self, dev: Device, kind: str) -> Any:
        """Return attribute ``kind`` (``"exist"``, ``"device_name"``, ...) or None if unknown."""

    @abc.abstractmethod
    def alloc_data_space(self, dev: Device, nbytes: int, alignment: int, dtype: Any = None) -> int:
        """Allocate ``nbytes`` (``alignment``-aligned) and return a non-zero pointer/handle."""

    def alloc_zeroed_data_space(self, dev: Device, nbytes: int, alignment: int, dtype: Any = None) -> int:
        """Like :meth:`alloc_data_space`, but the memory reads as zeros (free it the same way).

        The default allocates, then uploads host zeros; override it where the device can do
        better (the CPU asks the C library's ``calloc`` for pages that are zero already).
        """
        ptr = self.alloc_data_space(dev, nbytes, alignment, dtype)
        if nbytes:
            zeros = np.zeros(int(nbytes), dtype=np.uint8)
            self.copy_data_from_to(zeros.ctypes.data, 0, ptr, 0, int(nbytes), Device(1, 0), dev)
        return ptr

    @abc.abstractmethod
    def free_data_space(self, dev: Device, ptr: int) -> None:
        """Release memory returned by :meth:`alloc_data_space`."""

    @abc.abstractmethod
    def copy_data_from_to(
        self,
        src_ptr: int,
        src_offset: int,
        dst_ptr: int,
        dst_offset: int,
        nbytes: int,
        src_dev: Device,
        dst_dev: Device,
        stream: Any = None,
    ) -> None:
        """Copy ``nbytes`` from ``src_ptr + src_offset`` to ``dst_ptr + dst_offset``.

        One side may be the CPU (host address); the other belongs to this API's device type.
        """

    def create_stream(self, dev: Device) -> Any:
        """Create a stream/queue (None: the device has only its default stream)."""
        return None

    def free_stream(self, dev: Device, stream: Any) -> None:
        """Destroy a stream made by :meth:`create_stream`."""

    def stream_sync(self, dev: Device, stream: Any) -> None:
        """Block until ``stream`` (None = default) is idle. Synchronous devices need nothing."""

    def set_stream(self, dev: Device, stream: Any) -> None:
        """Make ``stream`` the one later work is queued on."""

    def alloc_workspace(self, dev: Device, nbytes: int, dtype: Any = None) -> int:
        """Allocate short-lived scratch memory (default: a regular aligned allocation)."""
        return self.alloc_data_space(dev, nbytes, ALLOC_ALIGNMENT, dtype)

    def free_workspace(self, dev: Device, ptr: int) -> None:
        """Release memory from :meth:`alloc_workspace`."""
        self.free_data_space(dev, ptr)


class CPUDeviceAPI(DeviceAPI):
    """Host memory. Allocations are NumPy byte buffers, over-allocated and offset to alignment.

    NumPy (not ``malloc`` via ctypes) owns the bytes so that freeing is just dropping the
    buffer, and the address -> buffer dict is what keeps each allocation alive until
    :meth:`free_data_space`.
    """

    host_visible = True

    def __init__(self) -> None:
        self._buffers: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def get_attr(self, dev: Device, kind: str) -> Any:
        if kind == "exist":
            return True
        if kind == "device_name":
            return platform.processor() or platform.machine() or "cpu"
        if kind == "multi_processor_count":
            return os.cpu_count()
        if kind == "total_global_memory":
            try:
                return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            except (ValueError, OSError, AttributeError):
                return None
        return None

    def alloc_data_space(self, dev: Device, nbytes: int, alignment: int = ALLOC_ALIGNMENT, dtype: Any = None) -> int:
        return self._alloc(dev, nbytes, alignment, np.empty)

    def alloc_zeroed_data_space(self, dev: Device, nbytes: int, alignment: int = ALLOC_ALIGNMENT,
                                dtype: Any = None) -> int:
        # np.zeros is calloc: large blocks come as fresh zero pages, so zeroing costs nothing
        # until (and unless) the memory is touched.
        return self._alloc(dev, nbytes, alignment, np.zeros)

    def _alloc(self, dev: Device, nbytes: int, alignment: int, make: Any) -> int:
        nbytes = int(nbytes)
        if nbytes < 0:
            raise DeviceError(f"cannot allocate a negative number of bytes ({nbytes}) on {dev}")
        alignment = max(int(alignment), ALLOC_ALIGNMENT)
        if alignment & (alignment - 1):
            raise DeviceError(f"alignment must be a power of two, got {alignment}")
        # +alignment so an aligned start always fits; a size-0 request still gets a unique,
        # valid, aligned address (DLPack consumers dislike NULL data pointers).
        buf = make(nbytes + alignment, dtype=np.uint8)
        base = buf.ctypes.data
        ptr = base + (-base % alignment)
        with self._lock:
            self._buffers[ptr] = buf
        return ptr

    def free_data_space(self, dev: Device, ptr: int) -> None:
        with self._lock:
            buf = self._buffers.pop(ptr, None)
        if buf is None:
            raise DeviceError(f"free of unknown pointer 0x{ptr:x} on {dev} (double free?)")

    def copy_data_from_to(
        self,
        src_ptr: int,
        src_offset: int,
        dst_ptr: int,
        dst_offset: int,
        nbytes: int,
        src_dev: Device,
        dst_dev: Device,
        stream: Any = None,
    ) -> None:
        if not (src_dev.host_visible and dst_dev.host_visible):
            raise DeviceError(
                f"the CPU device API cannot copy between {src_dev} and {dst_dev}; "
                "use the device API of the non-host device"
            )
        if nbytes:
            ctypes.memmove(dst_ptr + dst_offset, src_ptr + src_offset, nbytes)

    def _live_allocations(self) -> int:
        """Number of allocations not yet freed (for leak tests)."""
        return len(self._buffers)


_REGISTRY: dict[int, DeviceAPI] = {}
_REGISTRY_LOCK = threading.Lock()

def _lookup_api(dt: int, why: list[str] | None = None) -> "DeviceAPI | None":
    """The API of device type ``dt``, importing the plug-in that declares it on first use.

    A plug-in that fails to import gives None (so ``exist`` answers False); the reason, naming
    the plug-in, is appended to ``why`` for the caller's error message.
    """
    api = _REGISTRY.get(dt)
    if api is None:
        found = _plugins.find_device_type(dt)
        if found is not None:
            try:
                _plugins.import_facet(found[0], "device", f"device type {dt} ({found[1].name})",
                                      registered=lambda: dt in _REGISTRY)
            except _plugins.PluginError as err:
                if why is not None:
                    why.append(str(err))
                return None
            api = _REGISTRY.get(dt)
    return api


def register_device_api(device_type: int, api: DeviceAPI, name: str | None = None, override: bool = False) -> None:
    """Register the :class:`DeviceAPI` serving a device type (how device plug-ins hook in).

    Parameters
    ----------
    device_type : int
        DLPack device type code, e.g. ``DeviceType.CUDA`` or a new code for a custom device.
    api : DeviceAPI
        The implementation.
    name : str, optional
        Name for ``device(name)`` and ``str(Device)``; required for a code Kiln has no name for.
    override : bool, optional
        Replace an existing registration (API or name) instead of raising.

    Raises
    ------
    DeviceError
        If the type already has an API, or ``name`` is taken by another type, and
        ``override`` is False; or if ``api`` is not a DeviceAPI.
    """
    dt = operator.index(device_type)
    if dt <= 0:
        raise DeviceError(f"device type must be a positive DLPack code, got {dt}")
    if not isinstance(api, DeviceAPI):
        raise DeviceError(f"register_device_api expects a DeviceAPI instance, got {type(api).__name__}")
    with _REGISTRY_LOCK:
        if dt in _REGISTRY and not override:
            raise DeviceError(
                f"a DeviceAPI is already registered for device type {dt} ({_type_name(dt) or '?'}); "
                "pass override=True to replace it"
            )
        if name is not None:
            name = name.lower()
            owner = _name_type(name)
            if owner is not None and owner != dt and not override:
                raise DeviceError(f"device name {name!r} already means device type {owner}")
            _NAME_TYPES[name] = dt
            _TYPE_NAMES[dt] = name
        elif _type_name(dt) is None:
            raise DeviceError(f"device type {dt} has no built-in name (nor a plug-in's); "
                              "pass name=... to register_device_api")
        _REGISTRY[dt] = api


def get_device_api(device_type: int | Device) -> DeviceAPI:
    """Return the :class:`DeviceAPI` registered for a device type.

    Parameters
    ----------
    device_type : int or Device

    Raises
    ------
    DeviceError
        If nothing is registered; the message names the device and lists registered types.
    """
    dt = device_type.device_type if isinstance(device_type, Device) else operator.index(device_type)
    why: list[str] = []
    api = _lookup_api(dt, why)
    if api is None:
        cause = f"its plug-in failed: {why[0]}" if why else "its runtime plug-in is not installed or not imported"
        raise DeviceError(
            f"no DeviceAPI registered for device type {dt} ({_type_name(dt) or 'unnamed'}); "
            f"{cause}. Registered: {_describe_registered()}"
        )
    return api


def list_device_apis() -> dict[int, str]:
    """Registered device types and their names, e.g. ``{1: "cpu"}``."""
    return {t: _type_name(t) or f"device{t}" for t in sorted(_REGISTRY)}


def _describe_registered() -> str:
    return ", ".join(f"{n} ({t})" for t, n in list_device_apis().items()) or "none"


_NAME_RE = re.compile(r"^\s*([A-Za-z_][\w]*)\s*(?:[:(]\s*(\d+)\s*\)?)?\s*$")


def device(name_or_type: str | int | Device, device_id: int = 0) -> Device:
    """Make a :class:`Device` from a name ("cpu", "cuda", "cuda:1", "opencl(0)") or type code.

    Parameters
    ----------
    name_or_type : str, int or Device
        Device name (case-insensitive; TVM aliases such as "llvm", "gpu", "cl" work), a DLPack
        device type code, or a Device (returned unchanged).
    device_id : int, optional
        Device ordinal, used when the name carries none.

    Returns
    -------
    Device

    Raises
    ------
    DeviceError
        For an unknown name; the message lists the known names.
    """
    if isinstance(name_or_type, Device):
        return name_or_type
    if isinstance(name_or_type, str):
        m = _NAME_RE.match(name_or_type)
        dt = _name_type(m.group(1).lower()) if m else None
        if m is None or dt is None:
            known = sorted(set(_NAME_TYPES) | set(_plugins.device_names(discover_entry_points=True)))
            raise DeviceError(f"unknown device {name_or_type!r}; known device names: {', '.join(known)}")
        if m.group(2) is not None:
            device_id = int(m.group(2))
        return Device(dt, device_id)
    return Device(name_or_type, device_id)


def cpu(dev_id: int = 0) -> Device:
    """The host CPU device."""
    return Device(DeviceType.CPU, dev_id)


def cuda(dev_id: int = 0) -> Device:
    """A CUDA GPU device (constructible without a driver; check ``.exist``)."""
    return Device(DeviceType.CUDA, dev_id)


def opencl(dev_id: int = 0) -> Device:
    """An OpenCL device (constructible without a driver; check ``.exist``)."""
    return Device(DeviceType.OPENCL, dev_id)


register_device_api(DeviceType.CPU, CPUDeviceAPI())
