#!/usr/bin/env python3
"""When the first batch of a gpufeed.Loader's first epoch arrives (issue 27):
makes the Loader (device="cuda", bf16 NHWC, batches of 256), waits SECONDS as
a training script building its model would, then times two epochs and when
their first batches arrived. Every epoch must deliver every sample once.

  python3 bench/peer/loader_first_batch.py inet.h5 [gpu|auto|cpu] [SECONDS]
"""
import sys
import time

import torch

import gpufeed


def main():
    path = sys.argv[1]
    decode = sys.argv[2] if len(sys.argv) > 2 else "gpu"
    wait = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    t = time.perf_counter()
    loader = gpufeed.Loader(path, batch_size=256, device="cuda", dtype=torch.bfloat16, layout="NHWC", threads=4,
                            decode=decode, seed=1)
    print("made the Loader in %.3f s; waiting %.1f s" % (time.perf_counter() - t, wait), flush=True)
    time.sleep(wait)
    n = loader.num_samples if hasattr(loader, "num_samples") else None
    for e in range(2):
        loader.set_epoch(e)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        marks, count = [], 0
        for k, (x, y) in enumerate(loader):
            count += x.shape[0]
            if k < 6 or k % 10 == 0:
                torch.cuda.synchronize()
                marks.append((k, time.perf_counter() - t0))
        torch.cuda.synchronize()
        if n is not None and count != n:
            raise SystemExit("epoch %d delivered %d samples of %d" % (e, count, n))
        print("epoch %d: %.3f s, %d samples; batch k at: %s" % (
            e, time.perf_counter() - t0, count, " ".join("%d:%.3f" % m for m in marks)), flush=True)
    loader.close()


if __name__ == "__main__":
    main()
