"""DLPack capsules around the C API's DLManagedTensors, and Array: a small
wrapper any DLPack consumer (torch, NumPy >= 1.22, JAX, CuPy) takes through
__dlpack__ / __dlpack_device__.

Capsule protocol (DLPack 0.6): the capsule is named "dltensor"; a consumer
that takes the tensor renames it "used_dltensor" and calls the tensor's
deleter when it is done. A capsule destroyed unconsumed calls the deleter
itself, through the destructor below.
"""
import ctypes

from . import _lib
from ._lib import lib

_DLTENSOR = b"dltensor"  # module-level: the capsule keeps a pointer to these bytes

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_DESTRUCTOR
def _capsule_destructor(capsule_ptr):
    # Takes the capsule as a raw pointer: it is being destroyed, so it must
    # not be wrapped in a new reference.
    if _capsule_is_valid(capsule_ptr, _DLTENSOR):
        lib.gpufeed_dlpack_delete(_capsule_get_pointer(capsule_ptr, _DLTENSOR))


# The C API's destructor where it can reach Python's capsule calls (always,
# under CPython): it runs no Python code, so a Ctrl-C arriving during a
# tensor's release is neither swallowed nor able to leak the batch's slot.
if lib.gpufeed_dlpack_capsule_destructor_available():
    _DESTRUCTOR_PTR = ctypes.cast(lib.gpufeed_dlpack_capsule_destructor, ctypes.c_void_p).value
else:
    _DESTRUCTOR_PTR = ctypes.cast(_capsule_destructor, ctypes.c_void_p).value


def capsule(managed):
    """A "dltensor" capsule owning `managed` (a DLManagedTensor* as an int)."""
    return _capsule_new(managed, _DLTENSOR, _DESTRUCTOR_PTR)


KDLCPU, KDLCUDA = 1, 2


def _dtype_name(code, bits):
    """The dtype's name from the library's one dtype table (gpufeed/dtype.h)."""
    name = lib.gpufeed_dtype_name_of_dlpack(code, bits)
    return name.decode() if name else "?"


class BatchRef:
    """The C batch handle, released when the last Array of the batch that
    still needs it (for stream waits) is gone. Tensors themselves hold the
    slot through their own DLPack references, not through this."""

    __slots__ = ("handle",)

    def __init__(self, handle):
        self.handle = handle

    def __del__(self):
        try:
            if self.handle:
                lib.gpufeed_batch_destroy(self.handle)
                self.handle = None
        except Exception:  # interpreter shutdown
            pass


def _stream_pointer(stream):
    # DLPack's stream argument for CUDA: None or 1 = the legacy default
    # stream, 2 = the per-thread default stream, else a cudaStream_t.
    if stream is None or stream == 1 or stream == 0:
        return None
    return stream


class Array:
    """One exported array of a batch, before any framework has taken it.

    Holds one DLManagedTensor; `__dlpack__` hands it over (once), after
    making the consumer's stream wait for a device batch. If nobody takes it,
    it is released when the Array is garbage-collected."""

    def __init__(self, managed, batch_ref=None):
        self._managed = managed  # DLManagedTensor* as an int
        self._batch = batch_ref
        t = _lib.DLManagedTensor.from_address(managed).dl_tensor
        self.shape = tuple(t.shape[i] for i in range(t.ndim))
        self.dtype = _dtype_name(t.dtype.code, t.dtype.bits)
        self.device = (t.device.device_type, t.device.device_id)

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        if self._managed is None:
            raise RuntimeError("gpufeed.Array: the DLPack tensor was already handed over")
        if self.device[0] == KDLCUDA and self._batch is not None:
            s = _stream_pointer(stream)
            err = ctypes.c_void_p()
            _lib.check(lib.gpufeed_batch_wait_stream(self._batch.handle, s, ctypes.byref(err)), err)
            lib.gpufeed_batch_set_release_stream(self._batch.handle, s)
        managed, self._managed = self._managed, None
        self._batch = None
        return capsule(managed)

    def __del__(self):
        try:
            if getattr(self, "_managed", None) is not None:
                lib.gpufeed_dlpack_delete(self._managed)
                self._managed = None
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self):
        return "gpufeed.Array(shape=%s, dtype=%s, device=%s)" % (self.shape, self.dtype, self.device)
