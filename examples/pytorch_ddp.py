#!/usr/bin/env python3
"""Data-parallel PyTorch training fed by gpufeed: one process a GPU under
torchrun, the node's ranks reading through one shared decode.

    .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 --redirects 1 --tee 1 \
        examples/pytorch_ddp.py --train fm-train.h5 --test fm-test.h5

(torchrun through the Python that has gpufeed; --redirects 1 --tee 1 for
Debian's torch 1.13 on Python 3.11: README.md "Many GPUs". fm-*.h5 as
examples/pytorch_train.py makes them.) Each rank's
gpufeed.Loader takes its rank and world size from torchrun's environment and,
with more than one local rank, share="node" by default: the first rank to
open the file starts a node-local `gpufeed serve`, the others attach to it,
and it ends after the last rank. Each rank keeps its own shard, pinned slots
and GPU feed. Every rank gets the same number of batches (the short shard is
padded, as DistributedSampler does), so no all-reduce waits on a rank with
one batch fewer; each epoch's sample count and every rank's batch count are
all-reduced and checked. On CPUs (--device cpu, the gloo backend) it is
CI's test of the same path (--min-accuracy).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import gpufeed


class SmallCNN(nn.Module):
    """examples/pytorch_train.py's CNN for any channel count and image size
    (Fashion-MNIST's 1 x 28 x 28, or CelebA-shaped 3 x 218 x 178)."""

    def __init__(self, channels=1, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(7)
        self.fc = nn.Linear(16 * 7 * 7, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(self.pool(x).flatten(1))


def all_sum(values, device):
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def evaluate(model, loader, device):
    """Accuracy over the test set, each rank scoring its shard (when the
    ranks do not divide it, the padding rows of the short shard count too)."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(1) == labels).sum().item()
            total += labels.numel()
    model.train()
    correct, total = all_sum([correct, total], device)
    return correct / total


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128, help="per rank")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--threads", type=int, default=0, help="loader threads per rank (0: the node's cores, shared)")
    p.add_argument("--share", default="auto", help="auto, node or none (gpufeed.Loader's share=)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--min-accuracy", type=float, help="exit 1 unless the final test accuracy reaches this")
    a = p.parse_args()

    cuda = a.device.startswith("cuda")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    feed = dict(device="cuda" if cuda else "cpu", dtype=torch.float32, threads=a.threads, share=a.share)
    # rank and world_size come from torch.distributed; each rank its shard.
    train = gpufeed.Loader(a.train, batch_size=a.batch_size, order="block", seed=0, **feed)
    test = gpufeed.Loader(a.test, batch_size=1000, order="sequential", **feed)
    torch.manual_seed(0)
    model = SmallCNN(train.sample_shape[0], a.classes).to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr * world)
    if local_rank == 0:
        print("node %s: %d ranks in all, %s; train: %d samples, %d batches a rank, share=%r" % (
            os.environ.get("GROUP_RANK", "0"), world, device.type, train.num_samples, len(train), train.share),
            flush=True)
    acc = 0.0
    for epoch in range(a.epochs):
        train.set_epoch(epoch)  # every rank reshuffles alike
        t0, seen, steps = time.time(), 0, 0
        for images, labels in train:
            loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen += labels.numel()
            steps += 1
        seconds = time.time() - t0
        seen_all = all_sum([seen], device)[0]
        counts = torch.tensor([steps], device=device)
        lo, hi = counts.clone(), counts.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        steps_min, steps_max = int(lo), int(hi)
        if steps_min != steps_max:
            raise SystemExit("epoch %d: ranks ran %d to %d batches" % (epoch, steps_min, steps_max))
        padded = world * ((train.num_samples + world - 1) // world)
        if int(seen_all) != padded:
            raise SystemExit("epoch %d: the ranks delivered %d samples, want %d (the file's %d, padded)" % (
                epoch, seen_all, padded, train.num_samples))
        acc = evaluate(model, test, device)
        if rank == 0:
            print("epoch %d: %d samples over %d ranks in %.1f s (%.0f samples/s), test accuracy %.4f" % (
                epoch, seen_all, world, seconds, seen_all / max(seconds, 1e-9), acc), flush=True)
    train.close()
    test.close()
    # Teardown in this order: the DDP module (its reducer holds the process
    # group) while the group is still registered, then the group once no
    # collective is in flight (torch 1.13's gloo group, freed last by the
    # reducer at exit, could wait for the GIL its own destructor held).
    dist.barrier()
    del model, opt
    dist.destroy_process_group()
    if a.min_accuracy is not None and acc < a.min_accuracy:
        print("test accuracy %.4f < %.2f" % (acc, a.min_accuracy), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
