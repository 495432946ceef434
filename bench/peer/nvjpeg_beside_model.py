#!/usr/bin/env python3
"""How long nvJPEG's batched hardware decode call blocks its thread, alone
and beside a model training on the same GPU, for two output formats: RGBI
(interleaved RGB, what gpufeed's decoder asks for) and YUV (planar, the
engine's own layout). A thread decodes batches of --batch JPEGs on its own
stream in a loop; the main thread trains torchvision's --model (bf16,
channels-last, AdamW) on batches already on the GPU, on the default stream.
Prints the median and 90th percentile milliseconds a call, and images/s.

  python3 bench/peer/nvjpeg_beside_model.py --data inet.h5
"""
import argparse
import ctypes
import pathlib
import statistics
import sys
import threading
import time

import numpy as np
import torch
import torchvision

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from torch_jpeg_gpu import jpeg_size, read_encoded  # noqa: E402

FORMATS = {"yuv": 1, "rgbi": 5}


class Image(ctypes.Structure):
    _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--seconds", type=float, default=6)
    p.add_argument("--model-stream", default="default", choices=["default", "side"],
                   help="the model on PyTorch's default (legacy) stream or a side stream of its own")
    p.add_argument("--formats", default="rgbi,yuv")
    a = p.parse_args()
    blobs, labels = read_encoded(a.data)
    blobs = blobs[:a.batch * 8]
    sizes = [jpeg_size(bytes(b[:4096])) for b in blobs]
    pinned = [torch.from_numpy(np.asarray(b)).pin_memory() for b in blobs]
    lib = None
    for name in ("libnvjpeg.so.13", "libnvjpeg.so.12"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            pass
    h, st = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.nvjpegCreateEx(3, None, None, 0, ctypes.byref(h)) == 0, "no hardware backend"
    assert lib.nvjpegJpegStateCreate(h, ctypes.byref(st)) == 0
    # Output planes: full size for every plane (pitch w), whatever the subsampling.
    outs = [torch.empty(3 * hh * ww, dtype=torch.uint8, device="cuda") for hh, ww in sizes]
    stream = torch.cuda.Stream()

    errors = []

    def decode_loop(fmt, stop, times):
        try:
            decode_batches(fmt, stop, times)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append("%s: %r" % (fmt, e))

    def decode_batches(fmt, stop, times):
        torch.cuda.set_device(0)  # the runtime's current context, in this thread too
        torch.zeros(1, device="cuda")
        r = lib.nvjpegDecodeBatchedInitialize(h, st, a.batch, 1, FORMATS[fmt])
        assert r == 0, "nvjpegDecodeBatchedInitialize(%s): %d" % (fmt, r)
        k = 0
        while not stop.is_set():
            idx = range((k % 8) * a.batch, (k % 8 + 1) * a.batch)
            data = (ctypes.c_void_p * a.batch)(*[pinned[i].data_ptr() for i in idx])
            lens = (ctypes.c_size_t * a.batch)(*[pinned[i].numel() for i in idx])
            imgs = (Image * a.batch)()
            for j, i in enumerate(idx):
                hh, ww = sizes[i]
                base = outs[i].data_ptr()
                if fmt == "rgbi":
                    imgs[j].channel[0], imgs[j].pitch[0] = base, 3 * ww
                else:
                    for c in range(3):
                        imgs[j].channel[c], imgs[j].pitch[c] = base + c * hh * ww, ww
            t0 = time.perf_counter()
            r = lib.nvjpegDecodeBatched(h, st, data, lens, imgs, ctypes.c_void_p(stream.cuda_stream))
            stream.synchronize()
            times.append(time.perf_counter() - t0)
            assert r == 0, "nvjpegDecodeBatched: %d" % r
            k += 1

    model = getattr(torchvision.models, a.model)(num_classes=1000).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    crit = torch.nn.CrossEntropyLoss()
    x = torch.randn(256, 3, 224, 224, device="cuda").to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (256,), device="cuda")

    side = torch.cuda.Stream() if a.model_stream == "side" else None

    def step():
        if side is not None:
            with torch.cuda.stream(side):
                return train_step()
        return train_step()

    def train_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = crit(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    print("%s, %s on the %s stream, batches of %d" % (torch.cuda.get_device_name(0), a.model, a.model_stream, a.batch),
          flush=True)
    for fmt in a.formats.split(","):
        for beside in (False, True):
            stop, times = threading.Event(), []
            t = threading.Thread(target=decode_loop, args=(fmt, stop, times))
            t.start()
            t0, steps = time.perf_counter(), 0
            while time.perf_counter() - t0 < a.seconds:
                if beside:
                    step()
                    steps += 1
                    if steps % 4 == 0:
                        torch.cuda.synchronize()
                else:
                    time.sleep(0.05)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            stop.set()
            t.join()
            if errors or len(times) < 3:
                print("%s: no timing (%s)" % (fmt, errors or "fewer than 3 calls"), flush=True)
                errors.clear()
                continue
            ms = sorted(1e3 * s for s in times[2:])
            print("%-4s %-12s calls %4d  median %.1f ms  p90 %.1f ms  decode %.0f images/s%s" % (
                fmt, "beside model" if beside else "alone", len(ms), statistics.median(ms), ms[int(0.9 * len(ms))],
                a.batch * len(times) / wall,
                "  model %.0f images/s" % (256 * steps / wall) if beside else ""), flush=True)


if __name__ == "__main__":
    main()
