#!/usr/bin/env python3
"""ResNet-18 in PyTorch (bf16 autocast, channels-last, AdamW) fed five ways,
in one run, on one GPU:

  ceiling  the same batches already on the GPU (normalized, a permutation per
           epoch): the model's compute ceiling
  naive    DataLoader + h5py as its users write it (file opened lazily per
           worker, one __getitem__ per sample, h5py's 1 MiB chunk cache,
           shuffle, pin_memory, persistent_workers)
  tuned    the 'GPU Util 99%' recipe: a chunk cache holding the decoded file
           in each worker (rdcc_nbytes, rdcc_w0=1, prime rdcc_nslots) and a
           batch sampler reading each batch's sorted indices in one call
  gpufeed  gpufeed.Loader(device="cuda", dtype=torch.bfloat16): normalized on
           the GPU, NHWC (a channels-last view without a copy)
  daemon   the same through a `gpufeed serve` daemon (shared memory);
           --daemon unix:PATH, --dataset NAME

Per mode and epoch: samples/s, mean NVML GPU utilization (sampled every
50 ms while the epoch runs), the share of the ceiling; per mode: peak host
RSS of this process plus its worker processes (shared pages counted in each)
and peak GPU memory in use (NVML, the whole device). An epoch counts only
when it delivered every sample once (the count and the sum of labels equal
the file's); an epoch cut at --max-seconds (slow peers) is reported as
partial, its rate over what it delivered.

Before timing, `check` compares gpufeed's CUDA batches with its CPU twins'
(the same loader options, device="cpu"), batch for batch.

  PYTHONPATH=dist/gpufeed/python python3 bench/peer/torch_resnet.py \\
      --data celeba-deflate.h5 --epochs 3 --workers 15 --threads 16
"""
import argparse
import ctypes
import json
import os
import pathlib
import sys
import threading
import time

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import gpufeed

ROOT = pathlib.Path(__file__).resolve().parents[2]


# --- NVML: utilization and memory of the device, sampled in a thread --------
class Nvml:
    def __init__(self, index=0):
        self.lib = None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            self.handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)) != 0:
                return
            self.lib = lib
        except OSError:
            pass

    def sample(self):
        """(utilization %, memory used bytes) or None."""
        if self.lib is None:
            return None
        util = (ctypes.c_uint * 2)()
        mem = (ctypes.c_ulonglong * 3)()  # total, free, used
        if self.lib.nvmlDeviceGetUtilizationRates(self.handle, util) != 0:
            return None
        if self.lib.nvmlDeviceGetMemoryInfo(self.handle, mem) != 0:
            return None
        return util[0], mem[2]


def children_rss():
    """RSS of this process and every descendant, bytes (from /proc)."""
    me = os.getpid()
    parent, rss = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/status" % d) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            parent[int(d)] = int(fields["PPid"])
            rss[int(d)] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            continue
    total = 0
    for pid in rss:
        p = pid
        while p and p != me:
            p = parent.get(p, 0)
        if p == me:
            total += rss[pid]
    return total


class Sampler:
    def __init__(self, nvml):
        self.nvml, self.util, self.stop = nvml, [], threading.Event()
        self.peak_rss = self.peak_gpu = 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        k = 0
        while not self.stop.wait(0.05):
            s = self.nvml.sample()
            if s is not None:
                self.util.append(s[0])
                self.peak_gpu = max(self.peak_gpu, s[1])
            if k % 10 == 0:
                self.peak_rss = max(self.peak_rss, children_rss())
            k += 1

    def take_util(self):
        u, self.util = self.util, []
        return sum(u) / len(u) if u else float("nan")

    def close(self):
        self.stop.set()
        self.thread.join()


# --- the model ---------------------------------------------------------------
def resnet18(in_channels, classes):
    try:
        import torchvision
        m = torchvision.models.resnet18(num_classes=classes)
        if in_channels != 3:
            m.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
        return m, "torchvision"
    except ImportError:
        pass

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = F.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return F.relu(y + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers), "written out"


# --- the h5py peers ---------------------------------------------------------
# The Dataset of torch_e2e.py (per-sample reads naive, sorted per-batch reads
# tuned, the file opened lazily per worker): one peer for both scripts.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from torch_e2e import H5Samples  # noqa: E402


def dataloader(path, tuned, batch_size, workers):
    ds = H5Samples(path, tuned)
    g = torch.Generator()
    g.manual_seed(0)
    kw = dict(num_workers=workers, persistent_workers=workers > 0, pin_memory=True)
    if workers > 0:
        kw["prefetch_factor"] = 4
    if tuned:
        sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(ds, generator=g), batch_size, False)
        return torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, **kw)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, generator=g, **kw)


# --- the timed loop --------------------------------------------------------------
def run(name, batches_for_epoch, in_channels, classes, epochs, want, prepare, sampler, max_seconds):
    torch.manual_seed(0)
    model, kind = resnet18(in_channels, classes)
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = []
    for epoch in range(epochs):
        n = label_sum = 0
        partial = False
        torch.cuda.synchronize()
        sampler.take_util()
        t0 = time.perf_counter()
        for images, labels in batches_for_epoch(epoch):
            images, labels = prepare(images, labels)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            n += labels.shape[0]
            label_sum += labels.sum()
            if max_seconds and time.perf_counter() - t0 > max_seconds:
                partial = True
                break
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        util = sampler.take_util()
        label_sum = int(label_sum)
        if not partial and (n, label_sum) != want:
            raise SystemExit("%s: epoch %d delivered %d samples, label sum %d; the file has %s" % (
                name, epoch + 1, n, label_sum, want))
        rate = n / seconds
        out.append({"samples_per_s": rate, "gpu_util": util, "seconds": seconds, "samples": n, "partial": partial})
        print("  %-8s epoch %d: %8.0f samples/s  GPU %5.1f%%  %.1f s%s" % (
            name, epoch + 1, rate, util, seconds, "  (partial: cut at %d s)" % max_seconds if partial else ""),
            flush=True)
        if partial and epoch >= 1:
            break
    return {"epochs": out, "model": kind}


def describe(path):
    """(labels int64, images shape, per-channel mean, per-channel std) of a
    gpufeed file (mean/std from its attributes, else 0 and 255)."""
    with h5py.File(path, "r") as f:
        labels = f["labels"][...].astype(np.int64)
        shape = f["images"].shape
        mean = [float(v) for v in f["images"].attrs.get("mean", [0.0] * shape[1])]
        std = [float(v) for v in f["images"].attrs.get("std", [255.0] * shape[1])]
    if len(mean) == 1 and shape[1] != 1:
        mean, std = mean * shape[1], std * shape[1]
    return labels, shape, mean, std


def on_gpu(path, mean, std, threads=0):
    """The whole file on the current GPU, normalized bf16 (an NCHW view of
    channels-last storage), and its int64 labels: the ceiling's batches."""
    loader = gpufeed.Loader(path, batch_size=1024, order="sequential", threads=threads, device="cuda",
                            dtype=torch.bfloat16, layout="NHWC", mean=mean, std=std, share="none", rank=0,
                            world_size=1)
    parts, lparts = [], []
    for images, lab in loader:
        parts.append(images.clone())
        lparts.append(lab.long().clone())
    loader.close()
    return torch.cat(parts).permute(0, 3, 1, 2), torch.cat(lparts)


def check_cuda_against_cpu_twins(data, mean, std, threads, batches=4):
    """gpufeed's CUDA batches equal its CPU twins' (bf16 rounding apart)."""
    common = dict(batch_size=256, order="block", seed=7, threads=threads, dtype=torch.float32, mean=mean, std=std)
    gpu = gpufeed.Loader(data, device="cuda", **common)
    cpu = gpufeed.Loader(data, device="cpu", **common)
    worst = 0.0
    for k, ((gi, gl), (ci, cl)) in enumerate(zip(gpu, cpu)):
        if k == batches:
            break
        if gi.device.type != "cuda":
            raise SystemExit("check: device='cuda' gave a tensor on %s" % gi.device)
        if not torch.equal(gl.cpu().long(), cl.long()):
            raise SystemExit("check: batch %d labels differ between CUDA and CPU twins" % k)
        worst = max(worst, float((gi.cpu() - ci).abs().max()))
    gpu.close()
    cpu.close()
    if worst > 1e-5:
        raise SystemExit("check: CUDA and CPU batches differ by %g" % worst)
    print("check: %d batches, gpufeed CUDA feed == CPU twins (max |diff| %.2g)" % (batches, worst), flush=True)
    return worst


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=15)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--cache-bytes", default="auto", help="gpufeed's chunk cache (bytes or auto)")
    p.add_argument("--modes", default="check,ceiling,naive,tuned,gpufeed")
    p.add_argument("--daemon", help="unix:PATH of a gpufeed serve daemon (mode daemon)")
    p.add_argument("--dataset", help="the daemon's name for --data (default: --data)")
    p.add_argument("--max-seconds", type=float, default=0, help="cut the naive peer's epochs after this long")
    p.add_argument("--json")
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True
    labels, shape, mean, std = describe(a.data)
    n, channels = len(labels), shape[1]
    classes = int(labels.max()) + 1
    want = (n, int(labels.sum()))
    mean_t = torch.tensor(mean, device="cuda").view(1, -1, 1, 1)
    std_t = torch.tensor(std, device="cuda").view(1, -1, 1, 1)
    cache = a.cache_bytes if a.cache_bytes == "auto" else int(a.cache_bytes)
    if cache == "auto":
        cache = int(min(int(n * np.prod(shape[1:]) * 1.25), 64 << 30))

    def prepare_host(images, labels):
        images = images.cuda(non_blocking=True)
        images = ((images.float() - mean_t) / std_t).contiguous(memory_format=torch.channels_last)
        return images, labels.cuda(non_blocking=True)

    def prepare_feed(images, labels):  # NHWC bf16 on the GPU: a channels-last NCHW view
        return images.permute(0, 3, 1, 2), labels.long()

    nvml = Nvml(torch.cuda.current_device())
    results = {}
    print("%s: %d samples %s, %d classes; torch %s, %s, batch %d, %d workers / %d threads" % (
        a.data, n, list(shape[1:]), classes, torch.__version__, torch.cuda.get_device_name(), a.batch_size,
        a.workers, a.threads), flush=True)
    for mode in a.modes.split(","):
        sampler = Sampler(nvml)
        torch.cuda.reset_peak_memory_stats()
        if mode == "check":
            results[mode] = {"max_abs_diff": check_cuda_against_cpu_twins(a.data, mean, std, a.threads)}
            sampler.close()
            continue
        if mode == "ceiling":
            all_images, all_labels = on_gpu(a.data, mean, std, a.threads)

            def batches(epoch):
                g = torch.Generator(device="cuda")
                g.manual_seed(epoch)
                perm = torch.randperm(n, device="cuda", generator=g)
                for s in range(0, n, a.batch_size):
                    i = perm[s:s + a.batch_size]
                    yield all_images[i].contiguous(memory_format=torch.channels_last), all_labels[i]
            r = run(mode, batches, channels, classes, a.epochs, want, lambda x, y: (x, y), sampler, 0)
            del all_images, all_labels
        elif mode in ("naive", "tuned"):
            dl = dataloader(a.data, mode == "tuned", a.batch_size, a.workers)
            # Only the naive peer's epochs are cut: the tuned one's first epoch fills its caches.
            cut = a.max_seconds if mode == "naive" else 0
            r = run(mode, lambda epoch: dl, channels, classes, a.epochs, want, prepare_host, sampler, cut)
            del dl
        elif mode in ("gpufeed", "daemon"):
            kw = dict(batch_size=a.batch_size, order="block", seed=0, device="cuda", dtype=torch.bfloat16,
                      layout="NHWC", mean=mean, std=std)
            if mode == "daemon":
                if not a.daemon:
                    raise SystemExit("mode daemon needs --daemon unix:PATH")
                loader = gpufeed.Loader(a.daemon, dataset=a.dataset or a.data, **kw)
            else:
                loader = gpufeed.Loader(a.data, threads=a.threads, cache_bytes=cache, **kw)

            def batches(epoch):
                loader.set_epoch(epoch)
                return iter(loader)
            r = run(mode, batches, channels, classes, a.epochs, want, prepare_feed, sampler, 0)
            if mode == "gpufeed":
                r["stats"] = loader.stats()
            loader.close()
        else:
            raise SystemExit("unknown mode " + mode)
        sampler.close()
        r["peak_host_rss"] = sampler.peak_rss
        r["peak_gpu_mem"] = sampler.peak_gpu
        r["torch_peak_alloc"] = torch.cuda.max_memory_allocated()
        results[mode] = r
        torch.cuda.empty_cache()
    ceiling = results.get("ceiling")
    ceil_later = None
    if ceiling:
        later = [e["samples_per_s"] for e in ceiling["epochs"][1:]] or [ceiling["epochs"][0]["samples_per_s"]]
        ceil_later = sum(later) / len(later)
    print("\n%s (%d samples), ResNet-18 bf16 channels-last, batch %d" % (a.data, n, a.batch_size))
    print("  %-8s %12s %8s %12s %8s %9s %10s %10s" % ("feed", "epoch1 /s", "GPU%", "later /s", "GPU%",
                                                      "of ceil", "host RSS", "GPU mem"))
    for mode, r in results.items():
        if mode == "check":
            continue
        e = r["epochs"]
        later = e[1:] or e[:1]
        rate = sum(x["samples_per_s"] for x in later) / len(later)
        util = sum(x["gpu_util"] for x in later) / len(later)
        r["later_samples_per_s"], r["later_gpu_util"] = rate, util
        r["share_of_ceiling"] = rate / ceil_later if ceil_later else float("nan")
        r["epoch1_share_of_ceiling"] = e[0]["samples_per_s"] / ceil_later if ceil_later else float("nan")
        print("  %-8s %12.0f %8.1f %12.0f %8.1f %8.1f%% %9.1fG %9.1fG%s" % (
            mode, e[0]["samples_per_s"], e[0]["gpu_util"], rate, util, 100 * r["share_of_ceiling"],
            r["peak_host_rss"] / 2**30, r["peak_gpu_mem"] / 2**30,
            "  partial" if any(x["partial"] for x in e) else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"data": a.data, "samples": n, "batch_size": a.batch_size, "workers": a.workers,
                       "threads": a.threads, "torch": torch.__version__, "results": results}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
