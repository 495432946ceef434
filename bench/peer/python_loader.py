#!/usr/bin/env python3
"""gpufeed.Loader (Python, ctypes, DLPack -> torch) against `gpufeed bench
loader` (C++) on the same file with the same options, in the same run, and
the Python side's cost per batch.

1. Throughput: both run `--epochs` epochs with a do-nothing consumer; the
   last epoch's samples/s is reported and the ratio Python / C++, runs
   alternating. The C++ bench verifies as it runs; the Python run checks in
   an untimed epoch first that every sample arrives once (indices), then
   times the loop users write and checks each timed epoch's sample count.
2. Overhead per batch: with the pipeline ahead of the consumer (it sleeps
   until `prefetch` batches are ready), the time of each next() is the
   Python + C API cost alone (the handoff from the fetch thread, the DLPack
   export, torch's from_dlpack): median and mean in microseconds.

  PYTHONPATH=python /usr/bin/python3 bench/peer/python_loader.py --data f.h5 \\
      --gpufeed build/gpufeed --threads 2 --batch-size 256 --epochs 3
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import gpufeed


def cpp_rate(binary, a):
    cmd = [binary, "bench", "loader", "--data", a.data, "--threads", str(a.threads), "--batch-size",
           str(a.batch_size), "--order", a.order, "--prefetch", str(a.prefetch), "--epochs", str(a.epochs), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    j = json.loads(p.stdout)
    assert j["verified"], "the C++ bench did not verify"
    return j["samples_per_s"], " ".join(cmd)


def python_rate(a):
    """The loop users write (for images, labels in loader), timed; before it,
    an untimed epoch checks every sample arrives once (indices). pin_memory
    False as `bench loader` (no GPU consumer in either)."""
    loader = gpufeed.Loader(a.data, batch_size=a.batch_size, order=a.order, threads=a.threads,
                            prefetch=a.prefetch, pin_memory=False)
    n = loader.num_samples
    seen = bytearray(n)
    for b in loader.batches():
        for k in b["indices"].tolist():
            seen[k] += 1
    assert all(c == 1 for c in seen), "the Python loader's epoch is not every sample once"
    rate = 0.0
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        samples = 0
        t0 = time.perf_counter()
        for images, labels in loader:
            samples += images.shape[0]
        rate = samples / (time.perf_counter() - t0)
        assert samples == n, "epoch %d delivered %d of %d samples" % (epoch, samples, n)
    return rate


def overhead_us(a, rounds):
    loader = gpufeed.Loader(a.data, batch_size=a.batch_size, order=a.order, threads=a.threads,
                            prefetch=a.prefetch, pin_memory=False)
    times = []
    it = iter(loader)
    for _ in range(rounds):
        time.sleep(a.fill_seconds)  # the pipeline fills its prefetch queue
        for _ in range(a.prefetch - 1):
            t0 = time.perf_counter()
            try:
                images, labels = next(it)
            except StopIteration:
                it = iter(loader)
                break
            times.append((time.perf_counter() - t0) * 1e6)
            del images, labels
    return statistics.median(times), statistics.mean(times), len(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--gpufeed", default="build/gpufeed", help="the gpufeed binary (C++ figure)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--order", default="block")
    p.add_argument("--prefetch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3, help="alternating runs of each; the best of each is reported")
    p.add_argument("--rounds", type=int, default=20, help="overhead: rounds of prefetch - 1 ready batches")
    p.add_argument("--fill-seconds", type=float, default=0.3)
    a = p.parse_args()
    cpp, py = [], []
    for _ in range(a.repeats):
        r, cmd = cpp_rate(a.gpufeed, a)
        cpp.append(r)
        py.append(python_rate(a))
    med, mean, n = overhead_us(a, a.rounds)
    out = {"data": a.data, "threads": a.threads, "batch_size": a.batch_size, "order": a.order,
           "prefetch": a.prefetch, "epochs": a.epochs, "cpp_samples_per_s": max(cpp), "python_samples_per_s": max(py),
           "ratio": max(py) / max(cpp), "paired_ratio_median": statistics.median(p / c for p, c in zip(py, cpp)),
           "cpp_runs": cpp, "python_runs": py, "overhead_us_median": med,
           "overhead_us_mean": mean, "overhead_batches": n, "cpp_command": cmd}
    print(json.dumps(out, indent=2))
    print("%s: Python %.0f samples/s vs C++ %.0f samples/s (best of %d each) = %.3f, paired runs' median %.3f; "
          "per-batch Python overhead %.0f us median (%.0f mean, %d batches)" % (
              a.data, max(py), max(cpp), a.repeats, max(py) / max(cpp), out["paired_ratio_median"], med, mean, n),
          file=sys.stderr)


if __name__ == "__main__":
    main()
