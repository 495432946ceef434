"""gpufeed.jax (issue 52) and the DLPack contract it stands on.

Without JAX (CI: Debian has no JAX): the DLPack capsules gpufeed hands any
consumer, through NumPy and torch (lifetime, strides, dtype codes with bf16,
device, zero-copy); the sharding plan as plain Python, and as gpufeed
Loaders reading the rows it gives each device (every sample once over N
devices and P processes); gpufeed.jax importable without JAX, a Loader
refused naming the package.

With JAX (the GPU host's, scripts/gpu-host-jax): the same loader as jax
Arrays, on four CPU devices (a child with XLA's host device count forced)
and on every GPU: every sample once, each shard's buffer the feed's slot,
labels, dtypes, state_dict, a slot held by a queued step.
"""
import gc
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.utils.dlpack

import gpufeed
from gpufeed import _lib
from gpufeed import jax as gjax

from conftest import N_SAMPLES, ROOT, index_of, python_path, run_python, sample_bytes

# threads=2: several Loaders of 2 threads iterated together in one process,
# as gpufeed.jax's feeds are (they once hung on 2 cores:
# tests/loader/interleaved_loaders_test.cc).
OPTS = dict(order="block", seed=5, threads=2, prefetch=3, shuffle_window=3)
KDLINT, KDLUINT, KDLFLOAT, KDLBFLOAT = 0, 1, 2, 4


def _tensor(array):
    """The DLTensor of a gpufeed.Array not yet handed over."""
    return _lib.DLManagedTensor.from_address(array._managed).dl_tensor


def _shape_strides(t):
    shape = [t.shape[i] for i in range(t.ndim)]
    strides = None if not t.strides else [t.strides[i] for i in range(t.ndim)]
    return shape, strides


# -- the DLPack contract, through NumPy and torch ----------------------------


@pytest.mark.parametrize("dtype,code,bits", [(None, KDLUINT, 8), ("float32", KDLFLOAT, 32),
                                             ("float16", KDLFLOAT, 16), ("bfloat16", KDLBFLOAT, 16)])
def test_capsule_dtype_code_strides_and_device(index_file, dtype, code, bits):
    loader = gpufeed.Loader(index_file, batch_size=32, **dict(OPTS, order="sequential"), output="dlpack",
                            dtype=dtype)
    images, labels = next(iter(loader))
    t = _tensor(images)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (code, bits, 1)
    assert (t.device.device_type, t.device.device_id) == (1, 0) == images.__dlpack_device__()
    shape, strides = _shape_strides(t)
    assert shape == [32, 3, 6, 5] and t.byte_offset == 0
    # Compact row-major: no strides (DLPack's "compact") or exactly those.
    assert strides in (None, [90, 30, 5, 1]), strides
    assert t.data % 64 == 0, "the slot is not 64-byte aligned (XLA's buffers are): JAX would copy it"
    lt = _tensor(labels)
    assert (lt.dtype.code, lt.dtype.bits) == (KDLINT, 64) and _shape_strides(lt)[0] == [32]
    # torch takes every dtype (bf16 too) and views the same bytes.
    ptr = t.data
    x = torch.utils.dlpack.from_dlpack(images)
    assert x.data_ptr() == ptr and x.is_contiguous() and x.device.type == "cpu"
    want = np.stack([sample_bytes(k) for k in range(32)]).astype(np.float32)
    if dtype is None:
        assert x.dtype == torch.uint8 and np.array_equal(x.numpy(), want.astype(np.uint8))
    else:
        # The CPU feed's default normalization: (x - 0) / 255, rounded to the dtype.
        assert x.dtype == getattr(torch, dtype)
        tol = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
        np.testing.assert_allclose(x.float().numpy(), want / 255.0, atol=tol)
    y = torch.utils.dlpack.from_dlpack(labels)
    assert y.dtype == torch.int64 and y.tolist() == [k % 10 for k in range(32)]


def test_numpy_views_the_slot_and_keeps_it_until_freed(index_file):
    """np.from_dlpack views the slot (same pointer, no copy); a held array
    keeps its slot, its bytes unchanged while the other slots are reused; a
    program holding every slot is refused naming prefetch, and served again
    once it frees one. prefetch=2: a pool of 3 (the loop itself keeps the
    previous batch while it fetches the next)."""
    loader = gpufeed.Loader(index_file, batch_size=32, **dict(OPTS, order="sequential", prefetch=2),
                            output="dlpack")
    it = iter(loader)
    images, labels = next(it)
    ptr = _tensor(images).data
    held = np.from_dlpack(images)
    assert held.ctypes.data == ptr and held.flags.c_contiguous and held.dtype == np.uint8
    assert [index_of(r) for r in held] == list(range(32))
    before = held.copy()
    with pytest.raises(RuntimeError, match="already handed over"):
        images.__dlpack__()
    del images, labels  # the unconsumed labels Array held the slot too
    gc.collect()  # and the RuntimeError's traceback, which pytest.raises keeps in a cycle
    seen = []
    for b, lab in it:
        a = np.from_dlpack(b)
        assert a.ctypes.data != ptr
        seen.extend(index_of(r) for r in a)
        del a, b, lab
    assert seen == list(range(32, N_SAMPLES))
    assert np.array_equal(held, before), "a held array's bytes changed: its slot was reused"
    kept = [held]
    it = iter(loader)
    with pytest.raises(gpufeed.InvalidArgumentError, match="prefetch"):
        while True:
            kept.append(np.from_dlpack(next(it)[0]))
    assert len(kept) == 3
    del kept[1:]
    gc.collect()
    it = iter(loader)
    assert [index_of(r) for r in np.from_dlpack(next(it)[0])] == list(range(32))


@pytest.mark.parametrize("feed", [False, True])
def test_a_refusal_for_held_slots_loses_no_batch(index_file, feed):
    """Every slot held: the next batch is refused (naming slots, or prefetch
    without the feed); once one is freed, asking again continues the epoch
    with the batch that was refused, none lost. gpufeed.jax waits for the
    slots its queued steps hold this way (the feed's refusal ended its
    stream: the retry got the epoch's end)."""
    opts = dict(OPTS, order="sequential", prefetch=2)
    if feed:
        opts.update(dtype="float32", mean=[0.0] * 3, std=[1.0] * 3, slots=2)
    loader = gpufeed.Loader(index_file, batch_size=32, **opts, output="dlpack")
    loader._start()
    held, got = [], []
    while True:
        try:
            h = loader._next()
        except gpufeed.InvalidArgumentError as e:
            assert ("slots" if feed else "prefetch") in str(e) and len(held) == (2 if feed else 3)
            del held[0]
            gc.collect()
            continue
        if h is None:
            break
        images = np.from_dlpack(loader._convert(h, ("images",))["images"])
        got.extend(index_of(r.astype(np.uint8)) for r in images)
        held.append(images)
    assert got == list(range(N_SAMPLES))


def test_torch_tensor_keeps_its_slot_past_close(index_file):
    loader = gpufeed.Loader(index_file, batch_size=32, **dict(OPTS, order="sequential"), output="dlpack")
    images, _ = next(iter(loader))
    x = torch.utils.dlpack.from_dlpack(images)
    loader.close()
    assert [index_of(r) for r in x.numpy()] == list(range(32))


# -- the sharding plan, plain Python ------------------------------------------


@pytest.mark.parametrize("devices,processes", [(1, 1), (4, 1), (2, 2), (8, 2), (3, 3)])
def test_plan_gives_every_row_of_the_global_batch_to_one_rank(devices, processes):
    world = devices * processes
    batch = 24 * world
    ranks = {}
    for p in range(processes):
        rows = gjax.default_rows(batch, ["p%dd%d" % (p, d) for d in range(devices)], p, processes)
        feeds = gjax.plan_feeds(batch, rows)
        assert [f.device for f in feeds] == ["p%dd%d" % (p, d) for d in range(devices)]
        for f in feeds:
            assert f.world_size == world and f.stop - f.start == 24 and f.start == f.rank * 24
            assert f.rank not in ranks
            ranks[f.rank] = (p, f.device)
    assert sorted(ranks) == list(range(world))
    # Process p's devices hold ranks p * D ... p * D + D - 1: as torchrun ranks a node's processes.
    assert [ranks[r][0] for r in range(world)] == [r // devices for r in range(world)]


@pytest.mark.parametrize("batch,devices,processes", [(30, 4, 1), (100, 8, 2), (6, 4, 1)])
def test_plan_refuses_a_batch_that_does_not_split(batch, devices, processes):
    with pytest.raises(gpufeed.InvalidArgumentError, match="batch_size=%d.*multiple of %d" % (
            batch, devices * processes)):
        gjax.default_rows(batch, list(range(devices)), 0, processes)


def test_plan_refuses_uneven_or_misplaced_rows_and_keeps_replicas():
    with pytest.raises(gpufeed.InvalidArgumentError, match="unequal rows"):
        gjax.plan_feeds(12, [("a", 0, 4), ("b", 4, 12)])
    with pytest.raises(gpufeed.InvalidArgumentError, match="does not split evenly"):
        gjax.plan_feeds(10, [("a", 0, 4)])
    with pytest.raises(gpufeed.InvalidArgumentError, match="not a block"):
        gjax.plan_feeds(12, [("a", 2, 6)])
    with pytest.raises(gpufeed.InvalidArgumentError, match="no device"):
        gjax.plan_feeds(12, [])
    with pytest.raises(gpufeed.InvalidArgumentError, match="global batch"):
        gjax.plan_feeds(0, [("a", 0, 4)])
    # A 2-D mesh (batch x model): devices along the model axis hold the same
    # rows and read the same rank.
    feeds = gjax.plan_feeds(8, [("a", 0, 4), ("b", 0, 4), ("c", 4, 8), ("d", 4, 8)])
    assert [(f.rank, f.world_size) for f in feeds] == [(0, 2), (0, 2), (1, 2), (1, 2)]


class _Dev:
    def __init__(self, i):
        self.id = i

    def __repr__(self):
        return "dev%d" % self.id


class _Sharding:
    """What gpufeed.jax reads of a jax Sharding: addressable_devices_indices_map."""

    def __init__(self, index_map):
        self.index_map = index_map

    def addressable_devices_indices_map(self, shape):
        return self.index_map


def test_rows_come_from_the_shardings_index_map_in_device_order():
    d = [_Dev(i) for i in range(4)]
    # Process 1 of 2 holds devices 2 and 3 (listed out of order): rows 16-23 and 24-31 of 32.
    rows = gjax._rows_of(_Sharding({d[3]: (slice(24, 32),), d[2]: (slice(16, 24),)}), 32)
    assert rows == [(d[2], 16, 24), (d[3], 24, 32)]
    assert [(f.rank, f.world_size) for f in gjax.plan_feeds(32, rows)] == [(2, 4), (3, 4)]
    # A replicated batch (no batch axis): every device reads the whole batch as rank 0 of 1.
    rows = gjax._rows_of(_Sharding({d[0]: (slice(None),), d[1]: (slice(None),)}), 8)
    assert [(f.rank, f.world_size, f.start, f.stop) for f in gjax.plan_feeds(8, rows)] == [(0, 1, 0, 8)] * 2
    with pytest.raises(gpufeed.InvalidArgumentError, match="strided"):
        gjax._rows_of(_Sharding({d[0]: (slice(0, 8, 2),)}), 8)


def _global_batches(data, batch, devices, processes, **opts):
    """Every global batch of one epoch, as the plan's feeds read them
    (gpufeed.Loaders on the CPU, NumPy): [[sample index of each row]]."""
    feeds = []
    for p in range(processes):
        rows = gjax.default_rows(batch, list(range(devices)), p, processes)
        feeds += gjax.plan_feeds(batch, rows)
    loaders = [gpufeed.Loader(data, batch_size=f.stop - f.start, rank=f.rank, world_size=f.world_size,
                              output="numpy", **dict(OPTS, **opts)) for f in feeds]
    out = []
    for parts in zip(*[iter(loader) for loader in loaders]):
        assert len({len(images) for images, _ in parts}) == 1, "devices got different row counts"
        row = []
        for (images, labels), f in sorted(zip(parts, feeds), key=lambda x: x[1].rank):
            ks = [index_of(r) for r in images]
            assert list(labels) == [k % 10 for k in ks]
            row += ks
        out.append(row)
    lens = [len(loader) for loader in loaders]
    assert len(set(lens)) == 1 and len(out) == lens[0]
    return out


@pytest.mark.parametrize("devices,processes", [(2, 1), (4, 1), (2, 2)])
def test_feeds_of_the_plan_read_every_sample_once(tmp_path, devices, processes):
    from conftest import write_index_file
    world = devices * processes
    n = 8 * world * 5  # divides evenly: every sample exactly once, no padding
    data = write_index_file(tmp_path / ("even%d.h5" % n), n=n)
    got = [k for b in _global_batches(data, 8 * world, devices, processes) for k in b]
    assert sorted(got) == list(range(n))


def test_feeds_pad_an_uneven_epoch_as_ranks_do(index_file):
    """N = 250 over 4 devices: each reads ceil(250 / 4) = 63, the short
    shares padded from the epoch's start (DistributedSampler's rule), 2
    samples twice; every sample at least once. drop_last=True: 62 each,
    rounded down to whole batches, none twice."""
    got = [k for b in _global_batches(index_file, 32, 4, 1) for k in b]
    counts = np.bincount(got, minlength=N_SAMPLES)
    assert len(got) == 4 * 63 and (counts >= 1).all() and (counts == 2).sum() == 4 * 63 - N_SAMPLES
    dropped = _global_batches(index_file, 32, 4, 1, drop_last=True)
    flat = [k for b in dropped for k in b]
    assert all(len(b) == 32 for b in dropped) and len(flat) == len(set(flat)) == 4 * 56


# -- the module without JAX -----------------------------------------------------

NO_JAX_CHILD = r"""
import sys
sys.modules["jax"] = None  # import jax now raises ImportError: a machine without JAX
import gpufeed
assert "gpufeed.jax" not in sys.modules, "import gpufeed imported gpufeed.jax"
import gpufeed.jax
try:
    gpufeed.jax.Loader(%(data)r, batch_size=32)
except ImportError as e:
    print("ImportError", e.name, e)
"""


def test_module_imports_without_jax_and_names_it_when_used(index_file):
    out = run_python(NO_JAX_CHILD % {"data": index_file})
    assert out.startswith("ImportError jax "), out
    assert "pip install" in out and "gpufeed.Loader" in out


def test_import_gpufeed_does_not_import_jax():
    out = run_python("import sys, gpufeed; print('jax' in sys.modules, 'gpufeed.jax' in sys.modules)")
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize("script", ["examples/jax_train.py", "examples/lightning_train.py",
                                    "tests/python/jax_check.py", "bench/peer/jax_resnet.py",
                                    "bench/peer/lightning_resnet.py", "scripts/gpu-host-jax"])
def test_jax_and_lightning_scripts_compile(script):
    """They run on the GPU host (scripts/gpu-host-jax); here they must at least compile."""
    path = ROOT / script
    if path.suffix == ".py":
        compile(path.read_text(), str(path), "exec")  # a SyntaxError fails the test
    else:
        p = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr


# -- with JAX (the GPU host) ----------------------------------------------------


def _jax_check(args, env=None, timeout=600):
    full = dict(os.environ, PYTHONPATH=python_path(), **(env or {}))
    p = subprocess.run([sys.executable, str(ROOT / "tests/python/jax_check.py")] + args, env=full,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, "jax_check failed (%d):\n%s\n%s" % (p.returncode, p.stdout[-4000:], p.stderr[-4000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def _have_jax():
    try:
        import jax  # noqa: F401
        return True
    except ImportError:
        return False


needs_jax = pytest.mark.skipif(not _have_jax(), reason="JAX is not installed here (the GPU host runs these)")


@needs_jax
@pytest.mark.parametrize("dtype", [None, "float32", "bfloat16"])
def test_jax_on_four_cpu_devices(index_file, dtype):
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    r = _jax_check(["--data", index_file, "--batch-size", "32", "--devices", "4"] + (
        ["--dtype", dtype] if dtype else []), env=env)
    assert r["devices"] == 4 and r["platform"] == "cpu"
    assert r["every_sample"] and r["same_pointer_first_device"] and r["resume_ok"], r


@needs_jax
def test_jax_on_every_gpu(index_file):
    import jax
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("no GPU for JAX here")
    r = _jax_check(["--data", index_file, "--batch-size", str(4 * len(gpus)), "--devices", str(len(gpus)),
                    "--dtype", "bfloat16", "--queued"])
    assert r["platform"] == "gpu" and r["every_sample"] and r["same_pointer"] and r["resume_ok"] and r["queued_ok"], r
