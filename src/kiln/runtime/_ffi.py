"""ctypes mirrors of the C ABI in ``include/kiln/c_runtime_api.h``.

This module is the only place that knows the binary layout of DLPack structs, the packed
argument union and the executor's call records. Keep it in step with the header.
"""

from __future__ import annotations

import ctypes

__all__ = [
    "DLDevice",
    "DLDataType",
    "DLTensor",
    "DLManagedTensor",
    "KilnValue",
    "KilnOpCall",
    "PackedCFunc",
    "ParallelLambda",
    "DLManagedTensorDeleter",
    "TypeCode",
]


class TypeCode:
    """Argument type codes of the packed calling convention."""

    INT = 0
    UINT = 1
    FLOAT = 2
    HANDLE = 3
    NULL = 4
    DLTENSOR = 7
    STR = 11


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensorDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DLManagedTensorDeleter),
]


class KilnValue(ctypes.Union):
    _fields_ = [
        ("v_int64", ctypes.c_int64),
        ("v_float64", ctypes.c_double),
        ("v_handle", ctypes.c_void_p),
        ("v_str", ctypes.c_char_p),
    ]


PackedCFunc = ctypes.CFUNCTYPE(
    ctypes.c_int32,
    ctypes.POINTER(KilnValue),
    ctypes.POINTER(ctypes.c_int32),
    ctypes.c_int32,
    ctypes.POINTER(KilnValue),
    ctypes.POINTER(ctypes.c_int32),
    ctypes.c_void_p,
)

ParallelLambda = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)


class KilnOpCall(ctypes.Structure):
    _fields_ = [
        ("fn", ctypes.c_void_p),
        ("args", ctypes.POINTER(KilnValue)),
        ("type_codes", ctypes.POINTER(ctypes.c_int32)),
        ("num_args", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]
