#!/usr/bin/env python3
"""ResNet-18 (torchvision, bf16 autocast, channels-last, AdamW, batch
--batch-size a rank) trained data parallel under torchrun from an encoded
JPEG file (`gpufeed bench gen --workload imagenet-jpeg`), each rank fed by
its own gpufeed.Loader with decode=--decode (auto: the GPU's decoder with the
loader's share measured), against the same job's ceiling: each rank's model
on 8 batches already on its GPU, as many steps as an epoch.

  torchrun --standalone --nproc_per_node 2 bench/peer/torch_jpeg_ddp.py --data inet.h5

Every epoch is checked across ranks before it is reported: the sample count
and the label sum, all-reduced, must be the file's. Rank 0 prints images/s of
the node per epoch (the slowest rank's wall time) and each rank's decode
split; --json writes it.
"""
import argparse
import json
import os
import time

import h5py
import numpy as np
import torch
import torch.distributed as dist
import torchvision

import gpufeed


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--threads", type=int, default=4, help="loader threads a rank")
    p.add_argument("--decode", default="auto", choices=["auto", "gpu", "cpu"])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--order", default="block", choices=["block", "random", "sequential"])
    p.add_argument("--share", default="auto", choices=["auto", "none", "node"])
    p.add_argument("--loader-first", action="store_true",
                   help="make the Loader before the model and the ceiling, as training scripts do")
    p.add_argument("--json")
    a = p.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    with h5py.File(a.data, "r") as f:
        labels = f["labels"][()]
    n, want = len(labels), int(labels.sum())
    classes = int(labels.max()) + 1
    mean = [0.485 * 255, 0.456 * 255, 0.406 * 255]
    std = [0.229 * 255, 0.224 * 255, 0.225 * 255]

    def make_loader():
        return gpufeed.Loader(a.data, batch_size=a.batch_size, device="cuda", dtype=torch.bfloat16, layout="NHWC",
                              threads=a.threads, decode=a.decode, seed=1, mean=mean, std=std, order=a.order,
                              share=a.share)

    loader = make_loader() if a.loader_first else None
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)(num_classes=classes).to(dev).to(memory_format=torch.channels_last)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    crit = torch.nn.CrossEntropyLoss()

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = crit(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    # Ceiling: 8 resident batches, an epoch's worth of steps of this rank's share.
    steps = -(-n // world) // a.batch_size
    xs = [torch.randn(a.batch_size, 3, 224, 224, device=dev).to(torch.bfloat16).contiguous(
        memory_format=torch.channels_last) for _ in range(8)]
    ys = [torch.randint(0, classes, (a.batch_size,), device=dev) for _ in range(8)]
    for i in range(10):
        step(xs[i % 8], ys[i % 8])
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(steps):
        step(xs[i % 8], ys[i % 8])
    torch.cuda.synchronize()
    wall = torch.tensor([time.perf_counter() - t0], device=dev)
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)
    ceiling = steps * a.batch_size * world / wall.item()
    del xs, ys

    if loader is None:
        loader = make_loader()
    rates, firsts = [], []  # images/s of the node; this rank's seconds to each epoch's first batch
    for e in range(a.epochs):
        loader.set_epoch(e)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        count = torch.zeros((), dtype=torch.int64, device=dev)
        lsum = torch.zeros((), dtype=torch.int64, device=dev)
        first = None
        for images, lab in loader:
            if first is None:
                first = time.perf_counter() - t0
                firsts.append(first)
            lab = lab.long()
            step(images.permute(0, 3, 1, 2), lab)
            count += lab.numel()
            lsum += lab.sum()
        torch.cuda.synchronize()
        wall = torch.tensor([time.perf_counter() - t0], device=dev)
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)
        dist.all_reduce(count)
        dist.all_reduce(lsum)
        if int(count) != n or int(lsum) != want:
            raise SystemExit("epoch %d: %d samples, label sum %d; the file: %d, %d" % (e, int(count), int(lsum),
                                                                                       n, want))
        rates.append(n / wall.item())
    st = loader.stats()
    split = {k: st.get(k) for k in ("feed_decoded_on_device", "feed_decoded_by_loader", "balanced_samples",
                                    "host_decode_share", "feed_decode_seconds", "feed_data_wait_seconds",
                                    "chunk_reads", "bytes_read")}
    split["first_batch_seconds"] = [round(f, 3) for f in firsts]
    splits = [None] * world
    dist.all_gather_object(splits, split)
    if rank == 0:
        print("%s x %d GPUs (%s), %d loader threads a rank, order=%s, share=%s, decode=%s [%s]: ceiling %.0f images/s; epochs %s "
              "images/s = %s of the ceiling" % (a.model, world, torch.cuda.get_device_name(0), a.threads, a.order, loader.share, a.decode,
                                                loader.decode, ceiling, " ".join("%.0f" % r for r in rates),
                                                " ".join("%.3f" % (r / ceiling) for r in rates)), flush=True)
        for r, s in enumerate(splits):
            print("  rank %d: %s" % (r, s), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"model": a.model, "gpus": world, "threads": a.threads, "decode": loader.decode,
                           "order": a.order, "share": loader.share, "loader_first": a.loader_first,
                           "ceiling": ceiling, "rates": rates, "splits": splits}, f, indent=1)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
