"""Loader's keywords, made from the library's option table (capi/options.cc,
as libgpufeed.so lists it: gpufeed_option_*), in small groups mirroring the
C++ structs:

    loader = gpufeed.Loader("train.h5",
                            loader_options=gpufeed.LoaderOptions(batch_size=256, seed=0),
                            feed_options=gpufeed.FeedOptions(device="cuda", dtype="bfloat16"))

is the same loader as gpufeed.Loader("train.h5", batch_size=256, seed=0,
device="cuda", dtype="bfloat16"): every field of a group is also a keyword
of Loader (flat keywords and groups mix; a keyword given both ways with
different values is an error).

Each keyword is one row below: its group, the option(s) of the table it sets
and, where Python decides it, its default and what it is. A keyword that
sets an option takes the option's default, type and description from the
table; Loader's signature (inspect.signature(gpufeed.Loader)), the groups'
fields and the docs are made from the rows, and at import every option of
the table must be set by a row (a library of another build is refused,
naming the option), so a keyword, its default and its doc are written once.
"""
import dataclasses
import difflib
import inspect
from typing import Any, Optional

from . import _capi, errors

_FROM_TABLE = object()  # a row's default: the option's default in the library's table


@dataclasses.dataclass(frozen=True)
class Keyword:
    """One Loader keyword: the table's options it sets (none: Python's own),
    and where Python decides them, its default, type and description."""
    name: str
    options: tuple = ()
    default: Any = _FROM_TABLE
    type: Any = None
    doc: str = ""


def _k(name, options=None, default=_FROM_TABLE, type=None, doc=""):  # noqa: A002 (as the field)
    if options is None:
        options = (name,)
    elif isinstance(options, str):
        options = (options,)
    return Keyword(name, tuple(options), default, type, doc)


def _own(name, default, type, doc):  # noqa: A002
    """A keyword of Python's own, setting no option of the table directly."""
    return Keyword(name, (), default, type, doc)


# Loader's groups, in order: (class name, what it mirrors, its keywords in order).
_ROWS = {
    "loader_options": ("LoaderOptions", "C++ LoaderOptions, and where a node's ranks make batches (share).", [
        _k("batch_size"), _k("order"), _k("seed"), _k("threads"), _k("prefetch"), _k("pool_bytes"),
        _k("cache_bytes"), _k("shuffle_window"),
        _k("rank", default=None, doc="this rank (default: torch.distributed's, else RANK, else 0)"),
        _k("world_size", default=None, doc="ranks (default: torch.distributed's, else WORLD_SIZE, else 1)"),
        _k("drop_last"), _k("pin_memory"), _k("share"),
    ]),
    "open_options": ("OpenOptions", "C++ OpenOptions: how a file is opened and what of it is read.", [
        _k("labels", "labels_path", default=None,
           doc="labels dataset (default: /labels when present; \"none\": no labels)"),
        _k("trust_files"),
        _k("io", default=None, doc="direct-path I/O: auto, direct or buffered (default: auto, or GPUFEED_IO)"),
        _own("fields", None, Any, "named fields: [\"NAME=/path\", ...] (a tuple a batch) or {NAME: /path} (a dict)"),
        _k("max_open_files", default=None, doc="open files (default 256)"),
        _k("no_sample_axis"),
        _k("allow_paths", default=None, type=Any,
           doc="directories (one, or a list) a file's external data, virtual sources and links may lie in, besides "
               "its own"),
    ]),
    "decode_options": ("DecodeOptions", "C++ DecodeOptions: encoded image datasets, and where they are decoded.", [
        _k("image_size", ("image_height", "image_width"), type=Any,
           doc="decoded image size: S or (H, W)"),
        _k("transform", "image_transform"), _k("image_layout"), _k("skip_corrupt"), _k("decode"),
    ]),
    "feed_options": ("FeedOptions", "C++ FeedOptions: the device, dtype, layout and augmentation of batches.", [
        _k("device", ("feed_device", "feed_force_cpu"), default="cpu", type=str,
           doc="\"cpu\", \"cuda\" (GPU LOCAL_RANK) or \"cuda:N\"; cuda runs the feed"),
        _k("dtype", "feed_dtype", default=None, type=Any,
           doc="float32, float16 or bfloat16 (or the torch dtype); given, it runs the feed (default float32 then)"),
        _k("layout", "feed_layout"), _k("input_layout", "feed_input_layout"),
        _own("mean", None, Any, "per channel, in stored units (default: the dataset's attributes, else 0)"),
        _own("std", None, Any, "per channel, in stored units (default: the dataset's attributes, else 255)"),
        _k("echo", "feed_echo"), _k("super_batch", "feed_super_batch"), _k("crop_padding", "feed_crop_padding"),
        _k("flip", "feed_flip"),
        _k("augment_seed", "feed_seed", default=None, doc="augmentation seed (default: seed)"),
        _k("slots", "feed_slots"), _k("labels_int32", "feed_labels_int32"),
    ]),
    "remote_options": ("RemoteOptions", "C++ RemoteLoaderOptions: reading from a `gpufeed serve` daemon.", [
        _k("dataset", default=None, doc="the daemon's dataset to read (default: its first)"),
        _k("token", default=None), _k("token_file", default=None),
        _k("client_name", default="python"),
        _k("compress"), _k("shared_memory"), _k("connect_timeout_ms"), _k("io_timeout_ms"), _k("keepalive_ms"),
    ]),
    "output_options": ("OutputOptions", "What iteration yields, and how long each of its waits polls (Python's own).", [
        _own("output", "auto", str, "\"torch\", \"numpy\", \"dlpack\" or \"auto\" (torch, else NumPy, else DLPack)"),
        _own("poll_ms", 100, int, "milliseconds of each blocking wait"),
    ]),
}
# Options of the table no keyword sets as it is: Loader decides them from
# others (feed: device, dtype, crop_padding or flip ask for the feed).
DERIVED = {"feed": "device, dtype, crop_padding or flip"}

_PY_TYPE = {"uint64": int, "uint32": int, "int": int, "bool": bool, "string": str, "bytes": Any}


def _check_against_the_table():
    named = {o: k.name for rows in _ROWS.values() for k in rows[2] for o in k.options}
    for option in named:
        if option not in _capi.OPTIONS:
            raise errors.Error(errors.INTERNAL, "gpufeed.Loader's keyword %r sets option %r, which libgpufeed.so's "
                               "option table lacks: use the package of the library's build" % (named[option], option))
    for option in _capi.OPTIONS:
        if option not in named and option not in DERIVED:
            raise errors.Error(errors.INTERNAL, "libgpufeed.so's option table has %r, which no gpufeed.Loader keyword "
                               "sets: use the package of the library's build" % option)


_check_against_the_table()


def _default(k):
    if k.default is not _FROM_TABLE:
        return k.default
    values = [_capi.DEFAULTS[o] for o in k.options]
    return values[0] if all(v == values[0] for v in values) else tuple(values)


def _type(k, default):
    t = k.type if k.type is not None else _PY_TYPE[_capi.OPTIONS[k.options[0]][0]]
    return Optional[t] if default is None and t is not Any else t


def _doc(k):
    return k.doc or _capi.OPTIONS[k.options[0]][1]


# Every keyword: name -> (its row, default, type, doc), in Loader's order.
ROWS = {k.name: k for rows in _ROWS.values() for k in rows[2]}
DEFAULTS = {name: _default(k) for name, k in ROWS.items()}
DOCS = {name: _doc(k) for name, k in ROWS.items()}
# The Loader keyword that sets an option of the table, where it is not
# spelled as the option (feed_dtype: dtype; image_height: image_size).
OPTION_KEYWORD = {o: k.name for k in ROWS.values() for o in k.options if o != k.name}


def _field_line(name):
    return "    %s=%r: %s" % (name, DEFAULTS[name], DOCS[name])


def _group_class(param, class_name, what, rows):
    fields = [(k.name, _type(k, DEFAULTS[k.name]), dataclasses.field(default=DEFAULTS[k.name])) for k in rows]
    doc = what + "\n\nFields (each also a keyword of gpufeed.Loader), with their defaults:\n" + "\n".join(
        _field_line(k.name) for k in rows)
    cls = dataclasses.make_dataclass(class_name, fields, namespace={"__doc__": doc})
    cls.__module__ = __name__
    return cls


# Loader's group keywords, in order, and the class each takes.
GROUPS = {param: _group_class(param, *rows) for param, rows in _ROWS.items()}
LoaderOptions = GROUPS["loader_options"]
OpenOptions = GROUPS["open_options"]
DecodeOptions = GROUPS["decode_options"]
FeedOptions = GROUPS["feed_options"]
RemoteOptions = GROUPS["remote_options"]
OutputOptions = GROUPS["output_options"]
# Every flat keyword: its group class and default.
KEYWORDS = {f.name: (cls, f.default) for cls in GROUPS.values() for f in dataclasses.fields(cls)}


def signature():
    """Loader(data, *, <group>=None ..., <keyword>=<default> ...)'s signature."""
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
              inspect.Parameter("data", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(param, kw, default=None, annotation=Optional[cls]) for param, cls in GROUPS.items()]
    params += [inspect.Parameter(f.name, kw, default=f.default, annotation=f.type)
               for cls in GROUPS.values() for f in dataclasses.fields(cls)]
    return inspect.Signature(params)


def keyword_doc():
    """Every keyword with its default and what it is, group by group."""
    out = ["\n    Keywords and their defaults (gpufeed/options.py, from the library's option table):\n"]
    for param, cls in GROUPS.items():
        out.append("    %s (gpufeed.%s):" % (param, cls.__name__))
        out += ["    " + _field_line(f.name) for f in dataclasses.fields(cls)]
    return "\n".join(out) + "\n"


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
