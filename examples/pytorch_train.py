#!/usr/bin/env python3
"""A plain PyTorch training loop fed by gpufeed: a small CNN on Fashion-MNIST.

    build/gpufeed convert /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz \\
        --labels /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz -o fm-train.h5
    build/gpufeed convert /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz \\
        --labels /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz -o fm-test.h5
    PYTHONPATH=python python3 examples/pytorch_train.py --train fm-train.h5 --test fm-test.h5

On a GPU the batches arrive normalized on the device, ready on torch's
current stream; on the CPU the feed's CPU twins normalize them. Checkpoints
hold the loader's state, so a run resumes mid-epoch with the same batches.
--min-accuracy makes the script a test (CI: CPU, 2 epochs, >= 0.85).
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import gpufeed


class SmallCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 7 * 7, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def evaluate(model, loader):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(1) == labels).sum().item()
            total += labels.numel()
    model.train()
    return correct / total


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True, help="gpufeed convert output (or unix:/tcp:// daemon with --dataset)")
    p.add_argument("--dataset", help="with a daemon --train: the dataset to read there")
    p.add_argument("--test", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=0, help="loader threads (0: all cores)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--checkpoint", help="save model + loader state here after each epoch; resume from it if present")
    p.add_argument("--min-accuracy", type=float, help="exit 1 unless the final test accuracy reaches this")
    a = p.parse_args()

    torch.manual_seed(0)
    device = torch.device(a.device)
    model = SmallCNN().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    # Normalized float32 batches: the dataset's mean/std attributes (written
    # by gpufeed convert), on the GPU or by the feed's CPU twins.
    train = gpufeed.Loader(a.train, dataset=a.dataset, batch_size=a.batch_size, order="block", seed=0,
                           threads=a.threads, device=a.device, dtype=torch.float32)
    test = gpufeed.Loader(a.test, batch_size=1000, order="sequential", threads=a.threads, device=a.device,
                          dtype=torch.float32)

    start_epoch = 0
    if a.checkpoint and os.path.exists(a.checkpoint):
        ckpt = torch.load(a.checkpoint)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        train.load_state_dict(ckpt["loader"])
        start_epoch = ckpt["loader"]["epoch"]
        print("resumed at epoch %d, batch %d" % (start_epoch, ckpt["loader"].get("batch", 0)))

    acc = 0.0
    for epoch in range(start_epoch, a.epochs):
        train.set_epoch(epoch)
        t0, seen, loss_sum, steps = time.time(), 0, 0.0, 0
        for images, labels in train:
            loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen += labels.numel()
            loss_sum += loss.item()
            steps += 1
        train_s = time.time() - t0
        acc = evaluate(model, test)
        print("epoch %d: loss %.4f, %d samples in %.1f s (%.0f samples/s), test accuracy %.4f" % (
            epoch, loss_sum / max(1, steps), seen, train_s, seen / max(train_s, 1e-9), acc), flush=True)
        if a.checkpoint:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "loader": train.state_dict()},
                       a.checkpoint)
    if a.min_accuracy is not None and acc < a.min_accuracy:
        print("test accuracy %.4f < %.2f" % (acc, a.min_accuracy), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
