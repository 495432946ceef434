#!/usr/bin/env python3
"""ResNet-18 data parallel under torchrun (DDP, NCCL, bf16 autocast,
channels-last, AdamW, batch --batch-size a rank), fed one way per run:

  ceiling  each rank's shard already on its GPU (normalized, a permutation
           per epoch): the model's compute ceiling at this many GPUs
  gpufeed  a gpufeed.Loader in each rank (share="none"; threads: --threads,
           0 = the rank's share of the host's cores)
  node     gpufeed.Loader(share="node"): the node's ranks read through one
           node-local server (one reader, cache and set of decode threads)
  tuned    DataLoader + DistributedSampler + h5py as the 'GPU Util 99%'
           write-up tunes it (a chunk cache holding the decoded file in each
           worker, sorted per-batch reads), --workers split between the ranks

  torchrun --standalone --nproc_per_node G bench/peer/torch_ddp.py --data celeba-deflate.h5 --mode node

Every epoch is checked across ranks before it is reported: the sample count
and the label sum, all-reduced, must be the file's (each rank the same
number of batches, or the collectives would hang). Before epoch 1 the model
takes 5 steps on random batches (cuDNN's autotuning and the allocator's
first growth are not the feed's). Reported by rank 0: samples/s of the whole
node per epoch (the slowest rank's wall time), NVML GPU utilization (mean of
the ranks), peak host RSS of the job (every process under torchrun's agent,
the node server and DataLoader workers included), peak GPU memory per rank.
--json writes it all.
"""
import argparse
import json
import os
import pathlib
import sys
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from torch_e2e import H5Samples  # noqa: E402
from torch_resnet import Nvml, describe, on_gpu, resnet18  # noqa: E402

import gpufeed  # noqa: E402


def pss(pid):
    """Proportional set size of one process, bytes: shared pages (the node
    server's slots mapped by a rank, torch's libraries) divided among the
    processes that map them, so a sum over processes counts memory once."""
    try:
        with open("/proc/%s/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_pss(root):
    """PSS of `root` and every descendant (the node server, started by a
    rank, and DataLoader workers are descendants of torchrun's agent)."""
    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    total = 0
    for pid in parent:
        p = pid
        while p and p != root:
            p = parent.get(p, 0)
        if p == root and pid != root:
            total += pss(pid)
    return total


class Sampler(threading.Thread):
    """NVML utilization of this rank's GPU every 50 ms; rank 0 also the
    job's PSS (torchrun's agent excluded) every 0.5 s."""

    def __init__(self, nvml, rss_root):
        super().__init__(daemon=True)
        self.nvml, self.rss_root, self.util, self.stop = nvml, rss_root, [], threading.Event()
        self.peak_rss = self.peak_gpu = 0
        self.start()

    def run(self):
        k = 0
        while not self.stop.wait(0.05):
            s = self.nvml.sample()
            if s is not None:
                self.util.append(s[0])
                self.peak_gpu = max(self.peak_gpu, s[1])
            if self.rss_root and k % 10 == 0:
                self.peak_rss = max(self.peak_rss, tree_pss(self.rss_root))
            k += 1

    def take_util(self):
        u, self.util = self.util, []
        return sum(u) / len(u) if u else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--mode", required=True, choices=["ceiling", "gpufeed", "node", "tuned"])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--threads", type=int, default=0, help="gpufeed: loader threads a rank (0: the default split)")
    p.add_argument("--workers", type=int, default=15, help="tuned: DataLoader workers of the node, split")
    p.add_argument("--cache-bytes", type=int, default=0, help="gpufeed: chunk cache a stream (0: the decoded file)")
    p.add_argument("--max-seconds", type=float, default=0, help="cut an epoch after this long (slow peers)")
    p.add_argument("--json")
    a = p.parse_args()

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    torch.backends.cudnn.benchmark = True

    labels_all, shape, mean, std = describe(a.data)
    n, channels = len(labels_all), shape[1]
    classes = int(labels_all.max()) + 1
    sample_bytes = int(np.prod(shape[1:]))
    share = -(-n // world)
    cache = a.cache_bytes or int(n * sample_bytes * 1.25)

    torch.manual_seed(0)
    model, kind = resnet18(channels, classes)
    model = model.to(dev).to(memory_format=torch.channels_last)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mean_t = torch.tensor(mean, device=dev).view(1, -1, 1, 1)
    std_t = torch.tensor(std, device=dev).view(1, -1, 1, 1)

    def step(images, labels):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    # The model's warm-up, the same for every mode: the input dtype the mode
    # delivers (bf16 from gpufeed and the ceiling, float32 normalized by the
    # tuned peer), at the full and the last (short) batch size, so cuDNN's
    # autotuning is not counted in epoch 1.
    in_dtype = torch.float32 if a.mode == "tuned" else torch.bfloat16
    for size in sorted({a.batch_size, share % a.batch_size or a.batch_size}):
        warm = torch.randn(size, channels, shape[2], shape[3], device=dev).to(in_dtype).contiguous(
            memory_format=torch.channels_last)
        for _ in range(3):
            step(warm, torch.randint(0, classes, (size,), device=dev))
    del warm
    torch.cuda.synchronize()
    base = torch.tensor([pss(os.getpid())], dtype=torch.float64, device=dev)
    dist.all_reduce(base)  # the ranks' memory before the feed opens

    loader = None
    t_open = time.perf_counter()
    if a.mode == "ceiling":
        all_images, all_labels = on_gpu(a.data, mean, std)  # the whole file on each rank

        def batches(epoch):
            # The rank's shard of a permutation common to all ranks (as
            # DistributedSampler), padded the same way.
            g = torch.Generator(device=dev)
            g.manual_seed(epoch)
            perm = torch.randperm(n, device=dev, generator=g)
            perm = torch.cat([perm, perm[:share * world - n]])[rank * share:(rank + 1) * share]
            for s in range(0, share, a.batch_size):
                i = perm[s:s + a.batch_size]
                yield all_images[i].contiguous(memory_format=torch.channels_last), all_labels[i]
    elif a.mode in ("gpufeed", "node"):
        loader = gpufeed.Loader(a.data, batch_size=a.batch_size, order="block", seed=0, threads=a.threads,
                                cache_bytes=cache, device="cuda", dtype=torch.bfloat16, layout="NHWC", mean=mean,
                                std=std, share="node" if a.mode == "node" else "none")
        assert loader.share == ("node" if a.mode == "node" else "none")

        def batches(epoch):
            loader.set_epoch(epoch)
            for images, lab in loader:
                yield images.permute(0, 3, 1, 2), lab.long()
    else:
        ds = H5Samples(a.data, True)
        sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True,
                                                                  seed=0)
        workers = max(1, a.workers // world)
        dl = torch.utils.data.DataLoader(
            ds, sampler=torch.utils.data.BatchSampler(sampler, a.batch_size, False), batch_size=None,
            num_workers=workers, persistent_workers=True, pin_memory=True, prefetch_factor=4)

        def batches(epoch):
            sampler.set_epoch(epoch)
            for images, lab in dl:
                images = images.cuda(non_blocking=True)
                images = ((images.float() - mean_t) / std_t).contiguous(memory_format=torch.channels_last)
                yield images, lab.cuda(non_blocking=True)
    open_s = time.perf_counter() - t_open

    nvml = Nvml(local_rank)
    sampler_t = Sampler(nvml, os.getppid() if rank == 0 else 0)
    want_count = share * world
    want_sum = int(labels_all.sum()) if want_count == n else None
    epochs = []
    for epoch in range(a.epochs):
        count = torch.zeros(3, dtype=torch.float64, device=dev)  # samples, label sum, batches
        partial = 0
        dist.barrier()
        torch.cuda.synchronize()
        sampler_t.take_util()
        t0 = time.perf_counter()
        for images, lab in batches(epoch):
            step(images, lab)
            count[0] += lab.shape[0]
            count[1] += lab.sum()
            count[2] += 1
            if a.max_seconds and time.perf_counter() - t0 > a.max_seconds:
                partial = 1
                break
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        util = sampler_t.take_util()
        stats = torch.tensor([seconds, util, partial], dtype=torch.float64, device=dev)
        slowest = stats.clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        dist.all_reduce(stats)
        lo = count.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(count)
        samples, label_sum = int(count[0]), int(count[1])
        if not slowest[2]:
            if int(lo[2]) * world != int(count[2]):
                raise SystemExit("%s: epoch %d: the ranks ran different numbers of batches" % (a.mode, epoch + 1))
            if samples != want_count or (want_sum is not None and label_sum != want_sum):
                raise SystemExit("%s: epoch %d delivered %d samples, label sum %d; want %d, %s" % (
                    a.mode, epoch + 1, samples, label_sum, want_count, want_sum))
        rate = samples / float(slowest[0])
        e = {"samples_per_s": rate, "seconds": float(slowest[0]), "samples": samples,
             "gpu_util": float(stats[1]) / world, "partial": bool(slowest[2])}
        epochs.append(e)
        if rank == 0:
            print("  %-8s G=%d epoch %d: %8.0f samples/s  GPU %5.1f%%  %.2f s%s" % (
                a.mode, world, epoch + 1, rate, e["gpu_util"], e["seconds"],
                "  (partial: cut at %d s)" % a.max_seconds if e["partial"] else ""), flush=True)
        if e["partial"] and epoch >= 1:
            break
    sampler_t.stop.set()
    sampler_t.join()
    peak = torch.tensor([sampler_t.peak_gpu, torch.cuda.max_memory_allocated()], dtype=torch.float64, device=dev)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    stats = loader.stats() if loader is not None else {}
    if loader is not None:
        loader.close()
    if rank == 0:
        later = epochs[1:] or epochs[:1]
        out = {"mode": a.mode, "gpus": world, "data": a.data, "samples": n, "batch_size": a.batch_size,
               "threads": a.threads, "workers": a.workers, "torch": torch.__version__, "model": kind,
               "device": torch.cuda.get_device_name(), "open_seconds": open_s, "epochs": epochs,
               "later_samples_per_s": sum(x["samples_per_s"] for x in later) / len(later),
               "peak_host_rss": sampler_t.peak_rss, "feed_host_bytes": sampler_t.peak_rss - float(base[0]),
               "peak_gpu_mem_per_rank": float(peak[0]),
               "torch_peak_alloc_per_rank": float(peak[1]), "loader_stats_rank0": stats,
               "cpus": os.cpu_count()}
        print("  %-8s G=%d later epochs %.0f samples/s, job memory %.1f GiB (the feed's %.1f), GPU mem %.1f GiB a "
              "rank, open %.1f s" % (a.mode, world, out["later_samples_per_s"], out["peak_host_rss"] / 2**30,
                                     out["feed_host_bytes"] / 2**30, out["peak_gpu_mem_per_rank"] / 2**30, open_s),
              flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
