#!/usr/bin/env bash
# CI for examples/pytorch_train.py: converts Fashion-MNIST (Debian's
# dataset-fashion-mnist) with the built gpufeed, then trains the example's
# CNN on the CPU for 2 epochs and fails below 0.85 test accuracy.
# Usage: pytorch_example.sh GPUFEED_CLI WORK_DIR   (GPUFEED_LIBRARY, PYTHONPATH set by CTest)
set -euo pipefail
cli="$1" work="$2"
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=tests/python/fashion_mnist.sh
. "$root/tests/python/fashion_mnist.sh"
exec /usr/bin/python3 "$root/examples/pytorch_train.py" --train "$work/fashion-mnist-train.h5" \
  --test "$work/fashion-mnist-t10k.h5" --epochs 2 --threads 2 --device cpu --min-accuracy 0.85
