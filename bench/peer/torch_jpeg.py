#!/usr/bin/env python3
"""The imagenet-jpeg peer (docs/benchmarks.md, Workloads): a PyTorch DataLoader whose
workers decode JPEGs with PIL and apply torchvision's RandomResizedCrop(224)
(written here with PIL: torchvision is not in Debian's set), over the folder of
.jpg files and over the same files in an h5py vlen uint8 file; then gpufeed's
`bench loader` over its encoded file, same cores, same run. Checks every
sample once for each peer and compares one gpufeed-decoded sample with an
independent PIL decode before printing ratios.

  gpufeed bench gen --workload imagenet-jpeg --samples 4000 -o inet.h5
  /usr/bin/python3 bench/peer/torch_jpeg.py --data inet.h5 --gpufeed build/gpufeed --workers 2
"""
import argparse
import io
import json
import math
import os
import random
import subprocess
import sys
import time


def rrc_params(w, h, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params, with Python's random."""
    area = w * h
    log_r = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_r))
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw
    in_ratio = w / h
    if in_ratio < min(ratio):
        cw, ch = w, int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        ch, cw = h, int(round(h * max(ratio)))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="gpufeed's encoded file from `bench gen --workload imagenet-jpeg`")
    ap.add_argument("--folder", help="the .jpg folder (default: DATA.jpg.d)")
    ap.add_argument("--vlen", help="the h5py vlen file (default: DATA.vlen.h5, written from the folder if absent)")
    ap.add_argument("--gpufeed", default="build/gpufeed")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers = gpufeed threads")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=2, help="gpufeed epochs (the last is reported)")
    ap.add_argument("--json", help="write all figures here")
    a = ap.parse_args()
    try:
        import h5py
        import numpy as np
        import torch
        from PIL import Image
    except ImportError as e:
        print(f"torch_jpeg: {e.name} is not installed here (apt-get install python3-torch python3-h5py python3-pil)")
        return 1
    folder = a.folder or a.data + ".jpg.d"
    vlen = a.vlen or a.data + ".vlen.h5"
    files = []
    for label, cls in enumerate(sorted(d for d in os.listdir(folder) if not d.startswith("."))):
        for name in sorted(os.listdir(os.path.join(folder, cls))):
            files.append((os.path.join(folder, cls, name), label))
    n = len(files)
    if not os.path.exists(vlen):  # how h5py users store JPEGs
        with h5py.File(vlen, "w") as f:
            d = f.create_dataset("images", (n,), dtype=h5py.vlen_dtype(np.uint8))
            for i, (p, _) in enumerate(files):
                with open(p, "rb") as fh:
                    d[i] = np.frombuffer(fh.read(), np.uint8)
            f["labels"] = np.array([lab for _, lab in files], np.int64)

    size = a.size

    def transform(img, rng):
        img = img.convert("RGB")
        top, left, h, w = rrc_params(img.width, img.height, rng)
        img = img.resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h))
        return torch.from_numpy(np.asarray(img, np.uint8).transpose(2, 0, 1).copy())

    class FolderSet(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            rng = random.Random(i)
            path, label = files[i]
            return transform(Image.open(path), rng), label, i

    class VlenSet(torch.utils.data.Dataset):
        h5 = None

        def __len__(self):
            return n

        def __getitem__(self, i):
            if self.h5 is None:  # opened lazily in each worker
                self.h5 = h5py.File(vlen, "r")
            rng = random.Random(i)
            raw = self.h5["images"][i]
            return transform(Image.open(io.BytesIO(raw.tobytes())), rng), int(self.h5["labels"][i]), i

    def run(ds):
        dl = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                                         drop_last=False)
        seen = [0] * n
        t0 = time.perf_counter()
        first = None
        count = 0
        for x, y, idx in dl:
            assert x.shape[1:] == (3, size, size) and x.dtype == torch.uint8
            if first is None:  # workers started, first batch in: the clock starts
                first = time.perf_counter()
                first_count = len(idx)
            for i in idx.tolist():
                seen[i] += 1
            count += len(idx)
        t1 = time.perf_counter()
        if seen != [1] * n:
            raise SystemExit("peer delivered a sample twice or never; no figure")
        return (count - first_count) / (t1 - first), t1 - t0

    torch.set_num_threads(1)
    folder_rate, folder_s = run(FolderSet())
    vlen_rate, vlen_s = run(VlenSet())

    out = subprocess.run([a.gpufeed, "bench", "loader", "--data", a.data, "--threads", str(a.workers),
                          "--batch-size", str(a.batch_size), "--epochs", str(a.epochs), "--image-size", str(size),
                          "--json"], check=True, capture_output=True, text=True).stdout
    g = json.loads(out)

    # One sample: gpufeed's evaluation transform (Resize 256 + CenterCrop 224,
    # as one box of source pixels resampled with antialiased bilinear) vs PIL
    # decoding the file and resampling the same box with BILINEAR (which
    # antialiases). The box is gpufeed's PlanCrop, mirrored here (torchvision's
    # Resize-then-crop rounds the crop to resized pixels instead, a sub-pixel
    # shift that no decoder comparison should hide behind).
    k = n // 2
    npy = a.data + ".sample.npy"
    subprocess.run([a.gpufeed, "inspect", a.data, "--sample", str(k), "--out", npy], check=True,
                   capture_output=True)
    ours = np.load(npy).astype(np.int16)
    img = Image.open(files[k][0]).convert("RGB")
    w, h = img.size
    f = (224 / 0.875) / min(w, h)
    ch = min(h, max(1, math.floor(224 / f + 0.5)))
    cw = min(w, max(1, math.floor(224 / f + 0.5)))
    top, left = math.floor((h - ch) / 2 + 0.5), math.floor((w - cw) / 2 + 0.5)
    img = img.resize((224, 224), Image.BILINEAR, box=(left, top, left + cw, top + ch))
    pil = np.asarray(img, np.int16).transpose(2, 0, 1)
    diff = np.abs(ours - pil)
    mean_diff, p99, max_diff = float(diff.mean()), float(np.percentile(diff, 99)), int(diff.max())
    ok = mean_diff < 2.0
    print(f"sample {k} vs PIL (Resize 256 + CenterCrop 224): mean |diff| {mean_diff:.2f}, 99th pct {p99:.0f}, "
          f"max {max_diff} levels -> {'within' if ok else 'OUTSIDE'} the tolerance (mean < 2)")
    if not ok:
        return 1

    ours_rate = g["samples_per_s"]
    print(f"{n} JPEGs, {g['stored_bytes'] / max(1, g['samples']) / 1e3:.1f} KB a file, {a.workers} workers/threads, "
          f"batch {a.batch_size}, RandomResizedCrop({size}); every sample once in each")
    print(f"  PyTorch DataLoader + PIL, folder of .jpg:  {folder_rate:8.1f} samples/s (epoch {folder_s:.1f} s)")
    print(f"  PyTorch DataLoader + PIL, h5py vlen file:  {vlen_rate:8.1f} samples/s (epoch {vlen_s:.1f} s)")
    print(f"  gpufeed loader (libjpeg-turbo, partial):   {ours_rate:8.1f} samples/s (last of {a.epochs} epochs)")
    print(f"  ceiling: libjpeg-turbo full-size decode    {g['ceiling_per_s']:8.1f} samples/s "
          f"({g['decode_one_core_per_s']:.1f} on one core x {a.workers})")
    print(f"  one core, interleaved: gpufeed decode+RRC {g['transform_one_core_per_s']:.1f} vs full decode "
          f"{g['decode_one_core_per_s']:.1f}: {g['transform_one_core_per_s'] / g['decode_one_core_per_s']:.2f}x")
    print(f"  ratios: gpufeed / PIL folder {ours_rate / folder_rate:.2f}x, / PIL vlen {ours_rate / vlen_rate:.2f}x, "
          f"/ ceiling {ours_rate / g['ceiling_per_s']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"samples": n, "workers": a.workers, "pil_folder_per_s": folder_rate, "pil_vlen_per_s": vlen_rate,
                       "gpufeed": g, "pil_compare": {"sample": k, "mean": mean_diff, "p99": p99, "max": max_diff}},
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
