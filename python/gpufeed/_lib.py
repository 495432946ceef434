"""Loads libgpufeed.so and declares the C API (include/gpufeed/c_api.h) for ctypes.

ctypes releases the GIL for the duration of every call into a CDLL, so a
thread blocked in gpufeed_loader_next does not stop other Python threads.
"""
import ctypes
import os
import pathlib

from . import errors

C_API_VERSION = 1  # GPUFEED_C_API_VERSION this package was written for

_HERE = pathlib.Path(__file__).resolve().parent


def _candidates():
    env = os.environ.get("GPUFEED_LIBRARY")
    if env:
        yield pathlib.Path(env)
        return
    yield _HERE / "_native" / "lib" / "libgpufeed.so"  # the wheel (scripts/wheel)
    yield _HERE / "libgpufeed.so"                      # installed beside the package
    yield _HERE.parent.parent / "lib" / "libgpufeed.so"  # the bundle: dist/gpufeed/{python,lib}
    yield _HERE.parents[2] / "libgpufeed.so"             # cmake --install: PREFIX/lib/python3/dist-packages/gpufeed
    root = _HERE.parent.parent                          # a source checkout: python/gpufeed
    for build in ("build", "build-cpu"):
        yield root / build / "libgpufeed.so"


def _load():
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.is_file():
            return ctypes.CDLL(str(path))
    raise errors.Error(
        errors.INTERNAL,
        "libgpufeed.so not found (tried %s); build it (scripts/build) or set GPUFEED_LIBRARY" % ", ".join(tried),
    )


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


lib = _load()

_P = ctypes.c_void_p
_ERR = ctypes.POINTER(ctypes.c_void_p)
_SIGS = {
    "gpufeed_version": (ctypes.c_char_p, []),
    "gpufeed_c_api_version": (ctypes.c_int, []),
    "gpufeed_error_code": (ctypes.c_int, [_P]),
    "gpufeed_error_message": (ctypes.c_char_p, [_P]),
    "gpufeed_error_destroy": (None, [_P]),
    "gpufeed_code_name": (ctypes.c_char_p, [ctypes.c_int]),
    "gpufeed_free": (None, [_P]),
    "gpufeed_options_create": (_P, []),
    "gpufeed_options_destroy": (None, [_P]),
    "gpufeed_options_set_feed_mean": (None, [_P, ctypes.POINTER(ctypes.c_double), ctypes.c_size_t]),
    "gpufeed_options_set_feed_std": (None, [_P, ctypes.POINTER(ctypes.c_double), ctypes.c_size_t]),
    "gpufeed_loader_open": (_P, [ctypes.c_char_p, _P, _ERR]),
    "gpufeed_loader_destroy": (None, [_P]),
    "gpufeed_loader_name": (ctypes.c_char_p, [_P]),
    "gpufeed_loader_num_samples": (ctypes.c_uint64, [_P]),
    "gpufeed_loader_num_batches": (ctypes.c_uint64, [_P]),
    "gpufeed_loader_batch_size": (ctypes.c_uint64, [_P]),
    "gpufeed_loader_sample_ndim": (ctypes.c_int, [_P]),
    "gpufeed_loader_sample_dim": (ctypes.c_uint64, [_P, ctypes.c_int]),
    "gpufeed_loader_dtype": (ctypes.c_char_p, [_P]),
    "gpufeed_loader_has_labels": (ctypes.c_int, [_P]),
    "gpufeed_loader_on_gpu": (ctypes.c_int, [_P]),
    "gpufeed_loader_share": (ctypes.c_char_p, [_P]),
    "gpufeed_loader_decode": (ctypes.c_char_p, [_P]),
    "gpufeed_loader_started_node_server": (ctypes.c_int, [_P]),
    "gpufeed_loader_start_epoch": (ctypes.c_int, [_P, ctypes.c_uint64, ctypes.c_uint64, _ERR]),
    "gpufeed_loader_next": (ctypes.c_int, [_P, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), _ERR]),
    "gpufeed_loader_interrupt": (None, [_P]),
    "gpufeed_loader_position": (None, [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]),
    "gpufeed_loader_save_state": (
        ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), _ERR]),
    "gpufeed_loader_restore_state": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_size_t, _ERR]),
    "gpufeed_loader_stats_json": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_void_p), _ERR]),
    "gpufeed_batch_epoch": (ctypes.c_uint64, [_P]),
    "gpufeed_batch_index": (ctypes.c_uint64, [_P]),
    "gpufeed_batch_size": (ctypes.c_uint64, [_P]),
    "gpufeed_batch_num_arrays": (ctypes.c_int, [_P]),
    "gpufeed_batch_array_name": (ctypes.c_char_p, [_P, ctypes.c_int]),
    "gpufeed_batch_find_array": (ctypes.c_int, [_P, ctypes.c_char_p]),
    # The DLManagedTensor* as an int (None on failure): _dlpack reads it.
    "gpufeed_batch_array_dlpack": (_P, [_P, ctypes.c_int, _ERR]),
    "gpufeed_dlpack_delete": (None, [_P]),
    "gpufeed_dtype_name_of_dlpack": (ctypes.c_char_p, [ctypes.c_uint8, ctypes.c_uint8]),
    "gpufeed_dlpack_capsule_destructor_available": (ctypes.c_int, []),
    "gpufeed_batch_wait_stream": (ctypes.c_int, [_P, _P, _ERR]),
    "gpufeed_batch_set_release_stream": (None, [_P, _P]),
    "gpufeed_batch_destroy": (None, [_P]),
    "gpufeed_options_add_field": (None, [_P, ctypes.c_char_p]),
}
for _name, (_res, _args) in _SIGS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args

# Setters: (kind, C name suffix). Kinds: u64, int, bool, str.
SETTERS = {
    "batch_size": ("u64", "batch_size"), "order": ("str", "order"), "seed": ("u64", "seed"),
    "threads": ("int", "threads"), "prefetch": ("int", "prefetch"), "cache_bytes": ("u64", "cache_bytes"),
    "shuffle_window": ("u64", "shuffle_window"), "rank": ("int", "rank"), "world_size": ("int", "world_size"),
    "drop_last": ("bool", "drop_last"), "pin_memory": ("bool", "pin_memory"),
    "labels_path": ("str", "labels_path"), "trust_files": ("bool", "trust_files"), "io": ("str", "io"),
    "dataset": ("str", "dataset"), "token": ("str", "token"), "token_file": ("str", "token_file"),
    "client_name": ("str", "client_name"), "compress": ("bool", "compress"),
    "shared_memory": ("bool", "shared_memory"), "connect_timeout_ms": ("int", "connect_timeout_ms"),
    "io_timeout_ms": ("int", "io_timeout_ms"), "keepalive_ms": ("int", "keepalive_ms"),
    "feed": ("bool", "feed"), "feed_device": ("int", "feed_device"), "feed_dtype": ("str", "feed_dtype"),
    "feed_layout": ("str", "feed_layout"), "feed_input_layout": ("str", "feed_input_layout"),
    "feed_echo": ("int", "feed_echo"), "feed_super_batch": ("int", "feed_super_batch"),
    "feed_crop_padding": ("int", "feed_crop_padding"), "feed_flip": ("bool", "feed_flip"),
    "feed_seed": ("u64", "feed_seed"), "feed_slots": ("int", "feed_slots"),
    "feed_labels_int32": ("bool", "feed_labels_int32"), "feed_force_cpu": ("bool", "feed_force_cpu"),
    "max_open_files": ("int", "max_open_files"),
    "image_height": ("u32", "image_height"), "image_width": ("u32", "image_width"),
    "image_transform": ("str", "image_transform"), "image_layout": ("str", "image_layout"),
    "skip_corrupt": ("bool", "skip_corrupt"), "no_sample_axis": ("bool", "no_sample_axis"),
    "share": ("str", "share"), "decode": ("str", "decode"),
}
_CTYPE = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32, "int": ctypes.c_int, "bool": ctypes.c_int, "str": ctypes.c_char_p}
for _key, (_kind, _suffix) in SETTERS.items():
    _f = getattr(lib, "gpufeed_options_set_" + _suffix)
    _f.restype = None
    _f.argtypes = [_P, _CTYPE[_kind]]

if lib.gpufeed_c_api_version() != C_API_VERSION:
    raise errors.Error(
        errors.INTERNAL,
        "libgpufeed.so speaks C API version %d, this package version %d: use the package of the same build"
        % (lib.gpufeed_c_api_version(), C_API_VERSION),
    )


def check(code, err):
    """Raises the gpufeed.Error for a failed call's code and error object (which it frees)."""
    if code == 0:
        return
    message = ""
    if err:
        message = lib.gpufeed_error_message(err).decode("utf-8", "replace")
        lib.gpufeed_error_destroy(err)
    if not message:
        message = lib.gpufeed_code_name(code).decode()
    from ._args import caller_terms
    raise errors.from_code(code, caller_terms(message))


def take_error(err_ref):
    """The error object stored by a call that returned NULL (as a gpufeed.Error)."""
    err = err_ref.value
    code = lib.gpufeed_error_code(err) if err else errors.INTERNAL
    check(code or errors.INTERNAL, err)
