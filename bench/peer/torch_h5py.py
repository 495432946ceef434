#!/usr/bin/env python3
"""The peer: PyTorch DataLoader over an h5py Dataset, written the way its users
write it (file opened lazily in each worker, shuffle=True, pin_memory=True,
persistent_workers, prefetch_factor), swept over num_workers; then gpufeed's
loader on the same file in the same run. Prints both figures and the ratio.

Steady state: the clock starts only after `warmup` batches (default two per
worker, at least 2): the consumer does nothing, so no backlog builds and the
batches made before the clock are consumed outside the timed window. The
iterator is restarted at an epoch's end (persistent workers), as training does.

Where torch or h5py is missing it says so and exits 0.

  bench/peer/torch_h5py.py --data celeba-raw.h5 --gpufeed dist/gpufeed/bin/gpufeed \
      --workers 0,4,8,12,15 --batches 60 --order block --threads 16
"""
import argparse
import json
import os
import subprocess
import sys
import time


def peer_rate(torch, h5py, path, workers, batch_size, batches, prefetch_factor, warmup):
    class H5Images(torch.utils.data.Dataset):
        def __init__(self, path):
            self.path = path
            self.file = None
            with h5py.File(path, "r") as f:
                self.n = len(f["images"])

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.file is None:  # opened lazily, once per worker process
                self.file = h5py.File(self.path, "r")
                self.images = self.file["images"]
                self.labels = self.file["labels"]
            return torch.from_numpy(self.images[i]), int(self.labels[i])

    loader = torch.utils.data.DataLoader(
        H5Images(path), batch_size=batch_size, shuffle=True, num_workers=workers,
        pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0,
        prefetch_factor=prefetch_factor if workers > 0 else None, drop_last=True)
    if warmup is None:
        warmup = max(2, 2 * workers)
    it = iter(loader)

    def next_batch():
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(loader)
            return next(it)

    with h5py.File(path, "r") as f:
        file_labels = f["labels"][:]
    n = len(file_labels)
    seen = 0
    for _ in range(warmup):
        next_batch()
    t0 = time.perf_counter()
    timed = []
    for _ in range(batches):
        x, y = next_batch()
        seen += x.shape[0]
        timed.append((x, y))
    dt = time.perf_counter() - t0
    del it, loader
    # Checked after the clock, as gpufeed's bench: the samples of a `bench
    # gen` file carry their index in their first 8 bytes; within a window of
    # one epoch's batches no index may come twice, and each label must be the
    # file's (a window may span an epoch's end, so per epoch-sized stretch).
    per_epoch = max(1, n // batch_size)
    for start in range(0, len(timed), per_epoch):
        got = []
        for x, y in timed[start:start + per_epoch]:
            b = x.reshape(x.shape[0], -1)[:, :8].numpy().astype("uint64")
            idx = sum(b[:, k] << (8 * k) for k in range(8))
            if (idx >= n).any() or (file_labels[idx] != y.numpy()).any():
                raise SystemExit(f"peer: a sample arrived with a wrong index or label ({path}; a `bench gen` file?)")
            got.extend(idx.tolist())
        if len(set(got)) != len(got):
            raise SystemExit(f"peer: an index came twice within one epoch ({path})")
    return seen / dt


def next_prime(n):
    def is_prime(v):
        if v < 2:
            return False
        d = 2
        while d * d <= v:
            if v % d == 0:
                return False
            d += 1
        return True
    while not is_prime(n):
        n += 1
    return n


def peer_epochs(torch, h5py, path, workers, batch_size, epochs, tuned):
    """Whole epochs, each timed apart (worker start-up inside epoch 1, as a
    training run sees it). naive: h5py's defaults (a 1 MiB chunk cache).
    tuned: as the 'GPU Util 99%' write-up advises: rdcc_nbytes >= the decoded
    file, rdcc_w0=1, a prime rdcc_nslots ~100x the chunks that fit; each
    worker keeps its own cache, so epoch 1 decodes every chunk once per
    worker and later epochs can be served from memory. Every epoch is checked:
    each index exactly once."""
    with h5py.File(path, "r") as f:
        d = f["images"]
        n = len(d)
        decoded = d.size * d.dtype.itemsize
        chunk = d.chunks or d.shape
        chunk_bytes = d.dtype.itemsize
        for c in chunk:
            chunk_bytes *= c
    kwargs = {}
    if tuned:
        fit = max(1, (decoded + chunk_bytes) // chunk_bytes)
        kwargs = dict(rdcc_nbytes=int(decoded + chunk_bytes), rdcc_w0=1.0, rdcc_nslots=next_prime(100 * fit))

    class H5Images(torch.utils.data.Dataset):
        def __init__(self):
            self.file = None

        def __len__(self):
            return n

        def __getitem__(self, i):
            if self.file is None:  # opened lazily, once per worker process
                self.file = h5py.File(path, "r", **kwargs)
                self.images = self.file["images"]
            return torch.from_numpy(self.images[i]), i

    loader = torch.utils.data.DataLoader(
        H5Images(), batch_size=batch_size, shuffle=True, num_workers=workers,
        persistent_workers=workers > 0, prefetch_factor=4 if workers > 0 else None)
    rates = []
    for _ in range(epochs):
        seen = torch.zeros(n, dtype=torch.int64)
        t0 = time.perf_counter()
        for x, idx in loader:
            seen[idx] += 1
        dt = time.perf_counter() - t0
        if not bool((seen == 1).all()):
            raise SystemExit(f"peer: an epoch did not deliver every sample exactly once ({path})")
        rates.append(n / dt)
    del loader
    return rates


def gpufeed_rate(binary, path, order, threads, batches, batch_size, cache_bytes):
    cmd = [binary, "bench", "loader", "--data", path, "--order", order, "--json", "--batch-size", str(batch_size)]
    if threads:
        cmd += ["--threads", str(threads)]
    if batches:
        cmd += ["--batches", str(batches)]
    if cache_bytes:
        cmd += ["--cache-bytes", str(cache_bytes)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--gpufeed", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "gpufeed"))
    ap.add_argument("--workers", default="0,4,8,12,15")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--batches", type=int, default=40, help="timed batches per worker count")
    ap.add_argument("--warmup", type=int, default=None, help="untimed batches (default: 2 per worker, at least 2)")
    ap.add_argument("--prefetch-factor", type=int, default=4)
    ap.add_argument("--order", default="block", help="gpufeed's order")
    ap.add_argument("--threads", type=int, default=0, help="gpufeed's threads (default: all cores)")
    ap.add_argument("--cache-bytes", type=int, default=0, help="gpufeed's cache (default: its own)")
    ap.add_argument("--gpufeed-batches", type=int, default=0, help="gpufeed batches (default: one epoch)")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--epochs", type=int, default=0,
                    help="whole-epoch mode: time E epochs apart for gpufeed and the naive and tuned peers "
                         "(workers = the first --workers value; --cache-bytes for gpufeed)")
    ap.add_argument("--peers", default="naive,tuned", help="whole-epoch mode: which peers to run")
    a = ap.parse_args()
    try:
        import h5py
        import torch
    except ImportError as e:
        print(f"torch_h5py: {e.name} is not installed here; the peer cannot run (skipped)")
        return 0

    if a.epochs > 0:
        return epochs_mode(a, torch, h5py)
    results = {"data": a.data, "batch_size": a.batch_size, "peer": {}, "torch": torch.__version__,
               "h5py": h5py.__version__}
    for w in [int(x) for x in a.workers.split(",") if x != ""]:
        r = peer_rate(torch, h5py, a.data, w, a.batch_size, a.batches, a.prefetch_factor, a.warmup)
        results["peer"][w] = r
        print(f"peer  DataLoader+h5py  workers {w:2d}: {r:10.0f} samples/s", flush=True)
    g = gpufeed_rate(a.gpufeed, a.data, a.order, a.threads, a.gpufeed_batches, a.batch_size, a.cache_bytes)
    results["gpufeed"] = g
    best_w = max(results["peer"], key=results["peer"].get)
    best = results["peer"][best_w]
    rate = g["samples_per_s"]
    what = (f"the last of {g['epochs']} epochs, {g['samples']} samples" if g["full_epoch"]
            else f"{g['samples']} samples of its last epoch")
    print(f"gpufeed loader, order {a.order}, {g['threads']} threads: {rate:10.0f} samples/s "
          f"({what}; verified: {g['coverage']}; read amplification {g['cache']['read_amplification']:.2f})")
    print(f"ratio gpufeed / best peer ({best_w} workers, {best:.0f} samples/s, {a.batches} batches after "
          f"{a.warmup if a.warmup is not None else 'the default'} warm-up batches, shuffled, checked: no index twice "
          f"an epoch, labels equal): {rate / best:.1f}x (gpufeed {g['threads']} threads vs the peer's "
          f"{best_w} worker processes)")
    results["ratio"] = rate / best
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def epochs_mode(a, torch, h5py):
    workers = int(a.workers.split(",")[0])
    threads = a.threads or max(1, workers)
    cmd = [a.gpufeed, "bench", "loader", "--data", a.data, "--order", a.order, "--json", "--batch-size",
           str(a.batch_size), "--threads", str(threads), "--epochs", str(a.epochs)]
    if a.cache_bytes:
        cmd += ["--cache-bytes", str(a.cache_bytes)]
    g = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    results = {"data": a.data, "batch_size": a.batch_size, "workers": workers, "threads": threads,
               "torch": torch.__version__, "h5py": h5py.__version__, "gpufeed": g["per_epoch"]}
    peers = [p for p in a.peers.split(",") if p]
    for name, tuned in (("naive", False), ("tuned", True)):
        if name in peers:
            results[name] = peer_epochs(torch, h5py, a.data, workers, a.batch_size, a.epochs, tuned)
    print(f"{a.data}: {a.epochs} epochs, gpufeed {threads} threads (order {a.order}, "
          f"cache {g['cache_bytes']} bytes) vs DataLoader + h5py, {workers} workers, shuffle=True")
    for e in range(a.epochs):
        ge = g["per_epoch"][e]
        gr = ge["samples_per_s"]
        line = f"  epoch {e + 1}: gpufeed {gr:9.0f} samples/s ({ge['chunk_reads']} chunk reads)"
        for name in ("naive", "tuned"):
            if name in results:
                r = results[name][e]
                line += f" | {name} {r:8.0f} ({gr / r:6.1f}x)"
        print(line, flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
