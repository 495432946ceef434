#!/usr/bin/env python3
"""When the first batch of a gpufeed.Loader's first epoch arrives (issues 27,
30 and 46): makes the Loader, waits --wait seconds as a training script
building its model would, then times --epochs epochs and when each one's first
batch came (and the loader's own first_batch_seconds). Every epoch must
deliver every sample once.

Host batches of an HDF5 array, the library under test named by GPUFEED_LIBRARY:
  python3 bench/peer/loader_first_batch.py cd.h5 --device cpu --threads 2 --order block --wait 2

JPEGs decoded on the GPU (device="cuda", bf16 NHWC):
  python3 bench/peer/loader_first_batch.py inet.h5 --decode gpu --wait 2
Named fields over many files, host batches (DeepCAM), pinned or not:
  python3 bench/peer/loader_first_batch.py '/tmp/dc96/*.h5' --field data=/climate/data \\
      --field labels=/climate/labels_0 --device cpu --batch-size 8 --threads 16 --pin 1,0 --prefetch 8,2
"""
import argparse
import time

import gpufeed


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data")
    p.add_argument("--dataset", default=None, help="with data unix:SOCK: the file a `gpufeed serve` daemon reads")
    p.add_argument("--field", action="append", default=[], help="NAME=/path (repeatable): named fields")
    p.add_argument("--device", default="cuda",
                   help="cuda: the GPU feed (bf16 NHWC); cpu: host batches; cpu-feed: the feed on its CPU twins (float32)")
    p.add_argument("--decode", default="gpu", help="for encoded images: gpu, auto or cpu")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--order", default="random")
    p.add_argument("--cache-bytes", type=int, default=None)
    p.add_argument("--pin", default="1", help="pin_memory values to try, comma-separated (1, 0)")
    p.add_argument("--prefetch", default="8", help="prefetch values to try, comma-separated")
    p.add_argument("--wait", type=float, default=0.0, help="seconds between making the Loader and its first epoch")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--between", type=float, default=0.0,
                   help="seconds between an epoch's end and the next epoch's start (validation, a checkpoint)")
    a = p.parse_args()
    if a.device == "cuda":
        import torch
    for pin in (bool(int(v)) for v in a.pin.split(",")):
        for prefetch in (int(v) for v in a.prefetch.split(",")):
            kw = dict(batch_size=a.batch_size, threads=a.threads, order=a.order, seed=1, prefetch=prefetch,
                      pin_memory=pin)
            if a.field:
                kw["fields"] = a.field
            if a.dataset:
                kw["dataset"] = a.dataset
            if a.cache_bytes is not None:
                kw["cache_bytes"] = a.cache_bytes
            if a.device == "cuda":
                kw.update(device="cuda", dtype=torch.bfloat16, layout="NHWC", decode=a.decode)
            elif a.device == "cpu-feed":
                kw.update(device="cpu", dtype="float32", output="numpy")
            else:
                kw.update(output="numpy")
            t = time.perf_counter()
            loader = gpufeed.Loader(a.data, **kw)
            made = time.perf_counter() - t
            time.sleep(a.wait)
            n = loader.num_samples
            out = []
            for e in range(a.epochs):
                if e > 0:
                    time.sleep(a.between)
                loader.set_epoch(e)
                if a.device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                first, count = None, 0
                for arrays in loader.batches():
                    if first is None:
                        if a.device == "cuda":
                            torch.cuda.synchronize()
                        first = time.perf_counter() - t0
                    count += arrays["images" if "images" in arrays else next(iter(arrays))].shape[0]
                if a.device == "cuda":
                    torch.cuda.synchronize()
                took = time.perf_counter() - t0
                if count != n:
                    raise SystemExit("epoch %d delivered %d samples of %d" % (e, count, n))
                # The loader's own figure (stats' first_batch_seconds, from the
                # epoch's start in the library), and whether it started early.
                st = loader.stats()
                out.append("epoch %d %.3f s (%.1f samples/s), first batch %.3f s (stats %s, started early %s)"
                           % (e + 1, took, n / took, first, st.get("first_batch_seconds"), st.get("started_early")))
            stats = loader.stats()
            loader.close()
            print("pin_memory=%s prefetch=%d, made in %.3f s, waited %.1f s (%.1f s between epochs): %s; last epoch's "
                  "minor faults %s" % (pin, prefetch, made, a.wait, a.between, "; ".join(out), stats.get("minor_faults")),
                  flush=True)


if __name__ == "__main__":
    main()
