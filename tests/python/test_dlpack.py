"""DLPack both ways: NumPy (producer and consumer), a producer double that hands out what NumPy
cannot (strides, other devices, bfloat16, unversioned capsules), pointer identity throughout,
and the refusals."""
import ctypes as C
import gc
import sys

import numpy as np
import pytest

import metrale_gpu as mg
from metrale_gpu import _dlpack as dl


def test_numpy_in_without_copy(b, rng):
    a = rng.standard_normal((19, 7)).astype(np.float32)
    x = mg.from_dlpack(a, backend=b)
    assert x.ptr == a.ctypes.data and x.shape == (19, 7) and x.dtype == mg.DTYPE_F32
    # the library reads and writes the array's own memory
    assert np.array_equal(x.numpy(), a)
    x.fill_bytes(0)
    assert not a.any()
    ints = np.arange(10, dtype=np.int32)
    assert mg.from_dlpack(ints, backend=b).dtype == mg.DTYPE_I32
    assert mg.from_dlpack(np.zeros(3, np.uint8), backend=b).dtype == mg.DTYPE_U8


def test_numpy_out_without_copy(b, rng):
    buf = b.asbuffer(rng.standard_normal((5, 3)).astype(np.float32))
    n = np.from_dlpack(buf)
    assert n.ctypes.data == buf.ptr and n.shape == (5, 3) and n.dtype == np.float32
    assert np.array_equal(n, buf.numpy())
    # the consumer keeps the buffer alive after our last reference goes
    ptr = buf.ptr
    del buf
    gc.collect()
    assert n.ctypes.data == ptr and b.ledger_live()[1] == 1
    del n
    gc.collect()
    assert b.ledger_live()[1] == 0


def test_round_trip_and_views_share_registration(b, rng):
    a = rng.standard_normal(64).astype(np.float32)
    x = mg.from_dlpack(a, backend=b)
    y = mg.from_dlpack(a[8:40], backend=b)  # inside the registered range: reused
    assert y.ptr == a.ctypes.data + 32
    back = np.from_dlpack(x)
    assert back.ctypes.data == a.ctypes.data
    again = mg.from_dlpack(back, backend=b)
    assert again.ptr == x.ptr
    # one of our own buffers coming back through a consumer is not registered again
    ours = b.alloc(16, "f32")
    assert mg.from_dlpack(np.from_dlpack(ours), backend=b).ptr == ours.ptr


def test_default_backend_is_cpu():
    a = np.ones(4, np.float32)
    x = mg.from_dlpack(a)
    assert x.backend.kind == mg.BACKEND_CPU and x.ptr == a.ctypes.data


def test_refusals(b):
    with pytest.raises(BufferError, match="not C-contiguous"):
        mg.from_dlpack(np.zeros((4, 6), np.float32)[:, ::2], backend=b)
    with pytest.raises(BufferError, match="not C-contiguous"):
        mg.from_dlpack(np.zeros((4, 6), np.float32).T, backend=b)
    with pytest.raises(BufferError, match="no library dtype"):
        mg.from_dlpack(np.zeros(4, np.float64), backend=b)
    with pytest.raises(BufferError, match="no library dtype"):
        mg.from_dlpack(np.zeros(4, np.int64), backend=b)
    with pytest.raises(TypeError, match="__dlpack__"):
        mg.from_dlpack([1, 2, 3], backend=b)
    with pytest.raises(BufferError, match="lives on cuda:0"):
        mg.from_dlpack(Producer(np.zeros(4, np.float32), device=(dl.KDL_CUDA, 0)), backend=b)
    with pytest.raises(BufferError, match="pass backend="):
        mg.from_dlpack(Producer(np.zeros(4, np.float32), device=(dl.KDL_CUDA, 0)))
    buf = b.alloc(4, "f32")
    with pytest.raises(BufferError, match="copy=True"):
        buf.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="stream must be None"):
        buf.__dlpack__(stream=1)
    with pytest.raises(BufferError, match="device"):
        buf.__dlpack__(dl_device=(dl.KDL_CUDA, 0))


def test_a_refused_import_releases_the_producer(b):
    p = Producer(np.zeros((4, 6), np.float32), strides=(1, 4))
    with pytest.raises(BufferError):
        mg.from_dlpack(p, backend=b)
    assert p.deleted == 1


@pytest.mark.parametrize("versioned", [True, False])
def test_producer_double(b, rng, versioned):
    """bfloat16 and float8_e4m3fn, which NumPy cannot hand out, in both capsule versions; the
    deleter runs exactly once, when the Buffer goes."""
    bits = rng.integers(0, 2**16, (3, 8), dtype=np.uint16)
    p = Producer(bits, code=(dl.KDL_BFLOAT, 16), versioned=versioned)
    x = mg.from_dlpack(p, backend=b)
    assert x.dtype == mg.DTYPE_BF16 and x.ptr == bits.ctypes.data and x.shape == (3, 8)
    assert np.array_equal(x.numpy(), bits)
    assert p.deleted == 0
    del x
    gc.collect()
    assert p.deleted == 1
    codes = rng.integers(0, 256, 16, dtype=np.uint8)
    x = mg.from_dlpack(Producer(codes, code=(dl.KDL_FLOAT8_E4M3FN, 8), versioned=versioned),
                       backend=b)
    assert x.dtype == mg.DTYPE_FP8_E4M3


def test_our_capsules_state_the_dtypes(b):
    """BF16 exports as bfloat16, FP8 codes as uint8, with the buffer's shape; the versioned
    capsule when the consumer asks for one."""
    for dtype, code in (("bf16", (dl.KDL_BFLOAT, 16)), ("fp8_e4m3", (dl.KDL_UINT, 8)),
                        ("f16", (dl.KDL_FLOAT, 16)), ("u32", (dl.KDL_UINT, 32))):
        buf = b.alloc((2, 16), dtype)
        t = dl.Imported(buf.__dlpack__(max_version=(1, 0)))
        assert t._versioned and (t.code, t.bits, t.lanes) == code + (1,)
        assert t.shape == (2, 16) and t.strides is None and t.data == buf.ptr
        assert (t.device_type, t.device_id) == (dl.KDL_CPU, 0)
        t.release()
        t = dl.Imported(buf.__dlpack__())
        assert not t._versioned and t.shape == (2, 16)
        t.release()
    assert b.alloc(3, "bf16").__dlpack_device__() == (dl.KDL_CPU, 0)
    # NumPy has no bfloat16: it refuses our BF16 capsule; the uint16 view is the way in
    bf = b.alloc(4, "bf16")
    with pytest.raises((BufferError, TypeError, RuntimeError)):
        np.from_dlpack(bf)
    assert np.from_dlpack(bf.view("u8")).ctypes.data == bf.ptr
    dl.sweep()  # the refused capsule is released, not leaked
    assert not any(entry[2] is bf for entry in dl._live.values())


def test_an_unconsumed_capsule_frees_its_reference(b):
    buf = b.alloc(8, "f32")
    refs = sys.getrefcount(buf)
    cap = buf.__dlpack__()
    assert sys.getrefcount(buf) == refs + 1
    del cap
    dl.sweep()
    assert sys.getrefcount(buf) == refs


class Producer:
    """A DLPack producer double: any dtype code, strides and device, either capsule version;
    counts deleter calls."""

    def __init__(self, array, code=None, strides=None, device=(dl.KDL_CPU, 0), versioned=True):
        self.array, self.code, self.device, self.versioned = array, code, device, versioned
        self.strides = strides
        self.deleted = 0
        if code is None:
            self.code = {np.dtype(np.float32): (dl.KDL_FLOAT, 32),
                         np.dtype(np.uint8): (dl.KDL_UINT, 8)}[array.dtype]

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, **kw):
        versioned = self.versioned and max_version is not None
        cls = dl.DLManagedTensorVersioned if versioned else dl.DLManagedTensor
        deleter_type = dl.DELETER_V if versioned else dl.DELETER
        m = cls()
        if versioned:
            m.version = dl.DLPackVersion(1, 0)
        shape = (C.c_int64 * self.array.ndim)(*self.array.shape)
        strides = (C.c_int64 * self.array.ndim)(*self.strides) if self.strides else None

        def delete(_):
            self.deleted += 1
            self._keep = None

        m.deleter = deleter_type(delete)
        t = m.dl_tensor
        t.data = self.array.ctypes.data
        t.device = dl.DLDevice(*self.device)
        t.ndim = self.array.ndim
        t.dtype = dl.DLDataType(self.code[0], self.code[1], 1)
        t.shape = C.cast(shape, C.POINTER(C.c_int64))
        t.strides = C.cast(strides, C.POINTER(C.c_int64)) if strides else None
        self._keep = (m, shape, strides, m.deleter)
        name = dl.NAME_V if versioned else dl.NAME
        return dl._api.PyCapsule_New(C.addressof(m), name, dl._NO_DESTRUCTOR)
