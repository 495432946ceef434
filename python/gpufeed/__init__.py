"""gpufeed for Python: batches from HDF5 (or a `gpufeed serve` daemon) as
zero-copy PyTorch tensors, NumPy arrays or DLPack arrays.

    import torch, gpufeed
    loader = gpufeed.Loader("train.h5", batch_size=256, seed=0, device="cuda", dtype=torch.bfloat16)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:
            ...

Pure Python over libgpufeed.so's C API (ctypes), standard library only;
torch and NumPy are used when importable. See docs/python.md.
"""
import os as _os
import sys as _sys

# CUDA's hardware work queues: a device takes CUDA_DEVICE_MAX_CONNECTIONS
# of them (8 unless set), and streams beyond that share a queue, where each
# operation waits for the one queued before it whatever its stream. nvJPEG's
# internal streams, the feed's, the model's and NCCL's are more than 8, so the
# GPU decoder's copies and kernels waited behind a training step's: two H200s
# under torchrun fed ResNet-18 at 0.76 of its ceiling with 8 and 0.84-0.91
# with 32 (docs/benchmarks.md). 32, the most, where the job has not chosen;
# it applies to CUDA contexts made after this import (import gpufeed before
# the first CUDA call; a value in the environment is left as it is).
if "CUDA_DEVICE_MAX_CONNECTIONS" not in _os.environ:
    _os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"
    # Too late for a context torch has made already: say so (torch is not
    # imported here; a program that made a context has imported it).
    _torch = _sys.modules.get("torch")
    _cuda = getattr(_torch, "cuda", None)
    if _cuda is not None and getattr(_cuda, "is_initialized", lambda: False)():
        import warnings as _warnings
        _warnings.warn("gpufeed was imported after CUDA started: its default CUDA_DEVICE_MAX_CONNECTIONS=32 (CUDA's "
                       "hardware queues; 8 otherwise, which slows the GPU decoder beside a model) applies only to "
                       "contexts made later. Import gpufeed before the first CUDA call, or set the variable in the "
                       "job's environment.", RuntimeWarning, stacklevel=2)
    del _torch, _cuda

from ._lib import lib as _lib_handle  # noqa: E402
from ._dlpack import Array
from .errors import (CorruptError, Error, InternalError, InvalidArgumentError, IOFailureError, NotFoundError,
                     UnsupportedError)
from .loader import Loader
from .options import DecodeOptions, FeedOptions, LoaderOptions, OpenOptions, OutputOptions, RemoteOptions

__version__ = _lib_handle.gpufeed_version().decode()
C_API_VERSION = _lib_handle.gpufeed_c_api_version()

__all__ = ["Loader", "LoaderOptions", "OpenOptions", "DecodeOptions", "FeedOptions", "RemoteOptions", "OutputOptions",
           "Array", "Error", "InvalidArgumentError", "NotFoundError", "UnsupportedError", "CorruptError",
           "IOFailureError", "InternalError", "__version__"]
