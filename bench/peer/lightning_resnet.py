#!/usr/bin/env python3
"""ResNet-18 under PyTorch Lightning, Trainer(strategy="ddp", devices=G,
precision="bf16-mixed"), fed one way per run:

  ceiling  each rank's shard already on its GPU (normalized bf16, the whole
           file on each GPU, a permutation per epoch common to the ranks):
           the model's compute ceiling under Lightning at G GPUs
  gpufeed  a gpufeed.Loader per rank (examples/lightning_train.py's
           LightningDataModule: the rank and world size from the trainer,
           Lightning's sampler off), bf16 NHWC on the GPU

  python3 bench/peer/lightning_resnet.py --data celeba-deflate.h5 --devices 2 --mode gpufeed --json out.json

The model is bench/peer/torch_resnet.py's (channels-last, AdamW); epoch 1
holds cuDNN's autotuning, so epochs 2 on are compared. Every epoch is
checked across ranks (the sample count and, where the ranks divide the file,
the label sum, summed over the ranks, must be the file's) before rank 0
reports it: samples/s of the job per epoch (the slowest rank's wall time).
"""
import argparse
import json
import os
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

try:
    import lightning.pytorch as pl
except ImportError:  # the package's older name
    import pytorch_lightning as pl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from torch_resnet import describe, on_gpu, resnet18  # noqa: E402

import gpufeed  # noqa: E402


class Batches(torch.utils.data.IterableDataset):
    """An epoch's batches from `make(epoch)`, the epoch the trainer's."""

    def __init__(self, make, length, trainer):
        super().__init__()
        self.make, self.length, self.trainer = make, length, trainer

    def __iter__(self):
        return iter(self.make(self.trainer.current_epoch))

    def __len__(self):
        return self.length


class Data(pl.LightningDataModule):
    def __init__(self, a, mean, std, n):
        super().__init__()
        self.a, self.mean, self.std, self.n = a, mean, std, n
        self.loader = None

    def setup(self, stage=None):
        t, a = self.trainer, self.a
        rank, world = t.global_rank, t.world_size
        dev = t.strategy.root_device
        self.share = -(-self.n // world)
        if a.mode == "ceiling":
            torch.cuda.set_device(dev)
            images, labels = on_gpu(a.data, self.mean, self.std)

            def make(epoch):
                g = torch.Generator(device=dev)
                g.manual_seed(epoch)
                perm = torch.randperm(self.n, device=dev, generator=g)
                perm = torch.cat([perm, perm[:self.share * world - self.n]])[rank * self.share:(rank + 1) * self.share]
                for s in range(0, self.share, a.batch_size):
                    i = perm[s:s + a.batch_size]
                    yield images[i].contiguous(memory_format=torch.channels_last), labels[i]
            self.batches = Batches(make, -(-self.share // a.batch_size), t)
        else:
            threads = a.threads or max(1, (os.cpu_count() or 1) // world)  # this rank's share of the cores
            self.loader = gpufeed.Loader(a.data, batch_size=a.batch_size, order="block", seed=0, threads=threads,
                                         rank=rank, world_size=world, device="cuda:%d" % dev.index,
                                         dtype=torch.bfloat16, layout="NHWC", mean=self.mean, std=self.std,
                                         share=a.share, cache_bytes=a.cache_bytes or "auto")

            def make(epoch):
                self.loader.set_epoch(epoch)
                for images, labels in self.loader:
                    yield images.permute(0, 3, 1, 2), labels.long()  # a channels-last NCHW view
            self.batches = Batches(make, len(self.loader), t)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.batches, batch_size=None, num_workers=0)


class Model(pl.LightningModule):
    def __init__(self, channels, classes, want):
        super().__init__()
        self.net, _ = resnet18(channels, classes)
        self.net = self.net.to(memory_format=torch.channels_last)
        self.want = want
        self.epochs = []

    def on_fit_start(self):
        torch.backends.cudnn.benchmark = True  # epoch 1 holds its autotuning: epochs 2+ are compared

    def on_train_epoch_start(self):
        self.count = torch.zeros(2, dtype=torch.float64, device=self.device)
        torch.cuda.synchronize()
        self.t0 = time.perf_counter()

    def training_step(self, batch, index):
        images, labels = batch
        self.count[0] += labels.shape[0]
        self.count[1] += labels.sum()
        return F.cross_entropy(self.net(images), labels)

    def on_train_epoch_end(self):
        torch.cuda.synchronize()
        seconds = torch.tensor(time.perf_counter() - self.t0, dtype=torch.float64, device=self.device)
        slowest = self.trainer.strategy.reduce(seconds, reduce_op="max")
        count = self.trainer.strategy.reduce(self.count, reduce_op="sum")
        samples, label_sum = int(count[0]), int(count[1])
        if samples != self.want[0] or (self.want[1] is not None and label_sum != self.want[1]):
            raise SystemExit("epoch %d delivered %d samples, label sum %d; want %s" % (
                self.current_epoch + 1, samples, label_sum, self.want))
        rate = samples / float(slowest)
        self.epochs.append({"samples_per_s": rate, "seconds": float(slowest), "samples": samples})
        if self.trainer.is_global_zero:
            print("  G=%d epoch %d: %8.0f samples/s  %.2f s" % (self.trainer.world_size, self.current_epoch + 1,
                                                             rate, float(slowest)), flush=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.net.parameters(), lr=1e-3)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--mode", required=True, choices=["ceiling", "gpufeed"])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--threads", type=int, default=0, help="gpufeed: loader threads a rank (0: the default split)")
    p.add_argument("--share", default="none", help="gpufeed.Loader's share= (none, node, auto)")
    p.add_argument("--cache-bytes", type=int, default=0, help="gpufeed: chunk cache (0: auto)")
    p.add_argument("--json")
    a = p.parse_args()
    labels, shape, mean, std = describe(a.data)
    n, channels, classes = len(labels), shape[1], int(labels.max()) + 1
    share = -(-n // a.devices)
    want = (share * a.devices, int(labels.sum()) if share * a.devices == n else None)
    model = Model(channels, classes, want)
    trainer = pl.Trainer(accelerator="gpu", devices=a.devices, strategy="ddp", precision="bf16-mixed",
                         max_epochs=a.epochs, use_distributed_sampler=False, num_sanity_val_steps=0,
                         enable_checkpointing=False, logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, datamodule=Data(a, mean, std, n))
    if trainer.is_global_zero:
        later = model.epochs[1:] or model.epochs
        rate = sum(e["samples_per_s"] for e in later) / len(later)
        print("%s G=%d %s: epochs 2+ %.0f samples/s" % (a.data, a.devices, a.mode, rate), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"data": a.data, "mode": a.mode, "devices": a.devices, "batch_size": a.batch_size,
                           "lightning": pl.__version__, "torch": torch.__version__, "epochs": model.epochs,
                           "later_samples_per_s": rate}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
