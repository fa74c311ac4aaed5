"""Backends, streams, events, graphs and buffers (metrale/gpu.h), and DLPack both ways."""
import ctypes as C
import math
import sys
import weakref

from . import _dlpack as dl
from ._lib import (Error, InvalidArgument, backend_probe, check, device_info, lib,
                   raise_status)

# mg_backend_kind
BACKEND_CPU, BACKEND_CUDA, BACKEND_METAL, BACKEND_AUTO = 0, 1, 2, 3
_KINDS = {"cpu": 0, "cuda": 1, "metal": 2, "auto": 3}
# mg_dtype
DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_FP8_E4M3, DTYPE_U8, DTYPE_I32, DTYPE_U32 = range(7)
_DTYPES = {"f32": 0, "bf16": 1, "f16": 2, "fp8_e4m3": 3, "u8": 4, "i32": 5, "u32": 6}
DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_DTYPE_BYTES = {0: 4, 1: 2, 2: 2, 3: 1, 4: 1, 5: 4, 6: 4}
# Each dtype's DLPack (code, bits). FP8 E4M3 codes travel as uint8 (few consumers know
# float8_e4m3fn); an imported float8_e4m3fn tensor is taken as FP8 too.
_TO_DL = {0: (dl.KDL_FLOAT, 32), 1: (dl.KDL_BFLOAT, 16), 2: (dl.KDL_FLOAT, 16),
          3: (dl.KDL_UINT, 8), 4: (dl.KDL_UINT, 8), 5: (dl.KDL_INT, 32), 6: (dl.KDL_UINT, 32)}
_FROM_DL = {(dl.KDL_FLOAT, 32): 0, (dl.KDL_BFLOAT, 16): 1, (dl.KDL_FLOAT, 16): 2,
            (dl.KDL_FLOAT8_E4M3FN, 8): 3, (dl.KDL_UINT, 8): 4, (dl.KDL_INT, 32): 5,
            (dl.KDL_UINT, 32): 6, (dl.KDL_INT, 8): 4,
            # NumPy has no bfloat16: its uint16 arrays are taken as BF16 bits.
            (dl.KDL_UINT, 16): 1}
# The NumPy dtype a buffer's bytes are copied into (BF16 as its uint16 bits, FP8 as codes).
_NUMPY = {0: "float32", 1: "uint16", 2: "float16", 3: "uint8", 4: "uint8", 5: "int32",
          6: "uint32"}
# mg_capability
(CAP_MANAGED_MEMORY, CAP_GRAPHS, CAP_GRAPH_UPDATE, CAP_PINNED_HOST, CAP_HOST_DEVICE_POINTER,
 CAP_MODULES, CAP_EVENT_TIMING) = range(7)


def dtype_of(d):
    """The mg_dtype of `d`: a DTYPE_* value or its name ("f32", "bf16", "fp8_e4m3", ...)."""
    if isinstance(d, str):
        if d not in _DTYPES:
            raise InvalidArgument(1, "unknown dtype %r (one of %s)" % (d, ", ".join(_DTYPES)))
        return _DTYPES[d]
    if d not in _DTYPE_BYTES:
        raise InvalidArgument(1, "unknown dtype %r" % (d,))
    return int(d)


def dtype_bytes(d):
    return _DTYPE_BYTES[dtype_of(d)]


def _kind_of(kind):
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise InvalidArgument(1, "unknown backend kind %r (cpu, cuda, metal or auto)" % kind)
        return _KINDS[kind]
    return int(kind)


def backend_probe_kind(kind):
    """What backend kind `kind` is on this machine, without opening it: a dict with
    compiled_in, usable, device_count and reason (why not usable)."""
    p = backend_probe()
    check(lib.mg_backend_probe_kind(_kind_of(kind), C.byref(p)), "mg_backend_probe_kind")
    return {"compiled_in": p.compiled_in, "usable": p.usable, "device_count": p.device_count,
            "reason": p.reason.decode()}


class Backend:
    """One device of one backend kind (mg_backend_open). `kind` is "cpu", "cuda" or "auto"
    (CUDA when a driver and a device are there, else the CPU). One backend per (kind, device)
    at a time in a process: opening it again while open raises (MG_ERR_BUSY). close() (or the
    end of a `with` block) synchronizes and frees everything still live, buffers included;
    buffers and streams of a closed backend must not be used."""

    def __init__(self, kind="auto", device=0):
        h = C.c_void_p()
        check(lib.mg_backend_open(_kind_of(kind), int(device), C.byref(h)), "mg_backend_open")
        self._h = h.value
        self.kind = lib.mg_backend_get_kind(self._h)
        self.kind_name = lib.mg_backend_kind_name(self.kind).decode()
        self.device = int(device)
        self._default = Stream(self, lib.mg_stream_default(self._h), owned=False)
        self._streams = weakref.WeakSet()
        # Host ranges registered for imported arrays (CPU backend): base -> [bytes, holds].
        self._registered = {}
        # Our own live allocations: base -> bytes (to tell an imported buffer of ours).
        self._allocations = {}

    @property
    def handle(self):
        if not self._h:
            raise InvalidArgument(1, "the backend is closed")
        return self._h

    def close(self):
        h, self._h = self._h, None
        if h:
            self._registered.clear()
            self._allocations.clear()
            check(lib.mg_backend_close(h), "mg_backend_close")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None) and not sys.is_finalizing():
            lib.mg_backend_close(self._h)

    def __repr__(self):
        return "<metrale_gpu.Backend %s:%d>" % (self.kind_name, self.device)

    # -------------------------------------------------------------- queries
    def device_get_info(self):
        """mg_device_get_info as a dict: name, total_bytes, multiprocessors, cc_major,
        cc_minor, integrated, l2_bytes, max_shared_per_block_optin, driver."""
        i = device_info()
        check(lib.mg_device_get_info(self.handle, C.byref(i)), "mg_device_get_info")
        return {f: (getattr(i, f).decode() if isinstance(getattr(i, f), bytes) else getattr(i, f))
                for f, _ in device_info._fields_}

    info = device_get_info

    def supports(self, cap):
        return bool(lib.mg_backend_supports(self.handle, int(cap)))

    def memory_free_bytes(self):
        free, total = C.c_uint64(), C.c_uint64()
        check(lib.mg_memory_free_bytes(self.handle, C.byref(free), C.byref(total)),
              "mg_memory_free_bytes")
        return free.value, total.value

    def ledger_live(self):
        """(live bytes, live allocations) of this backend."""
        b, n = C.c_uint64(), C.c_uint64()
        check(lib.mg_ledger_live(self.handle, C.byref(b), C.byref(n)), "mg_ledger_live")
        return b.value, n.value

    # -------------------------------------------------------------- streams and events
    @property
    def default_stream(self):
        return self._default

    def stream_create(self):
        s = C.c_void_p()
        check(lib.mg_stream_create(self.handle, C.byref(s)), "mg_stream_create")
        stream = Stream(self, s.value, owned=True)
        self._streams.add(stream)
        return stream

    def event_create(self):
        e = C.c_void_p()
        check(lib.mg_event_create(self.handle, C.byref(e)), "mg_event_create")
        return Event(self, e.value)

    def synchronize(self):
        """Waits for the default stream and every stream created from Python."""
        self._default.synchronize()
        for s in list(self._streams):
            if s._h:
                s.synchronize()

    # -------------------------------------------------------------- memory
    def alloc(self, shape, dtype="u8"):
        """A new buffer of `shape` elements of `dtype` (contents undefined: poison it or write
        it before reading). The ledger records it as allocated from Python."""
        return Buffer._alloc(self, shape, dtype)

    empty = alloc

    def asbuffer(self, array, dtype=None):
        """A new buffer holding a copy of NumPy-like `array` (its bytes; `dtype` names how the
        library reads them, default from the array: float32 -> f32, uint16 -> bf16, ...)."""
        import numpy as np
        a = np.ascontiguousarray(array)
        if dtype is None:
            dtype = {"float32": "f32", "uint16": "bf16", "float16": "f16", "uint8": "u8",
                     "int32": "i32", "uint32": "u32"}.get(a.dtype.name)
            if dtype is None:
                raise InvalidArgument(1, "asbuffer: no library dtype for NumPy %s; pass dtype="
                                      % a.dtype)
        buf = Buffer._alloc(self, a.shape, dtype)
        if a.nbytes != buf.nbytes:
            raise InvalidArgument(1, "asbuffer: %d bytes of %s do not make %s%s" % (
                a.nbytes, a.dtype, DTYPE_NAMES[buf.dtype], list(a.shape)))
        buf.copy_from_host(a)
        return buf

    def from_dlpack(self, x, stream=None):
        return from_dlpack(x, backend=self, stream=stream)

    def _own_allocation(self, ptr, nbytes):
        for base, size in self._allocations.items():
            if base <= ptr and ptr + nbytes <= base + size:
                return True
        return False

    def _register(self, ptr, nbytes):
        """Makes [ptr, ptr + nbytes) a device range (CPU backend); returns the base to release."""
        for base, entry in self._registered.items():
            if base <= ptr and ptr + nbytes <= base + entry[0]:
                entry[1] += 1
                return base
        dev = C.c_uint64()
        st = lib.mg_host_register(self.handle, ptr, nbytes, C.byref(dev))
        if st:
            raise_status(st, "mg_host_register")
        self._registered[ptr] = [nbytes, 1]
        return ptr

    def _unregister(self, base):
        entry = self._registered.get(base)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._registered[base]
            if self._h:
                lib.mg_host_unregister(self._h, base)


class _BackendObject:
    """A handle that belongs to a backend: usable while both are open. destroy() (or the
    garbage collector, for an owned handle) releases it through the C call `_destroy` names."""

    _what, _gone, _destroy = "object", "destroyed", None

    def __init__(self, backend, handle, owned=True):
        self.backend = backend
        self._h = handle
        self._owned = owned

    @property
    def handle(self):
        if not self._h or not self.backend._h:
            raise InvalidArgument(1, f"the {self._what} (or its backend) is {self._gone}")
        return self._h

    def destroy(self):
        h, self._h = self._h, None
        if h and self._owned and self.backend._h:
            check(getattr(lib, self._destroy)(h), self._destroy)

    def __del__(self):
        if getattr(self, "_owned", False) and getattr(self, "_h", None) and self.backend._h and \
                not sys.is_finalizing():
            getattr(lib, self._destroy)(self._h)


class Stream(_BackendObject):
    """An in-order queue of work (mg_stream). Methods: synchronize, is_capturing,
    wait_event, begin_capture, end_capture, end_capture_update, abort_capture, destroy."""

    _what, _gone, _destroy = "stream", "closed", "mg_stream_destroy"

    def synchronize(self):
        check(lib.mg_stream_synchronize(self.handle), "mg_stream_synchronize")

    def is_capturing(self):
        c = C.c_bool()
        check(lib.mg_stream_is_capturing(self.handle, C.byref(c)), "mg_stream_is_capturing")
        return c.value

    def wait_event(self, event):
        check(lib.mg_stream_wait_event(self.handle, event.handle), "mg_stream_wait_event")

    def begin_capture(self):
        """Work issued to this stream from now on is recorded, not run (mg_graph_begin_capture).
        Allocate and plan before: allocations and blocking calls are refused meanwhile."""
        check(lib.mg_graph_begin_capture(self.handle), "mg_graph_begin_capture")

    def end_capture(self):
        g = C.c_void_p()
        check(lib.mg_graph_end_capture(self.handle, C.byref(g)), "mg_graph_end_capture")
        return Graph(self.backend, g.value)

    def end_capture_update(self, graph):
        """Replaces `graph`'s work with this capture; True when it was updated in place."""
        u = C.c_bool()
        check(lib.mg_graph_end_capture_update(self.handle, graph.handle, C.byref(u)),
              "mg_graph_end_capture_update")
        return u.value

    def abort_capture(self):
        check(lib.mg_graph_abort_capture(self.handle), "mg_graph_abort_capture")

    def capture(self):
        """`with s.capture() as c: ...work on s...`; then c.graph is the executable graph (the
        capture is aborted when the block raises)."""
        return _Capture(self)



class _Capture:
    def __init__(self, stream):
        self.stream = stream
        self.graph = None

    def __enter__(self):
        self.stream.begin_capture()
        return self

    def __exit__(self, kind, value, tb):
        if kind is not None:
            self.stream.abort_capture()
            return False
        self.graph = self.stream.end_capture()
        return False


class Event(_BackendObject):
    """A point in a stream's work (mg_event): record, synchronize, query, elapsed_ms."""

    _what, _destroy = "event", "mg_event_destroy"

    def record(self, stream=None):
        check(lib.mg_event_record(self.handle, _stream(stream)), "mg_event_record")

    def synchronize(self):
        check(lib.mg_event_synchronize(self.handle), "mg_event_synchronize")

    def query(self):
        """True when the recorded work has completed (never blocks)."""
        st = lib.mg_event_query(self.handle)
        if st == 6:
            return False
        check(st, "mg_event_query")
        return True

    def elapsed_ms(self, end):
        ms = C.c_float()
        check(lib.mg_event_elapsed_ms(self.handle, end.handle, C.byref(ms)),
              "mg_event_elapsed_ms")
        return ms.value



class Graph(_BackendObject):
    """An executable captured graph: launch(stream) replays it, reading its buffers' contents
    at replay time."""

    _what, _destroy = "graph", "mg_graph_destroy"

    def launch(self, stream=None):
        check(lib.mg_graph_launch(self.handle, _stream(stream)), "mg_graph_launch")



def _stream(s):
    if s is None:
        return None
    return s.handle


class Buffer:
    """Device memory of one backend seen as a C-contiguous array: `ptr` (the mg_devptr),
    `shape`, `dtype` (an mg_dtype; `dtype_name` its name), `nbytes`. Made by Backend.alloc /
    asbuffer (owned: freed when the last reference goes, or by free()), by from_dlpack (the
    producer's memory, without a copy) or by view(). Exports __dlpack__ / __dlpack_device__,
    so numpy.from_dlpack (CPU backend) and torch.from_dlpack take it without a copy."""

    __slots__ = ("backend", "ptr", "shape", "dtype", "nbytes", "read_only", "_free",
                 "_parent", "__weakref__")

    def __init__(self, backend, ptr, shape, dtype, free=None, parent=None, read_only=False):
        self.backend = backend
        self.ptr = int(ptr)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype_of(dtype)
        self.nbytes = math.prod(self.shape) * _DTYPE_BYTES[self.dtype]
        self.read_only = read_only
        self._free = free
        self._parent = parent

    @classmethod
    def _alloc(cls, backend, shape, dtype):
        shape = (int(shape),) if isinstance(shape, int) else tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise InvalidArgument(1, "alloc: negative extent in shape %s" % (list(shape),))
        d = dtype_of(dtype)
        nbytes = math.prod(shape) * _DTYPE_BYTES[d]
        out = C.c_uint64()
        check(lib.mg_alloc_at(backend.handle, max(nbytes, 1), 0, C.byref(out), b"python", 0),
              "mg_alloc")
        backend._allocations[out.value] = max(nbytes, 1)
        return cls(backend, out.value, shape, d, free=("alloc", out.value))

    def free(self):
        """Releases the memory now (an owned buffer) or the producer's tensor (an import)."""
        f, self._free = self._free, None
        if f is None:
            return
        b = self.backend
        if f[0] == "alloc":
            b._allocations.pop(f[1], None)
            if b._h:
                check(lib.mg_free(b._h, f[1]), "mg_free")
        else:
            _, base, imported = f
            if base is not None:
                b._unregister(base)
            imported.release()

    def __del__(self):
        if getattr(self, "_free", None) and not sys.is_finalizing():
            try:
                self.free()
            except Error:
                pass

    @property
    def dtype_name(self):
        return DTYPE_NAMES[self.dtype]

    @property
    def size(self):
        return math.prod(self.shape)

    def __repr__(self):
        return "<metrale_gpu.Buffer %s%s at 0x%x on %s>" % (
            self.dtype_name, list(self.shape), self.ptr, self.backend)

    def view(self, dtype=None, shape=None):
        """The same bytes as another dtype and/or shape (e.g. a BF16 buffer as "u8" codes or
        as uint16 bits for NumPy: view("i32") is refused, sizes must agree)."""
        d = self.dtype if dtype is None else dtype_of(dtype)
        if shape is None:
            if self.nbytes % _DTYPE_BYTES[d]:
                raise InvalidArgument(1, "view: %d bytes are not whole %s elements" % (
                    self.nbytes, DTYPE_NAMES[d]))
            last = (self.shape[-1] if self.shape else 1) * _DTYPE_BYTES[self.dtype]
            if last % _DTYPE_BYTES[d]:
                raise InvalidArgument(1, "view: rows of %d bytes are not whole %s elements" % (
                    last, DTYPE_NAMES[d]))
            shape = self.shape[:-1] + (last // _DTYPE_BYTES[d],)
        shape = (int(shape),) if isinstance(shape, int) else tuple(shape)
        if math.prod(shape) * _DTYPE_BYTES[d] != self.nbytes:
            raise InvalidArgument(1, "view: %s%s does not have the %d bytes of %s%s" % (
                DTYPE_NAMES[d], list(shape), self.nbytes, self.dtype_name, list(self.shape)))
        return Buffer(self.backend, self.ptr, shape, d, parent=self, read_only=self.read_only)

    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        return self.view(shape=shape)

    # -------------------------------------------------------------- copies
    def copy_from_host(self, array, stream=None):
        """Copies NumPy-like `array`'s bytes (exactly nbytes of them) into the buffer: blocking
        with stream None, else mg_copy_h2d_async on `stream`."""
        import numpy as np
        a = np.ascontiguousarray(array)
        if a.nbytes != self.nbytes:
            raise InvalidArgument(1, "copy_from_host: %d bytes into a buffer of %d" % (
                a.nbytes, self.nbytes))
        if self.nbytes == 0:
            return
        if stream is None:
            check(lib.mg_copy_h2d(self.backend.handle, self.ptr, a.ctypes.data, a.nbytes),
                  "mg_copy_h2d")
        else:
            check(lib.mg_copy_h2d_async(self.backend.handle, self.ptr, a.ctypes.data, a.nbytes,
                                        stream.handle), "mg_copy_h2d_async")

    def numpy(self):
        """A NumPy copy of the contents (blocking; BF16 as uint16 bits, FP8 as uint8 codes)."""
        import numpy as np
        out = np.empty(self.shape, dtype=_NUMPY[self.dtype])
        if self.nbytes:
            check(lib.mg_copy_d2h(self.backend.handle, out.ctypes.data, self.ptr, self.nbytes),
                  "mg_copy_d2h")
        return out

    def fill_bytes(self, value):
        """mg_memset of every byte (e.g. poisoning an output before an op writes it)."""
        if self.nbytes:
            check(lib.mg_memset(self.backend.handle, self.ptr, int(value) & 0xFF, self.nbytes),
                  "mg_memset")

    def copy_from(self, other, stream=None):
        """Device-to-device copy of another buffer of the same backend and byte size."""
        if other.nbytes != self.nbytes:
            raise InvalidArgument(1, "copy_from: %d bytes into %d" % (other.nbytes, self.nbytes))
        if stream is None:
            check(lib.mg_copy_d2d(self.backend.handle, self.ptr, other.ptr, self.nbytes),
                  "mg_copy_d2d")
        else:
            check(lib.mg_copy_d2d_async(self.backend.handle, self.ptr, other.ptr, self.nbytes,
                                        stream.handle), "mg_copy_d2d_async")

    # -------------------------------------------------------------- DLPack export
    def __dlpack_device__(self):
        if self.backend.kind == BACKEND_CPU:
            return (dl.KDL_CPU, 0)
        if self.backend.kind == BACKEND_CUDA:
            return (dl.KDL_CUDA, self.backend.device)
        raise BufferError("metrale_gpu: no DLPack device for the %s backend"
                          % self.backend.kind_name)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """The DLPack capsule of this buffer, without a copy (copy=True is refused). `stream`:
        CPU backend: None only. CUDA: the consumer's stream (None, 1 or 2: the default
        streams, or a CUstream as an int); the buffer's backend is synchronized first (its
        default stream and the streams made from Python), so the data is ready on any
        consumer stream; -1 skips that. The capsule is versioned (DLPack 1.x) when the
        consumer passes max_version >= (1, 0)."""
        if copy:
            raise BufferError("metrale_gpu: __dlpack__(copy=True) is not supported; export "
                              "without a copy and copy on the consumer's side")
        device = self.__dlpack_device__()
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError("metrale_gpu: the buffer is on DLPack device %s, not %s"
                              % (device, tuple(dl_device)))
        if device[0] == dl.KDL_CPU:
            if stream is not None:
                raise BufferError("metrale_gpu: stream must be None for a CPU buffer, got %r"
                                  % (stream,))
        elif stream != -1:
            self.backend.synchronize()
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        return dl.export(self, self.ptr, device[0], device[1], _TO_DL[self.dtype], self.shape,
                         versioned, self.read_only)


def _contiguous(shape, strides):
    if strides is None:
        return True
    expected = 1
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def from_dlpack(x, backend=None, stream=None):
    """A Buffer on `x`'s memory, without a copy: `x` is any object with __dlpack__ (a NumPy
    array for the CPU backend; a PyTorch or CuPy tensor, CPU or CUDA). `backend` must match
    x's device (default: a CPU backend opened for it when x is on the CPU; required for CUDA).
    On the CPU backend the array's memory is registered (mg_host_register) as device memory
    while the Buffer lives. `stream` (CUDA): the consumer's raw stream handle passed to the
    producer; None asks the producer to make the data ready on the legacy default stream.
    Refused with a clear message: another device, a non-contiguous layout, a dtype the library
    has no name for (bool, float64, int64, ...), lanes != 1."""
    if isinstance(x, Buffer):
        if backend is not None and x.backend is not backend:
            raise BufferError("metrale_gpu.from_dlpack: the buffer belongs to %s, not %s"
                              % (x.backend, backend))
        return x
    if not hasattr(x, "__dlpack__"):
        raise TypeError("metrale_gpu.from_dlpack: %s has no __dlpack__" % type(x).__name__)
    device = tuple(x.__dlpack_device__()) if hasattr(x, "__dlpack_device__") else None
    if device is not None:
        _check_device(device, backend, x)
    kwargs = {}
    if device is not None and device[0] in (dl.KDL_CUDA, dl.KDL_CUDA_MANAGED):
        kwargs["stream"] = 1 if stream is None else stream
    elif stream is not None:
        raise BufferError("metrale_gpu.from_dlpack: stream must be None for host memory")
    try:
        capsule = x.__dlpack__(max_version=dl.VERSION, **kwargs)
    except TypeError:
        capsule = x.__dlpack__(**kwargs)
    t = dl.Imported(capsule)
    try:
        if backend is None:
            backend = _default_backend(t.device_type)
        _check_device((t.device_type, t.device_id), backend, x)
        if t.lanes != 1 or (t.code, t.bits) not in _FROM_DL:
            raise BufferError("metrale_gpu.from_dlpack: DLPack dtype (code %d, %d bits, %d "
                              "lanes) has no library dtype: use float32, bfloat16, float16, "
                              "uint8/int8, int32, uint32, float8_e4m3fn or uint16 (BF16 bits)"
                              % (t.code, t.bits, t.lanes))
        if not _contiguous(t.shape, t.strides):
            raise BufferError("metrale_gpu.from_dlpack: shape %s with strides %s is not "
                              "C-contiguous; the ops take packed rows (copy it first, e.g. "
                              "numpy.ascontiguousarray or tensor.contiguous())"
                              % (list(t.shape), list(t.strides)))
        dtype = _FROM_DL[(t.code, t.bits)]
        nbytes = math.prod(t.shape) * _DTYPE_BYTES[dtype]
        base = None
        if backend.kind == BACKEND_CPU and nbytes and not backend._own_allocation(t.data, nbytes):
            base = backend._register(t.data, nbytes)
    except BaseException:
        t.release()
        raise
    return Buffer(backend, t.data, t.shape, dtype, free=("import", base, t),
                  read_only=t.read_only)


_cpu_backend = None


def _default_backend(device_type):
    global _cpu_backend
    if device_type != dl.KDL_CPU:
        raise BufferError("metrale_gpu.from_dlpack: pass backend= for a tensor on a device "
                          "(DLPack device type %d)" % device_type)
    if _cpu_backend is None or not _cpu_backend._h:
        _cpu_backend = Backend("cpu", 0)
    return _cpu_backend


_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 13: "cuda_managed"}


def _check_device(device, backend, x):
    if backend is None:
        return
    kind, index = int(device[0]), int(device[1])
    ok = (backend.kind == BACKEND_CPU and kind == dl.KDL_CPU) or (
        backend.kind == BACKEND_CUDA and kind in (dl.KDL_CUDA, dl.KDL_CUDA_MANAGED) and
        index == backend.device)
    if not ok:
        raise BufferError("metrale_gpu.from_dlpack: %s lives on %s:%d, but the backend is %s:%d;"
                          " move it there first" % (type(x).__name__,
                                                    _DEVICE_NAMES.get(kind, str(kind)), index,
                                                    backend.kind_name, backend.device))
