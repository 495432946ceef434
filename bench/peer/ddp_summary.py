#!/usr/bin/env python3
"""The table of scripts/gpu-host-ddp from torch_ddp.py's JSON files: per G
and mode, epoch 1 and later epochs (samples/s of the node), each as a share
of the ceiling's later epochs at the same G, GPU utilization, the job's host
RSS and GPU memory a rank; then the scaling from the smallest G.

  python3 bench/peer/ddp_summary.py OUT/ddp-*.json
"""
import json
import sys


def main(paths):
    runs = [json.load(open(p)) for p in paths]
    ceiling = {r["gpus"]: r["later_samples_per_s"] for r in runs if r["mode"] == "ceiling"}
    print("%-3s %-11s %10s %6s %10s %6s %6s %9s %9s %9s" % ("G", "feed", "epoch 1/s", "of c.", "later /s", "of c.",
                                                            "GPU%", "job mem", "feed mem", "GPU mem"))
    order = {"ceiling": 0, "gpufeed": 1, "node": 2, "tuned": 3}
    for r in sorted(runs, key=lambda r: (r["gpus"], order.get(r["mode"], 9), r.get("threads", 0))):
        c = ceiling.get(r["gpus"])
        e = r["epochs"]
        later = e[1:] or e[:1]
        util = sum(x["gpu_util"] for x in later) / len(later)
        e1 = e[0]["samples_per_s"]
        name = r["mode"] + ("/t%d" % r["threads"] if r.get("threads") and r["mode"] != "tuned" else "")
        print("%-3d %-11s %10.0f %6s %10.0f %6s %6.1f %8.1fG %8.1fG %8.1fG%s" % (
            r["gpus"], name, e1, "%.3f" % (e1 / c) if c else "-", r["later_samples_per_s"],
            "%.3f" % (r["later_samples_per_s"] / c) if c else "-", util, r["peak_host_rss"] / 2**30,
            r.get("feed_host_bytes", float("nan")) / 2**30, r["peak_gpu_mem_per_rank"] / 2**30, "  partial" if any(x["partial"] for x in e) else ""))
    by = {}
    for r in runs:
        name = r["mode"] + ("/t%d" % r["threads"] if r.get("threads") and r["mode"] != "tuned" else "")
        by.setdefault(name, {})[r["gpus"]] = r["later_samples_per_s"]
    for mode, rates in sorted(by.items(), key=lambda kv: (order.get(kv[0].split("/")[0], 9), kv[0])):
        gs = sorted(rates)
        if len(gs) > 1:
            print("scaling %-8s %s" % (mode, ", ".join("%d->%d GPUs %.2fx" % (gs[0], g, rates[g] / rates[gs[0]])
                                                       for g in gs[1:])))


if __name__ == "__main__":
    main(sys.argv[1:])
