#!/usr/bin/env python3
"""A torchvision model (bf16 autocast, channels-last, AdamW, batch --batch-size
a rank) trained data parallel under torchrun from an encoded JPEG file
(`gpufeed bench gen --workload imagenet-jpeg`), each rank fed by --loader:

  gpufeed          its own gpufeed.Loader (decode=--decode; auto: the GPU's
                   decoder with the loader's share measured), --order, --share
  dataloader-pil   DataLoader + DistributedSampler(shuffle=True) + PIL decode,
                   RandomResizedCrop(224) and flip written with PIL, --workers
                   a rank, the file opened lazily with h5py in each worker
                   (--peer-variant naive: h5py's defaults; tuned: rdcc set)
  torchvision-gpu  the same sampler, workers returning the encoded bytes,
                   decode_jpeg(device="cuda") a batch at a time and the same
                   crop and flip on the GPU (torchvision.transforms.v2)

against the same job's ceiling: each rank's model on 8 batches already on its
device, as many steps as an epoch (bench/peer/jpeg_peers.py has the peers).

  torchrun --standalone --nproc_per_node 2 bench/peer/torch_jpeg_ddp.py --data inet.h5 --loader dataloader-pil

Every epoch is checked across ranks before it is reported: the sample count
and the label sum, all-reduced, must be the file's. Rank 0 prints images/s of
the node per epoch (the slowest rank's wall time), epoch 1 apart from the
later ones, and per rank: the wait for data (host seconds in the loader's
next batch, the peers' GPU decode and crop included), images/s, GPU
utilization (NVML, sampled), peak RSS, torch's peak GPU memory and NVML's, and
gpufeed's CPU/GPU decode split; --json writes all of it.

--device cpu (gloo, no autocast) runs the gpufeed and dataloader-pil loaders
on CPU ranks, for a smoke test (--model tiny: a small CNN, no torchvision).
"""
import argparse
import importlib
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jpeg_peers  # noqa: E402  (the peers, beside this file)
import step_clock  # noqa: E402

LOADERS = ("gpufeed", "dataloader-pil", "torchvision-gpu")
MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--loader", default="gpufeed", choices=LOADERS)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--threads", type=int, default=4, help="gpufeed: loader threads a rank")
    p.add_argument("--decode", default="auto", choices=["auto", "gpu", "cpu"], help="gpufeed")
    p.add_argument("--order", default="block", choices=["block", "random", "sequential"], help="gpufeed")
    p.add_argument("--share", default="auto", choices=["auto", "none", "node"], help="gpufeed")
    p.add_argument("--workers", type=int,
                   help="peers: DataLoader workers a rank (default: dataloader-pil the rank's share of the cores "
                        "this process may run on; torchvision-gpu 4 or that share if fewer)")
    p.add_argument("--prefetch-factor", type=int, default=4, help="peers: batches each worker keeps ahead")
    p.add_argument("--peer-variant", default="tuned", choices=["naive", "tuned"],
                   help="peers: h5py's defaults, or the chunk cache set (rdcc_nbytes, rdcc_w0=1, rdcc_nslots)")
    p.add_argument("--model", default="resnet18", help="a torchvision.models name, or tiny (a small CNN)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--loader-first", action="store_true",
                   help="make the loader before the model and the ceiling, as training scripts do")
    p.add_argument("--json")
    a = p.parse_args()
    if a.device == "cpu" and a.loader == "torchvision-gpu":
        p.error("--loader torchvision-gpu decodes on a GPU (decode_jpeg(device='cuda')): run it with --device cuda")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch %s sees no CUDA device here; use --device cpu (gpufeed, dataloader-pil)"
                % torch.__version__)
    for k in ("epochs", "batch_size", "image_size", "prefetch_factor"):
        if getattr(a, k) < 1:
            p.error("--%s must be at least 1" % k.replace("_", "-"))
    if a.workers is not None and a.workers < 0:
        p.error("--workers must be 0 (the rank's own process) or more")
    return a


def make_model(name, classes, dev):
    if name == "tiny":  # a smoke test's model: no torchvision needed
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 7, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(16, classes))
    else:
        import torchvision
        m = getattr(torchvision.models, name)(num_classes=classes)
    return m.to(dev).to(memory_format=torch.channels_last)


def cores_here():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Feed:
    """One loader kind behind one interface: epoch(e) yields (images NCHW on the
    rank's device, channels-last; labels int64 there) for this rank's share."""

    def __init__(self, a, n, rank, world, local_world, dev):
        self.a, self.dev, self.kind = a, dev, a.loader
        self.info = {"loader": a.loader}
        cuda = dev.type == "cuda"
        if a.loader == "gpufeed":
            import gpufeed
            self.loader = gpufeed.Loader(a.data, batch_size=a.batch_size, device=str(dev) if cuda else "cpu",
                                         dtype=torch.bfloat16, layout="NHWC", threads=a.threads, decode=a.decode,
                                         seed=1, mean=MEAN, std=STD, order=a.order, share=a.share)
            self.info.update({"threads": a.threads, "order": a.order, "share": self.loader.share,
                              "decode": self.loader.decode})
            return
        if n % world:
            raise SystemExit("%d samples over %d ranks: DistributedSampler would pad with %d repeated samples and "
                             "the every-sample-once check would fail; generate N a multiple of the ranks"
                             % (n, world, world - n % world))
        share = max(1, cores_here() // max(1, local_world))
        workers = a.workers if a.workers is not None else (share if a.loader == "dataloader-pil" else min(4, share))
        labels_, data_bytes, chunk = jpeg_peers.read_index(a.data)
        import psutil
        h5_kw = jpeg_peers.rdcc_for(a.peer_variant, data_bytes, chunk, max(1, workers) * local_world,
                                    psutil.virtual_memory().total)
        self.dl, self.sampler = jpeg_peers.make_dataloader(torch, a.data, n, a.loader, a.image_size, a.batch_size,
                                                           workers, a.prefetch_factor, h5_kw, rank, world,
                                                           pin=cuda, seed=1)
        self.info.update({"workers": workers, "prefetch_factor": a.prefetch_factor, "variant": a.peer_variant,
                          "h5py_file_kw": h5_kw, "order": "shuffle (DistributedSampler)",
                          "decode": "cpu (PIL)" if a.loader == "dataloader-pil" else "gpu (torchvision)"})
        if a.loader == "torchvision-gpu":
            self.gpu = jpeg_peers.GpuDecodeCrop(torch, dev, a.image_size, MEAN, STD, seed=1000 + rank)
            self.info["torchvision"] = self.gpu.version
        else:
            self.mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1)
            self.std = torch.tensor(STD, device=dev).view(1, 3, 1, 1)

    def epoch(self, e):
        if self.kind == "gpufeed":
            self.loader.set_epoch(e)
            for images, lab in self.loader:
                yield images.permute(0, 3, 1, 2), lab.long()
            return
        self.sampler.set_epoch(e)
        if self.kind == "torchvision-gpu":
            for flat, lengths, lab in self.dl:
                yield self.gpu(flat, lengths), lab.to(self.dev, non_blocking=True)
            return
        for x, lab in self.dl:  # uint8 NHWC: as NCHW it is channels-last already
            x = x.to(self.dev, non_blocking=True).permute(0, 3, 1, 2).float().sub_(self.mean).div_(self.std)
            yield x.to(torch.bfloat16), lab.to(self.dev, non_blocking=True)

    def stats(self):
        """gpufeed's statistics of the epoch just run (the decode split); torchvision-gpu's
        host seconds in decode_jpeg and in the crops; {} for dataloader-pil."""
        if self.kind == "torchvision-gpu":
            return self.gpu.take_times()
        if self.kind != "gpufeed":
            return {}
        st = self.loader.stats()
        return {k: st.get(k) for k in ("feed_decoded_on_device", "feed_decoded_by_loader", "balanced_samples",
                                        "host_decoded_samples", "host_decode_share", "feed_decode_seconds",
                                        "feed_data_wait_seconds", "chunk_reads", "bytes_read")}

    def close(self):
        if self.kind == "gpufeed":
            self.loader.close()
        else:
            it = getattr(self.dl, "_iterator", None)
            if it is not None:  # the persistent workers end here, before the process group
                it._shutdown_workers()
            self.dl = None


def decode_split(st, where):
    """gpufeed: the shares of the epoch's images decoded by the GPU's decoder and
    by the loader's CPU threads (the feed's counts; a feed on the CPU decodes
    everything in the loader); None for the peers."""
    if not st:
        return None
    on_gpu, on_cpu = st.get("feed_decoded_on_device") or 0, st.get("feed_decoded_by_loader") or 0
    total = on_gpu + on_cpu
    if total:
        return {"gpu": on_gpu / total, "cpu": on_cpu / total}
    return {"gpu": 0.0, "cpu": 1.0} if str(where).startswith("cpu") else None


def main():
    a = parse()
    if a.loader == "gpufeed":
        # Before CUDA starts: gpufeed sets the context's hardware queues (CUDA_DEVICE_MAX_CONNECTIONS).
        importlib.import_module("gpufeed")
    cuda = a.device == "cuda"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        try:
            dist.init_process_group("nccl", device_id=dev)
        except TypeError:  # a torch without device_id
            dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if not cuda:
        dev = torch.device("cpu")
        torch.set_num_threads(max(1, cores_here() // max(1, local_world)))
    import h5py
    with h5py.File(a.data, "r") as f:
        if "labels" not in f:
            raise SystemExit("%s: no labels; use a file of `gpufeed bench gen --workload imagenet-jpeg`" % a.data)
        labels = f["labels"][()]
    n, want = len(labels), int(labels.astype("int64").sum())
    classes = int(labels.max()) + 1
    monitor = jpeg_peers.Monitor(torch, local, a.device)
    if rank == 0 and monitor.nvml_error:
        print("!! NVML: %s (no GPU utilization or NVML memory in this run)" % monitor.nvml_error, flush=True)

    feed = Feed(a, n, rank, world, local_world, dev) if a.loader_first else None
    torch.manual_seed(0)
    model = make_model(a.model, classes, dev)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    crit = torch.nn.CrossEntropyLoss()

    def step(x, y):
        if cuda:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = crit(model(x), y)
        else:
            loss = crit(model(x.float()), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    # Ceiling: 8 resident batches, an epoch's worth of steps of this rank's share.
    steps = max(1, -(-n // world) // a.batch_size)
    size = a.image_size
    xs = [torch.randn(a.batch_size, 3, size, size, device=dev).to(torch.bfloat16).contiguous(
        memory_format=torch.channels_last) for _ in range(8)]
    ys = [torch.randint(0, classes, (a.batch_size,), device=dev) for _ in range(8)]
    for i in range(10):
        step(xs[i % 8], ys[i % 8])
    sync()
    dist.barrier()
    clock = step_clock.StepClock(torch, dev)
    t0 = time.perf_counter()
    for i in range(steps):
        clock.begin()
        step(xs[i % 8], ys[i % 8])
        clock.end()
    sync()
    ceiling_steps = clock.epoch()
    wall = torch.tensor([time.perf_counter() - t0], device=dev)
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)
    ceiling = steps * a.batch_size * world / wall.item()
    del xs, ys

    if feed is None:
        feed = Feed(a, n, rank, world, local_world, dev)
    epochs = []  # this rank's figures per epoch
    rates = []   # images/s of the node per epoch
    for e in range(a.epochs):
        sync()
        dist.barrier()
        monitor.begin()
        t0 = time.perf_counter()
        count = torch.zeros((), dtype=torch.int64, device=dev)
        lsum = torch.zeros((), dtype=torch.int64, device=dev)
        first, wait, mine = None, 0.0, 0
        it = feed.epoch(e)
        while True:
            tw = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            wait += time.perf_counter() - tw
            if first is None:
                first = time.perf_counter() - t0
            clock.begin()
            step(x, y)
            clock.end()
            count += y.numel()
            lsum += y.sum()
            mine += y.numel()
        sync()
        mywall = time.perf_counter() - t0
        mon = monitor.end()
        wall = torch.tensor([mywall], device=dev)
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)
        dist.all_reduce(count)
        dist.all_reduce(lsum)
        if int(count) != n or int(lsum) != want:
            raise SystemExit("%s epoch %d: %d samples, label sum %d; the file: %d, %d" % (
                a.loader, e + 1, int(count), int(lsum), n, want))
        rates.append(n / wall.item())
        st = feed.stats()
        epochs.append(dict(mon, wall_s=mywall, wait_s=wait, first_batch_s=first, images=mine, steps=clock.epoch(),
                           images_per_s=mine / mywall, gpufeed=st if a.loader == "gpufeed" else None,
                           peer_times=st if a.loader == "torchvision-gpu" else None,
                           decode_split=decode_split(st, feed.info.get("decode")) if a.loader == "gpufeed" else None))
    me = {"rank": rank, "epochs": epochs, "peak_rss": vm_hwm_or_rusage(), "ceiling_steps": ceiling_steps,
          "tree_rss_peak": monitor.job_rss_peak, "nvml_gpu_mem_peak": monitor.job_gpu_mem_peak,
          "max_memory_allocated": torch.cuda.max_memory_allocated(dev) if cuda else None,
          "nvml_error": monitor.nvml_error}
    ranks = [None] * world
    dist.all_gather_object(ranks, me)
    if rank == 0:
        report(a, feed.info, n, world, ceiling, rates, ranks, dev)
    feed.close()
    monitor.close()
    dist.destroy_process_group()


def vm_hwm_or_rusage():
    hwm = jpeg_peers.vm_hwm()
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def report(a, info, n, world, ceiling, rates, ranks, dev):
    """Rank 0: the lines a log reader needs, and the JSON of everything."""
    later = rates[1:]
    later_rate = len(later) / sum(1 / r for r in later) if later else None  # n x epochs / their walls
    node_rss = sum(r["tree_rss_peak"] for r in ranks)
    pss = [sum(r["epochs"][e]["tree_pss_end"] or 0 for r in ranks) for e in range(len(rates))]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    what = {"gpufeed": "%d threads a rank, order=%s, share=%s, decode=%s [%s]" % (
        a.threads, a.order, info.get("share"), a.decode, info.get("decode")),
        "dataloader-pil": "%d workers a rank, %s h5py, DistributedSampler(shuffle=True), PIL" % (
            info.get("workers", 0), a.peer_variant),
        "torchvision-gpu": "%d workers a rank, %s h5py, DistributedSampler(shuffle=True), decode_jpeg(cuda) "
                           "torchvision %s" % (info.get("workers", 0), a.peer_variant, info.get("torchvision"))}
    print("%s %s x %d (%s), %d images, batch %d a rank, %s: ceiling %.0f images/s" % (
        a.loader, a.model, world, name, n, a.batch_size, what[a.loader], ceiling), flush=True)
    print("  epoch 1: %.0f images/s = %.3f of the ceiling; later epochs: %s" % (
        rates[0], rates[0] / ceiling, ", ".join("%.0f (%.3f)" % (r, r / ceiling) for r in later) or "none run"),
        flush=True)
    for r in ranks:
        ep = r["epochs"]
        util = [x["gpu_util"] for x in ep]
        print("  rank %d: wait %s s, %s images/s, GPU %s %%, first batch %s s, peak RSS %.2f GiB (with children "
              "%.2f), GPU memory torch %s, NVML %s%s" % (
                  r["rank"], "/".join("%.2f" % x["wait_s"] for x in ep),
                  "/".join("%.0f" % x["images_per_s"] for x in ep),
                  "/".join("-" if u is None else "%.0f" % u for u in util),
                  "/".join("%.3f" % (x["first_batch_s"] or 0) for x in ep), r["peak_rss"] / 2**30,
                  r["tree_rss_peak"] / 2**30, gib(r["max_memory_allocated"]), gib(r["nvml_gpu_mem_peak"]),
                  where_time_went(a.loader, ep)), flush=True)
    for r in ranks:  # a step's host queueing and GPU time (bench/peer/step_clock.py), ceiling / each epoch
        ms = lambda v: "-" if v is None else "%.1f" % v  # noqa: E731
        cs = r["ceiling_steps"]
        print("  rank %d step ms, ceiling then each epoch: host queueing %s | %s; GPU %s | %s; wall %s | %s" % (
            r["rank"], ms(cs["host_queue_ms"]), "/".join(ms(x["steps"]["host_queue_ms"]) for x in r["epochs"]),
            ms(cs["gpu_step_ms"]), "/".join(ms(x["steps"]["gpu_step_ms"]) for x in r["epochs"]),
            ms(cs["wall_step_ms"]), "/".join(ms(x["steps"]["wall_step_ms"]) for x in r["epochs"])), flush=True)
    print("  node: RSS %.2f GiB (each rank's peak with its children, summed), PSS at epochs' ends %s GiB" % (
        node_rss / 2**30, "/".join("%.2f" % (p / 2**30) for p in pss)), flush=True)
    if a.json:
        out = {"loader": a.loader, "model": a.model, "gpus": world, "device": name, "host_cores": os.cpu_count(),
               "samples": n, "batch_size": a.batch_size, "epochs_run": len(rates), "loader_first": a.loader_first,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "checked": "count and label sum, "
               "all-reduced, equal to the file's in every epoch", "ceiling": ceiling, "rates": rates,
               "epoch1": rates[0], "epoch1_of_ceiling": rates[0] / ceiling, "later": later_rate,
               "later_of_ceiling": later_rate / ceiling if later_rate else None,
               "gpu_util_epoch1": mean(r["epochs"][0]["gpu_util"] for r in ranks),
               "gpu_util_later": mean(x["gpu_util"] for r in ranks for x in r["epochs"][1:]),
               "node_rss_peak": node_rss, "node_pss_end": pss, "ranks": ranks,
               # the fields of the earlier gpufeed-only JSON, for the scripts that read it
               "threads": a.threads, "decode": info.get("decode"), "order": info.get("order"),
               "share": info.get("share"), "splits": [r["epochs"][-1]["gpufeed"] for r in ranks]}
        out.update({k: v for k, v in info.items() if k not in out})
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


def where_time_went(loader, ep):
    """gpufeed: the decode split per epoch; torchvision-gpu: host seconds in decode_jpeg and in the crops."""
    if loader == "gpufeed":
        return "; decode gpu/cpu %s" % " ".join(
            "%.2f/%.2f" % (x["decode_split"]["gpu"], x["decode_split"]["cpu"]) if x["decode_split"] else "-"
            for x in ep)
    if loader == "torchvision-gpu":
        return "; in decode_jpeg/crops %s s" % " ".join(
            "%.2f/%.2f" % (x["peer_times"]["decode_call_s"], x["peer_times"]["crop_call_s"]) for x in ep)
    return ""


def gib(x):
    return "-" if x is None else "%.2f GiB" % (x / 2**30)


if __name__ == "__main__":
    main()
