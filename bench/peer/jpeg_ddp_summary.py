#!/usr/bin/env python3
"""The table of scripts/gpu-host-jpeg-order from torch_jpeg_ddp.py's JSON files:
per model, G and loader (gpufeed by order and share, the peers by h5py
variant), the job's ceiling, epoch 1 and later epochs (images/s of the node
and the share of that job's ceiling), the largest wait for data of a rank in
later epochs, mean GPU utilization (NVML) in later epochs, node RSS, GPU
memory a rank (torch's peak / NVML's peak) and gpufeed's decode split.

  python3 bench/peer/jpeg_ddp_summary.py OUT/jpeg-*.json
"""
import json
import sys

KIND = {"gpufeed": 0, "dataloader-pil": 1, "torchvision-gpu": 2}


def name(r):
    if r["loader"] == "gpufeed":
        return "gpufeed %s/%s t%s" % (r.get("order"), r.get("share"), r.get("threads"))
    return "%s %s w%s" % (r["loader"], r.get("variant"), r.get("workers"))


def gib(x):
    return "-" if x is None else "%.1f" % (x / 2**30)


def row(r):
    later = [e for rk in r["ranks"] for e in rk["epochs"][1:]] or [e for rk in r["ranks"] for e in rk["epochs"]]
    wait = max(e["wait_s"] for e in later)
    util = r.get("gpu_util_later") if r.get("gpu_util_later") is not None else r.get("gpu_util_epoch1")
    mems = [rk["max_memory_allocated"] for rk in r["ranks"] if rk["max_memory_allocated"] is not None]
    torch_mem = max(mems) if mems else None
    nvml = [rk["nvml_gpu_mem_peak"] for rk in r["ranks"] if rk["nvml_gpu_mem_peak"]]
    splits = [e["decode_split"] for e in later if e.get("decode_split")]
    split = "%.2f/%.2f" % (sum(s["gpu"] for s in splits) / len(splits), sum(s["cpu"] for s in splits) / len(splits)) \
        if splits else "-"
    c = r["ceiling"]
    pss = r.get("node_pss_end") or [None]
    return "%-9s %-2d %-38s %8.0f %8.0f %5.3f %8s %5s %6.2f %5s %6s %6s %5s/%-5s %9s" % (
        r["model"], r["gpus"], name(r), c, r["epoch1"], r["epoch1"] / c,
        "%.0f" % r["later"] if r.get("later") else "-", "%.3f" % (r["later"] / c) if r.get("later") else "-",
        wait, "-" if util is None else "%.0f" % util, gib(r["node_rss_peak"]), gib(pss[-1]), gib(torch_mem),
        gib(max(nvml) if nvml else None), split)


def main(paths):
    runs = []
    for p in paths:
        try:
            with open(p) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            print("%s: not read (%s)" % (p, e))
            continue
        if "ranks" not in r:  # a JSON of the earlier gpufeed-only script: no per-rank figures
            print("%s: an older torch_jpeg_ddp.py's JSON, left out" % p)
            continue
        runs.append(r)
    print("%-9s %-2s %-38s %8s %8s %5s %8s %5s %6s %5s %6s %6s %11s %9s" % (
        "model", "G", "loader", "ceiling", "epoch 1", "of c.", "later", "of c.", "wait s", "GPU%", "RSS G", "PSS G",
        "GPU mem G", "dec g/c"))
    for r in sorted(runs, key=lambda r: (r["model"], r["gpus"], KIND.get(r["loader"], 9), name(r))):
        print(row(r))
    print("later: epochs 2.. (images/s of the node: N x epochs / their walls); wait: the largest of a rank's later "
          "epochs;\nRSS: the node's (each rank's peak with its workers, summed: shared pages once a process); PSS: the node's at the last epoch's end (shared pages once);\nGPU mem: a rank's largest, torch's "
          "allocator / NVML's (context and libraries included); dec g/c: gpufeed's images decoded on the GPU / CPU")


if __name__ == "__main__":
    main(sys.argv[1:])
