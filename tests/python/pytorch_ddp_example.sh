#!/usr/bin/env bash
# CI for examples/pytorch_ddp.py: Fashion-MNIST converted with the built
# gpufeed, then torchrun with two CPU ranks (gloo), share="node" by default
# (one node-local server for both ranks), 1 epoch, >= 0.80 test accuracy;
# the example itself checks every epoch across the ranks.
# Usage: pytorch_ddp_example.sh GPUFEED_CLI WORK_DIR   (GPUFEED_LIBRARY, PYTHONPATH set by CTest)
set -euo pipefail
cli="$1" work="$2"
src=/usr/share/datasets/fashion-mnist
mkdir -p "$work"
for split in train t10k; do
  out="$work/fashion-mnist-$split.h5"
  [ -f "$out" ] || "$cli" convert "$src/$split-images-idx3-ubyte.gz" --labels "$src/$split-labels-idx1-ubyte.gz" \
                      -o "$out" >/dev/null
done
root="$(cd "$(dirname "$0")/../.." && pwd)"
export GPUFEED_CLI="$cli" GPUFEED_NODE_DIR="$work"
# --redirects 1 --tee 1: Debian's torch 1.13 under Python 3.11 cannot parse
# the default redirects ("0": IntFlag's zero member is not iterated there).
/usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 --redirects 1 --tee 1 \
  "$root/examples/pytorch_ddp.py" --train "$work/fashion-mnist-train.h5" --test "$work/fashion-mnist-t10k.h5" \
  --epochs 1 --device cpu --min-accuracy 0.80
# The node's server ends with the last rank.
for _ in $(seq 100); do
  ls "$work"/gpufeed-*.sock >/dev/null 2>&1 || exit 0
  sleep 0.1
done
echo "the node's server outlived the job: $(ls "$work"/gpufeed-*.sock)" >&2
exit 1
