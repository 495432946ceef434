#!/usr/bin/env python3
"""Cold data: h5py reading a benchmark file sample by sample in random order
after the file was dropped from the page cache (posix_fadvise DONTNEED),
against `gpufeed bench loader --cold` on the same file in the same run (which
drops the file before each of its epochs and measures the O_DIRECT ceiling).

  /usr/bin/python3 bench/peer/h5py_cold.py --data celeba-raw.h5 --gpufeed build/gpufeed --io direct
"""
import argparse
import json
import os
import subprocess
import time


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--gpufeed", default="build/gpufeed")
    ap.add_argument("--samples", type=int, default=1000, help="random samples h5py reads (timed)")
    ap.add_argument("--io", default="direct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-bytes", default="300000000")
    a = ap.parse_args()
    import h5py
    import numpy as np
    evict(a.data)
    with h5py.File(a.data, "r") as f:  # h5py's defaults, as users open files
        images = f["images"]
        n = len(images)
        order = np.random.default_rng(0).permutation(n)[: a.samples]
        t0 = time.perf_counter()
        for k, i in enumerate(order):
            x = images[int(i)]
            if k % 97 == 0:  # index-valued check: the sample h5py returns is a sample of this file
                assert x.shape == images.shape[1:]
        peer = a.samples / (time.perf_counter() - t0)
    out = subprocess.run([a.gpufeed, "--io", a.io, "bench", "loader", "--data", a.data, "--order", "block", "--threads",
                          str(a.threads), "--cold", "--epochs", "2", "--cache-bytes", a.cache_bytes, "--trust-files",
                          "--json"], check=True, capture_output=True, text=True).stdout
    g = json.loads(out)
    ceiling = g["cold"]["ceiling_gb_per_s"]
    sb = g["samples"] and (g["gb_per_s"] * 1e9 / g["samples_per_s"])
    print(f"h5py cold random order ({a.samples} samples): {peer:.0f} samples/s = {peer * sb / 1e9:.3f} GB/s")
    for e in g["per_epoch"]:
        print(f"gpufeed cold block order, epoch {e['epoch']}: {e['samples_per_s']:.0f} samples/s = "
              f"{e['samples_per_s'] * sb / 1e9:.2f} GB/s ({e['samples_per_s'] * sb / 1e9 / ceiling:.2f} of the "
              f"O_DIRECT ceiling {ceiling:.2f} GB/s; {e['samples_per_s'] / peer:.1f}x h5py)")
    for e in g["cold"]["epochs"]:
        print(f"  page cache: {100 * e['resident_before']:.1f}% of the file at the epoch's start, "
              f"{100 * e['resident_after']:.1f}% at its end (I/O {g['cold']['io']})")


if __name__ == "__main__":
    main()
