#!/usr/bin/env python3
"""gpufeed.jax checked where JAX is (the GPU host; tests/python/test_jax.py
runs it in a child): two epochs of an index-valued HDF5 file as jax.Arrays
sharded over the first --devices devices, and a JSON line of what was seen.

    PYTHONPATH=dist/gpufeed/python python3 tests/python/jax_check.py --data index.h5 --batch-size 32 --devices 4
    JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4 python3 tests/python/jax_check.py ...

Checked: every sample once an epoch (the short shares padded as ranks pad),
labels with their samples, each device's shard is the buffer of that
device's feed slot (unsafe_buffer_pointer() equals the DLPack tensor's data
pointer: no copy; on CPU-only JAX the first device's only), the global array's sharding, dtype, a state_dict through
JSON resuming the same remaining batches in a second Loader, and with
--queued a batch freed while a slow step that reads it is still queued on
the device, then slots + 2 more batches taken: the step must still read its
own batch's values (the slot is not reused under it) and the loader must
wait for slots rather than raise. Without --data it writes its own file
(sample k's first three bytes hold k).
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

SHAPE = (3, 6, 5)


def sample_bytes(k):
    n = int(np.prod(SHAPE))
    a = (7 * k + np.arange(n)) % 256
    a[0], a[1], a[2] = k & 0xFF, (k >> 8) & 0xFF, (k >> 16) & 0xFF
    return a.astype(np.uint8).reshape(SHAPE)


def write_file(path, n):
    import h5py
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=np.stack([sample_bytes(k) for k in range(n)]), chunks=(16,) + SHAPE,
                         compression="gzip")
        f.create_dataset("labels", data=np.arange(n, dtype=np.int64) % 10)


def indices_of(images):
    """Sample indices of a batch (uint8 as stored, or floats of mean 0 / std 1: the same integers)."""
    a = np.asarray(images.astype("float32") if images.dtype != np.uint8 else images)
    flat = np.rint(a.reshape(a.shape[0], -1)[:, :3]).astype(np.int64)
    return flat[:, 0] | flat[:, 1] << 8 | flat[:, 2] << 16


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data")
    p.add_argument("--samples", type=int, default=250)
    p.add_argument("--batch-size", type=int, default=32, help="the global batch")
    p.add_argument("--devices", type=int, default=0, help="the first N of jax.devices() (0: all)")
    p.add_argument("--dtype", help="float32, float16 or bfloat16 (default: uint8 as stored on the CPU)")
    p.add_argument("--queued", action="store_true", help="also the freed-while-queued check")
    a = p.parse_args()

    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh
    import gpufeed.jax

    tmp = tempfile.TemporaryDirectory()
    data = a.data
    if data is None:
        data = os.path.join(tmp.name, "index.h5")
        write_file(data, a.samples)
    import h5py
    with h5py.File(data, "r") as f:
        n = f["images"].shape[0]
    devices = jax.devices()[:a.devices or None]
    mesh = Mesh(np.asarray(devices), ("batch",))
    opts = dict(batch_size=a.batch_size, mesh=mesh, order="block", seed=5, threads=2, shuffle_window=3)
    if a.dtype or devices[0].platform == "gpu":
        opts.update(dtype=a.dtype or "float32", mean=[0.0] * SHAPE[0], std=[1.0] * SHAPE[0])
    loader = gpufeed.jax.Loader(data, **opts)
    world = loader.plan[0].world_size
    per_rank = -(-n // world)
    report = {"devices": len(devices), "platform": devices[0].platform, "jax": jax.__version__,
              "batches": len(loader), "world": world}
    same_pointer = same_first = True
    every = True
    first_epoch = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        counts = np.zeros(n, np.int64)
        for images, labels in loader:
            assert isinstance(images, jax.Array) and images.shape[0] % world == 0, images.shape
            if len(devices) > 1:
                assert images.sharding.is_equivalent_to(loader.sharding, images.ndim), images.sharding
            by_device = {s.device: s.data.unsafe_buffer_pointer() for s in images.addressable_shards}
            want = dict(zip([f.device for f in loader.plan], loader.last_slot_pointers["images"]))
            same_pointer &= by_device == want
            first = loader.plan[0].device
            same_first &= by_device[first] == want[first]
            ks = indices_of(images)
            assert np.array_equal(np.asarray(labels), ks % 10), "labels are not their samples'"
            if a.dtype:
                assert images.dtype == jnp.dtype(a.dtype), images.dtype
            counts += np.bincount(ks, minlength=n)
            if epoch == 0:
                first_epoch.append(ks)
            del images, labels
        every &= bool((counts >= 1).all() and counts.sum() == world * per_rank)
    # On CPU-only JAX only the first CPU device views the slot (JAX takes a
    # DLPack host tensor as CPU device 0's; the others get copies).
    report.update(every_sample=every, same_pointer=same_pointer, same_pointer_first_device=same_first)

    # state_dict through JSON: a second Loader resumes epoch 0 after 3 batches.
    loader.set_epoch(0)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    second = gpufeed.jax.Loader(data, **opts)
    second.load_state_dict(state)
    rest = [indices_of(x) for x, _ in second]
    report["resume_ok"] = len(rest) == len(first_epoch) - 3 and all(
        np.array_equal(x, y) for x, y in zip(rest, first_epoch[3:]))
    second.close()

    if a.queued:
        report["queued_ok"] = queued_check(jax, jnp, loader)
    loader.close()
    print(json.dumps(report))
    zero_copy = report["same_pointer"] if report["platform"] == "gpu" else report["same_pointer_first_device"]
    ok = report["every_sample"] and zero_copy and report["resume_ok"] and report.get("queued_ok", True)
    return 0 if ok else 1


def queued_check(jax, jnp, loader):
    """A step reading a batch is queued behind a long computation; the batch
    is freed at once and slots + 2 more batches are taken while the step
    waits on the device. The step must still read its own batch."""

    @jax.jit
    def slow_sum(w, x):
        for _ in range(64):  # about 0.1 s of matrix products on one GPU before x is read
            w = jnp.tanh(w @ w)
        scale = 1.0 + 0.0 * jnp.sum(w)  # x's read waits for the products
        return jnp.sum(x.astype(jnp.float32) * scale)

    from jax.sharding import NamedSharding, PartitionSpec
    w = jax.device_put(jnp.full((4096, 4096), 1e-3, jnp.float32), NamedSharding(loader.mesh, PartitionSpec()))
    loader.set_epoch(3)
    it = iter(loader)
    images, _ = next(it)
    ks = indices_of(images)  # read before the step: what the batch must sum to
    want = float(sum(sample_bytes(int(k)).astype(np.float64).sum() for k in ks))
    slow_sum(w, images).block_until_ready()  # compiled
    t0 = time.time()
    result = slow_sum(w, images)
    del images
    taken = 0
    for x, _ in it:  # while the step is queued: the loader may not reuse its slot
        taken += 1
        if taken >= loader._slots + 2:
            break
    got = float(result)
    it.close()
    print("queued: %d batches taken behind the step, %.2f s; sum %.1f want %.1f" % (
        taken, time.time() - t0, got, want), file=sys.stderr)
    return abs(got - want) <= 1e-6 * max(1.0, abs(want)) * 10 and taken >= loader._slots + 2


if __name__ == "__main__":
    sys.exit(main())
