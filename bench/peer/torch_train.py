#!/usr/bin/env python3
"""The peer of `gpufeed train`: the same model, batch and precision in PyTorch,
on batches already resident on the GPU (no input pipeline at all), so its
samples/s is PyTorch's compute ceiling for that model.

Model (as gpufeed's trainer builds it): per channel count, conv3x3 (pad 1, no
bias) -> BatchNorm -> ReLU -> MaxPool 2x2, then flatten -> linear; or an mlp.
Mixed precision: bf16/fp16 autocast with fp32 master weights (fp16 with a
GradScaler), channels-last, AdamW. Prints one JSON line.

  python3 bench/peer/torch_train.py --model cnn --channels 32,64,128,256 \
      --shape 3,218,178 --classes 40 --batch-size 256 --precision bf16 --steps 300
"""
import argparse
import json
import time

import torch
import torch.nn as nn


def build(model, widths, shape, classes):
    c, h, w = shape
    layers = []
    if model == "mlp":
        layers.append(nn.Flatten())
        n = c * h * w
        for k in widths:
            layers += [nn.Linear(n, k), nn.ReLU()]
            n = k
        layers.append(nn.Linear(n, classes))
    else:
        for k in widths:
            layers += [nn.Conv2d(c, k, 3, padding=1, bias=False), nn.BatchNorm2d(k), nn.ReLU(), nn.MaxPool2d(2)]
            c, h, w = k, h // 2, w // 2
        layers += [nn.Flatten(), nn.Linear(c * h * w, classes)]
    return nn.Sequential(*layers)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cnn", choices=["mlp", "cnn"])
    p.add_argument("--channels", default="32,64,128,256", help="cnn block channels or mlp widths")
    p.add_argument("--shape", default="3,218,178", help="C,H,W of a sample")
    p.add_argument("--classes", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--resident", type=int, default=8, help="distinct batches kept on the GPU, cycled")
    args = p.parse_args()

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    shape = tuple(int(x) for x in args.shape.split(","))
    widths = [int(x) for x in args.channels.split(",")]
    model = build(args.model, widths, shape, args.classes).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    scaler = torch.amp.GradScaler("cuda", enabled=args.precision == "fp16")
    g = torch.Generator(device=dev).manual_seed(0)
    xs = [torch.randn((args.batch_size,) + shape, device=dev, generator=g).to(memory_format=torch.channels_last)
          for _ in range(args.resident)]
    ys = [torch.randint(0, args.classes, (args.batch_size,), device=dev, generator=g) for _ in range(args.resident)]
    loss_fn = nn.CrossEntropyLoss()

    def step(i):
        x, y = xs[i % len(xs)], ys[i % len(ys)]
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(i)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    loss = float(loss)
    if loss != loss:
        raise SystemExit("torch_train: loss is NaN; the figure would be meaningless")
    print(json.dumps({"peer": "torch", "torch": torch.__version__, "model": args.model, "widths": widths,
                      "shape": shape, "batch_size": args.batch_size, "precision": args.precision,
                      "steps": args.steps, "seconds": dt, "samples_per_s": args.steps * args.batch_size / dt,
                      "step_ms": 1000 * dt / args.steps, "final_loss": loss}))


if __name__ == "__main__":
    main()
