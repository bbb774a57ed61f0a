"""DLPack capsule mechanics, independent of NDArray.

Export: :func:`export_capsule` wraps a tensor description in a ``DLManagedTensor`` whose
deleter releases the Python owner, inside a PyCapsule named ``"dltensor"``. A consumer renames
the capsule to ``"used_dltensor"`` and later calls the deleter; if nobody consumes it, the
capsule's destructor calls the deleter instead. Consumers that announce DLPack >= 1.0
(``max_version``) get a ``"dltensor_versioned"`` capsule from :func:`export_capsule_versioned`
instead, as the protocol prescribes; NumPy, for one, treats legacy capsules as read-only.

Import: :func:`consume` takes an object with ``__dlpack__`` (or a raw capsule), validates the
tensor, marks the capsule used and returns a :class:`ForeignTensor` whose ``owner`` calls the
producer's deleter when garbage-collected. :mod:`kiln.runtime.ndarray` builds NDArrays on top.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, NamedTuple

from ._ffi import DLManagedTensor, DLManagedTensorDeleter, DLTensor
from .device import Device
from .dtype import SUB_BYTE_DTYPES, from_dl
from .errors import InputError

__all__ = [
    "export_capsule",
    "export_capsule_versioned",
    "consume",
    "ForeignTensor",
    "is_capsule",
    "DLPackVersion",
    "DLManagedTensorVersioned",
]


class DLPackVersion(ctypes.Structure):
    """``DLPackVersion`` (DLPack >= 1.0); not in ``_ffi`` because only capsules use it."""

    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    """``DLManagedTensorVersioned`` (DLPack >= 1.0)."""


DLManagedTensorVersionedDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DLManagedTensorVersionedDeleter),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]

#: DLPack version Kiln's versioned capsules declare.
DLPACK_VERSION = (1, 0)

# Capsule names must outlive the capsules (CPython stores the char*, not a copy): module-level
# bytes constants live for the whole process.
_NAME = b"dltensor"
_USED_NAME = b"used_dltensor"
_VERSIONED_NAME = b"dltensor_versioned"

_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# Private function objects (not ctypes.pythonapi.X itself) so that argtypes set here never
# clash with other code configuring the shared pythonapi attributes differently.
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _Destructor)(
    ("PyCapsule_New", ctypes.pythonapi)
)
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_capsule_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_SetName", ctypes.pythonapi)
)
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
# Raw-pointer variants for the capsule destructor: the capsule is mid-deallocation (refcount
# 0), so wrapping it in a py_object would resurrect it. CFUNCTYPE (not PYFUNCTYPE) because the
# error indicator may legitimately be set while objects are torn down and PYFUNCTYPE would
# misread that as a failure of the call; these two functions set no error on the path used.
_capsule_is_valid_raw = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_capsule_get_pointer_raw = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)

# address of an exported DLManagedTensor -> (the ctypes struct, the Python owner). The entry is
# what keeps both alive while a consumer holds the tensor; the deleter drops it.
_EXPORTS: dict[int, tuple[Any, Any]] = {}
_EXPORTS_LOCK = threading.Lock()


def _export_deleter_impl(managed: Any) -> None:
    if managed:
        with _EXPORTS_LOCK:
            _EXPORTS.pop(ctypes.addressof(managed.contents), None)


_EXPORT_DELETER = DLManagedTensorDeleter(_export_deleter_impl)
_EXPORT_DELETER_VERSIONED = DLManagedTensorVersionedDeleter(_export_deleter_impl)


def _capsule_destructor_impl(capsule_ptr: int) -> None:
    # Only an unconsumed capsule still owns its tensor: a consumer renames it and becomes
    # responsible for calling the deleter itself.
    for name, struct in ((_NAME, DLManagedTensor), (_VERSIONED_NAME, DLManagedTensorVersioned)):
        if _capsule_is_valid_raw(capsule_ptr, name):
            ptr = _capsule_get_pointer_raw(capsule_ptr, name)
            if ptr:
                managed = ctypes.cast(ptr, ctypes.POINTER(struct))
                deleter = managed.contents.deleter
                if deleter:
                    deleter(managed)
            return


_CAPSULE_DESTRUCTOR = _Destructor(_capsule_destructor_impl)


def export_capsule(handle: DLTensor, owner: Any) -> Any:
    """Wrap a tensor in a new ``"dltensor"`` PyCapsule.

    Parameters
    ----------
    handle : DLTensor
        Tensor description; copied by value (its shape array must stay alive with ``owner``).
    owner : Any
        Object kept alive until the consumer (or the unconsumed capsule) calls the deleter.

    Returns
    -------
    PyCapsule
        Legacy DLPack capsule holding a ``DLManagedTensor*``.
    """
    managed = DLManagedTensor()
    managed.dl_tensor = handle
    managed.manager_ctx = None
    managed.deleter = _EXPORT_DELETER
    addr = ctypes.addressof(managed)
    with _EXPORTS_LOCK:
        _EXPORTS[addr] = (managed, owner)
    return _capsule_new(addr, _NAME, _CAPSULE_DESTRUCTOR)


def export_capsule_versioned(handle: DLTensor, owner: Any, read_only: bool = False) -> Any:
    """Like :func:`export_capsule` but a DLPack 1.0 ``"dltensor_versioned"`` capsule.

    Parameters
    ----------
    handle : DLTensor
    owner : Any
    read_only : bool, optional
        Sets ``DLPACK_FLAG_BITMASK_READ_ONLY`` so consumers refuse to write.
    """
    managed = DLManagedTensorVersioned()
    managed.version = DLPackVersion(*DLPACK_VERSION)
    managed.manager_ctx = None
    managed.deleter = _EXPORT_DELETER_VERSIONED
    managed.flags = 1 if read_only else 0
    managed.dl_tensor = handle
    addr = ctypes.addressof(managed)
    with _EXPORTS_LOCK:
        _EXPORTS[addr] = (managed, owner)
    return _capsule_new(addr, _VERSIONED_NAME, _CAPSULE_DESTRUCTOR)


def _live_exports() -> int:
    """Number of exported tensors whose deleter has not run yet (for leak tests)."""
    return len(_EXPORTS)


def is_capsule(obj: Any) -> bool:
    """True if ``obj`` is a PyCapsule (``types.CapsuleType`` only exists from Python 3.13)."""
    return type(obj).__name__ == "PyCapsule"


class _ForeignOwner:
    """Keeps a consumed DLManagedTensor (and its producer) alive; calls its deleter on GC."""

    __slots__ = ("_ptr", "_producer", "__weakref__")

    def __init__(self, ptr: int, producer: Any) -> None:
        self._ptr = ptr
        self._producer = producer

    def __del__(self) -> None:
        ptr, self._ptr = self._ptr, 0
        if not ptr:
            return
        try:
            managed = ctypes.cast(ptr, ctypes.POINTER(DLManagedTensor))
            deleter = managed.contents.deleter
            if deleter:
                deleter(managed)
        except Exception:  # noqa: BLE001  # pragma: no cover - interpreter shutdown: ctypes may be gone
            pass


class ForeignTensor(NamedTuple):
    """A consumed DLPack tensor: raw fields plus the owner that must outlive any view of it."""

    data: int
    byte_offset: int
    shape: tuple[int, ...]
    dtype: str
    device: Device
    owner: _ForeignOwner


def _is_compact(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    if 0 in shape:
        return True  # nothing to address
    expected = 1
    for dim, stride in zip(reversed(shape), reversed(strides)):
        # Size-1 dimensions never step, so producers may give them any stride (NumPy, torch do).
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def consume(obj: Any) -> ForeignTensor:
    """Take ownership of a DLPack tensor without copying its data.

    Parameters
    ----------
    obj : object with ``__dlpack__`` or PyCapsule
        A producer (NumPy array, torch tensor, Kiln NDArray, ...) or a ``"dltensor"`` capsule.

    Returns
    -------
    ForeignTensor

    Raises
    ------
    InputError
        If ``obj`` is not a DLPack producer, the capsule was already consumed or is versioned,
        the dtype is unsupported, or the strides are not compact row-major.
    """
    if is_capsule(obj):
        capsule, producer = obj, None
    elif hasattr(obj, "__dlpack__"):
        # No max_version: ask for the legacy capsule, which every producer can make.
        capsule, producer = obj.__dlpack__(), obj
        if not is_capsule(capsule):
            raise InputError(f"{type(obj).__name__}.__dlpack__() returned {type(capsule).__name__}, not a PyCapsule")
    else:
        raise InputError(
            f"from_dlpack expects an object with __dlpack__ or a DLPack capsule, got {type(obj).__name__}"
        )
    if not _capsule_is_valid(capsule, _NAME):
        if _capsule_is_valid(capsule, _USED_NAME):
            raise InputError("this DLPack capsule was already consumed; a capsule can be consumed only once")
        if _capsule_is_valid(capsule, _VERSIONED_NAME):
            raise InputError("versioned DLPack capsules ('dltensor_versioned') are not supported; pass a legacy one")
        raise InputError("object is not a valid 'dltensor' DLPack capsule")
    ptr = _capsule_get_pointer(capsule, _NAME)
    t = ctypes.cast(ptr, ctypes.POINTER(DLManagedTensor)).contents.dl_tensor

    # Validate everything before renaming: on error the capsule stays unconsumed and its own
    # destructor releases the tensor.
    dtype = from_dl(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    if dtype in SUB_BYTE_DTYPES:
        raise InputError(f"from_dlpack: {dtype} tensors are packed several elements to a byte in DLPack; Kiln "
                         f"stores one element per byte and does not import packed ones (pass the values as an "
                         f"ml_dtypes NumPy array instead)")
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[i]) for i in range(ndim)) if ndim else ()
    if t.strides and ndim:
        strides = tuple(int(t.strides[i]) for i in range(ndim))
        if not _is_compact(shape, strides):
            raise InputError(
                f"from_dlpack needs a contiguous (compact row-major) tensor; got shape {shape} with "
                f"element strides {strides}. Make it contiguous first (e.g. .contiguous() / np.ascontiguousarray)"
            )
    device = Device(t.device.device_type, t.device.device_id)
    data = int(t.data or 0)
    byte_offset = int(t.byte_offset)

    if _capsule_set_name(capsule, _USED_NAME) != 0:  # pragma: no cover - only fails on a non-capsule
        raise InputError("could not mark the DLPack capsule as consumed")
    return ForeignTensor(data, byte_offset, shape, dtype, device, _ForeignOwner(ptr, producer))
