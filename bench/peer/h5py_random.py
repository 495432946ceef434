#!/usr/bin/env python3
"""h5py reading a gpufeed benchmark file sample by sample in random order (what
a torch Dataset's __getitem__ does), against gpufeed's loader on the same file
in the same run, on the same work: a whole epoch in random order on one
thread on both sides (the ratio), then gpufeed on --threads (labelled as
such). Every sample h5py read is checked (a `bench gen` sample carries its
index in its first 8 bytes; its label must be the file's); gpufeed verifies
its own epochs. --samples N times N samples only, and says so.
For machines without torch (the 2-core developer machine); torch_h5py.py is
the full peer.

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
    ap.add_argument("--samples", type=int, default=0, help="random samples h5py reads (default: the whole epoch)")
    ap.add_argument("--threads", type=int, default=2, help="gpufeed's threads for its second figure")
    a = ap.parse_args()
    try:
        import h5py
        import numpy as np
    except ImportError as e:
        print(f"h5py_random: {e.name} is not installed here (skipped)")
        return 0
    with h5py.File(a.data, "r") as f:  # h5py's defaults, as users open files
        images, labels = f["images"], f["labels"]
        file_labels = labels[:]
        n = len(images)
        order = np.random.default_rng(0).permutation(n)
        if a.samples:
            order = order[: a.samples]
        images[int(order[0])]  # open and first touch outside the clock
        got = []
        t0 = time.perf_counter()
        for i in order:
            x = images[int(i)]
            y = int(labels[int(i)])
            got.append((int(i), x.reshape(-1)[:8].tobytes(), y))
        peer = len(order) / (time.perf_counter() - t0)
    for i, head, y in got:  # checked after the clock
        if int.from_bytes(head, "little") != i or y != file_labels[i]:
            raise SystemExit(f"h5py_random: sample {i} read back wrong (not a `bench gen` file?)")
    if len(set(i for i, _, _ in got)) != len(got):
        raise SystemExit("h5py_random: a sample read twice")

    def gpufeed(threads):
        cmd = [a.gpufeed, "bench", "loader", "--data", a.data, "--order", "random", "--threads", str(threads), "--json"]
        return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)

    one, many = gpufeed(1), gpufeed(a.threads)
    what = "the whole epoch" if not a.samples else f"{len(order)} of {n} samples (not the epoch gpufeed runs)"
    print(f"h5py, random order, 1 process:           {peer:10.1f} samples/s ({what}; every sample checked)")
    print(f"gpufeed loader, random, 1 thread:        {one['samples_per_s']:10.1f} samples/s "
          f"(last epoch; verified: {one['coverage']})")
    print(f"gpufeed loader, random, {a.threads} threads:       {many['samples_per_s']:10.1f} samples/s "
          f"(last epoch; verified: {many['coverage']})")
    print(f"ratio, 1 thread vs 1 process{'' if not a.samples else ' (h5py on a subset)'}: "
          f"{one['samples_per_s'] / peer:.1f}x; gpufeed on {a.threads} threads vs h5py on 1: "
          f"{many['samples_per_s'] / peer:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
