"""gpufeed.Loader against h5py, the C++ Loader, itself in new processes, and
the daemon. Every check is exact: sample k's bytes encode k."""
import ctypes
import hashlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch

import gpufeed
from conftest import N_SAMPLES, ROOT, index_of, run_python, sample_bytes, write_index_file

OPTS = dict(batch_size=32, order="block", seed=5, threads=2, prefetch=3, shuffle_window=3)


def collect(loader):
    """[(index, indices, labels, images)] of one iteration, as NumPy."""
    out = []
    for b in loader.batches():
        out.append((len(out), b["indices"].numpy().copy(), b["labels"].numpy().copy(), b["images"].numpy().copy()))
    return out


@pytest.mark.parametrize("order", ["block", "random", "sequential"])
def test_every_sample_once_with_h5py_bytes(index_file, order):
    with h5py.File(index_file, "r") as f:
        want_images, want_labels = f["images"][...], f["labels"][...]
    loader = gpufeed.Loader(index_file, **dict(OPTS, order=order))
    assert len(loader) == (N_SAMPLES + 31) // 32
    orders = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen = np.zeros(N_SAMPLES, dtype=int)
        got = []
        for images, labels in loader:
            assert images.dtype == torch.uint8 and images.shape[1:] == want_images.shape[1:]
            assert labels.dtype == torch.int64
            for row, label in zip(images.numpy(), labels.numpy()):
                k = index_of(row)
                seen[k] += 1
                got.append(k)
                assert np.array_equal(row, want_images[k]), "sample %d's bytes differ from h5py's" % k
                assert label == want_labels[k]
        assert (seen == 1).all(), "epoch %d: missing %s, doubled %s" % (
            epoch, np.flatnonzero(seen == 0)[:5], np.flatnonzero(seen > 1)[:5])
        orders.append(got)
    if order != "sequential":
        assert orders[0] != orders[1]
    else:
        assert orders[0] == list(range(N_SAMPLES))
    stats = loader.stats()
    assert stats["samples"] == N_SAMPLES and stats["batches"] == len(loader)


def _dump(order_dump, data, epoch, start, opts, rank=0, world=1, drop_last=False):
    args = [order_dump, data, str(epoch), str(start), str(opts["batch_size"]), opts["order"], str(opts["seed"]),
            str(opts["threads"]), str(opts["prefetch"]), str(opts["shuffle_window"]), str(rank), str(world),
            str(int(drop_last))]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return [line.split(";") for line in p.stdout.splitlines()]


def _fnv(data):
    h = 0xCBF29CE484222325
    for x in data.tobytes():
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


@pytest.mark.parametrize("rank,world,drop_last", [(0, 1, False), (1, 3, False), (2, 3, True)])
def test_same_batches_as_cpp_loader(index_file, order_dump, rank, world, drop_last):
    # The C++ Loader in its own process (no C API, no fetch thread, no Python)
    # against the Python package for the same options: same batches, bytes.
    want = _dump(order_dump, index_file, 4, 0, OPTS, rank, world, drop_last)
    loader = gpufeed.Loader(index_file, rank=rank, world_size=world, drop_last=drop_last, **OPTS)
    loader.set_epoch(4)
    got = collect(loader)
    assert len(got) == len(want) == len(loader)
    for (i, idx, lab, img), (wi, widx, wlab, whash) in zip(got, want):
        assert str(i) == wi
        assert ",".join(map(str, idx)) == widx
        assert ",".join(map(str, lab)) == wlab
        assert _fnv(img) == whash


RESUME_CHILD = r"""
import hashlib, json, sys, torch, gpufeed
loader = gpufeed.Loader(sys.argv[1] if len(sys.argv) > 1 else %(data)r, **%(opts)r)
state = torch.load(%(state)r)
loader.load_state_dict(state)
loader.set_epoch(state["epoch"])
print(json.dumps([b["indices"].tolist() + [hashlib.sha1(b["images"].contiguous().numpy().tobytes()).hexdigest()]
                  for b in loader.batches()]))
"""


@pytest.mark.parametrize("feed", [False, True])
def test_state_dict_resumes_in_new_process(index_file, tmp_path, feed):
    opts = dict(OPTS)
    if feed:  # the CPU feed with augmentation: resume must give the same crops and flips
        opts.update(dtype="float32", crop_padding=2, flip=True)
    loader = gpufeed.Loader(index_file, **opts)
    loader.set_epoch(2)
    it = loader.batches()
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    assert state["epoch"] == 2 and state["batch"] == 3
    torch.save(state, tmp_path / "state.pt")
    # Every byte of every batch, in order (a hash of the images: a sum would
    # not see a sample moved within a batch, a flip or a crop shifted); the
    # feed has no per-row indices, so its labels (index-valued) order it.
    def digest(b):
        return hashlib.sha1(b["images"].contiguous().numpy().tobytes()).hexdigest()
    key = (lambda b: b["indices"].tolist() + [digest(b)]) if not feed else (lambda b: [digest(b), b["labels"].tolist()])
    want = [key(b) for b in it]
    child = RESUME_CHILD % {"data": index_file, "opts": opts, "state": str(tmp_path / "state.pt")}
    if feed:
        child = child.replace('b["indices"].tolist() + [hashlib.sha1(b["images"].contiguous().numpy().tobytes()).hexdigest()]',
                              '[hashlib.sha1(b["images"].contiguous().numpy().tobytes()).hexdigest(), b["labels"].tolist()]')
        assert "labels" in child
    got = json.loads(run_python(child))
    assert len(want) == len(loader) - 3
    assert got == want


def test_load_state_dict_checks_seed(index_file):
    loader = gpufeed.Loader(index_file, **OPTS)
    next(iter(loader))
    state = loader.state_dict()
    other = gpufeed.Loader(index_file, **dict(OPTS, seed=6))
    with pytest.raises(gpufeed.InvalidArgumentError, match="seed"):
        other.load_state_dict(state)  # refused when given, not at the next batch


RANK_CHILD = r"""
import json, gpufeed
loader = gpufeed.Loader(%(data)r, batch_size=32, seed=3, threads=1, prefetch=2)
loader.set_epoch(1)
print(json.dumps([k for b in loader.batches() for k in b["indices"].tolist()]))
"""


def test_two_ranks_cover_an_epoch_disjointly(index_file):
    got = []
    for rank in range(2):
        out = run_python(RANK_CHILD % {"data": index_file}, env={"RANK": str(rank), "WORLD_SIZE": "2"})
        got.append(json.loads(out))
    assert len(got[0]) == len(got[1]) == N_SAMPLES // 2
    assert not set(got[0]) & set(got[1])
    assert sorted(got[0] + got[1]) == list(range(N_SAMPLES))


def test_explicit_rank_wins_over_env(index_file, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert len(gpufeed.Loader(index_file, **OPTS)) == (N_SAMPLES // 2 + 31) // 32
    assert len(gpufeed.Loader(index_file, rank=0, world_size=1, **OPTS)) == (N_SAMPLES + 31) // 32


def test_freed_tensors_return_their_slots(index_file):
    # prefetch=1: a pool of 2 slots. Holding 1 batch at a time over 3 epochs
    # needs every freed batch's slot back; a leak would end in the error below.
    loader = gpufeed.Loader(index_file, **dict(OPTS, prefetch=1))
    n = 0
    for epoch in range(3):
        loader.set_epoch(epoch)
        for images, labels in loader:
            n += 1
    assert n == 3 * len(loader)
    del images, labels  # the loop's last batch
    # Images kept past their batch (views into the slot) keep it: two held
    # images tensors are the whole pool, so the next batch must be refused
    # (labels are copies of their own: test_keeping_the_labels_keeps_no_batch)...
    it = iter(loader)
    held = [next(it)[0], next(it)[0]]
    with pytest.raises(gpufeed.InvalidArgumentError, match="prefetch"):
        next(it)
    # ...and freeing one gives its slot back.
    del held[0]
    it = iter(loader)
    assert next(it)[0].shape[0] == 32


HOLD_CHILD = r"""
import gpufeed
loader = gpufeed.Loader(%(data)r, batch_size=16, threads=2, prefetch=2)
held = []
try:
    for images, labels in loader:
        held.append(images)
except gpufeed.Error as e:
    print(type(e).__name__, len(held), e)
"""


def test_holding_too_many_batches_is_an_error_not_a_hang(index_file):
    # In a child with a timeout: a hang fails the test instead of stalling it.
    out = run_python(HOLD_CHILD % {"data": index_file}, timeout=60)
    assert out.startswith("InvalidArgumentError 3 "), out
    assert "prefetch" in out


def test_damaged_file_names_file_and_chunk(tmp_path):
    path = write_index_file(tmp_path / "damaged.h5")
    with h5py.File(path, "r") as f:
        info = f["images"].id.get_chunk_info(5)
    with open(path, "r+b") as f:
        f.seek(info.byte_offset + 4)
        f.write(b"\xff" * 32)
    loader = gpufeed.Loader(path, **dict(OPTS, order="sequential"))
    with pytest.raises(gpufeed.CorruptError) as e:
        for _ in loader:
            pass
    assert "damaged.h5" in str(e.value) and "chunk 5" in str(e.value)
    assert isinstance(e.value, gpufeed.Error)


@pytest.mark.parametrize("io", ["direct", "buffered"])
def test_io_modes_deliver_the_same_batches(index_file, io):
    want = collect(gpufeed.Loader(index_file, **OPTS))
    got = collect(gpufeed.Loader(index_file, io=io, **OPTS))
    assert len(got) == len(want)
    for (_, gi, gl, gx), (_, wi, wl, wx) in zip(got, want):
        assert np.array_equal(gi, wi) and np.array_equal(gl, wl) and np.array_equal(gx, wx)
    with pytest.raises(gpufeed.InvalidArgumentError, match="auto, direct, buffered"):
        gpufeed.Loader(index_file, io="sideways")


def test_errors_carry_codes_and_messages(tmp_path, index_file):
    with pytest.raises(gpufeed.NotFoundError, match="nothing.h5"):
        gpufeed.Loader(str(tmp_path / "nothing.h5"))
    with pytest.raises(gpufeed.NotFoundError, match="/pixels"):
        gpufeed.Loader(index_file + ":/pixels")
    with pytest.raises(gpufeed.InvalidArgumentError, match="sideways"):
        gpufeed.Loader(index_file, order="sideways")
    with pytest.raises(gpufeed.InvalidArgumentError):
        gpufeed.Loader(index_file, device="tpu")
    with pytest.raises(gpufeed.IOFailureError, match="gpufeed-none.sock"):
        gpufeed.Loader("unix:" + str(tmp_path / "gpufeed-none.sock"), dataset=index_file, connect_timeout_ms=500)


def test_cpu_feed_normalizes(index_file):
    mean, std = [10.0, 20.0, 30.0], [2.0, 4.0, 8.0]
    loader = gpufeed.Loader(index_file, **dict(OPTS, order="sequential"), dtype=torch.float32, mean=mean,
                            std=std, layout="NHWC", labels_int32=True)
    rows = 0
    for images, labels in loader:
        assert images.dtype == torch.float32 and images.shape[1:] == (6, 5, 3)
        assert labels.dtype == torch.int32
        for r in range(images.shape[0]):
            k = rows + r  # sequential order
            want = (sample_bytes(k).astype(np.float32) - np.array(mean, np.float32)[:, None, None]) / np.array(
                std, np.float32)[:, None, None]
            np.testing.assert_allclose(images[r].numpy(), want.transpose(1, 2, 0), rtol=1e-6)
            assert labels[r] == k % 10
        rows += images.shape[0]
    assert rows == N_SAMPLES
    assert loader.stats()["feed_fresh_batches"] == len(loader)

    bf = gpufeed.Loader(index_file, **OPTS, dtype=torch.bfloat16)
    images, _ = next(iter(bf))
    assert images.dtype == torch.bfloat16 and images.shape == (32, 3, 6, 5)


NUMPY_CHILD = r"""
import sys
sys.modules["torch"] = None  # import torch now raises ImportError: a machine without torch
import numpy as np, gpufeed
loader = gpufeed.Loader(%(data)r, batch_size=32, seed=1, threads=2, prefetch=2)
n = 0
for images, labels in loader:
    assert type(images) is np.ndarray and images.dtype == np.uint8, type(images)
    assert type(labels) is np.ndarray and labels.dtype == np.int64
    for row, label in zip(images, labels):
        k = int(row.reshape(-1)[0]) | int(row.reshape(-1)[1]) << 8
        assert label == k %% 10
        n += 1
f = gpufeed.Loader(%(data)r, batch_size=32, threads=2, prefetch=2, dtype="float32")
images, labels = next(iter(f))
assert images.dtype == np.float32 and images.shape == (32, 3, 6, 5)
print(n)
"""


def test_numpy_only_path(index_file):
    assert run_python(NUMPY_CHILD % {"data": index_file}).strip() == str(N_SAMPLES)


def test_dlpack_arrays_for_any_consumer(index_file):
    loader = gpufeed.Loader(index_file, **dict(OPTS, order="sequential"), output="dlpack")
    images, labels = next(iter(loader))
    assert isinstance(images, gpufeed.Array) and images.shape == (32, 3, 6, 5) and images.dtype == "uint8"
    assert images.__dlpack_device__() == (1, 0)
    a = np.from_dlpack(images)
    t = torch.utils.dlpack.from_dlpack(labels)
    assert index_of(a[7]) == 7 and t[7] == 7
    with pytest.raises(RuntimeError):
        images.__dlpack__()  # handed over once


def test_unconsumed_capsules_return_their_slots_without_python_code(index_file):
    """A capsule dropped unconsumed gives its batch's slot back through the C
    API's destructor, which runs no Python (a Python one dropped a Ctrl-C
    raised inside it and leaked the slot). With a pool of prefetch + 1 = 3
    slots, 3 epochs of 8 batches only go through if every dropped capsule
    returned its slot."""
    from gpufeed import _dlpack
    assert _dlpack._DESTRUCTOR_PTR == ctypes.cast(gpufeed._lib.lib.gpufeed_dlpack_capsule_destructor,
                                                  ctypes.c_void_p).value
    loader = gpufeed.Loader(index_file, **dict(OPTS, order="sequential", prefetch=2), output="dlpack")
    seen = 0
    for epoch in range(3):
        loader.set_epoch(epoch)
        for images, labels in loader:
            caps = [images.__dlpack__(), labels.__dlpack__()]  # handed over, never consumed
            del images, labels, caps
            seen += 1
    assert seen == 3 * 8


def _wait_for_socket(path, proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError("gpufeed serve exited: " + proc.stderr.read().decode())
        if os.path.exists(path):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
                return
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.05)
    raise AssertionError("gpufeed serve did not listen on " + path)


@pytest.fixture
def daemon(gpufeed_cli, index_file, tmp_path):
    sock = str(tmp_path / "gpufeed.sock")
    proc = subprocess.Popen([gpufeed_cli, "serve", "--data", index_file, "--listen", "unix:" + sock, "--threads", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_socket(sock, proc)
        yield "unix:" + sock
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("shared_memory", [True, False])
def test_daemon_client_equals_local_loader(daemon, index_file, shared_memory):
    local = gpufeed.Loader(index_file, **OPTS)
    remote = gpufeed.Loader(daemon, dataset=index_file, shared_memory=shared_memory, **OPTS)
    assert len(remote) == len(local) and remote.num_samples == N_SAMPLES
    for epoch in (0, 3):
        local.set_epoch(epoch)
        remote.set_epoch(epoch)
        want, got = collect(local), collect(remote)
        assert len(got) == len(want)
        for (_, wi, wl, wimg), (_, gi, gl, gimg) in zip(want, got):
            assert np.array_equal(wi, gi) and np.array_equal(wl, gl) and np.array_equal(wimg, gimg)
    # Resume on the daemon: the state of a local run continues remotely.
    local.set_epoch(1)
    it = local.batches()
    next(it)
    next(it)
    remote.load_state_dict(local.state_dict())
    rest = [b["indices"].tolist() for b in it]
    assert [b["indices"].tolist() for b in remote.batches()] == rest


def test_daemon_client_left_idle_takes_its_first_epoch_or_resumes_exactly(daemon, index_file):
    """A Loader over a daemon starts epoch 0 when it is made too (the
    server sends its first batches while the model is built); idled, its
    epoch 0 equals a local Loader's, and a load_state_dict before the first
    iteration resumes exactly the saved run's remaining batches."""
    local = gpufeed.Loader(index_file, **OPTS)
    want = collect(local)
    remote = gpufeed.Loader(daemon, dataset=index_file, **OPTS)
    time.sleep(0.3)
    got = collect(remote)
    assert remote.stats()["started_early"] == 1
    assert len(got) == len(want)
    for (_, wi, wl, wimg), (_, gi, gl, gimg) in zip(want, got):
        assert np.array_equal(wi, gi) and np.array_equal(wl, gl) and np.array_equal(wimg, gimg)
    remote.close()
    for epoch in (0, 1):
        local.set_epoch(epoch)
        it = local.batches()
        next(it)
        next(it)
        state = local.state_dict()
        rest = [b["indices"].tolist() for b in it]
        idle = gpufeed.Loader(daemon, dataset=index_file, **OPTS)
        time.sleep(0.3)
        idle.load_state_dict(state)
        assert [b["indices"].tolist() for b in idle.batches()] == rest, "epoch %d" % epoch
        assert idle.stats()["started_early"] == 0
        idle.close()
    local.close()


def test_close_keeps_held_tensors_valid(index_file):
    loader = gpufeed.Loader(index_file, **dict(OPTS, order="sequential"))
    images, labels = next(iter(loader))
    loader.close()
    assert index_of(images[3].numpy()) == 3 and labels[3] == 3
    with pytest.raises(gpufeed.Error, match="after close"):
        len(loader)


CTRL_C_CHILD = r"""
import sys, time, gpufeed
loader = gpufeed.Loader(%(data)r, batch_size=16, threads=1, prefetch=2, poll_ms=50)
print("ready", flush=True)
try:
    while True:
        for images, labels in loader:
            pass
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_stops_the_loop(index_file):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pathlib.Path(gpufeed.__file__).parents[1]),
                                                      env.get("PYTHONPATH")]))
    p = subprocess.Popen([sys.executable, "-c", CTRL_C_CHILD % {"data": index_file}], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "interrupted" in out, err


def test_cli_bench_loader_reads_a_daemon(daemon, gpufeed_cli, index_file):
    # `gpufeed serve` tried from the command line alone: the bench verifies
    # every index once and the bytes against the file before it prints.
    p = subprocess.run([gpufeed_cli, "bench", "loader", "--data", daemon, "--dataset", index_file, "--threads", "2",
                        "--batch-size", "32", "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["verified"] and out["bytes_verified"] and out["samples"] == N_SAMPLES and out["full_epoch"]


def test_holding_every_feed_slot_is_an_error_naming_slots(index_file):
    loader = gpufeed.Loader(index_file, **OPTS, dtype="float32", slots=2)
    it = iter(loader)
    held = [next(it), next(it)]
    with pytest.raises(gpufeed.InvalidArgumentError, match="slots"):
        next(it)
    assert len(held) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: cuda batches are tested on the GPU host")
def test_cuda_without_a_gpu_says_so(index_file):
    loader = gpufeed.Loader(index_file, **OPTS, device="cuda")
    with pytest.raises(gpufeed.UnsupportedError, match="device='cpu'"):
        next(iter(loader))


def test_cli_train_from_a_daemon_equals_training_from_the_file(daemon, gpufeed_cli, index_file, tmp_path):
    # Same batches from the daemon as from the file, so the same weights, bit
    # for bit (the trainer's CPU backend is deterministic).
    hashes = []
    for data in (daemon, index_file):
        out = tmp_path / "train.json"
        p = subprocess.run([gpufeed_cli, "train", "--data", data, "--epochs", "2", "--batch-size", "32",
                            "--device", "cpu", "--threads", "2", "--json", str(out)],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        hashes.append(json.loads(out.read_text())["weights_hash"])
    assert hashes[0] == hashes[1]


CORPUS = ROOT / "tests" / "corpus" / "data" / "hdf5-cve"
CORPUS_CHILD = r"""
import sys, gpufeed
bad = 0
for path in sys.argv[1:]:
    try:
        loader = gpufeed.Loader(path, batch_size=8, threads=1, device="cpu")
        for _ in loader:
            pass
        print("OK", path)
    except gpufeed.Error as e:
        print("ERR", type(e).__name__, path, str(e)[:100])
    except Exception as e:  # anything but gpufeed.Error is a failure
        print("BAD", type(e).__name__, path, e)
        bad += 1
sys.exit(1 if bad else 0)
"""


def test_hdf5_cve_corpus_gives_gpufeed_errors_not_crashes():
    # In one child process: a crash or a hang of HDF5 there would take the
    # interpreter with it; the probe process must contain them instead.
    files = sorted(str(p) for p in CORPUS.iterdir() if p.name != "COPYING" and not p.name.endswith(".md"))
    proc = subprocess.run([sys.executable, "-c", CORPUS_CHILD] + files, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(lines) == len(files), proc.stderr[-2000:]
    assert all(l.startswith(("ERR", "OK")) for l in lines)


@pytest.mark.parametrize("output", ["torch", "numpy"])
def test_keeping_the_labels_keeps_no_batch(index_file, output):
    # The pool holds prefetch + 1 = 3 batches; keeping every batch's labels
    # (a metric's habit) must not hold their slots: labels are copies of
    # their own, the images views of the slot.
    if output == "torch":
        pytest.importorskip("torch")
    loader = gpufeed.Loader(index_file, batch_size=10, prefetch=2, order="sequential", output=output)
    kept = []
    for images, labels in loader:
        kept.append(labels)
    assert len(kept) == 25
    assert [int(x) for batch in kept for x in batch] == [k % 10 for k in range(250)]


def test_later_epochs_of_one_feed_equal_fresh_loaders(index_file):
    """The feed is restarted at each epoch, not made anew (its device buffers
    and decoder stay): every epoch equals a fresh Loader's for that epoch,
    augmentation included, and the last epoch's batch still held across the
    next epoch's start keeps its values."""
    opts = dict(OPTS, dtype=torch.float32, crop_padding=1, flip=True)
    loader = gpufeed.Loader(index_file, **opts)
    held = held_copy = None
    for epoch in range(3):
        loader.set_epoch(epoch)
        got = []
        for b in loader.batches():
            got.append((b["labels"].numpy().copy(), b["images"].numpy().copy()))
            last = b["images"]
        if held is not None:
            np.testing.assert_array_equal(held.numpy(), held_copy)
        held, held_copy = last, last.numpy().copy()
        fresh = gpufeed.Loader(index_file, **opts)
        fresh.set_epoch(epoch)
        want = [(b["labels"].numpy().copy(), b["images"].numpy().copy()) for b in fresh.batches()]
        fresh.close()
        assert len(got) == len(want) == len(loader)
        for (gl, gx), (wl, wx) in zip(got, want):
            np.testing.assert_array_equal(gl, wl)
            np.testing.assert_array_equal(gx, wx)
        assert loader.stats()["feed_fresh_batches"] == len(loader)  # this epoch's own


@pytest.mark.parametrize("feed", [False, True])
def test_next_epoch_started_at_the_end_is_only_taken_when_asked(index_file, feed):
    """When an epoch ends, the next one starts at once (its first batches are
    read, and with the feed uploaded, while the caller finishes its steps).
    Whatever epoch is asked next, each equals a fresh Loader's for it: the
    one after (taken as started), the same one again, or another (started
    over); after the end, next() says end again and the statistics stay the
    ended epoch's."""
    opts = dict(OPTS, dtype=torch.float32, crop_padding=1, flip=True) if feed else dict(OPTS)

    def epoch_of(loader):
        return [(b["labels"].numpy().copy(), b["images"].numpy().copy()) for b in loader.batches()]

    wants = {}

    def fresh_epoch(epoch):
        if epoch not in wants:
            fresh = gpufeed.Loader(index_file, **opts)
            fresh.set_epoch(epoch)
            wants[epoch] = epoch_of(fresh)
            fresh.close()
        return wants[epoch]

    def assert_same(got, want):
        for (gl, gx), (wl, wx) in zip(got, want):
            np.testing.assert_array_equal(gl, wl)
            np.testing.assert_array_equal(gx, wx)

    loader = gpufeed.Loader(index_file, **opts)
    for epoch in [0, 1, 2, 2, 2, 5, 0, 1]:
        loader.set_epoch(epoch)
        got = epoch_of(loader)
        assert loader._next() is None, "a next() after the end must say end, not start the next epoch"
        stats = loader.stats()
        assert stats["samples"] == N_SAMPLES and stats["batches"] == len(loader), stats
        want = fresh_epoch(epoch)
        assert len(got) == len(want) == len(loader)
        assert_same(got, want)
    # A resume after an early-started epoch: the state's epoch and batch.
    loader.set_epoch(3)
    it = loader.batches()
    next(it)
    state = loader.state_dict()
    rest = [(b["labels"].numpy().copy(), b["images"].numpy().copy()) for b in it]
    loader.load_state_dict(state)
    again = epoch_of(loader)
    assert len(again) == len(rest) == len(loader) - 1
    assert_same(again, rest)
    # After the resumed epoch (nothing started early for it), the next ones as ever.
    for epoch in [4, 5]:
        loader.set_epoch(epoch)
        got = epoch_of(loader)
        assert len(got) == len(fresh_epoch(epoch))
        assert_same(got, fresh_epoch(epoch))
    loader.close()


@pytest.mark.parametrize("feed", [False, True])
def test_a_loader_left_idle_then_resumed_mid_epoch_delivers_exactly_the_rest(index_file, feed):
    """A Loader reads epoch 0's first batches while it sits idle (the first
    epoch started when it is made); a load_state_dict before its first
    iteration drops them: the resumed iteration is exactly the saved run's
    remaining batches, in epoch 0 (the one read ahead) and in another."""
    opts = dict(OPTS, dtype=torch.float32, crop_padding=1, flip=True) if feed else dict(OPTS)

    def key(b):
        return [b["labels"].tolist(), hashlib.sha1(b["images"].contiguous().numpy().tobytes()).hexdigest()]

    for epoch in (0, 1):
        saved = gpufeed.Loader(index_file, **opts)
        saved.set_epoch(epoch)
        it = saved.batches()
        for _ in range(3):
            next(it)
        state = saved.state_dict()
        assert state["epoch"] == epoch and state["batch"] == 3
        want = [key(b) for b in it]
        saved.close()
        idle = gpufeed.Loader(index_file, **opts)
        time.sleep(0.3)  # a model being built: epoch 0's first batches are read meanwhile
        idle.load_state_dict(state)
        got = [key(b) for b in idle.batches()]
        assert len(got) == len(want) == len(idle) - 3
        assert got == want, "epoch %d: the resumed batches differ from the saved run's rest" % epoch
        assert idle.stats()["started_early"] == 0
        idle.close()


def test_first_batch_time_after_iter_is_in_the_stats(index_file, monkeypatch):
    """stats()["first_batch_seconds"]: from iter() to the first batch;
    "started_early": whether the epoch's first batches were read before it
    (epoch 0 while the Loader sat idle, unless GPUFEED_FIRST_EPOCH_EARLY=0)."""
    for early in (True, False):
        if not early:
            monkeypatch.setenv("GPUFEED_FIRST_EPOCH_EARLY", "0")
        loader = gpufeed.Loader(index_file, **OPTS)
        time.sleep(0.2)
        t0 = time.perf_counter()
        it = loader.batches()
        next(it)
        waited = time.perf_counter() - t0
        stats = loader.stats()
        since_iter = time.perf_counter() - t0
        assert stats["started_early"] == (1 if early else 0)
        assert 0 < stats["first_batch_seconds"] <= waited
        # The loader's clock runs from its stream's start: when the Loader
        # was made (0.2 s before iter()) if started early, else in iter().
        if early:
            assert stats["wall_seconds"] >= since_iter + 0.15, stats
        else:
            assert stats["wall_seconds"] <= since_iter, stats
        for _ in it:
            pass
        assert loader.stats()["samples"] == N_SAMPLES
        loader.close()


def test_import_gives_cuda_its_most_connections_unless_the_job_chose():
    # Set at import, before any CUDA context (the GPU decoder's streams
    # otherwise share CUDA's 8 hardware queues with the model's and NCCL's).
    code = ("import os\n"
            "os.environ.pop('CUDA_DEVICE_MAX_CONNECTIONS', None) if os.environ.get('KEEP') != '1' else None\n"
            "import gpufeed\n"
            "print(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'))\n")
    assert run_python(code).strip() == "32"
    assert run_python(code, env={"KEEP": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}).strip() == "1"


def test_import_after_cuda_started_says_the_default_comes_too_late():
    # A stand-in torch whose CUDA has started (this machine may have none).
    code = ("import os, sys, types, warnings\n"
            "os.environ.pop('CUDA_DEVICE_MAX_CONNECTIONS', None) if os.environ.get('KEEP') != '1' else None\n"
            "torch = types.ModuleType('torch'); torch.cuda = types.SimpleNamespace(is_initialized=lambda: True)\n"
            "sys.modules['torch'] = torch\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    import gpufeed\n"
            "print([str(x.message) for x in w if issubclass(x.category, RuntimeWarning)])\n")
    out = run_python(code)
    assert "imported after CUDA started" in out and "Import gpufeed before the first CUDA call" in out, out
    # The job's own value: nothing to say.
    out = run_python(code, env={"KEEP": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "8"})
    assert out.strip() == "[]", out


def test_probe_beside_an_h5py_thread(tmp_path):
    """Debian's HDF5 has one global lock; a probe forked while a thread of h5py
    held it got a copy held forever, and a good file was reported as hanging
    after 10 s ("did not finish reading this file's metadata"). The fork is
    now made holding that lock (h5::ForkOutsideHdf5), and the child skips
    H5close where h5py is loaded (its conversion functions wait there for a
    GIL another thread held at the fork)."""
    import threading
    path = str(tmp_path / "small.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=np.arange(64 * 8, dtype=np.uint8).reshape(64, 8), chunks=(8, 8))
        f.create_dataset("labels", data=np.arange(64, dtype=np.int64))
    stop = threading.Event()

    def busy():  # h5py in and out of HDF5 all the time, as a reader thread would be
        while not stop.is_set():
            with h5py.File(path, "r") as f:
                int(f["images"][0, 0])

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    try:
        for _ in range(5):
            start = time.monotonic()
            loader = gpufeed.Loader(path, batch_size=8)
            # Not the probe's 10 s limit waited out: its child stuck in
            # H5close (h5py's conversion functions wait for the GIL there).
            assert time.monotonic() - start < 5
            got = sorted(int(i) for b in loader.batches() for i in b["indices"])
            assert got == list(range(64))
    finally:
        stop.set()
        t.join()
