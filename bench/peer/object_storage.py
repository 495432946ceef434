"""gpufeed against h5py's ROS3 driver on one object in an S3-compatible
server on 127.0.0.1 (s3rver, tests/testing/s3_server.py), with 0, 20 and
50 ms added to every request by a proxy: samples/s of a first epoch (block
order: chunks shuffled, every chunk fetched once) and the requests gpufeed
kept in flight (GPUFEED_REMOTE_STATS). h5py reads the same chunks, in a
shuffled order, a chunk-sized slice at a time (what a DataLoader's
__getitem__ over chunk-aligned slices does), for at most --h5py-chunks
chunks (ROS3 is slow at 50 ms).

    GPUFEED_LIBRARY=build/libgpufeed.so PYTHONPATH=python /usr/bin/python3 bench/peer/object_storage.py
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "testing"))
import s3_server  # noqa: E402

GPUFEED_EPOCH = """
import os, sys, time, gpufeed
best = 0.0
for seed in range(int(sys.argv[2])):
    loader = gpufeed.Loader(sys.argv[1], batch_size=64, order="block", seed=seed, output="numpy", share="none")
    t0 = time.perf_counter()
    n = sum(len(images) for images, _ in loader)
    best = max(best, n / (time.perf_counter() - t0))
    del loader
print(best)
"""


def gpufeed_rate(url, env, repeats):
    env = dict(env, GPUFEED_REMOTE_STATS="1")
    out = subprocess.run([sys.executable, "-c", GPUFEED_EPOCH, url, str(repeats)], capture_output=True, text=True,
                         env=env, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    stats = [line for line in out.stderr.splitlines() if "in flight" in line]
    # The data reads' object (the other line is the metadata's driver).
    data = max(stats, key=lambda line: int(re.search(r"(\d+) requests", line).group(1)))
    peak, mean = re.search(r"peak (\d+), mean ([\d.]+)", data).groups()
    return float(out.stdout.strip()), int(peak), float(mean)


def h5py_rate(http_url, chunks, chunk, max_chunks):
    order = np.random.default_rng(0).permutation(chunks)[:max_chunks]
    t0 = time.perf_counter()
    with h5py.File(http_url, "r", driver="ros3", aws_region=b"us-east-1", secret_id=s3_server.KEY.encode(),
                   secret_key=s3_server.SECRET.encode()) as f:
        d = f["images"]
        n = 0
        for c in order:
            n += len(d[c * chunk:(c + 1) * chunk])
    return n / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=16384)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=32)
    p.add_argument("--delays", default="0,20,50")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--h5py-chunks", type=int, default=64)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        local = pathlib.Path(tmp) / "bench.h5"
        images = np.zeros((a.samples, a.width), np.uint8)
        k = np.arange(a.samples)
        images[:, 0], images[:, 1], images[:, 2] = k & 0xFF, (k >> 8) & 0xFF, k >> 16
        with h5py.File(local, "w") as f:
            f.create_dataset("images", data=images, chunks=(a.chunk, a.width))
        chunks = (a.samples + a.chunk - 1) // a.chunk
        rows = []
        for delay in [float(d) for d in a.delays.split(",")]:
            with s3_server.S3Server(pathlib.Path(tmp) / ("s%g" % delay), delay_ms=delay, proxy=True) as s3:
                s3.make_bucket("data")
                s3.put("data", "bench.h5", local)
                env = s3.env()
                rate, peak, mean = gpufeed_rate("s3://data/bench.h5", env, a.repeats)
                ros3 = h5py_rate(s3.endpoint + "/data/bench.h5", chunks, a.chunk, a.h5py_chunks)
                row = dict(delay_ms=delay, gpufeed_samples_s=round(rate), in_flight_peak=peak,
                           in_flight_mean=mean, h5py_ros3_samples_s=round(ros3), ratio=round(rate / ros3, 1))
                print(json.dumps(row), flush=True)
                rows.append(row)
        base = rows[0]["gpufeed_samples_s"]
        for r in rows:
            print("%5g ms: gpufeed %8d samples/s (%.2f of 0 ms), in flight peak %d mean %.1f; h5py+ros3 %6d "
                  "samples/s; %.1fx" % (r["delay_ms"], r["gpufeed_samples_s"], r["gpufeed_samples_s"] / base,
                                        r["in_flight_peak"], r["in_flight_mean"], r["h5py_ros3_samples_s"],
                                        r["ratio"]))


if __name__ == "__main__":
    main()
