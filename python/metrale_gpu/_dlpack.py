"""DLPack (v1.x and the unversioned v0.x capsules) in ctypes: the C structs, export of our
buffers as capsules, and import of any producer's capsule.

Ownership: an exported capsule holds a reference to the buffer until the consumer calls the
tensor's deleter (or, for a capsule dropped unused, until the next export notices it: sweep()). An imported tensor is renamed "used_..."
and its deleter is called when the Buffer that wraps it is released.
"""
import ctypes as C
import sys

# DLDeviceType
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
# DLDataTypeCode
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_FLOAT8_E4M3FN = 0, 1, 2, 4, 10
FLAG_READ_ONLY = 1
VERSION = (1, 1)


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32),
                ("dtype", DLDataType), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class DLManagedTensor(C.Structure):
    pass


DELETER = C.CFUNCTYPE(None, C.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", C.c_void_p),
                            ("deleter", DELETER)]


class DLPackVersion(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32)]


class DLManagedTensorVersioned(C.Structure):
    pass


DELETER_V = C.CFUNCTYPE(None, C.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", C.c_void_p),
                                     ("deleter", DELETER_V), ("flags", C.c_uint64),
                                     ("dl_tensor", DLTensor)]

NAME = b"dltensor"
USED = b"used_dltensor"
NAME_V = b"dltensor_versioned"
USED_V = b"used_dltensor_versioned"

_api = C.pythonapi
CAPSULE_DESTRUCTOR = C.CFUNCTYPE(None, C.c_void_p)
_api.PyCapsule_New.restype = C.py_object
_api.PyCapsule_New.argtypes = [C.c_void_p, C.c_char_p, CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = C.c_int
_api.PyCapsule_IsValid.argtypes = [C.py_object, C.c_char_p]
_api.PyCapsule_GetPointer.restype = C.c_void_p
_api.PyCapsule_GetPointer.argtypes = [C.py_object, C.c_char_p]
_api.PyCapsule_SetName.restype = C.c_int
_api.PyCapsule_SetName.argtypes = [C.py_object, C.c_char_p]
_NO_DESTRUCTOR = C.cast(None, CAPSULE_DESTRUCTOR)
# Exported tensors still alive: address of the managed struct -> (struct, shape array, owner).
_live = {}
# Capsules we handed out, until a sweep sees them consumed or dropped (see export).
_handed_out = []


def _release(address):
    _live.pop(address, None)


@DELETER
def _deleter(managed):
    _release(C.addressof(managed.contents))


@DELETER_V
def _deleter_v(managed):
    _release(C.addressof(managed.contents))


def sweep():
    """Forgets capsules a consumer took (renamed "used_..."; its deleter call releases the
    tensor) and releases the tensors of capsules dropped unconsumed.

    Our capsules carry no destructor: a consumer that fails drops the capsule with its exception
    pending, and no Python code (a ctypes callback) may run then. So we keep a reference to each
    capsule and look at it here, at the next export."""
    keep = []
    for capsule, address, name in _handed_out:
        if not _api.PyCapsule_IsValid(capsule, name):
            continue  # consumed
        if sys.getrefcount(capsule) <= 3:  # this list's tuple, the loop variable, the call
            _release(address)
            continue
        keep.append((capsule, address, name))
    _handed_out[:] = keep


def export(owner, data, device_type, device_id, dtype, shape, versioned, read_only=False):
    """A capsule describing `shape` elements of DLPack dtype (code, bits) at `data`, keeping
    `owner` alive until the consumer deletes it. C-contiguous (strides NULL)."""
    shape_array = (C.c_int64 * max(len(shape), 1))(*shape)
    if versioned:
        m = DLManagedTensorVersioned()
        m.version = DLPackVersion(*VERSION)
        m.deleter = _deleter_v
        m.flags = FLAG_READ_ONLY if read_only else 0
    else:
        m = DLManagedTensor()
        m.deleter = _deleter
    t = m.dl_tensor
    t.data = data
    t.device = DLDevice(device_type, device_id)
    t.ndim = len(shape)
    t.dtype = DLDataType(dtype[0], dtype[1], 1)
    t.shape = C.cast(shape_array, C.POINTER(C.c_int64))
    t.strides = None
    t.byte_offset = 0
    sweep()
    address = C.addressof(m)
    _live[address] = (m, shape_array, owner)
    name = NAME_V if versioned else NAME
    capsule = _api.PyCapsule_New(address, name, _NO_DESTRUCTOR)
    _handed_out.append((capsule, address, name))
    return capsule


class Imported:
    """A consumed capsule: the DLTensor's fields and the deleter to call when done."""

    __slots__ = ("data", "device_type", "device_id", "code", "bits", "lanes", "shape",
                 "strides", "read_only", "_managed", "_versioned")

    def __init__(self, capsule):
        if _api.PyCapsule_IsValid(capsule, NAME_V):
            m = DLManagedTensorVersioned.from_address(_api.PyCapsule_GetPointer(capsule, NAME_V))
            if m.version.major != 1:
                raise BufferError("metrale_gpu.from_dlpack: DLPack major version %d is not "
                                  "supported (1 is)" % m.version.major)
            _api.PyCapsule_SetName(capsule, USED_V)
            self._versioned = True
            self.read_only = bool(m.flags & FLAG_READ_ONLY)
        elif _api.PyCapsule_IsValid(capsule, NAME):
            m = DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, NAME))
            _api.PyCapsule_SetName(capsule, USED)
            self._versioned = False
            self.read_only = False
        else:
            raise BufferError("metrale_gpu.from_dlpack: __dlpack__ did not return an unused "
                              "DLPack capsule")
        self._managed = m
        t = m.dl_tensor
        self.data = (t.data or 0) + t.byte_offset
        self.device_type, self.device_id = t.device.device_type, t.device.device_id
        self.code, self.bits, self.lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
        self.shape = tuple(t.shape[i] for i in range(t.ndim))
        self.strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None

    def release(self):
        m, self._managed = self._managed, None
        if m is not None and m.deleter:
            m.deleter(C.pointer(m))
