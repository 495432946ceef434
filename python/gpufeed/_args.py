"""Loader(...)'s keyword arguments checked where they are given: integers of
the right type and range (no wraparound through the C API's unsigned
setters, no silent truncation of floats or bools), sizes as bytes or
"512MiB"/"1GiB", each error naming the keyword as the caller wrote it and
what it takes."""
import operator
import re

from . import errors

_U64 = 2**64 - 1
_I32 = 2**31 - 1

# keyword: (least, most, what it is)
INTS = {
    "batch_size": (1, 2**63 - 1, "samples per batch"),
    "seed": (0, _U64, "the order's seed"),
    "augment_seed": (0, _U64, "the augmentation's seed"),
    "threads": (0, 4096, "loader threads; 0: this rank's share of the cores"),
    "prefetch": (1, 4096, "batches in flight ahead of the consumer"),
    "shuffle_window": (1, 2**63 - 1, "chunks per shuffle window"),
    "rank": (0, _I32, "this process's shard"),
    "world_size": (1, _I32, "the number of shards"),
    "connect_timeout_ms": (1, _I32, "milliseconds"),
    "io_timeout_ms": (1, _I32, "milliseconds"),
    "keepalive_ms": (0, _I32, "milliseconds; 0: none"),
    "echo": (0, 4096, "passes over each uploaded batch; 0: as many as the GPU's idle time allows"),
    "super_batch": (1, 4096, "batches per upload"),
    "crop_padding": (0, 4096, "pixels of padding for the random crop"),
    "slots": (1, 4096, "device batches the consumer may hold"),
    "max_open_files": (1, _I32, "files holding descriptors at once"),
    "poll_ms": (1, _I32, "milliseconds of each blocking wait"),
}

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 10**3, "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
          "g": 1 << 30, "gib": 1 << 30, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40, "tb": 10**12}


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


def size_bytes(name, value):
    """Bytes from an integer or a string such as "512MiB", "1GiB", "4G"
    (binary; "GB", "MB" decimal)."""
    takes = 'bytes: an integer >= 0 or a size such as "512MiB" or "1GiB"'
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise _bad(name, value, takes)
        v = int(float(m.group(1)) * _UNITS[unit])
    elif isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise _bad(name, value, takes)
    else:
        v = operator.index(value)
    if not 0 <= v <= _U64:
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
# crop_padding=0). One table: Loader's own signature.
_CXX_OR_CLI = re.compile(r"\b[A-Z][A-Za-z]*Options(?:(?:::|\.)[a-z_]+)*(?:::|\.)([a-z_]+)"
                         r"|(?<![\w-])--([a-z][a-z0-9-]*)(?: ([A-Za-z0-9][\w.-]*))?")


def caller_terms(message):
    """`message` with each option the Loader takes as a keyword named as one."""
    import inspect

    from .loader import Loader
    params = inspect.signature(Loader.__init__).parameters
    keywords = {n: p.default for n, p in params.items() if p.kind == inspect.Parameter.KEYWORD_ONLY}

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

    out = _CXX_OR_CLI.sub(keyword, message)
    # "raise prefetch (prefetch=, prefetch=; ...)": one spelling is enough.
    return re.sub(r"\b([a-z_]+=)(?:, \1)+", r"\1", out)
