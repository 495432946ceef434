#!/usr/bin/env python3
"""h5py reading a gpufeed benchmark file sample by sample in random order (what
a torch Dataset's __getitem__ does), against gpufeed's loader on the same file
in the same run. For machines without torch (the 2-core developer machine);
torch_h5py.py is the full peer.

  /usr/bin/python3 bench/peer/h5py_random.py --data celeba-deflate.h5 --gpufeed build/gpufeed --threads 2
"""
import argparse
import json
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--gpufeed", default="build/gpufeed")
    ap.add_argument("--samples", type=int, default=200, help="random samples h5py reads (timed)")
    ap.add_argument("--order", default="block")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    try:
        import h5py
        import numpy as np
    except ImportError as e:
        print(f"h5py_random: {e.name} is not installed here (skipped)")
        return 0
    with h5py.File(a.data, "r") as f:  # h5py's defaults, as users open files
        images, labels = f["images"], f["labels"]
        order = np.random.default_rng(0).permutation(len(images))[: a.samples]
        images[int(order[0])]  # open and first touch outside the clock
        t0 = time.perf_counter()
        for i in order:
            x = images[int(i)]
            y = int(labels[int(i)])
        peer = a.samples / (time.perf_counter() - t0)
    out = subprocess.run([a.gpufeed, "bench", "loader", "--data", a.data, "--order", a.order, "--threads",
                          str(a.threads), "--json"], check=True, capture_output=True, text=True).stdout
    g = json.loads(out)
    print(f"h5py, random order, 1 process:        {peer:10.1f} samples/s ({a.samples} samples)")
    print(f"gpufeed loader, {a.order}, {a.threads} threads:     {g['samples_per_s']:10.1f} samples/s (verified epoch)")
    print(f"ratio: {g['samples_per_s'] / peer:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
