"""Loader(...)'s keyword arguments checked where they are given: integers of
the right type and range (no wraparound through the C API's unsigned
setters, no silent truncation of floats or bools), sizes as bytes or text
read by the library's option table as the CLI reads them ("512MiB", "1GiB",
"2GB", "auto" for cache_bytes), each error naming the keyword as the caller
wrote it and what it takes."""
import operator
import os
import re

from . import _capi, errors, options
from .options import OPTION_KEYWORD

_I32 = 2**31 - 1

# keyword: (least, most, what it is). The integer options' ranges and what
# they are come from the library's table, so Python refuses, where the
# keyword is given, exactly what the library would.
INTS = {OPTION_KEYWORD.get(o, o): r + (_capi.OPTIONS[o][1],) for o, r in _capi.RANGES.items()}
INTS["poll_ms"] = (1, _I32, options.DOCS["poll_ms"])  # Python's own: how long each wait polls


def _bad(name, value, takes):
    return errors.InvalidArgumentError(errors.INVALID_ARGUMENT, "%s=%r: %s" % (name, value, takes))


def integer(name, value):
    """`value` as an int within INTS[name]'s range, or InvalidArgumentError."""
    least, most, what = INTS[name]
    takes = "an integer from %d to %d (%s)" % (least, most, what)
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise _bad(name, value, takes)  # 64.9, "64", True: not silently 64 or 1
    v = operator.index(value)
    if not least <= v <= most:
        raise _bad(name, value, takes)
    return v


def directories(name, value):
    """A list of directories (str or os.PathLike; one alone, or "DIR:DIR") as
    the ':'-separated text the option table takes, or InvalidArgumentError."""
    takes = "a directory or a list of directories (str or os.PathLike), none holding ':'"
    items = [value] if isinstance(value, (str, bytes, os.PathLike)) else value
    try:
        items = [os.fsdecode(os.fspath(v)) for v in items]
    except TypeError:
        raise _bad(name, value, takes) from None
    if isinstance(value, (str, bytes, os.PathLike)):
        return items[0]
    if any(":" in v or not v for v in items):
        raise _bad(name, value, takes)
    return ":".join(items)


def size_bytes(name, value):
    """Bytes from an integer or a string such as "512MiB", "1GiB", "4G"
    (binary; "GB", "MB" decimal) or, for cache_bytes, "auto" (half the
    memory available): text is read by the library's option table
    (capi/options.cc), the one parser the CLI's --cache-bytes uses too."""
    takes = 'bytes: an integer >= 0 or a size such as "512MiB" or "1GiB"'
    if isinstance(value, str):
        v, why = _capi.option_from_text(name, value)
        if why is not None:
            raise _bad(name, value, why)
        return v
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise _bad(name, value, takes)
    v = operator.index(value)
    least, most = INTS[name][:2]
    if not least <= v <= most:
        raise _bad(name, value, takes)
    return v


def image_size(value):
    """(height, width) from S or (H, W), each 1 to 32768."""
    pair = (value, value) if not isinstance(value, (tuple, list)) else tuple(value)
    takes = "an integer S or a pair (H, W), each from 1 to 32768"
    if len(pair) != 2:
        raise _bad("image_size", value, takes)
    out = []
    for v in pair:
        if isinstance(v, bool) or not hasattr(type(v), "__index__") or not 1 <= operator.index(v) <= 32768:
            raise _bad("image_size", value, takes)
        out.append(operator.index(v))
    return tuple(out)


def shard(rank, world_size):
    """(rank, world_size) checked together."""
    world_size = integer("world_size", world_size)
    rank = integer("rank", rank)
    if rank >= world_size:
        raise errors.InvalidArgumentError(
            errors.INVALID_ARGUMENT, "rank=%d with world_size=%d: rank is from 0 to world_size - 1" % (rank, world_size))
    return rank, world_size


# The library's messages name an option as C++ does (LoaderOptions::prefetch,
# FeedOptions::super_batch) or as the command line does (--prefetch,
# --crop-padding 0); from Python the caller wrote a keyword (prefetch=,
# crop_padding=0). One table: Loader's keywords (gpufeed/options.py).
# ... and as the C API's option table does (gpufeed_options_set("feed_echo",
# "0")): the keyword that sets it (OPTION_KEYWORD).
_C_OPTION = re.compile(r'gpufeed_options_set\("([a-z0-9_]+)", "([^"]*)"\)')
_CXX_OR_CLI = re.compile(r"\b[A-Z][A-Za-z]*Options(?:(?:::|\.)[a-z_]+)*(?:::|\.)([a-z_]+)"
                         r"|(?<![\w-])--([a-z][a-z0-9-]*)(?: ([A-Za-z0-9][\w.-]*))?")


def caller_terms(message):
    """`message` with each option the Loader takes as a keyword named as one."""
    keywords = options.DEFAULTS

    def keyword(m):
        name = (m.group(1) or m.group(2)).replace("-", "_")
        if name not in keywords:
            return m.group(0)
        value = m.group(3)
        if value is None:
            return name + "="
        if value.isdigit():
            return "%s=%s" % (name, value)
        if isinstance(keywords[name], str) or keywords[name] is None:
            return "%s=%r" % (name, value)
        return name + "= " + value

    def c_option(m):
        name, value = OPTION_KEYWORD.get(m.group(1), m.group(1)), m.group(2)
        if name not in keywords:
            return m.group(0)
        if re.fullmatch(r"-?[0-9]+", value) or not isinstance(keywords[name], (str, type(None))):
            return "%s=%s" % (name, value)
        return "%s=%r" % (name, value)

    out = _C_OPTION.sub(c_option, message)
    out = _CXX_OR_CLI.sub(keyword, out)
    # "raise prefetch (prefetch=, prefetch=; ...)": one spelling is enough.
    return re.sub(r"\b([a-z_]+=)(?:, \1)+", r"\1", out)
