#!/usr/bin/env python3
"""PyTorch Lightning fed by gpufeed: a LightningDataModule over gpufeed.Loader,
trained under Trainer(strategy="ddp", devices=N).

    PYTHONPATH=python python3 examples/lightning_train.py --train fm-train.h5 --test fm-test.h5 --devices 2

(fm-*.h5 as examples/pytorch_train.py makes them.) Lightning starts the
ranks; in setup() each rank opens its gpufeed.Loader with the rank and world
size Lightning gives it (trainer.global_rank, trainer.world_size) and its
device (the strategy's root device), so each rank reads its own shard, every
rank the same number of batches, each sample once an epoch (the short shard
padded as DistributedSampler pads). Lightning must not add a sampler of its
own: Trainer(use_distributed_sampler=False) (a DistributedSampler over an
IterableDataset is refused, and over a map-style one it would shard a second
time). The DataLoader is the loader as an IterableDataset, batch_size=None
(batches come batched) and num_workers=0 (the loader reads with its own
threads). Each epoch's order comes from trainer.current_epoch, taken when
the epoch's iteration starts (Lightning calls set_epoch only on samplers).

At each epoch's end the ranks' sample counts are summed and checked;
--min-accuracy makes the script a test.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import lightning.pytorch as pl
except ImportError:  # the package's older name
    import pytorch_lightning as pl

import gpufeed


class SmallCNN(nn.Module):
    """examples/pytorch_train.py's CNN for any channel count and image size."""

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


class EpochDataset(torch.utils.data.IterableDataset):
    """A gpufeed.Loader whose iteration runs the trainer's current epoch."""

    def __init__(self, loader, trainer, train):
        super().__init__()
        self.loader, self.trainer, self.train = loader, trainer, train

    def __iter__(self):
        if self.train:
            self.loader.set_epoch(self.trainer.current_epoch)
        return iter(self.loader)

    def __len__(self):
        return len(self.loader)


class GpufeedData(pl.LightningDataModule):
    def __init__(self, train, test, batch_size, threads, share):
        super().__init__()
        self.paths = (train, test)
        self.batch_size, self.threads, self.share = batch_size, threads, share
        self.train = self.test = None

    def setup(self, stage=None):
        # Runs in every rank once the process group is up: the rank is Lightning's.
        t = self.trainer
        device = t.strategy.root_device
        # threads=0: this rank's share of the host's cores (Lightning's ranks are
        # not torchrun's, whose LOCAL_WORLD_SIZE the loader would read).
        threads = self.threads or max(1, (os.cpu_count() or 1) // max(1, t.num_devices))
        feed = dict(rank=t.global_rank, world_size=t.world_size, threads=threads, share=self.share,
                    device="cuda:%d" % device.index if device.type == "cuda" else "cpu", dtype=torch.float32)
        if self.train is None:
            self.train = gpufeed.Loader(self.paths[0], batch_size=self.batch_size, order="block", seed=0, **feed)
            self.test = gpufeed.Loader(self.paths[1], batch_size=1000, order="sequential", **feed)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(EpochDataset(self.train, self.trainer, True), batch_size=None,
                                           num_workers=0)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(EpochDataset(self.test, self.trainer, False), batch_size=None,
                                           num_workers=0)

    def teardown(self, stage=None):
        for loader in (self.train, self.test):
            if loader is not None:
                loader.close()
        self.train = self.test = None


class Classifier(pl.LightningModule):
    def __init__(self, lr, channels=1, classes=10):
        super().__init__()
        self.model = SmallCNN(channels, classes)
        self.lr = lr
        self.seen = 0
        self.correct = self.total = 0
        self.t0 = 0.0
        self.accuracy = 0.0

    def on_train_epoch_start(self):
        self.seen, self.t0 = 0, time.time()

    def training_step(self, batch, index):
        images, labels = batch
        self.seen += labels.shape[0]
        return F.cross_entropy(self.model(images), labels)

    def on_train_epoch_end(self):
        data = self.trainer.datamodule
        seen = self.trainer.strategy.reduce(torch.tensor(float(self.seen), device=self.device), reduce_op="sum")
        world = self.trainer.world_size
        want = world * -(-data.train.num_samples // world)
        if int(seen) != want:
            raise SystemExit("epoch %d: the ranks were given %d samples, want %d (the file's %d, padded)" % (
                self.current_epoch, int(seen), want, data.train.num_samples))
        if self.trainer.is_global_zero:
            s = time.time() - self.t0
            print("epoch %d: %d samples over %d ranks in %.1f s (%.0f samples/s)" % (
                self.current_epoch, int(seen), world, s, seen / max(s, 1e-9)), flush=True)

    def on_validation_epoch_start(self):
        self.correct = self.total = 0

    def validation_step(self, batch, index):
        images, labels = batch
        self.correct += int((self.model(images).argmax(1) == labels).sum())
        self.total += labels.shape[0]

    def on_validation_epoch_end(self):
        both = torch.tensor([float(self.correct), float(self.total)], device=self.device)
        both = self.trainer.strategy.reduce(both, reduce_op="sum")
        self.accuracy = float(both[0] / max(1.0, float(both[1])))
        if self.trainer.is_global_zero and not self.trainer.sanity_checking:
            print("epoch %d: test accuracy %.4f" % (self.current_epoch, self.accuracy), flush=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr * self.trainer.world_size)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--accelerator", default="gpu" if torch.cuda.is_available() else "cpu")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128, help="per rank")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=0, help="loader threads per rank (0: the host's cores, shared)")
    p.add_argument("--share", default="auto", help="auto, node or none (gpufeed.Loader's share=)")
    p.add_argument("--min-accuracy", type=float, help="exit 1 unless the final test accuracy reaches this")
    a = p.parse_args()

    pl.seed_everything(0, workers=False)
    data = GpufeedData(a.train, a.test, a.batch_size, a.threads, a.share)
    model = Classifier(a.lr)
    trainer = pl.Trainer(accelerator=a.accelerator, devices=a.devices, strategy="ddp", max_epochs=a.epochs,
                         use_distributed_sampler=False,  # gpufeed shards by rank itself
                         num_sanity_val_steps=0, enable_checkpointing=False, logger=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=data)
    if trainer.is_global_zero and a.min_accuracy is not None and model.accuracy < a.min_accuracy:
        print("test accuracy %.4f < %.2f" % (model.accuracy, a.min_accuracy), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
