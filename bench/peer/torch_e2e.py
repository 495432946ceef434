#!/usr/bin/env python3
"""End to end in PyTorch: the model and loop of examples/pytorch_train.py fed by

  naive    DataLoader + h5py as its users write it (file opened lazily per
           worker, one __getitem__ per sample, h5py's default 1 MiB chunk cache)
  tuned    the same with the 'GPU Util 99%' recipe: a chunk cache holding the
           decoded file (rdcc_nbytes >= its size), rdcc_w0=1, a prime
           rdcc_nslots ~100x the chunks, and a batch sampler reading sorted
           indices per batch
  gpufeed  gpufeed.Loader (normalization in the feed: CPU twins or GPU)
  ceiling  the same batches already in memory (normalized tensors on the
           device, a permutation per epoch): the loop's compute ceiling

in one run, with samples/s and the share of the ceiling, epoch 1 (first,
cold: worker start, cache fill) and later epochs reported apart. Each epoch
is checked before its figure counts: every sample once (the sum and count of
labels equal the file's).

  PYTHONPATH=python /usr/bin/python3 bench/peer/torch_e2e.py --data fashion-mnist-train.h5 \\
      --epochs 3 --workers 2 --threads 2
"""
import argparse
import importlib.util
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
# gpufeed convert writes zstd by default: h5py reads it through gpufeed's plugin.
if "HDF5_PLUGIN_PATH" not in os.environ:
    for build in ("build", "build-cpu"):
        if (ROOT / build / "hdf5-plugins" / "libgpufeed_h5zstd.so").is_file():
            os.environ["HDF5_PLUGIN_PATH"] = str(ROOT / build / "hdf5-plugins")
            break

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gpufeed  # noqa: E402


def load_example():
    spec = importlib.util.spec_from_file_location("pytorch_train", ROOT / "examples" / "pytorch_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def next_prime(n):
    def prime(k):
        return k > 1 and all(k % d for d in range(2, int(k ** 0.5) + 1))
    while not prime(n):
        n += 1
    return n


class H5Samples(torch.utils.data.Dataset):
    """Per-sample reads (naive) or per-batch sorted reads (tuned, with a
    batch sampler): the file is opened lazily once per worker."""

    def __init__(self, path, tuned):
        self.path, self.tuned, self.file = path, tuned, None
        with h5py.File(path, "r") as f:
            d = f["images"]
            self.n = d.shape[0]
            self.decoded_bytes = d.size * d.dtype.itemsize
            self.chunks = -(-d.shape[0] // d.chunks[0]) if d.chunks else 1

    def __len__(self):
        return self.n

    def _open(self):
        if self.tuned:
            self.file = h5py.File(self.path, "r", rdcc_nbytes=int(self.decoded_bytes * 1.1) + (1 << 20),
                                  rdcc_w0=1.0, rdcc_nslots=next_prime(100 * self.chunks))
        else:
            self.file = h5py.File(self.path, "r")
        self.images, self.labels = self.file["images"], self.file["labels"]

    def __getitem__(self, i):
        if self.file is None:
            self._open()
        if isinstance(i, list):  # tuned: one read of the batch's sorted indices
            idx = np.sort(np.asarray(i))
            return torch.from_numpy(self.images[idx]), torch.from_numpy(self.labels[idx].astype(np.int64))
        return torch.from_numpy(self.images[i]), int(self.labels[i])


def dataloader(path, tuned, batch_size, workers, seed):
    ds = H5Samples(path, tuned)
    g = torch.Generator()
    g.manual_seed(seed)
    kw = dict(num_workers=workers, persistent_workers=workers > 0, pin_memory=torch.cuda.is_available())
    if tuned:
        sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(ds, generator=g), batch_size, False)
        return torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, **kw)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, generator=g, **kw)


def run(name, batches_for_epoch, model_fn, epochs, device, normalize, want):
    torch.manual_seed(0)
    model = model_fn().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    rates = []
    for epoch in range(epochs):
        n = label_sum = 0
        t0 = time.perf_counter()
        for images, labels in batches_for_epoch(epoch):
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            if normalize is not None:
                images = normalize(images)
            loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            n += labels.shape[0]
            label_sum += int(labels.sum())
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if (n, label_sum) != want:
            raise SystemExit("%s: epoch %d delivered %d samples, label sum %d; the file has %s" % (
                name, epoch, n, label_sum, want))
        rates.append(n / seconds)
        print("  %-8s epoch %d: %.0f samples/s (%.1f s)" % (name, epoch + 1, rates[-1], seconds), flush=True)
    later = rates[1:] or rates
    return {"epoch1": rates[0], "later": sum(later) / len(later)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a gpufeed convert output with /images (uint8) and /labels")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--threads", type=int, default=2, help="gpufeed loader threads")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", default="ceiling,naive,tuned,gpufeed")
    p.add_argument("--json", help="write the figures here too")
    a = p.parse_args()
    example = load_example()
    device = torch.device(a.device)
    with h5py.File(a.data, "r") as f:
        labels = f["labels"][...].astype(np.int64)
        mean = float(f["images"].attrs.get("mean", [0.0])[0])
        std = float(f["images"].attrs.get("std", [255.0])[0])
        n = len(labels)
    want = (n, int(labels.sum()))

    def normalize(x):
        return (x.float() - mean) / std

    results = {}
    for mode in a.modes.split(","):
        if mode == "ceiling":
            with h5py.File(a.data, "r") as f:
                all_images = normalize(torch.from_numpy(f["images"][...]).to(device))
            all_labels = torch.from_numpy(labels).to(device)

            def batches(epoch):
                g = torch.Generator()
                g.manual_seed(epoch)
                perm = torch.randperm(n, generator=g).to(device)
                for s in range(0, n, a.batch_size):
                    i = perm[s:s + a.batch_size]
                    yield all_images[i], all_labels[i]
            results[mode] = run(mode, batches, example.SmallCNN, a.epochs, device, None, want)
            del all_images
        elif mode in ("naive", "tuned"):
            dl = dataloader(a.data, mode == "tuned", a.batch_size, a.workers, 0)
            results[mode] = run(mode, lambda epoch: dl, example.SmallCNN, a.epochs, device, normalize, want)
            del dl
        elif mode == "gpufeed":
            loader = gpufeed.Loader(a.data, batch_size=a.batch_size, order="block", seed=0, threads=a.threads,
                                    device=a.device, dtype=torch.float32, mean=[mean], std=[std])

            def batches(epoch):
                loader.set_epoch(epoch)
                return iter(loader)
            results[mode] = run(mode, batches, example.SmallCNN, a.epochs, device, None, want)
            loader.close()
    ceiling = results.get("ceiling")
    print("%s, %s, batch %d, %d workers / %d threads, torch %s, %d torch threads" % (
        a.data, a.device, a.batch_size, a.workers, a.threads, torch.__version__, torch.get_num_threads()))
    print("  %-8s %14s %14s %10s" % ("feed", "epoch 1 /s", "later /s", "of ceiling"))
    for mode, r in results.items():
        share = r["later"] / ceiling["later"] if ceiling else float("nan")
        r["share_of_ceiling"] = share
        print("  %-8s %14.0f %14.0f %9.0f%%" % (mode, r["epoch1"], r["later"], 100 * share))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"data": a.data, "device": a.device, "batch_size": a.batch_size, "workers": a.workers,
                       "threads": a.threads, "results": results}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
