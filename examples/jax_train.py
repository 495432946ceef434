#!/usr/bin/env python3
"""A Flax/optax training loop fed by gpufeed.jax: a small CNN on Fashion-MNIST.

    scripts/demo   # converts Fashion-MNIST: data/fashion-mnist-train.h5, data/fashion-mnist-t10k.h5
    PYTHONPATH=python python3 examples/jax_train.py --train data/fashion-mnist-train.h5 \
        --test data/fashion-mnist-t10k.h5

The same network as examples/pytorch_train.py (two 3x3 convolutions with
max pooling, one dense layer), in Flax's linen API, trained with optax's
Adam. Each batch is a jax.Array made from gpufeed's device buffers with no
copy, normalized on the GPU (NHWC, as Flax's convolutions take it) and
sharded along the batch axis over every device JAX sees: one jit-compiled
step trains data-parallel on 1 or N GPUs (the parameters replicated, XLA's
partitioner inserting the gradient all-reduce). Under jax.distributed
(several hosts) each process feeds its own devices' rows. On CPU-only JAX
the CPU feed normalizes and the arrays are host arrays.

Checkpoints (--checkpoint) hold the parameters, the optimizer state and the
loader's state_dict() (plain JSON values), so a run resumes mid-epoch with
the same remaining batches. --min-accuracy makes the script a test.
"""
import argparse
import json
import os
import pickle
import sys
import time

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec

import gpufeed.jax


class SmallCNN(nn.Module):
    classes: int = 10

    @nn.compact
    def __call__(self, x):  # x: [B, H, W, C]
        x = nn.max_pool(nn.relu(nn.Conv(8, (3, 3), padding="SAME")(x)), (2, 2), strides=(2, 2))
        x = nn.max_pool(nn.relu(nn.Conv(16, (3, 3), padding="SAME")(x)), (2, 2), strides=(2, 2))
        return nn.Dense(self.classes)(x.reshape((x.shape[0], -1)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True, help="gpufeed convert output (or unix:/tcp:// daemon with --dataset)")
    p.add_argument("--dataset", help="with a daemon --train: the dataset to read there")
    p.add_argument("--test", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256, help="the global batch (a multiple of the devices)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=0, help="loader threads (0: the host's cores, shared)")
    p.add_argument("--checkpoint", help="save params, optimizer and loader state after each epoch; resume if present")
    p.add_argument("--min-accuracy", type=float, help="exit 1 unless the final test accuracy reaches this")
    a = p.parse_args()

    # Normalized float32 NHWC batches (the file's mean/std attributes, written
    # by gpufeed convert); drop_last keeps one shape, so jit compiles once.
    train = gpufeed.jax.Loader(a.train, dataset=a.dataset, batch_size=a.batch_size, order="block", seed=0,
                               threads=a.threads, dtype=jnp.float32, layout="NHWC", drop_last=True)
    test = gpufeed.jax.Loader(a.test, batch_size=1000, order="sequential", threads=a.threads, dtype=jnp.float32,
                              layout="NHWC")
    replicated = NamedSharding(train.mesh, PartitionSpec())
    model = SmallCNN()
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + tuple(train.sample_shape[1:]) +
                                                         (train.sample_shape[0],), jnp.float32))["params"]
    tx = optax.adam(a.lr)
    opt_state = tx.init(params)

    start_epoch = 0
    if a.checkpoint and os.path.exists(a.checkpoint):
        with open(a.checkpoint, "rb") as f:
            ckpt = pickle.load(f)
        params, opt_state = ckpt["params"], ckpt["opt_state"]
        state = json.loads(ckpt["loader"])
        train.load_state_dict(state)
        start_epoch = state["epoch"]
        print("resumed at epoch %d, batch %d" % (start_epoch, state["batch"]))
    params, opt_state = jax.device_put((params, opt_state), replicated)

    @jax.jit
    def train_step(params, opt_state, images, labels):
        def loss_fn(p):
            logits = model.apply({"params": p}, images)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def correct(params, images, labels):
        return jnp.sum(jnp.argmax(model.apply({"params": params}, images), -1) == labels)

    def evaluate(params):
        right = total = 0
        for images, labels in test:
            right += correct(params, images, labels)
            total += labels.shape[0]
        return float(right) / total

    print("%d devices (%s), global batch %d, %d a device; train %d samples, %d batches an epoch" % (
        len(train.mesh.devices.flat), jax.default_backend(), train.batch_size, train.local_batch_size,
        train.num_samples, len(train)), flush=True)
    acc = 0.0
    for epoch in range(start_epoch, a.epochs):
        train.set_epoch(epoch)
        t0, seen, steps = time.time(), 0, 0
        loss_sum = jnp.zeros((), jnp.float32)
        for images, labels in train:
            params, opt_state, loss = train_step(params, opt_state, images, labels)
            loss_sum += loss  # on the device: no host sync a step
            seen += images.shape[0]
            steps += 1
        loss_mean = float(loss_sum) / max(1, steps)
        train_s = time.time() - t0
        acc = evaluate(params)
        print("epoch %d: loss %.4f, %d samples in %.1f s (%.0f samples/s), test accuracy %.4f" % (
            epoch, loss_mean, seen, train_s, seen / max(train_s, 1e-9), acc), flush=True)
        if a.checkpoint:
            with open(a.checkpoint + ".tmp", "wb") as f:
                pickle.dump({"params": jax.device_get(params), "opt_state": jax.device_get(opt_state),
                             "loader": json.dumps(train.state_dict())}, f)
            os.replace(a.checkpoint + ".tmp", a.checkpoint)
    train.close()
    test.close()
    if a.min_accuracy is not None and acc < a.min_accuracy:
        print("test accuracy %.4f < %.2f" % (acc, a.min_accuracy), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
