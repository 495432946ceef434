#!/usr/bin/env python3
"""JPEG on the GPU (issue 27), every path in one run on one GPU, over the same
`gpufeed bench gen --workload imagenet-jpeg` file (and its .jpg.d folder):

  ceiling     nvJPEG's batched decoder, hardware backend, decode only
              (batches of --batch-size, the file's bytes already in pinned
              memory): what the engine does, nothing else
  gpufeed     gpufeed.Loader(device="cuda", dtype=bf16, decode=gpu|cpu|auto,
              threads=T): decode + random-resized-crop 224 + normalize
  torchvision torchvision.io.decode_jpeg(list, device="cuda") batched, then
              the same crop per image (crop + antialiased bilinear resize) and
              normalize, the bytes read by a thread from the same file
  pil         DataLoader + PIL (decode, RandomResizedCrop 224 written with
              PIL) with --workers workers over the folder, pinned, to cuda
  quality     gpufeed decode="gpu" against decode="cpu" for the same crops
              (float32 batches, mean 0, std 1: levels), mean |diff|
  train       torchvision ResNet-18 / ResNet-50, bf16 autocast, channels-last,
              AdamW: the ceiling (batches already on the GPU) and fed by
              gpufeed decode="gpu" with T threads, epochs 1.. apart

Every epoch counts only when it delivered every sample once (count and label
sum equal the file's).

  python3 bench/peer/torch_jpeg_gpu.py --data inet.h5 --modes ceiling,gpufeed,torchvision,pil,quality,train
"""
import argparse
import contextlib
import ctypes
import json
import math
import os
import random
import sys
import threading
import time

from torch_jpeg import rrc_params  # torchvision's RandomResizedCrop.get_params, as the PIL peer draws it


def read_encoded(path):
    """The stored JPEGs of gpufeed's encoded group, with h5py, and the labels."""
    import h5py
    import numpy as np
    with h5py.File(path, "r") as f:
        offsets = f["images/offsets"][()]
        data = f["images/bytes"][()]
        labels = f["labels"][()] if "labels" in f else np.zeros(len(offsets) - 1, np.int64)
    return [data[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)], labels


class NvjpegCeiling:
    """nvJPEG's batched decoder through ctypes (hardware backend): decode only."""

    def __init__(self, torch, batch):
        self.lib = None
        for name in ("libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                pass
        if self.lib is None:
            raise RuntimeError("libnvjpeg not found")
        self.torch = torch
        self.h = ctypes.c_void_p()
        self.st = ctypes.c_void_p()
        for backend in (3, 2):
            if self.lib.nvjpegCreateEx(backend, None, None, 0, ctypes.byref(self.h)) == 0:
                self.backend = {3: "hardware", 2: "gpu-hybrid"}[backend]
                break
        else:
            raise RuntimeError("nvjpegCreateEx failed")
        assert self.lib.nvjpegJpegStateCreate(self.h, ctypes.byref(self.st)) == 0
        self.batch = batch
        assert self.lib.nvjpegDecodeBatchedInitialize(self.h, self.st, batch, 1, 5) == 0

    def decode(self, blobs, sizes, out, stream):
        """blobs: pinned uint8 tensors; sizes: (h, w); out: device buffers."""
        n = len(blobs)
        if n != self.batch:
            assert self.lib.nvjpegDecodeBatchedInitialize(self.h, self.st, n, 1, 5) == 0
            self.batch = n

        class Image(ctypes.Structure):
            _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]
        data = (ctypes.c_void_p * n)(*[b.data_ptr() for b in blobs])
        lens = (ctypes.c_size_t * n)(*[b.numel() for b in blobs])
        imgs = (Image * n)()
        for i, ((h, w), o) in enumerate(zip(sizes, out)):
            imgs[i].channel[0] = o.data_ptr()
            imgs[i].pitch[0] = 3 * w
        r = self.lib.nvjpegDecodeBatched(self.h, self.st, data, lens, imgs, ctypes.c_void_p(stream))
        if r != 0:
            raise RuntimeError("nvjpegDecodeBatched: %d" % r)


def jpeg_size(b):
    """(h, w) from a baseline/progressive JPEG's SOF marker."""
    i = 2
    while i < len(b):
        if b[i] != 0xFF:
            i += 1
            continue
        m = b[i + 1]
        if m in (0xC0, 0xC1, 0xC2):
            return (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8]
        i += 2 + ((b[i + 2] << 8) | b[i + 3])
    raise ValueError("no SOF")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--modes", default="ceiling,gpufeed,torchvision,pil,quality,train")
    ap.add_argument("--threads", type=int, default=4, help="gpufeed loader threads for decode=gpu")
    ap.add_argument("--cpu-threads", type=int, default=16, help="gpufeed loader threads for decode=cpu")
    ap.add_argument("--workers", type=int, default=15, help="DataLoader + PIL workers")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--models", default="resnet18,resnet50")
    ap.add_argument("--loader-first", action="store_true",
                    help="train: make the Loaders before the model (a training script's order), not just before "
                         "their epochs")
    ap.add_argument("--train-stream", default="default", choices=["default", "side"],
                    help="train on the legacy default stream (PyTorch's default) or a side stream")
    ap.add_argument("--order", default="block", help="gpufeed's order (block: its default, chunk-aware)")
    ap.add_argument("--train-decode", default="gpu,auto",
                    help="train: gpufeed's decode= values to train with, each (gpu: the engine alone; auto: the "
                         "loader's threads take a measured share)")
    ap.add_argument("--loader-kw", default="{}", help="more gpufeed.Loader arguments, as JSON (experiments)")
    ap.add_argument("--json")
    a = ap.parse_args()
    import numpy as np
    import torch
    import gpufeed
    modes = a.modes.split(",")
    order = a.order
    blobs, labels = read_encoded(a.data)
    n = len(blobs)
    want_sum = int(labels.sum())
    classes = int(labels.max()) + 1
    mean = [0.485 * 255, 0.456 * 255, 0.406 * 255]
    std = [0.229 * 255, 0.224 * 255, 0.225 * 255]
    out = {"data": a.data, "samples": n, "host_cores": os.cpu_count(), "device": torch.cuda.get_device_name(0),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print("%s: %d JPEGs, %.1f KB mean; %s, %d cores" % (a.data, n, sum(len(b) for b in blobs) / n / 1e3,
                                                         out["device"], os.cpu_count()), flush=True)

    def make_loader(decode, threads, **kw):
        kw = dict(json.loads(a.loader_kw), **kw)
        return gpufeed.Loader(a.data, batch_size=a.batch_size, device="cuda", dtype=torch.bfloat16,
                              layout="NHWC", threads=threads, decode=decode, order=order, seed=1,
                              mean=mean, std=std, **kw)

    def gpufeed_epochs(decode, threads, epochs, consume=None, loader=None, **kw):
        loader = loader if loader is not None else make_loader(decode, threads, **kw)
        rates = []
        for e in range(epochs):
            loader.set_epoch(e) if hasattr(loader, "set_epoch") else None
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            count, lsum = 0, torch.zeros((), dtype=torch.int64, device="cuda")
            for images, lab in loader:
                if consume is not None:
                    consume(images, lab)
                count += images.shape[0]
                lsum += lab.sum()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if count != n or int(lsum) != want_sum:
                raise SystemExit("gpufeed decode=%s epoch %d: %d samples, label sum %d; file: %d, %d" % (
                    decode, e, count, int(lsum), n, want_sum))
            rates.append(n / dt)
        st = loader.stats()
        where = loader.decode
        loader.close()
        return rates, where, st

    if "ceiling" in modes:
        dec = NvjpegCeiling(torch, a.batch_size)
        sizes = [jpeg_size(bytes(b[:4096])) for b in blobs]
        pinned = [torch.from_numpy(np.asarray(b)).pin_memory() for b in blobs]
        stream = torch.cuda.current_stream().cuda_stream
        outs = {}
        best = 0
        for rep in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for s in range(0, n, a.batch_size):
                idx = range(s, min(n, s + a.batch_size))
                bufs = []
                for i in idx:
                    h, w = sizes[i]
                    key = (i - s, h * w)
                    if key not in outs:
                        outs[key] = torch.empty(h * w * 3, dtype=torch.uint8, device="cuda")
                    bufs.append(outs[key])
                dec.decode([pinned[i] for i in idx], [sizes[i] for i in idx], bufs, stream)
            torch.cuda.synchronize()
            best = max(best, n / (time.perf_counter() - t0))
        out["ceiling"] = {"backend": dec.backend, "images_per_s": best}
        print("ceiling: nvJPEG %s batched decode only: %.0f images/s" % (dec.backend, best), flush=True)
        del outs, pinned

    if "gpufeed" in modes:
        res = {}
        for decode, threads in (("gpu", a.threads), ("auto", a.threads), ("cpu", a.threads), ("cpu", a.cpu_threads)):
            rates, where, st = gpufeed_epochs(decode, threads, a.epochs)
            key = "%s_%d" % (decode, threads)
            res[key] = {"rates": rates, "decode": where,
                        "split": {k: st.get(k) for k in ("feed_decoded_on_device", "feed_decoded_by_loader",
                                                         "feed_decode_fallbacks", "feed_decode_seconds",
                                                         "feed_data_wait_seconds")}}
            print("gpufeed decode=%s threads=%d [%s]: epochs %s images/s; split %s" % (
                decode, threads, where, " ".join("%.0f" % r for r in rates), res[key]["split"]), flush=True)
        out["gpufeed"] = res

    if "torchvision" in modes:
        import torch.nn.functional as F
        import torchvision
        from torchvision.io import decode_jpeg
        m = torch.tensor(mean, device="cuda").view(1, 3, 1, 1)
        s_ = torch.tensor(std, device="cuda").view(1, 3, 1, 1)
        rng = random.Random(1)
        cpu_blobs = [torch.from_numpy(np.asarray(b)) for b in blobs]
        rates = []
        for e in range(2):
            perm = list(range(n))
            rng.shuffle(perm)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            count, lsum = 0, 0
            for s in range(0, n, a.batch_size):
                idx = perm[s:s + a.batch_size]
                imgs = decode_jpeg([cpu_blobs[i] for i in idx], device="cuda")
                outb = torch.empty(len(idx), 3, 224, 224, device="cuda", dtype=torch.bfloat16)
                for j, img in enumerate(imgs):
                    _, h, w = img.shape
                    t, l, ch, cw = rrc_params(w, h, rng)
                    crop = img[:, t:t + ch, l:l + cw].unsqueeze(0).float()
                    outb[j] = ((F.interpolate(crop, size=(224, 224), mode="bilinear", antialias=True,
                                              align_corners=False) - m) / s_)[0].to(torch.bfloat16)
                count += len(idx)
                lsum += int(labels[idx].sum())
            torch.cuda.synchronize()
            assert count == n and lsum == want_sum
            rates.append(n / (time.perf_counter() - t0))
        out["torchvision"] = rates
        print("torchvision decode_jpeg(device=cuda) batched + crop per image: epochs %s images/s" % (
            " ".join("%.0f" % r for r in rates)), flush=True)

    if "pil" in modes:
        from PIL import Image
        import io
        folder = a.data + ".jpg.d"
        files = sorted(os.path.join(r, f) for r, _, fs in os.walk(folder) for f in fs if f.endswith(".jpg"))
        if len(files) != n:
            files = None  # read the bytes from the file instead

        class DS(torch.utils.data.Dataset):
            def __len__(self):
                return n

            def __getitem__(self, i):
                rng = random.Random(i * 7919 + 1)
                b = open(files[i], "rb").read() if files else bytes(blobs[i])
                img = Image.open(io.BytesIO(b)).convert("RGB")
                t, l, ch, cw = rrc_params(img.width, img.height, rng)
                img = img.resize((224, 224), Image.BILINEAR, box=(l, t, l + cw, t + ch))
                return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()), int(labels[i])
        dl = torch.utils.data.DataLoader(DS(), batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                                         pin_memory=True, persistent_workers=True, prefetch_factor=4)
        m = torch.tensor(mean, device="cuda").view(1, 1, 1, 3)
        s_ = torch.tensor(std, device="cuda").view(1, 1, 1, 3)
        rates = []
        for e in range(2):
            t0 = time.perf_counter()
            count, lsum = 0, 0
            for x, y in dl:
                x = ((x.cuda(non_blocking=True).float() - m) / s_).to(torch.bfloat16)
                count += x.shape[0]
                lsum += int(y.sum())
            torch.cuda.synchronize()
            assert count == n and lsum == want_sum
            rates.append(n / (time.perf_counter() - t0))
        out["pil"] = rates
        print("DataLoader + PIL, %d workers: epochs %s images/s" % (a.workers, " ".join("%.0f" % r for r in rates)),
              flush=True)

    if "quality" in modes:
        kw = dict(batch_size=a.batch_size, device="cuda", dtype=torch.float32, threads=a.threads, order="sequential",
                  seed=3, mean=[0, 0, 0], std=[1, 1, 1])
        g = gpufeed.Loader(a.data, decode="gpu", **kw)
        c = gpufeed.Loader(a.data, decode="cpu", **kw)
        tot, cnt, worst = 0.0, 0, 0.0
        for (xg, yg), (xc, yc) in zip(g, c):
            assert torch.equal(yg, yc)
            d = (xg - xc).abs()
            per = d.flatten(1).mean(1)
            worst = max(worst, float(per.max()))
            tot += float(d.sum())
            cnt += d.numel()
        assert cnt == n * 3 * 224 * 224
        out["quality"] = {"mean_abs_diff_levels": tot / cnt, "worst_sample_mean": worst}
        print("quality: decode=gpu vs decode=cpu, same crops, %d samples: mean |diff| %.3f levels (worst sample "
              "%.2f)" % (n, tot / cnt, worst), flush=True)
        g.close()
        c.close()

    if "train" in modes:
        import torchvision
        res = {}
        for arch in a.models.split(","):
            # --loader-first: the Loaders made before the model, as a training
            # script makes its data pipeline first (their feeders start
            # while the model is built and its ceiling measured).
            early = {dec: make_loader(dec, a.threads) for dec in a.train_decode.split(",")} if a.loader_first else {}
            torch.manual_seed(0)
            model = getattr(torchvision.models, arch)(num_classes=classes).cuda().to(memory_format=torch.channels_last)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            crit = torch.nn.CrossEntropyLoss()

            def step(x, y):
                x = x.permute(0, 3, 1, 2) if x.shape[-1] == 3 else x  # NHWC storage -> NCHW view, channels-last
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = crit(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            # Ceiling: 8 batches resident on the GPU, cycled for an epoch's worth of steps.
            xs = [torch.randn(a.batch_size, 224, 224, 3, device="cuda").to(torch.bfloat16) for _ in range(8)]
            ys = [torch.randint(0, classes, (a.batch_size,), device="cuda") for _ in range(8)]
            for i in range(10):
                step(xs[i % 8], ys[i % 8])
            torch.cuda.synchronize()
            steps = n // a.batch_size
            t0 = time.perf_counter()
            for i in range(steps):
                step(xs[i % 8], ys[i % 8])
            torch.cuda.synchronize()
            ceiling = steps * a.batch_size / (time.perf_counter() - t0)
            side = torch.cuda.Stream() if a.train_stream == "side" else None
            res[arch] = {"ceiling": ceiling}
            for dec in a.train_decode.split(","):
                with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                    rates, where, st = gpufeed_epochs(dec, a.threads, a.epochs, consume=step, loader=early.pop(dec, None))
                split = {k: st.get(k) for k in ("feed_decode_seconds", "feed_data_wait_seconds", "feed_wall_seconds",
                                                 "feed_decoded_on_device", "feed_decoded_by_loader",
                                                 "balanced_samples", "host_decode_share")}
                res[arch]["gpufeed_" + dec] = {"rates": rates, "ratios": [r / ceiling for r in rates],
                                               "decode": where, "last_epoch_feed": split}
                print("  last epoch's feed: %s" % split, flush=True)
                print("train %s (%s stream): ceiling %.0f images/s; gpufeed decode=%s [%s] threads=%d epochs %s "
                      "images/s = %s of the ceiling" % (arch, a.train_stream, ceiling, dec, where, a.threads,
                                                        " ".join("%.0f" % r for r in rates),
                                                        " ".join("%.3f" % (r / ceiling) for r in rates)), flush=True)
            del model, opt, xs, ys
            torch.cuda.empty_cache()
        out["train"] = res

    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
