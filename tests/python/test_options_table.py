"""Loader's keywords are the library's option table's (issue 47, item 4):
each keyword's default, type and description come from the table that
libgpufeed.so lists (gpufeed_option_*, read here directly through ctypes),
except the few Python decides, listed here with why; every option of the
table is set by a keyword; and the package's modules import without a cycle."""
import ast
import ctypes
import dataclasses
import inspect
import pathlib
import typing

import pytest

import gpufeed
from gpufeed import _capi, _lib, errors, options

# Keywords whose default Python decides, not the table: None where "not
# given" lets the library (or torch.distributed) decide, or Python's own value.
PYTHON_DEFAULTS = {
    "rank": None, "world_size": None,  # torch.distributed's, else RANK / WORLD_SIZE
    "labels": None, "io": None, "max_open_files": None, "allow_paths": None,  # given: share="auto" stays local
    "dataset": None, "token": None, "token_file": None,
    "device": "cpu", "dtype": None, "augment_seed": None,  # the feed runs only when asked; its seed is seed's
    "client_name": "python",
}
# Keywords that set no option of the table by themselves, and options no keyword sets as it is.
PYTHON_OWN = {"fields", "mean", "std", "output", "poll_ms"}
DERIVED_OPTIONS = {"feed"}


def table():
    """The library's table as it lists itself: name -> (type, doc, default text)."""
    lib = _lib.lib
    opts = lib.gpufeed_options_create()
    out = {}
    try:
        for i in range(lib.gpufeed_option_count()):
            name = lib.gpufeed_option_name(i).decode()
            value, err = ctypes.c_void_p(), ctypes.c_void_p()
            assert lib.gpufeed_options_get(opts, name.encode(), ctypes.byref(value), ctypes.byref(err)) == 0, name
            text = ctypes.string_at(value).decode()
            lib.gpufeed_free(value)
            out[name] = (lib.gpufeed_option_type(i).decode(), lib.gpufeed_option_doc(i).decode(), text)
    finally:
        lib.gpufeed_options_destroy(opts)
    return out


def typed(kind, text):
    if kind == "bool":
        return text == "1"
    return text if kind == "string" else int(text)


def test_loaders_signature_and_defaults_are_the_tables():
    t = table()
    params = inspect.signature(gpufeed.Loader).parameters
    groups = list(options.GROUPS)
    assert list(params)[:1 + len(groups)] == ["data"] + groups
    keywords = {n: p for n, p in params.items() if n != "data" and n not in groups}
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in keywords.values())
    # The signature is the groups' fields, in order, with the same defaults.
    fields = [(f.name, f.default) for cls in options.GROUPS.values() for f in dataclasses.fields(cls)]
    assert [(n, p.default) for n, p in keywords.items()] == fields
    checked = 0
    for name, p in keywords.items():
        row = options.ROWS[name]
        if name in PYTHON_OWN:
            assert row.options == (), name
            continue
        assert row.options and all(o in t for o in row.options), (name, row.options)
        if name in PYTHON_DEFAULTS:
            assert p.default == PYTHON_DEFAULTS[name], (name, p.default)
            continue
        kind, doc, text = t[row.options[0]]
        want = typed(kind, text)
        assert p.default == want and type(p.default) is type(want), (name, p.default, want)
        for other in row.options[1:]:  # image_size: height and width, equal
            assert typed(*t[other][::2]) == want, (name, other)
        # Its type and description are the table's too.
        py = {"uint64": int, "uint32": int, "int": int, "bool": bool, "string": str}.get(kind, typing.Any)
        assert p.annotation is py or name == "image_size", (name, p.annotation, kind)
        assert options.DOCS[name] == doc or row.doc, name
        checked += 1
    assert checked >= 30  # most keywords take the table's default
    assert set(PYTHON_DEFAULTS) | PYTHON_OWN <= set(keywords)


def test_every_option_of_the_table_is_set_by_a_keyword():
    t = table()
    set_by = {o: row.name for row in options.ROWS.values() for o in row.options}
    assert set(set_by) | DERIVED_OPTIONS == set(t)
    # _args names an option as the keyword that sets it (caller_terms, INTS).
    assert options.OPTION_KEYWORD["feed_super_batch"] == "super_batch"
    assert options.OPTION_KEYWORD["image_width"] == options.OPTION_KEYWORD["image_height"] == "image_size"
    assert "batch_size" not in options.OPTION_KEYWORD


def test_docs_are_made_from_the_table():
    t = table()
    assert "    prefetch=8: " + t["prefetch"][1] in gpufeed.LoaderOptions.__doc__
    assert "    super_batch=1: " + t["feed_super_batch"][1] in gpufeed.FeedOptions.__doc__
    assert "    client_name='python': " + t["client_name"][1] in gpufeed.RemoteOptions.__doc__
    for name in options.ROWS:
        assert "\n        %s=" % name in gpufeed.Loader.__doc__, name


def test_a_library_of_another_build_is_refused_naming_the_option(monkeypatch):
    monkeypatch.setitem(_capi.OPTIONS, "feed_sharpen", ("bool", "sharpen"))
    with pytest.raises(errors.Error, match=r"option table has 'feed_sharpen', which no gpufeed.Loader keyword sets"):
        options._check_against_the_table()
    monkeypatch.delitem(_capi.OPTIONS, "feed_sharpen")
    monkeypatch.delitem(_capi.OPTIONS, "shuffle_window")
    with pytest.raises(errors.Error, match=r"keyword 'shuffle_window' sets option 'shuffle_window', which "):
        options._check_against_the_table()


def test_the_packages_modules_import_without_a_cycle():
    package = pathlib.Path(gpufeed.__file__).parent
    modules = {p.stem for p in package.glob("*.py")}
    edges = {}
    for m in modules:
        deps = set()
        for node in ast.walk(ast.parse((package / (m + ".py")).read_text())):  # function-level imports too
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpufeed."):
                deps.add(node.module.split(".")[1])
        edges[m] = {d.split(".")[0] for d in deps} & modules
    assert edges["_capi"] == {"errors"}  # the bottom: the library and its table
    seen, done = [], set()

    def visit(m):
        assert m not in seen, "import cycle: " + " -> ".join(seen[seen.index(m):] + [m])
        if m in done:
            return
        seen.append(m)
        for d in sorted(edges[m]):
            visit(d)
        seen.pop()
        done.add(m)

    for m in sorted(modules):
        visit(m)


# gpufeed train's flags for options of the table: (option, flag). Their
# description and range are the table's row (AddTableOption), as every other
# command's and Python's are.
TRAIN_TABLE_FLAGS = [
    ("batch_size", "--batch-size"), ("seed", "--seed"), ("order", "--order"), ("threads", "--threads"),
    ("feed_echo", "--echo"), ("feed_crop_padding", "--crop-padding"), ("feed_flip", "--flip"),
    ("feed_slots", "--feed-slots"), ("dataset", "--dataset"), ("token_file", "--token-file"), ("decode", "--decode"),
    ("image_transform", "--transform"), ("image_layout", "--image-layout"), ("skip_corrupt", "--skip-corrupt"),
]


def test_train_takes_its_loader_flags_from_the_table(gpufeed_cli):
    import re
    import subprocess
    t = table()
    out = subprocess.run([gpufeed_cli, "train", "--help"], capture_output=True, text=True, timeout=60).stdout
    text = re.sub(r"\s+", " ", out)  # CLI11 wraps long lines
    for option, flag in TRAIN_TABLE_FLAGS:
        m = re.search(r" %s[ =:A-Z|{]" % re.escape(flag), text)
        assert m, (flag, out)
        entry = text[m.start():m.start() + 400]
        assert t[option][1] in entry, (flag, t[option][1], entry)
    least, most = _capi.RANGES["threads"]
    assert re.search(r" --threads INT:INT in \[%d - %d\]" % (least, most), text), out
    # A value the table's range refuses is refused when the flags are read, naming the flag.
    p = subprocess.run([gpufeed_cli, "train", "--data", "x.h5", "--feed-slots", "0"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "--feed-slots" in p.stderr, p.stderr
    # A choice refused names the flag and its names, as before the table.
    p = subprocess.run([gpufeed_cli, "train", "--data", "x.h5", "--precision", "fp8"], capture_output=True, text=True,
                       timeout=60)
    assert "--precision: fp32, bf16 or fp16, not 'fp8'" in p.stderr, p.stderr
