"""The peers of bench/peer/torch_jpeg_ddp.py (issue 45): how PyTorch users feed a
rank from the JPEGs of gpufeed's encoded file (`gpufeed bench gen --workload
imagenet-jpeg`: the group `images` holds `bytes`, every file's bytes end to
end, and `offsets`, N + 1 byte offsets; `labels` beside it), and what the
job measures about each rank while it trains (GPU utilization, memory).

  dataloader-pil   DataLoader + DistributedSampler(shuffle=True), each worker
                   opening the file lazily with h5py, PIL decode, a
                   RandomResizedCrop(224) and a horizontal flip written with
                   PIL (torchvision's parameters, drawn with Python's random),
                   uint8 HWC batches pinned, normalized on the rank's device.
  torchvision-gpu  the same sampler and workers returning each batch's encoded
                   bytes (one uint8 tensor and the lengths), decoded on the
                   rank's GPU with torchvision.io.decode_jpeg(device="cuda") a
                   batch at a time, then the same crop and flip per image with
                   torchvision.transforms.v2.functional on the GPU (the
                   host seconds in decode_jpeg and in the crops are kept
                   apart, to show where its time goes).

The h5py file is opened as users open it (the benchmark docs' "Two ways the
peer is written"): "naive" with h5py's defaults (a 1 MiB chunk cache), "tuned"
with rdcc_nbytes up to the bytes dataset (within a memory budget per worker),
rdcc_w0=1 and rdcc_nslots a prime about 100 times the chunks that fit.
"""
import io
import os
import random
import threading
import time

from torch_jpeg import rrc_params  # torchvision's RandomResizedCrop.get_params, drawn with Python's random

IMAGES, BYTES, OFFSETS, LABELS = "images", "images/bytes", "images/offsets", "labels"


def read_index(path):
    """(labels as int64 numpy, the bytes dataset's total size and chunk bytes) of an
    encoded file; a file of another layout is refused naming what to make."""
    import h5py
    import numpy as np
    with h5py.File(path, "r") as f:
        missing = [k for k in (BYTES, OFFSETS, LABELS) if k not in f]
        if missing:
            raise SystemExit("%s: no %s; the peers read gpufeed's encoded image file (the group '%s' with 'bytes' "
                             "and 'offsets', and 'labels'), as `gpufeed bench gen --workload imagenet-jpeg "
                             "--samples N -o FILE` writes it" % (path, ", ".join(missing), IMAGES))
        labels = f[LABELS][()].astype(np.int64)
        d = f[BYTES]
        chunk = d.chunks[0] * d.dtype.itemsize if d.chunks else 0
        if f[OFFSETS].shape[0] != len(labels) + 1:
            raise SystemExit("%s: %d offsets for %d labels (want N + 1); regenerate the file" % (
                path, f[OFFSETS].shape[0], len(labels)))
        return labels, int(d.size) * d.dtype.itemsize, chunk


def next_prime(k):
    k = max(2, int(k))
    while any(k % p == 0 for p in range(2, int(k ** 0.5) + 1)):
        k += 1
    return k


def rdcc_for(variant, data_bytes, chunk_bytes, workers_on_node, mem_bytes):
    """h5py.File keywords for a worker: {} for naive (h5py's defaults), else the
    tuned cache: the whole bytes dataset if half the node's memory, shared by
    every worker of the node, holds it; else that share."""
    if variant == "naive":
        return {}
    budget = max(1 << 20, mem_bytes // 2 // max(1, workers_on_node))
    nbytes = int(min(data_bytes + chunk_bytes, budget))
    fit = max(1, nbytes // max(1, chunk_bytes))
    return {"rdcc_nbytes": nbytes, "rdcc_w0": 1.0, "rdcc_nslots": next_prime(100 * fit)}


class EncodedJpegs:
    """A map-style dataset over the encoded file: sample i is (its JPEG's bytes as a
    1-D uint8 tensor, label) with raw=True, else (the PIL crop as a uint8 HWC
    tensor of size x size x 3, label). The file is opened in the worker that
    first reads (h5py handles do not survive fork)."""

    def __init__(self, path, n, size, raw, h5_kw):
        self.path, self.n, self.size, self.raw, self.h5_kw = path, n, size, raw, h5_kw
        self.f = None

    def __len__(self):
        return self.n

    def _open(self):
        import h5py
        self.f = h5py.File(self.path, "r", **self.h5_kw)
        self.bytes = self.f[BYTES]
        self.offsets = self.f[OFFSETS][()]
        self.labels = self.f[LABELS][()]

    def __getitem__(self, i):
        import torch
        if self.f is None:
            self._open()
        raw = self.bytes[self.offsets[i]:self.offsets[i + 1]]
        label = int(self.labels[i])
        if self.raw:
            return torch.from_numpy(raw), label
        return pil_crop(raw, self.size, random), label


def pil_crop(raw, size, rng):
    """PIL decode, RandomResizedCrop(size) as one resample of the crop's box
    (bilinear, antialiased as PIL does) and a horizontal flip half the time."""
    import numpy as np
    import torch
    from PIL import Image
    img = Image.open(io.BytesIO(raw.tobytes())).convert("RGB")
    top, left, h, w = rrc_params(img.width, img.height, rng)
    img = img.resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(img, np.uint8).copy())


def collate_raw(items):
    """A batch of encoded samples as one tensor of bytes, the lengths and the
    labels: three tensors through the workers' queue, not one per file."""
    import torch
    blobs = [b for b, _ in items]
    lengths = torch.tensor([b.numel() for b in blobs], dtype=torch.int64)
    return torch.cat(blobs), lengths, torch.tensor([lab for _, lab in items], dtype=torch.int64)


def make_dataloader(torch, path, n, loader, size, batch_size, workers, prefetch, h5_kw, rank, world, pin, seed):
    """The DataLoader and its DistributedSampler(shuffle=True, drop_last=False)."""
    from torch.utils.data import DataLoader, DistributedSampler
    ds = EncodedJpegs(path, n, size, raw=loader == "torchvision-gpu", h5_kw=h5_kw)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=False)
    kw = {"persistent_workers": True, "prefetch_factor": prefetch} if workers > 0 else {}
    dl = DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=workers, pin_memory=pin,
                    collate_fn=collate_raw if loader == "torchvision-gpu" else None, drop_last=False, **kw)
    return dl, sampler


class GpuDecodeCrop:
    """torchvision's GPU path for a batch of encoded bytes: decode_jpeg(list,
    device) as one batched call, then per image the RandomResizedCrop box
    resampled to size x size (antialiased bilinear) and a flip half the time,
    stacked, normalized, bf16, channels-last."""

    def __init__(self, torch, device, size, mean, std, seed):
        import torchvision
        from torchvision.io import ImageReadMode, decode_jpeg
        from torchvision.transforms.v2 import functional as F
        self.torch, self.device, self.size = torch, device, size
        self.decode_jpeg, self.rgb, self.F = decode_jpeg, ImageReadMode.RGB, F
        self.version = torchvision.__version__
        self.mean = torch.tensor(mean, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, 3, 1, 1)
        self.rng = random.Random(seed)
        self.decode_s = self.crop_s = 0.0  # host seconds in decode_jpeg and in the crops, since take_times()

    def take_times(self):
        t = {"decode_call_s": self.decode_s, "crop_call_s": self.crop_s}
        self.decode_s = self.crop_s = 0.0
        return t

    def __call__(self, flat, lengths):
        torch = self.torch
        t0 = time.perf_counter()
        blobs = list(torch.split(flat, lengths.tolist()))
        imgs = self.decode_jpeg(blobs, mode=self.rgb, device=self.device)
        t1 = time.perf_counter()
        out = []
        for img in imgs:
            _, h, w = img.shape
            top, left, ch, cw = rrc_params(w, h, self.rng)
            c = self.F.resized_crop(img, top, left, ch, cw, [self.size, self.size], antialias=True)
            out.append(self.F.horizontal_flip(c) if self.rng.random() < 0.5 else c)
        x = torch.stack(out).float().sub_(self.mean).div_(self.std)
        x = x.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
        t2 = time.perf_counter()
        self.decode_s += t1 - t0
        self.crop_s += t2 - t1
        return x


def tree_rss(proc):
    """Resident bytes of a process and its children (DataLoader workers, a node
    server it started); shared pages count once per process."""
    total = 0
    for p in [proc] + proc.children(recursive=True):
        try:
            total += p.memory_info().rss
        except Exception:  # a worker gone between the listing and the read
            pass
    return total


def tree_pss(proc):
    """Proportional set size of a process and its children (shared pages split
    between their sharers, so a sum over the node counts them once), from
    /proc/PID/smaps_rollup; None where the kernel has none."""
    total = 0
    for p in [proc] + proc.children(recursive=True):
        try:
            with open("/proc/%d/smaps_rollup" % p.pid) as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except FileNotFoundError:
            if p is proc:
                return None
        except (OSError, ValueError):
            pass
    return total


def vm_hwm():
    """This process's peak resident bytes (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


class Monitor:
    """Samples, every `period` seconds on a thread of its own: the GPU's
    utilization (NVML's utilization.gpu: the share of time a kernel ran), this
    process's GPU memory as NVML sees it (CUDA context, gpufeed's and nvJPEG's
    buffers: more than torch's allocator counts), and the resident bytes of
    this process with its children. begin()/end() bracket an epoch; end()
    returns its means and peaks. A missing NVML (no GPU, no pynvml) leaves the
    GPU figures None and says why in `nvml_error`."""

    def __init__(self, torch, local, device, period=0.2):
        import psutil
        self.proc = psutil.Process()
        self.period = period
        self.handle, self.nvml, self.nvml_error = None, None, None
        if device == "cuda":
            try:
                import pynvml
                pynvml.nvmlInit()
                self.nvml = pynvml
                self.handle = self._handle(torch, local)
            except Exception as e:  # reported in the JSON and on stdout, the run goes on
                self.nvml_error = "%s: %s" % (type(e).__name__, e)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.utils, self.rss_peak, self.gpu_mem_peak = [], 0, None
        self.job_rss_peak, self.job_gpu_mem_peak = 0, None
        self.thread = threading.Thread(target=self._run, name="peer-monitor", daemon=True)
        self.thread.start()

    def _handle(self, torch, local):
        """The NVML device of torch's device `local`, by UUID (NVML counts all the
        host's GPUs, CUDA only the visible ones), else by CUDA_VISIBLE_DEVICES."""
        nv = self.nvml
        want = str(getattr(torch.cuda.get_device_properties(local), "uuid", "")).lower().replace("gpu-", "")
        if want:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                u = nv.nvmlDeviceGetUUID(h)
                u = (u.decode() if isinstance(u, bytes) else u).lower().replace("gpu-", "")
                if u == want:
                    return h
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if ids and local < len(ids) and ids[local].isdigit():
            return nv.nvmlDeviceGetHandleByIndex(int(ids[local]))
        return nv.nvmlDeviceGetHandleByIndex(local)

    def _gpu_mem(self):
        pid = os.getpid()
        for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
            if p.pid == pid:
                return p.usedGpuMemory
        return None

    def _run(self):
        while not self.stop_event.wait(self.period):
            try:
                util = mem = None
                if self.handle is not None:
                    util = self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu
                    mem = self._gpu_mem()
                rss = tree_rss(self.proc)
            except Exception as e:  # a failing sample must not end the job: said once, sampling goes on
                with self.lock:
                    if self.nvml_error is None:
                        self.nvml_error = "sample: %s: %s" % (type(e).__name__, e)
                continue
            with self.lock:
                if util is not None:
                    self.utils.append(util)
                self.rss_peak = max(self.rss_peak, rss)
                self.job_rss_peak = max(self.job_rss_peak, rss)
                if mem is not None:
                    self.gpu_mem_peak = max(self.gpu_mem_peak or 0, mem)
                    self.job_gpu_mem_peak = max(self.job_gpu_mem_peak or 0, mem)

    def begin(self):
        with self.lock:
            self.utils, self.rss_peak, self.gpu_mem_peak = [], tree_rss(self.proc), None

    def end(self):
        rss = tree_rss(self.proc)
        with self.lock:
            self.rss_peak = max(self.rss_peak, rss)
            self.job_rss_peak = max(self.job_rss_peak, rss)
            return {"gpu_util": sum(self.utils) / len(self.utils) if self.utils else None,
                    "gpu_util_samples": len(self.utils), "tree_rss_peak": self.rss_peak,
                    "tree_pss_end": tree_pss(self.proc), "nvml_gpu_mem_peak": self.gpu_mem_peak}

    def close(self):
        self.stop_event.set()
        self.thread.join(timeout=5)
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # shutting down a library that may be half up: nothing to report
                pass

