#!/usr/bin/env python3
"""Where nvJPEG's batched hardware decode waits beside a model (issue 27).

A decoder loops nvjpegDecodeBatched over --batch JPEGs on a stream of its
own (highest priority, as gpufeed's decoder) while torchvision's --model
trains on batches already on the GPU (bf16, channels-last, AdamW, a side
stream). The decoder runs either as a thread of the training process (one
CUDA context: what gpufeed does) or as a process of its own (its own
context): if a call waits for the model's queued work only in the same
context, the wait is a context-wide synchronization inside nvJPEG, not the
engine or the GPU's scheduling.

--profile FILE: the thread form under torch.profiler (CUPTI) for 2 s,
exported as a Chrome trace, then summarized: the decoder thread's CUDA
runtime/driver calls by total time and its longest calls, and the kernels
and copies it launched, with how long each waited between its launch and its
start on the GPU (queueing behind the model) and how long it ran.

--flags 0,1: nvjpegCreateEx's flags to compare (1: NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE,
what gpufeed's decoder uses).

--outputs rgbi,yuv: the output formats to compare (rgbi: interleaved RGB,
what gpufeed's decoder asks for; yuv: planar YUV, each plane full size here).

  python3 bench/peer/nvjpeg_wait.py --data inet.h5 [--flags 0,1] [--profile trace.json]
"""
import argparse
import ctypes
import json
import multiprocessing as mp
import pathlib
import statistics
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from torch_jpeg_gpu import jpeg_size, read_encoded  # noqa: E402

OUTPUTS = {"yuv": 1, "rgbi": 5}


class Image(ctypes.Structure):
    _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]


def load_nvjpeg():
    for name in ("libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    raise RuntimeError("libnvjpeg not found")


def decode_loop(data_path, batch, seconds, ready, start, out, label, flags=0, output="rgbi"):
    """Warms up, sets `ready`, then decodes batches until `seconds` after
    `start` is set; puts (label, [seconds a call alone], [beside]) on `out`
    (a list or a Queue)."""
    import numpy as np
    import torch
    torch.cuda.set_device(0)
    blobs, _ = read_encoded(data_path)
    blobs = blobs[:batch * 4]
    sizes = [jpeg_size(bytes(b[:4096])) for b in blobs]
    pinned = [torch.from_numpy(np.asarray(b)).pin_memory() for b in blobs]
    outs = [torch.empty(3 * h * w, dtype=torch.uint8, device="cuda") for h, w in sizes]
    lib = load_nvjpeg()
    h, st = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.nvjpegCreateEx(3, None, None, flags, ctypes.byref(h)) == 0, "no hardware backend"
    assert lib.nvjpegJpegStateCreate(h, ctypes.byref(st)) == 0
    assert lib.nvjpegDecodeBatchedInitialize(h, st, batch, 1, OUTPUTS[output]) == 0
    stream = torch.cuda.Stream(priority=-100)  # mapped to the device's highest, as gpufeed's decoder
    calls = []
    k = 0

    def one():
        nonlocal k
        idx = range((k % 4) * batch, (k % 4 + 1) * batch)
        data = (ctypes.c_void_p * batch)(*[pinned[i].data_ptr() for i in idx])
        lens = (ctypes.c_size_t * batch)(*[pinned[i].numel() for i in idx])
        imgs = (Image * batch)()
        for j, i in enumerate(idx):
            hh, ww = sizes[i]
            if output == "rgbi":
                imgs[j].channel[0], imgs[j].pitch[0] = outs[i].data_ptr(), 3 * ww
            else:
                for c in range(3):
                    imgs[j].channel[c], imgs[j].pitch[c] = outs[i].data_ptr() + c * hh * ww, ww
        t0 = time.perf_counter()
        r = lib.nvjpegDecodeBatched(h, st, data, lens, imgs, ctypes.c_void_p(stream.cuda_stream))
        stream.synchronize()
        assert r == 0, "nvjpegDecodeBatched: %d" % r
        k += 1
        return time.perf_counter() - t0

    for _ in range(3):
        one()  # warm: the engine's first calls set up
    alone = [one() for _ in range(8)]
    ready.set()
    start.wait()
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        calls.append(one())
    result = (label, alone, calls)
    if isinstance(out, list):
        out.append(result)
    else:
        out.put(result)


def train(model_name, seconds, go, profile_to=None):
    import torch
    import torchvision
    model = getattr(torchvision.models, model_name)(num_classes=1000).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    crit = torch.nn.CrossEntropyLoss()
    x = torch.randn(256, 3, 224, 224, device="cuda").to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (256,), device="cuda")
    side = torch.cuda.Stream()

    def step():
        with torch.cuda.stream(side):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = crit(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    go.set()
    t0, steps = time.perf_counter(), 0
    prof = None
    if profile_to:
        from torch.profiler import ProfilerActivity, profile
        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        prof.__enter__()
    while time.perf_counter() - t0 < seconds:
        step()
        steps += 1
        if steps % 4 == 0:
            side.synchronize()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    if prof is not None:
        prof.__exit__(None, None, None)
        prof.export_chrome_trace(profile_to)
    return 256 * steps / wall


def summarize_trace(path, decoder_tid):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X"]
    gpu = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X":
            gpu[e.get("args", {}).get("correlation")] = e
    tids = sorted({e["tid"] for e in runtime}, key=str)
    print("threads with CUDA calls:", tids)
    mine = [e for e in runtime if str(e["tid"]) == str(decoder_tid)]
    if not mine:
        print("no CUDA calls recorded on the decoder's thread %s (its calls may go through the driver API"
              " CUPTI did not name); every thread's longest calls:" % decoder_tid)
        mine = runtime
    by_name = {}
    for e in mine:
        n, d = by_name.get(e["name"], (0, 0.0))
        by_name[e["name"]] = (n + 1, d + e["dur"])
    print("decoder thread: calls by total time (ms)")
    for name, (n, d) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:15]:
        print("  %-40s %6d calls %9.1f ms" % (name, n, d / 1e3))
    print("decoder thread: longest calls")
    for e in sorted(mine, key=lambda e: -e["dur"])[:10]:
        print("  %-40s %8.2f ms (tid %s)" % (e["name"], e["dur"] / 1e3, e["tid"]))
    queued, ran = {}, {}
    for e in mine:
        g = gpu.get(e.get("args", {}).get("correlation"))
        if g is None:
            continue
        key = (g["cat"], g["name"][:60], g.get("args", {}).get("stream"))
        queued.setdefault(key, []).append(g["ts"] - (e["ts"] + e["dur"]))
        ran.setdefault(key, []).append(g["dur"])
    print("work the decoder launched: count, median and max wait from launch to start (ms), median run (ms)")
    for key, waits in sorted(queued.items(), key=lambda kv: -sum(kv[1]))[:15]:
        print("  %-10s %-60s stream %-4s %5d  wait %7.2f / %7.2f  run %6.3f" % (
            key[0], key[1], key[2], len(waits), statistics.median(waits) / 1e3, max(waits) / 1e3,
            statistics.median(ran[key]) / 1e3))
    streams, names = {}, {}
    for g in gpu.values():
        s = g.get("args", {}).get("stream")
        n, d = streams.get(s, (0, 0.0))
        streams[s] = (n + 1, d + g["dur"])
        per = names.setdefault(s, {})
        per[g["name"][:70]] = per.get(g["name"][:70], 0) + 1
    print("GPU work by stream: count, busy ms, its commonest operations")
    for s, (n, d) in sorted(streams.items(), key=lambda kv: -kv[1][1]):
        top = sorted(names[s].items(), key=lambda kv: -kv[1])[:3]
        print("  stream %-6s %7d %9.1f ms  %s" % (s, n, d / 1e3, "; ".join("%s x%d" % kv for kv in top)))


def report(label, alone, calls, model_rate, batch, seconds):
    ms = sorted(1e3 * c for c in calls)
    print("%-28s alone median %.1f ms; beside the model: %4d calls, median %.1f ms, p90 %.1f ms, "
          "decode %.0f images/s; model %.0f images/s" % (
              label, statistics.median(1e3 * a for a in alone), len(ms), statistics.median(ms),
              ms[int(0.9 * (len(ms) - 1))], batch * len(ms) / seconds, model_rate), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--seconds", type=float, default=6)
    p.add_argument("--forms", default="thread,process")
    p.add_argument("--profile", help="write the thread form's trace here and summarize it")
    p.add_argument("--flags", default="0", help="nvjpegCreateEx flags to try, comma-separated "
                   "(1: NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE)")
    p.add_argument("--outputs", default="rgbi", help="output formats to try: rgbi, yuv")
    a = p.parse_args()
    import torch
    print("%s, %s on a side stream, decode batches of %d" % (torch.cuda.get_device_name(0), a.model, a.batch),
          flush=True)
    runs = [(f, int(x), o) for f in a.forms.split(",") for x in a.flags.split(",") for o in a.outputs.split(",")]
    for form, flags, output in runs:
        label = "decoder %s, flags %d, %s" % (form, flags, output)
        if form == "thread":
            ready, go, out = threading.Event(), threading.Event(), []
            tid = []
            trace = a.profile.replace(".json", "-f%d-%s.json" % (flags, output)) if a.profile else None

            def run():
                tid.append(threading.get_native_id())
                decode_loop(a.data, a.batch, a.seconds, ready, go, out, label, flags, output)
            t = threading.Thread(target=run)
            t.start()
            ready.wait(timeout=300)
            rate = train(a.model, a.seconds, go, trace)
            t.join()
            report(*out[0], rate, a.batch, a.seconds)
            if trace:
                summarize_trace(trace, tid[0])
        else:
            ctx = mp.get_context("spawn")
            ready, go, q = ctx.Event(), ctx.Event(), ctx.Queue()
            proc = ctx.Process(target=decode_loop,
                               args=(a.data, a.batch, a.seconds, ready, go, q, label, flags, output))
            proc.start()
            ready.wait(timeout=300)
            rate = train(a.model, a.seconds, go)
            label, alone, calls = q.get(timeout=120)
            proc.join(timeout=60)
            report(label, alone, calls, rate, a.batch, a.seconds)


if __name__ == "__main__":
    main()
