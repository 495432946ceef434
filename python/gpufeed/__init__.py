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
from ._lib import lib as _lib_handle
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
