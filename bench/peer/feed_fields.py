#!/usr/bin/env python3
"""CosmoFlow-shaped samples (`gpufeed bench gen --workload cosmoflow`: /x int16
[4, D, D, D] whose voxel 0 is the sample index k, /y float32 [4] whose y[0] is
k) to the GPU, normalized per channel, two ways in one run:

  feed       gpufeed.Loader(device="cuda", fields x, y): the loader's batches
             go to the GPU and the feed normalizes the volume there (the
             volume kernel) and passes y through (the gather kernel).
  baseline   gpufeed.Loader(device="cpu") host batches (pinned), then what a
             PyTorch user writes: .cuda(non_blocking=True), .float(),
             (x - mean) / std.

Both are verified before any figure is printed: every epoch delivers every
sample exactly once, and row r of x and of y is the same sample (x's
normalized voxel 0 gives back y[r, 0]). An epoch is timed to its last
batch's completion on the GPU (torch.cuda.synchronize). Without torch, CUDA
or a GPU it says so and exits 0. The h5py peer (bench/peer/torch_h5py_files.py)
needs h5py, which the GPU host does not have; on the developer machine it
reads host batches only.

  PYTHONPATH=dist/gpufeed/python python3 bench/peer/feed_fields.py --data '/tmp/cosmo/*.h5' --threads 16
"""
import argparse
import json
import sys
import time

MEAN = [1.0, 2.0, 0.5, 1.5]
STD = [2.0, 4.0, 1.0, 0.5]


def run(gpufeed, torch, a, feed):
    kw = dict(fields=["x=/x", "y=/y"], batch_size=a.batch_size, threads=a.threads, order="block", seed=1,
              cache_bytes=a.cache_bytes, trust_files=True)
    dev = a.device
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    if feed:
        loader = gpufeed.Loader(a.data, device=dev, dtype=torch.float32, mean=MEAN, std=STD, **kw)
    else:
        loader = gpufeed.Loader(a.data, device="cpu", **kw)
    n = loader.num_samples
    mean = torch.tensor(MEAN, device=dev).view(1, 4, 1, 1, 1)
    inv_std = (1 / torch.tensor(STD, device=dev)).view(1, 4, 1, 1, 1)
    rates = []
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        ks_x, ks_y = [], []
        sync()
        t0 = time.perf_counter()
        for x, y in loader:
            if not feed:
                x = (x.to(dev, non_blocking=True).float() - mean) * inv_std
                y = y.to(dev, non_blocking=True)
            # Voxel 0 of channel 0 is k: (k - 1) / 2 exactly in fp32.
            ks_x.append(x[:, 0, 0, 0, 0] * STD[0] + MEAN[0])  # a new tensor: x's slot goes back
            ks_y.append(y[:, 0].clone())  # a view would hold the batch's slot
        sync()
        dt = time.perf_counter() - t0
        kx = torch.cat(ks_x).round().long().cpu()
        ky = torch.cat(ks_y).long().cpu()
        if not torch.equal(kx, ky):
            bad = int((kx != ky).nonzero()[0])
            raise SystemExit("%s epoch %d: row %d has x of sample %d but y of sample %d" % (
                "feed" if feed else "baseline", epoch, bad, int(kx[bad]), int(ky[bad])))
        if sorted(ky.tolist()) != list(range(n)):
            raise SystemExit("%s epoch %d: %d samples, not every one of %d once" % (
                "feed" if feed else "baseline", epoch, len(ky), n))
        rates.append(n / dt)
    loader.close()
    return n, rates


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="the cosmoflow files (a glob)")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--cache-bytes", type=int, default=1 << 30, help="gpufeed's decoded-chunk cache (default 1 GiB)")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--device", default="cuda", help="cuda; cpu runs both ways on the CPU twins (checks the script, "
                    "measures nothing worth keeping)")
    a = ap.parse_args()
    try:
        import torch
        import gpufeed
    except ImportError as e:
        print("feed_fields: %s; nothing measured" % e)
        return 0
    if a.device == "cuda" and not torch.cuda.is_available():
        print("feed_fields: no CUDA device for torch; nothing measured")
        return 0
    out = {"data": a.data, "threads": a.threads, "batch_size": a.batch_size, "epochs": a.epochs,
           "cache_bytes": a.cache_bytes}
    # Alternated twice so that neither way always runs on a warmer page cache.
    for rnd in range(2):
        for name, feed in (("baseline", False), ("feed", True)):
            n, rates = run(gpufeed, torch, a, feed)
            out.setdefault(name, []).append(rates)
            print("round %d %-8s %d samples: %s samples/s by epoch" % (
                rnd + 1, name, n, ", ".join("%.1f" % r for r in rates)), flush=True)
    for rnd in range(2):
        f, b = out["feed"][rnd], out["baseline"][rnd]
        print("round %d feed / baseline: epoch 1 %.2f, last epoch %.2f" % (rnd + 1, f[0] / b[0], f[-1] / b[-1]))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
