"""Loader(...) checks its arguments where they are given, naming the keyword
as the caller wrote it: no wraparound through the C API's unsigned setters
(batch_size=-1 became 60,000 samples, 2**64 + 3 became 3), no silent
truncation (64.9 became 64, True became 1), no failure deferred to the
first iteration (batch_size=0, threads=-1, prefetch=-1, rank=2 of 2)."""
import pytest

import gpufeed

BAD = [
    ("batch_size", -1), ("batch_size", 0), ("batch_size", 2**64 + 3), ("batch_size", 64.9), ("batch_size", True),
    ("batch_size", "abc"), ("batch_size", "64"), ("threads", -1), ("threads", 1.5), ("prefetch", -1),
    ("prefetch", 0), ("seed", -1), ("seed", 2**64), ("shuffle_window", 0), ("echo", -1), ("slots", 0),
    ("poll_ms", 0), ("connect_timeout_ms", -5), ("max_open_files", 0), ("crop_padding", -2),
    ("augment_seed", 1.0), ("cache_bytes", "1 parsec"), ("cache_bytes", -1), ("cache_bytes", 2.5),
    ("image_size", 0), ("image_size", (224,)), ("image_size", (224, 40000)),
]


@pytest.mark.parametrize("name,value", BAD, ids=["%s=%r" % nv for nv in BAD])
def test_bad_values_are_refused_by_the_constructor(index_file, name, value):
    with pytest.raises(gpufeed.InvalidArgumentError) as e:
        gpufeed.Loader(index_file, **{name: value})
    assert str(e.value).startswith("%s=%r: " % (name, value)), str(e.value)


def test_rank_outside_the_world_is_refused_at_once(index_file):
    with pytest.raises(gpufeed.InvalidArgumentError, match=r"rank=2 with world_size=2: rank is from 0"):
        gpufeed.Loader(index_file, rank=2, world_size=2)
    with pytest.raises(gpufeed.InvalidArgumentError, match=r"^world_size=0: "):
        gpufeed.Loader(index_file, rank=0, world_size=0)


@pytest.mark.parametrize("text,want", [("512MiB", 512 << 20), ("1GiB", 1 << 30), ("4G", 4 << 30), ("1GB", 10**9),
                                       ("1.5GiB", 3 << 29), (" 64 KiB ", 64 << 10), ("1000", 1000)])
def test_sizes_take_units(index_file, text, want):
    from gpufeed import _args
    assert _args.size_bytes("cache_bytes", text) == want
    loader = gpufeed.Loader(index_file, cache_bytes=text, threads=2)
    assert loader.num_samples > 0
    loader.close()


def test_integers_of_other_types_are_taken(index_file):
    np = pytest.importorskip("numpy")
    loader = gpufeed.Loader(index_file, batch_size=np.int64(32), seed=np.uint64(2**63), threads=2)
    assert loader.batch_size == 32
    loader.close()


def test_a_daemon_killed_mid_epoch_is_an_error_in_the_callers_terms(index_file, gpufeed_cli, tmp_path):
    """SIGKILL, not a graceful stop: no SHUTDOWN frame. The error says the
    daemon is gone and how to resume, in Python's terms (it was a bare
    "send: Broken pipe")."""
    import signal
    import socket
    import subprocess
    import time
    sock = tmp_path / "d.sock"
    proc = subprocess.Popen([gpufeed_cli, "serve", "--data", index_file, "--listen", "unix:%s" % sock, "--threads", "2",
                             "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(str(sock))
                break
            except OSError:
                assert time.time() < deadline and proc.poll() is None, "gpufeed serve did not listen"
                time.sleep(0.05)
            finally:
                s.close()
        loader = gpufeed.Loader("unix:%s" % sock, dataset=index_file, batch_size=8, prefetch=2, output="numpy")
        it = iter(loader)
        next(it)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with pytest.raises(gpufeed.IOFailureError) as e:
            for _ in it:
                pass
        assert "the daemon is gone" in str(e.value) and "load_state_dict" in str(e.value), str(e.value)
        loader.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_missing_labels_dataset_lists_the_files_datasets(index_file):
    with pytest.raises(gpufeed.NotFoundError, match=r":/nope: no such labels dataset \(the file has: /images, /labels;"):
        gpufeed.Loader(index_file, labels="/nope")


def test_a_dtype_torch_cannot_hold_is_said_at_the_constructor(tmp_path):
    """A uint32 dataset with torch output: this torch either takes it, or
    Loader(...) says so and what to do (it was torch's own RuntimeError at
    the first batch); output="numpy" reads it either way."""
    import h5py
    import numpy as np
    import torch
    path = str(tmp_path / "u32.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=np.arange(40 * 3, dtype=np.uint32).reshape(40, 3), chunks=(8, 3))
    try:
        torch.utils.dlpack.from_dlpack(np.zeros(1, dtype=np.uint32))
        torch_takes = True
    except Exception:
        torch_takes = False
    if torch_takes:
        images, _ = next(iter(gpufeed.Loader(path, batch_size=8, threads=2, order="sequential")))
        assert images.numpy().ravel().tolist() == list(range(24))
    else:
        with pytest.raises(gpufeed.UnsupportedError, match=r"uint32 samples, which torch .* output='numpy'"):
            gpufeed.Loader(path, batch_size=8, threads=2)
    arrays, _ = next(iter(gpufeed.Loader(path, batch_size=8, threads=2, order="sequential", output="numpy")))
    assert arrays.dtype == np.uint32 and arrays.ravel().tolist() == list(range(24))


def test_library_errors_name_the_keyword_not_the_cpp_or_cli_option(index_file):
    # A consumer that keeps every batch: the library names the option to
    # raise, as C++ (LoaderOptions::prefetch) and the CLI (--prefetch) spell
    # it; Python says prefetch=.
    loader = gpufeed.Loader(index_file, batch_size=10, prefetch=2, output="numpy")
    held = []
    with pytest.raises(gpufeed.InvalidArgumentError) as e:
        for batch in loader:
            held.append(batch)
    message = str(e.value)
    assert "prefetch=" in message, message
    assert "LoaderOptions" not in message and "--prefetch" not in message, message


def test_caller_terms_rewrites_cpp_and_cli_spellings_of_keywords_only():
    from gpufeed._args import caller_terms
    assert caller_terms("raise prefetch (LoaderOptions::prefetch, --prefetch; 9 buffers)") == \
        "raise prefetch (prefetch=; 9 buffers)"
    assert caller_terms("at least 1 (--batch-size)") == "at least 1 (batch_size=)"
    assert caller_terms("or lower (RemoteLoaderOptions::loader.prefetch)") == "or lower (prefetch=)"
    assert caller_terms("with --crop-padding 0, or --device cpu") == "with crop_padding=0, or device='cpu'"
    # Not Loader keywords: left as written.
    assert caller_terms("--stats makes, --data FILE, OpenOptions::bogus") == "--stats makes, --data FILE, OpenOptions::bogus"


def test_options_go_through_the_libraries_option_table(index_file):
    # Python sets every option by name through gpufeed_options_set (capi/options.cc):
    # the library's table is what Python knows of types and ranges, and its
    # refusals name the keyword the caller wrote.
    from gpufeed import _lib
    assert _lib.OPTIONS["batch_size"][0] == "uint64" and _lib.OPTIONS["feed_echo"][0] == "int"
    assert _lib.OPTIONS["drop_last"][0] == "bool" and _lib.OPTIONS["order"][0] == "string"
    from gpufeed import _args
    assert _args.INTS["prefetch"] == (1, 4096, _lib.OPTIONS["prefetch"][1])
    assert _args.INTS["echo"][:2] == (0, 4096) and _args.INTS["seed"][:2] == (0, 2**64 - 1)
    with pytest.raises(gpufeed.InvalidArgumentError, match=r"prefetch=5000: an integer from 1 to 4096 \(batches in"):
        gpufeed.Loader(index_file, batch_size=10, prefetch=5000)
    # Past Python's own checks (a value Loader() takes as it is), the library's refusal names the keyword.
    opts = _lib.lib.gpufeed_options_create()
    try:
        with pytest.raises(gpufeed.InvalidArgumentError, match=r"^super_batch=9999: batches per upload, 1 to 4096"):
            _lib.set_option(opts, "feed_super_batch", 9999)
    finally:
        _lib.lib.gpufeed_options_destroy(opts)


def test_caller_terms_rewrites_the_c_option_tables_calls():
    from gpufeed._args import caller_terms
    assert caller_terms('gpufeed_options_set("feed_echo", "0"): passes') == "echo=0: passes"
    assert caller_terms('gpufeed_options_set("order", "up"): no') == "order='up': no"
    assert caller_terms('gpufeed_options_set("client_name", "x")') == "client_name='x'"


def test_option_groups_mirror_the_cpp_structs_and_mix_with_keywords(index_file):
    # One loader, two spellings: the same batches in the same order.
    flat = gpufeed.Loader(index_file, batch_size=10, seed=5, order="random", threads=2, output="numpy")
    grouped = gpufeed.Loader(index_file, loader_options=gpufeed.LoaderOptions(batch_size=10, seed=5, order="random"),
                             threads=2, output_options=gpufeed.OutputOptions(output="numpy"))
    a = [(x.tolist(), y.tolist()) for x, y in flat]
    b = [(x.tolist(), y.tolist()) for x, y in grouped]
    assert a == b and len(a) == len(flat)
    # Each keyword and its default written once: the groups' fields are Loader's keywords.
    from gpufeed import options
    assert options.KEYWORDS["batch_size"] == (gpufeed.LoaderOptions, 256)
    assert options.KEYWORDS["echo"] == (gpufeed.FeedOptions, 1)


def test_option_groups_refuse_conflicts_unknown_keywords_and_wrong_groups(index_file):
    with pytest.raises(gpufeed.InvalidArgumentError, match=r"batch_size=20 and loader_options.batch_size=10: give it once"):
        gpufeed.Loader(index_file, batch_size=20, loader_options=gpufeed.LoaderOptions(batch_size=10))
    with pytest.raises(gpufeed.InvalidArgumentError, match=r"no keyword 'batchsize'; did you mean 'batch_size'"):
        gpufeed.Loader(index_file, batchsize=20)
    with pytest.raises(gpufeed.InvalidArgumentError, match=r"feed_options=.*a gpufeed.FeedOptions"):
        gpufeed.Loader(index_file, feed_options=gpufeed.LoaderOptions())
    # The same value both ways is no conflict.
    loader = gpufeed.Loader(index_file, batch_size=10, loader_options=gpufeed.LoaderOptions(batch_size=10), threads=2)
    assert loader.batch_size == 10


# One parser of sizes for every door (issue 50: Python took "1GiB" but not
# "auto", the CLI "auto" but not "1GiB"): the keyword and the flag read each
# spelling to the same bytes, or both refuse it.
SPELLINGS = ["1GiB", "512MB", "1.5 GiB", "64k", "123", "2TB", "auto", "1 parsec", "1e9", "0x10", "12 GiBs", ""]


def test_python_and_the_cli_read_sizes_alike(index_file, gpufeed_cli):
    import json
    import subprocess
    from gpufeed import _args
    for text in SPELLINGS:
        try:
            ours = _args.size_bytes("cache_bytes", text)
        except gpufeed.InvalidArgumentError as e:
            assert str(e).startswith("cache_bytes=%r: " % text), str(e)
            ours = None
        p = subprocess.run([gpufeed_cli, "bench", "loader", "--data", index_file, "--threads", "1", "--epochs", "1",
                            "--batches", "1", "--json", "--cache-bytes", text], capture_output=True, text=True,
                           timeout=120)
        theirs = json.loads(p.stdout)["cache_bytes"] if p.returncode == 0 else None
        if ours is None or theirs is None:
            assert ours is None and theirs is None, (text, ours, theirs, p.stderr)
            assert "--cache-bytes" in p.stderr, p.stderr
        elif text == "auto":  # half the memory available, read a moment apart
            assert abs(ours - theirs) <= theirs // 10, (ours, theirs)
        else:
            assert ours == theirs, (text, ours, theirs)
    assert _args.size_bytes("cache_bytes", "auto") > 0
    with pytest.raises(gpufeed.InvalidArgumentError, match=r"^pool_bytes='auto': "):
        _args.size_bytes("pool_bytes", "auto")  # no meaning for the pool: refused, not guessed
