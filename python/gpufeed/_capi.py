"""Loads libgpufeed.so, declares its C API (include/gpufeed/c_api.h) for
ctypes and reads its option table (capi/options.cc): the bottom of the
package, importing nothing of it but errors. What raises the C API's errors
in the caller's terms (_lib.check) sits above the keyword table
(options.py), which is made from this table.

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
    "gpufeed_loader_check_state": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_size_t, _ERR]),
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
    "gpufeed_options_set": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_char_p, _ERR]),
    "gpufeed_options_get": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), _ERR]),
    "gpufeed_option_count": (ctypes.c_int, []),
    "gpufeed_option_name": (ctypes.c_char_p, [ctypes.c_int]),
    "gpufeed_option_type": (ctypes.c_char_p, [ctypes.c_int]),
    "gpufeed_option_doc": (ctypes.c_char_p, [ctypes.c_int]),
    "gpufeed_option_range": (
        ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_uint64)]),
}
for _name, (_res, _args) in _SIGS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args

# The C API's option table (capi/options.cc), as the library lists it:
# name -> (type, what it is). Types: uint64, uint32, int, bool, string.
OPTIONS = {
    lib.gpufeed_option_name(_i).decode(): (lib.gpufeed_option_type(_i).decode(), lib.gpufeed_option_doc(_i).decode())
    for _i in range(lib.gpufeed_option_count())
}


def _ranges():
    out = {}
    least, most = ctypes.c_int64(), ctypes.c_uint64()
    for i in range(lib.gpufeed_option_count()):
        if lib.gpufeed_option_range(i, ctypes.byref(least), ctypes.byref(most)):
            out[lib.gpufeed_option_name(i).decode()] = (least.value, most.value)
    return out


# An integer option's values (least, most), from the same table.
RANGES = _ranges()


def _get(opts, name):
    """Option `name` of a gpufeed_options handle, typed as the table types it."""
    err, out = ctypes.c_void_p(), ctypes.c_void_p()
    if lib.gpufeed_options_get(opts, name.encode(), ctypes.byref(out), ctypes.byref(err)) != 0:
        raise errors.Error(errors.INTERNAL, "gpufeed_options_get(%r) failed: %s" % (name, message_of(err)))
    try:
        text = ctypes.string_at(out).decode()
    finally:
        lib.gpufeed_free(out)
    kind = OPTIONS[name][0]
    if kind == "bool":
        return text == "1"
    return text if kind == "string" else int(text)


def _defaults():
    opts = lib.gpufeed_options_create()
    try:
        return {name: _get(opts, name) for name in OPTIONS}
    finally:
        lib.gpufeed_options_destroy(opts)


def message_of(err):
    """A failed call's error message (the error object freed); "" for none."""
    if not err:
        return ""
    message = lib.gpufeed_error_message(err).decode("utf-8", "replace")
    lib.gpufeed_error_destroy(err)
    return message


if lib.gpufeed_c_api_version() != C_API_VERSION:
    raise errors.Error(
        errors.INTERNAL,
        "libgpufeed.so speaks C API version %d, this package version %d: use the package of the same build"
        % (lib.gpufeed_c_api_version(), C_API_VERSION),
    )

# Each option's default: its value in a gpufeed_options just made.
DEFAULTS = _defaults()


def option_from_text(name, text):
    """Option `name` as the library's table reads `text` (a size such as
    "1GiB", or "auto", as bytes): (value, None), or (None, why) where the
    table refuses it, `why` being its reason without the call's prefix."""
    opts = lib.gpufeed_options_create()
    err = ctypes.c_void_p()
    try:
        if lib.gpufeed_options_set(opts, name.encode(), text.encode(), ctypes.byref(err)) != 0:
            message = message_of(err)
            prefix = 'gpufeed_options_set("%s", "%s"): ' % (name, text)
            return None, message[len(prefix):] if message.startswith(prefix) else message
        return _get(opts, name), None
    finally:
        lib.gpufeed_options_destroy(opts)
