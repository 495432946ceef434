"""Loader's options as small groups mirroring the C++ structs, each keyword
and its default written once, here:

    loader = gpufeed.Loader("train.h5",
                            loader_options=gpufeed.LoaderOptions(batch_size=256, seed=0),
                            feed_options=gpufeed.FeedOptions(device="cuda", dtype="bfloat16"))

is the same loader as gpufeed.Loader("train.h5", batch_size=256, seed=0,
device="cuda", dtype="bfloat16"): every field of a group is also a keyword
of Loader (flat keywords and groups mix; a keyword given both ways with
different values is an error). Loader's docstring says what each one does;
the library's option table (capi/options.cc) checks their types and ranges.
"""
import dataclasses
import difflib
from typing import Any, Optional

from . import errors


@dataclasses.dataclass
class LoaderOptions:
    """C++ LoaderOptions, and where a node's ranks make batches (share)."""
    batch_size: int = 256
    order: str = "block"
    seed: int = 0
    threads: int = 0
    prefetch: int = 8
    pool_bytes: Any = 2 << 30
    cache_bytes: Any = 1 << 30
    shuffle_window: int = 16
    rank: Optional[int] = None
    world_size: Optional[int] = None
    drop_last: bool = False
    pin_memory: bool = True
    share: str = "auto"


@dataclasses.dataclass
class OpenOptions:
    """C++ OpenOptions: how a file is opened and what of it is read."""
    labels: Optional[str] = None
    trust_files: bool = False
    io: Optional[str] = None
    fields: Any = None
    max_open_files: Optional[int] = None
    no_sample_axis: bool = False
    allow_paths: Any = None


@dataclasses.dataclass
class DecodeOptions:
    """C++ DecodeOptions: encoded image datasets, and where they are decoded."""
    image_size: Any = 224
    transform: str = "random_resized_crop"
    image_layout: str = "NCHW"
    skip_corrupt: bool = False
    decode: str = "auto"


@dataclasses.dataclass
class FeedOptions:
    """C++ FeedOptions: the device, dtype, layout and augmentation of batches."""
    device: str = "cpu"
    dtype: Any = None
    layout: str = "NCHW"
    input_layout: str = "NCHW"
    mean: Any = None
    std: Any = None
    echo: int = 1
    super_batch: int = 1
    crop_padding: int = 0
    flip: bool = False
    augment_seed: Optional[int] = None
    slots: int = 3
    labels_int32: bool = False


@dataclasses.dataclass
class RemoteOptions:
    """C++ RemoteLoaderOptions: reading from a `gpufeed serve` daemon."""
    dataset: Optional[str] = None
    token: Optional[str] = None
    token_file: Optional[str] = None
    client_name: str = "python"
    compress: bool = False
    shared_memory: bool = True
    connect_timeout_ms: int = 5000
    io_timeout_ms: int = 30000
    keepalive_ms: int = 30000


@dataclasses.dataclass
class OutputOptions:
    """What iteration yields, and how long each of its waits polls (Python's own)."""
    output: str = "auto"
    poll_ms: int = 100


# Loader's group keywords, in order, and the class each takes.
GROUPS = {
    "loader_options": LoaderOptions, "open_options": OpenOptions, "decode_options": DecodeOptions,
    "feed_options": FeedOptions, "remote_options": RemoteOptions, "output_options": OutputOptions,
}
# Every flat keyword: its group class and default.
KEYWORDS = {f.name: (cls, f.default) for cls in GROUPS.values() for f in dataclasses.fields(cls)}


def _same(a, b):
    try:
        return a is b or bool(a == b)
    except Exception:  # noqa: BLE001 (arrays compare elementwise)
        return False


def resolve(groups, keywords):
    """Every keyword's value: the defaults, then the groups given, then the
    flat keywords (a group's field left at its default gives way to a flat
    keyword). InvalidArgumentError for an unknown keyword (naming the
    nearest), a group of the wrong class, or a keyword set in a group and
    given flat with another value."""
    values = {k: default for k, (_, default) in KEYWORDS.items()}
    from_group = {}
    for param, cls in GROUPS.items():
        group = groups.get(param)
        if group is None:
            continue
        if not isinstance(group, cls):
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT, "%s=%r: a gpufeed.%s" % (param, group, cls.__name__))
        for f in dataclasses.fields(cls):
            value = getattr(group, f.name)
            values[f.name] = value
            if not _same(value, f.default):  # a field left at its default was not given
                from_group[f.name] = param
    for key, value in keywords.items():
        if key not in KEYWORDS:
            near = difflib.get_close_matches(key, list(KEYWORDS) + list(GROUPS), n=1)
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT, "Loader() has no keyword %r%s" % (key, "; did you mean %r?" % near[0]
                                                                           if near else ""))
        if key in from_group and not _same(values[key], value):
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT, "%s=%r and %s.%s=%r: give it once" % (
                    key, value, from_group[key], key, values[key]))
        values[key] = value
    return values
