#!/usr/bin/env bash
# The gpufeed command starts on any host: it links no cuBLAS, cuDNN or NCCL
# (the trainer loads them when a GPU run starts, trainer/cuda_libs.h), so
# --version needs none of them and a CPU run trains without them; usage
# lines say "gpufeed" however the binary was started (the wheel runs
# .../site-packages/gpufeed/_native/bin/gpufeed).
#   tests/cli/starts_anywhere_test.sh GPUFEED_CLI
set -uo pipefail
cli=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# Neither needed by the binary itself nor by anything it needs.
libs=$(ldd "$cli" 2>&1) || { echo "FAIL: ldd $cli: $libs"; exit 1; }
if grep -E 'lib(cublas|cublasLt|cudnn[a-z_]*|nccl)\.so' <<<"$libs"; then
  echo "FAIL: $cli links the GPU libraries above; they are to be loaded when a GPU run needs them"
  fail=1
fi

# Started from another path, under another name: the usage still says gpufeed.
mkdir -p "$tmp/site-packages/gpufeed/_native/bin"
ln -s "$(readlink -f "$cli")" "$tmp/site-packages/gpufeed/_native/bin/gpufeed-renamed"
moved="$tmp/site-packages/gpufeed/_native/bin/gpufeed-renamed"
usage=$("$moved" --help 2>&1 | grep -m1 '^Usage:')
[[ "$usage" == "Usage: gpufeed "* ]] || { echo "FAIL: --help's usage line: $usage"; fail=1; }
usage=$("$moved" train --help 2>&1 | grep -m1 '^Usage:')
[[ "$usage" == "Usage: gpufeed train "* ]] || { echo "FAIL: train --help's usage line: $usage"; fail=1; }

# With the loader's search path emptied of CUDA's directories.
out=$(env LD_LIBRARY_PATH="$tmp" "$moved" --version 2>&1) || { echo "FAIL: --version: $out"; fail=1; }
[[ "$out" == "gpufeed "* ]] || { echo "FAIL: --version printed: $out"; fail=1; }

# A CPU run trains without loading any of them.
"$cli" bench gen --workload celeba-raw --samples 256 -o "$tmp/d.h5" >/dev/null 2>&1 || { echo "FAIL: gen"; exit 1; }
if ! out=$("$cli" train --data "$tmp/d.h5" --device cpu --model mlp --widths 16 --epochs 1 --batch-size 64 \
  --threads 1 2>&1); then
  echo "FAIL: train --device cpu: $out"
  fail=1
elif ! grep -q '^epoch   1 ' <<<"$out"; then
  echo "FAIL: train --device cpu trained no epoch: $out"
  fail=1
fi

[ $fail -eq 0 ] && echo "PASS"
exit $fail
