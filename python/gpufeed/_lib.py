"""The C API's calls in the caller's terms: a failed call raises the
gpufeed.Error of its code, its message naming each option as the Loader
keyword that sets it (_args.caller_terms). libgpufeed.so itself, its
declarations and its option table are _capi's; they are here too, as
_lib.lib, _lib.OPTIONS, ... for the package's modules.
"""
import ctypes

from . import _capi, errors
from ._args import caller_terms
from ._capi import (C_API_VERSION, DEFAULTS, OPTIONS, RANGES, DLDataType, DLDevice, DLManagedTensor,  # noqa: F401
                    DLTensor, lib, option_from_text)


def set_option(opts, name, value):
    """Sets option `name` of the table on a gpufeed_options handle; the library checks it."""
    kind = OPTIONS[name][0]
    if kind == "bool":
        text = "1" if value else "0"
    elif kind == "string":
        text = str(value)
    else:
        text = str(int(value))
    err = ctypes.c_void_p()
    check(lib.gpufeed_options_set(opts, name.encode(), text.encode(), ctypes.byref(err)), err)


def check(code, err):
    """Raises the gpufeed.Error for a failed call's code and error object (which it frees)."""
    if code == 0:
        return
    message = _capi.message_of(err) or lib.gpufeed_code_name(code).decode()
    raise errors.from_code(code, caller_terms(message))


def take_error(err_ref):
    """The error object stored by a call that returned NULL (as a gpufeed.Error)."""
    err = err_ref.value
    code = lib.gpufeed_error_code(err) if err else errors.INTERNAL
    check(code or errors.INTERNAL, err)
