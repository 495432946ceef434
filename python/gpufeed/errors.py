"""gpufeed.Error and its subclasses, one per C API error code."""

OK = 0
INVALID_ARGUMENT = 1
NOT_FOUND = 2
UNSUPPORTED = 3
CORRUPT = 4
IO_ERROR = 5
INTERNAL = 6
END = 100
TIMEOUT = 101
INTERRUPTED = 102


class Error(Exception):
    """A failure reported by gpufeed. `code` is the C API's gpufeed_code; the
    message is the library's (it names the file, dataset, chunk or daemon)."""

    code_name = "Error"

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class InvalidArgumentError(Error, ValueError):
    code_name = "InvalidArgument"


class NotFoundError(Error, FileNotFoundError):
    code_name = "NotFound"


class UnsupportedError(Error):
    code_name = "Unsupported"


class CorruptError(Error):
    code_name = "Corrupt"


class IOFailureError(Error, OSError):
    code_name = "IOError"


class InternalError(Error):
    code_name = "Internal"


_BY_CODE = {
    INVALID_ARGUMENT: InvalidArgumentError,
    NOT_FOUND: NotFoundError,
    UNSUPPORTED: UnsupportedError,
    CORRUPT: CorruptError,
    IO_ERROR: IOFailureError,
    INTERNAL: InternalError,
}


def from_code(code, message):
    cls = _BY_CODE.get(code, Error)
    e = cls.__new__(cls)
    Error.__init__(e, code, message)
    return e
