#!/usr/bin/env python3
"""Scientific workloads, the reference way and the converted way, against
gpufeed, in one run with the same number of workers/threads:

  h5py   a PyTorch DataLoader whose __getitem__ opens the sample's HDF5 file
         with h5py, reads every field, closes it (DeepCAM's reference loader);
         for many samples per file (CosmoFlow) each worker keeps its files
         open (opened lazily, once per worker).
  npy    per-sample .npy files made from the same data (NVIDIA's submissions
         convert to .npy), read with np.load(mmap_mode="r") and copied.
  gpufeed  gpufeed.Loader over the same files with the same fields.

Every loader is checked first: every sample exactly once per epoch, and (for
gpufeed) every field byte-identical to h5py's read of that sample. Then each
is timed for `--epochs` epochs (the first warms the page cache, processes and
pools; the last is reported), the consumer doing nothing but holding each
batch until the next. Where torch or h5py is missing it says so and exits 0.

  /usr/bin/python3 bench/peer/torch_h5py_files.py --data /tmp/deepcam \\
      --field data=/climate/data --field labels=/climate/labels_0 --workers 2 --batch-size 8
"""
import argparse
import glob
import json
import os
import sys
import time


def parse_fields(specs):
    out = []
    for s in specs:
        name, path = s.split("=", 1)
        out.append((name, path))
    return out


def index_files(h5py, files, fields):
    """[(file, local index)] per global sample, in file order."""
    where = []
    for f in files:
        with h5py.File(f, "r") as h:
            n = h[fields[0][1]].shape[0]
        where.extend((f, i) for i in range(n))
    return where


def make_h5py_dataset(torch, h5py, where, fields, per_file):
    class H5Files(torch.utils.data.Dataset):
        def __init__(self):
            self.open = {}

        def __len__(self):
            return len(where)

        def __getitem__(self, k):
            path, i = where[k]
            if per_file:  # the reference: open, read the fields, close
                with h5py.File(path, "r") as h:
                    arrays = [h[p][i] for _, p in fields]
            else:  # many samples per file: each worker keeps its files open
                h = self.open.get(path)
                if h is None:
                    h = self.open[path] = h5py.File(path, "r")
                arrays = [h[p][i] for _, p in fields]
            return [k] + [torch.from_numpy(a) for a in arrays]

    return H5Files()


def make_npy_dataset(torch, np, npy_dir, fields, n):
    class NpyFiles(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, k):
            arrays = [np.array(np.load(os.path.join(npy_dir, "%s_%06d.npy" % (name, k)), mmap_mode="r"))
                      for name, _ in fields]
            return [k] + [torch.from_numpy(a) for a in arrays]

    return NpyFiles()


def write_npy(h5py, np, where, fields, npy_dir):
    os.makedirs(npy_dir, exist_ok=True)
    done = os.path.join(npy_dir, "DONE")
    if os.path.exists(done):
        return
    for k, (path, i) in enumerate(where):
        with h5py.File(path, "r") as h:
            for name, p in fields:
                np.save(os.path.join(npy_dir, "%s_%06d.npy" % (name, k)), h[p][i])
    open(done, "w").close()


def time_torch(torch, dataset, n, workers, batch_size, epochs):
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                                         persistent_workers=workers > 0, drop_last=False)
    result = []
    for epoch in range(epochs):
        seen = [0] * n
        t0 = time.perf_counter()
        for batch in loader:
            for k in batch[0].tolist():
                seen[k] += 1
        secs = time.perf_counter() - t0
        if any(c != 1 for c in seen):
            raise SystemExit("peer epoch %d: not every sample once" % epoch)
        result.append(n / secs)
    return result


def verify_gpufeed(gpufeed, h5py, np, data, where, fields, threads, batch_size):
    """Every sample once, every field equal to h5py's read of it."""
    loader = gpufeed.Loader(data, fields=[n + "=" + p for n, p in fields], batch_size=batch_size, order="random",
                            seed=11, threads=threads, output="numpy", trust_files=True)
    seen = np.zeros(len(where), dtype=int)
    for b in loader.batches():
        for row, k in enumerate(b["indices"]):
            k = int(k)
            seen[k] += 1
            path, i = where[k]
            with h5py.File(path, "r") as h:
                for name, p in fields:
                    want = h[p][i]
                    got = b[name][row]
                    if want.dtype == bool:
                        want = want.astype(np.uint8)
                    if want.tobytes() != got.tobytes():
                        raise SystemExit("gpufeed: sample %d field %s differs from h5py's read" % (k, name))
    if not (seen == 1).all():
        raise SystemExit("gpufeed: not every sample once")


def time_gpufeed(gpufeed, data, fields, n, threads, batch_size, epochs, order, cache_bytes, pin_memory=True,
                 pool_bytes=None, trust_files=True):
    kw = {} if pool_bytes is None else {"pool_bytes": pool_bytes}
    loader = gpufeed.Loader(data, fields=[f + "=" + p for f, p in fields], batch_size=batch_size, order=order,
                            seed=1, threads=threads, cache_bytes=cache_bytes, trust_files=trust_files,
                            output="torch", pin_memory=pin_memory, **kw)
    result = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        count = 0
        t0 = time.perf_counter()
        for b in loader.batches():
            count += b["indices"].shape[0]
        secs = time.perf_counter() - t0
        if count != n:
            raise SystemExit("gpufeed epoch %d: %d samples of %d" % (epoch, count, n))
        result.append(n / secs)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="directory of .h5 files (bench gen --workload deepcam|cosmoflow)")
    ap.add_argument("--field", action="append", required=True, help="NAME=/path (repeatable)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers = gpufeed threads")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--npy-dir", help="per-sample .npy copies (made once; default DATA/npy); 'none' skips the peer")
    ap.add_argument("--order", default="random", help="gpufeed order (random or block)")
    ap.add_argument("--cache-bytes", type=int, default=1 << 20,
                    help="gpufeed's decoded-chunk cache (default 1 MiB: nothing kept between epochs, so every epoch "
                    "reads and decodes from the page cache as the peers do)")
    ap.add_argument("--skip", default="", help="comma list of loaders not to run: h5py,npy,gpufeed")
    ap.add_argument("--pin", type=int, default=1, help="gpufeed's pin_memory (1: its default where CUDA is; the "
                    "DataLoader peers do not pin)")
    ap.add_argument("--pool-bytes", type=int, default=None, help="gpufeed's pool_bytes (default: its own)")
    ap.add_argument("--trust-files", type=int, default=1,
                    help="gpufeed's trust_files for the timed loader (1: no probe, as h5py has none; 0: its default, "
                         "every file probed in forked processes at open, outside the timed epochs)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        import h5py
        import numpy as np
        import torch
    except ImportError as e:
        print("skipped: %s (use Debian's /usr/bin/python3 with python3-torch and python3-h5py)" % e)
        return 0
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import gpufeed

    fields = parse_fields(a.field)
    files = sorted(glob.glob(os.path.join(a.data, "*.h5")))
    where = index_files(h5py, files, fields)
    n = len(where)
    per_file = n == len(files)
    skip = set(filter(None, a.skip.split(",")))
    out = {"data": a.data, "files": len(files), "samples": n, "workers": a.workers, "batch_size": a.batch_size,
           "fields": a.field, "torch": torch.__version__, "h5py": h5py.__version__}
    with h5py.File(files[0], "r") as h:
        out["sample_bytes"] = sum(int(np.prod(h[p].shape[1:])) * h[p].dtype.itemsize for _, p in fields)
    data_glob = os.path.join(a.data, "*.h5")
    if "gpufeed" not in skip:
        verify_gpufeed(gpufeed, h5py, np, data_glob, where, fields, a.workers, a.batch_size)
        out["gpufeed_verified"] = "every sample once, every field byte-identical to h5py"
        out["gpufeed"] = time_gpufeed(gpufeed, data_glob, fields, n, a.workers, a.batch_size, a.epochs, a.order,
                                      a.cache_bytes, bool(a.pin), a.pool_bytes, bool(a.trust_files))
    if "h5py" not in skip:
        out["h5py"] = time_torch(torch, make_h5py_dataset(torch, h5py, where, fields, per_file), n, a.workers,
                                 a.batch_size, a.epochs)
    npy_dir = a.npy_dir or os.path.join(a.data, "npy")
    if "npy" not in skip and npy_dir != "none":
        write_npy(h5py, np, where, fields, npy_dir)
        out["npy"] = time_torch(torch, make_npy_dataset(torch, np, npy_dir, fields, n), n, a.workers, a.batch_size,
                                a.epochs)
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    mb = out["sample_bytes"] / 1e6
    print("%s: %d samples in %d files, %.2f MB a sample, %d workers/threads, batch %d (last of %d epochs)" % (
        a.data, n, len(files), mb, a.workers, a.batch_size, a.epochs))
    for key in ("gpufeed", "h5py", "npy"):
        if key in out:
            r = out[key][-1]
            print("  %-8s %8.1f samples/s  %6.2f GB/s   (epochs: %s)" % (
                key, r, r * mb / 1e3, ", ".join("%.1f" % x for x in out[key])))
    if "gpufeed" in out:
        for key in ("h5py", "npy"):
            if key in out:
                print("  gpufeed / %s: %.2fx" % (key, out["gpufeed"][-1] / out[key][-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
