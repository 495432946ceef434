#!/usr/bin/env python3
"""ResNet-18 in JAX (Flax linen, bf16, NHWC, optax AdamW) fed three ways, in
one run, on every GPU JAX sees (one process; the batch sharded over a Mesh,
the parameters replicated, XLA's partitioner adding the all-reduce):

  ceiling  the same batches already on the devices (the whole file
           normalized bf16 on each device, a permutation per epoch gathered
           on the device): the model's compute ceiling
  gpufeed  gpufeed.jax.Loader(dtype=bf16, layout="NHWC"): each device's rows
           from its own feed, zero-copy through DLPack
  h5py     the h5py reader a JAX user writes without a GPU loader (Grain is
           not on the GPU host): a thread reading each batch's sorted random
           indices from h5py (a chunk cache holding the decoded file),
           jax.device_put of the uint8 batch, normalized and transposed on
           the device

Per mode and epoch: samples/s and the share of the ceiling (epochs 2 on).
An epoch counts only when it delivered what the file holds (the count, and
the sum of labels where the devices divide the file); an epoch of the h5py
peer cut at --max-seconds is reported as partial, its rate over what it
delivered.

  PYTHONPATH=dist/gpufeed/python python3 bench/peer/jax_resnet.py --data celeba-deflate.h5 --epochs 3 --threads 16
"""
import argparse
import json
import queue
import sys
import threading
import time

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import gpufeed.jax

BF16 = jnp.bfloat16


class Block(nn.Module):
    filters: int
    strides: int

    @nn.compact
    def __call__(self, x, train):
        norm = lambda: nn.BatchNorm(use_running_average=not train, momentum=0.9, dtype=BF16)  # noqa: E731
        y = nn.Conv(self.filters, (3, 3), self.strides, padding=1, use_bias=False, dtype=BF16)(x)
        y = nn.relu(norm()(y))
        y = norm()(nn.Conv(self.filters, (3, 3), 1, padding=1, use_bias=False, dtype=BF16)(y))
        if x.shape != y.shape:
            x = norm()(nn.Conv(self.filters, (1, 1), self.strides, use_bias=False, dtype=BF16)(x))
        return nn.relu(x + y)


class ResNet18(nn.Module):
    classes: int

    @nn.compact
    def __call__(self, x, train=True):
        x = nn.Conv(64, (7, 7), 2, padding=3, use_bias=False, dtype=BF16)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9, dtype=BF16)(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
        for i, filters in enumerate((64, 128, 256, 512)):
            for j in range(2):
                x = Block(filters, 2 if i > 0 and j == 0 else 1)(x, train)
        return nn.Dense(self.classes, dtype=jnp.float32)(jnp.mean(x, axis=(1, 2)))


def describe(path):
    with h5py.File(path, "r") as f:
        labels = f["labels"][...].astype(np.int64)
        shape = f["images"].shape
        mean = [float(v) for v in f["images"].attrs.get("mean", [0.0] * shape[1])]
        std = [float(v) for v in f["images"].attrs.get("std", [255.0] * shape[1])]
    if len(mean) == 1 and shape[1] != 1:
        mean, std = mean * shape[1], std * shape[1]
    return labels, shape, mean, std


def make_step(model, tx):
    def step(params, stats, opt_state, images, labels):
        def loss_fn(p):
            logits, new = model.apply({"params": p, "batch_stats": stats}, images, train=True,
                                      mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), new["batch_stats"]

        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1, 2))


def run(name, batches_for_epoch, shape, classes, epochs, want, replicated, max_seconds):
    model = ResNet18(classes)
    tx = optax.adamw(1e-3)
    variables = model.init(jax.random.PRNGKey(0), jnp.zeros((2, shape[2], shape[3], shape[1]), BF16))
    params, stats = variables["params"], variables["batch_stats"]
    opt_state = tx.init(params)
    params, stats, opt_state = jax.device_put((params, stats, opt_state), replicated)
    step = make_step(model, tx)
    out = []
    for epoch in range(epochs):
        n = 0
        label_sum = jnp.zeros((), jnp.int32)
        partial = False
        jax.block_until_ready(params)
        t0 = time.perf_counter()
        for images, labels in batches_for_epoch(epoch):
            params, stats, opt_state, loss = step(params, stats, opt_state, images, labels)
            n += labels.shape[0]
            label_sum = label_sum + jnp.sum(labels)
            if max_seconds and time.perf_counter() - t0 > max_seconds:
                partial = True
                break
        jax.block_until_ready((params, loss))
        seconds = time.perf_counter() - t0
        got = (n, int(label_sum))
        if not partial and (got[0] != want[0] or (want[1] is not None and got[1] != want[1])):
            raise SystemExit("%s: epoch %d delivered %d samples, label sum %d; want %s" % (
                name, epoch + 1, got[0], got[1], want))
        out.append({"samples_per_s": n / seconds, "seconds": seconds, "samples": n, "partial": partial})
        print("  %-8s epoch %d: %8.0f samples/s  %.1f s%s" % (
            name, epoch + 1, n / seconds, seconds, "  (partial: cut at %d s)" % max_seconds if partial else ""),
            flush=True)
        if partial and epoch >= 1:
            break
    return {"epochs": out}


def h5py_batches(path, n, batch_size, epoch, sharding, decoded_bytes, depth=4):
    """Batches of a random permutation, each read as its sorted indices by a
    reader thread (h5py's chunk cache sized to hold the decoded file), then
    jax.device_put over the sharding."""
    q = queue.Queue(depth)
    stop = threading.Event()

    def reader():
        try:
            with h5py.File(path, "r", rdcc_nbytes=decoded_bytes, rdcc_w0=1.0, rdcc_nslots=1000003) as f:
                images, labels = f["images"], f["labels"]
                perm = np.random.default_rng(epoch).permutation(n)
                for s in range(0, n - n % batch_size if n >= batch_size else n, batch_size):
                    if stop.is_set():
                        return
                    idx = np.sort(perm[s:s + batch_size])
                    q.put((images[idx], labels[idx].astype(np.int32)))
        except BaseException as e:  # noqa: BLE001 (handed to the consumer)
            q.put(e)
            return
        q.put(None)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield jax.device_put(item[0], sharding), jax.device_put(item[1], sharding)
    finally:
        stop.set()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256, help="per device")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--devices", type=int, default=0, help="the first N of jax.devices() (0: all)")
    p.add_argument("--modes", default="ceiling,gpufeed,h5py")
    p.add_argument("--max-seconds", type=float, default=0, help="cut the h5py peer's epochs after this long")
    p.add_argument("--json")
    a = p.parse_args()
    labels, shape, mean, std = describe(a.data)
    n, classes = len(labels), int(labels.max()) + 1
    devices = jax.devices()[:a.devices or None]
    mesh = Mesh(np.asarray(devices), ("batch",))
    batch_sh, replicated = NamedSharding(mesh, PartitionSpec("batch")), NamedSharding(mesh, PartitionSpec())
    g = len(devices) * a.batch_size
    # drop_last: the loaders give whole global batches only (jit compiles one shape).
    per_dev = (n // len(devices)) // a.batch_size * a.batch_size
    want = (per_dev * len(devices), None)
    print("%s: %d samples %s, %d classes; jax %s on %d x %s, global batch %d" % (
        a.data, n, list(shape[1:]), classes, jax.__version__, len(devices), devices[0].device_kind, g), flush=True)
    mean_d = jnp.asarray(mean, jnp.float32)
    std_d = jnp.asarray(std, jnp.float32)

    @jax.jit
    def normalize(x):  # uint8 NCHW -> bf16 NHWC, on the device
        x = (jnp.transpose(x, (0, 2, 3, 1)).astype(jnp.float32) - mean_d) / std_d
        return jax.lax.with_sharding_constraint(x.astype(BF16), batch_sh)

    opts = dict(order="block", seed=0, dtype="bfloat16", layout="NHWC", mean=mean, std=std, drop_last=True,
                threads=a.threads, mesh=mesh)
    results = {}
    for mode in a.modes.split(","):
        if mode == "ceiling":
            loader = gpufeed.jax.Loader(a.data, batch_size=len(devices) * 128, **dict(opts, order="sequential",
                                                                                      drop_last=False))
            parts, lparts = [], []
            for x, y in loader:
                # Copies: on one device device_put(x, replicated) is x itself,
                # which would keep every one of the loader's slots.
                parts.append(jax.device_put(jnp.copy(x), replicated))
                lparts.append(jax.device_put(jnp.copy(y), replicated))
            loader.close()
            all_x, all_y = jnp.concatenate(parts), jnp.concatenate(lparts)
            del parts, lparts
            take = jax.jit(lambda x, y, i: (x[i], y[i]), out_shardings=(batch_sh, batch_sh))

            def batches(epoch):
                perm = jax.device_put(np.random.default_rng(epoch).permutation(all_x.shape[0])[:want[0]], replicated)
                for s in range(0, want[0], g):
                    yield take(all_x, all_y, perm[s:s + g])
            r = run(mode, batches, shape, classes, a.epochs, want, replicated, 0)
            del all_x, all_y
        elif mode == "gpufeed":
            loader = gpufeed.jax.Loader(a.data, batch_size=g, cache_bytes=int(min(n * np.prod(shape[1:]) * 1.25,
                                                                                   64 << 30)), **opts)

            def batches(epoch):
                loader.set_epoch(epoch)
                return iter(loader)
            r = run(mode, batches, shape, classes, a.epochs, want, replicated, 0)
            r["stats"] = loader.stats()
            loader.close()
        elif mode == "h5py":
            decoded = int(n * np.prod(shape[1:]) * 1.1)

            def batches(epoch):
                for x, y in h5py_batches(a.data, want[0], g, epoch, batch_sh, decoded):
                    yield normalize(x), y
            r = run(mode, batches, shape, classes, a.epochs, want, replicated, a.max_seconds)
        else:
            raise SystemExit("unknown mode " + mode)
        results[mode] = r
    ceiling = results.get("ceiling")
    ceil_later = None
    if ceiling:
        later = [e["samples_per_s"] for e in ceiling["epochs"][1:]] or [ceiling["epochs"][0]["samples_per_s"]]
        ceil_later = sum(later) / len(later)
    print("\n%s (%d samples), Flax ResNet-18 bf16 NHWC, %d devices, global batch %d" % (a.data, n, len(devices), g))
    print("  %-8s %12s %12s %9s" % ("feed", "epoch1 /s", "later /s", "of ceil"))
    for mode, r in results.items():
        e = r["epochs"]
        later = e[1:] or e[:1]
        rate = sum(x["samples_per_s"] for x in later) / len(later)
        r["later_samples_per_s"] = rate
        r["share_of_ceiling"] = rate / ceil_later if ceil_later else float("nan")
        print("  %-8s %12.0f %12.0f %8.1f%%%s" % (mode, e[0]["samples_per_s"], rate, 100 * r["share_of_ceiling"],
                                                 "  partial" if any(x["partial"] for x in e) else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"data": a.data, "samples": n, "devices": len(devices), "device_kind": devices[0].device_kind,
                       "batch_size_per_device": a.batch_size, "threads": a.threads, "jax": jax.__version__,
                       "results": results}, f, indent=2, default=str)


if __name__ == "__main__":
    sys.exit(main())
