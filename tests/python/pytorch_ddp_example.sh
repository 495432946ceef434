#!/usr/bin/env bash
# CI for examples/pytorch_ddp.py: Fashion-MNIST converted with the built
# gpufeed, then torchrun with two CPU ranks (gloo), share="node" by default
# (one node-local server for both ranks), 1 epoch, >= 0.80 test accuracy;
# the example itself checks every epoch across the ranks. Then two simulated
# nodes (two torchrun agents, one rendezvous), a server each.
# Usage: pytorch_ddp_example.sh GPUFEED_CLI WORK_DIR   (GPUFEED_LIBRARY, PYTHONPATH set by CTest)
set -euo pipefail
cli="$1" work="$2"
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=tests/python/fashion_mnist.sh
. "$root/tests/python/fashion_mnist.sh"
# The node servers' sockets in a short directory of their own (a Unix
# socket's path has at most 107 bytes; the build tree's may be long).
node_dir=$(mktemp -d /tmp/gpufeed-ci-node.XXXXXX)
trap 'rm -rf "$node_dir"' EXIT
export GPUFEED_CLI="$cli" GPUFEED_NODE_DIR="$node_dir"
# --redirects 1 --tee 1: Debian's torch 1.13 under Python 3.11 cannot parse
# the default redirects ("0": IntFlag's zero member is not iterated there).
/usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 --redirects 1 --tee 1 \
  "$root/examples/pytorch_ddp.py" --train "$work/fashion-mnist-train.h5" --test "$work/fashion-mnist-t10k.h5" \
  --epochs 1 --device cpu --min-accuracy 0.80
no_server_left() {  # the node servers end with the last rank
  for _ in $(seq 100); do
    ls "$node_dir"/gpufeed-*.sock >/dev/null 2>&1 || return 0
    sleep 0.1
  done
  echo "a node's server outlived the job: $(ls "$node_dir"/gpufeed-*.sock)" >&2
  exit 1
}
no_server_left
# Two "nodes" on this host: two torchrun agents of one job (--nnodes 2, one
# rendezvous on localhost), two ranks each: each node's ranks share that
# node's server, shards follow the global rank, nothing else coordinates.
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for node in 0 1; do
  /usr/bin/python3 -m torch.distributed.run --nnodes 2 --node_rank "$node" --nproc_per_node 2 \
    --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "gpufeed-ci-$$" --redirects 1 --tee 1 \
    "$root/examples/pytorch_ddp.py" --train "$work/fashion-mnist-train.h5" --test "$work/fashion-mnist-t10k.h5" \
    --epochs 1 --device cpu --min-accuracy 0.75 > "$work/node$node.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
cat "$work/node0.log" "$work/node1.log" | grep -E "node [01]:|epoch|Error|error" || true
[ "$status" = 0 ] || { echo "two-node run failed" >&2; tail -30 "$work/node0.log" "$work/node1.log" >&2; exit 1; }
grep -q "node 0: 4 ranks in all, cpu;.*share='node'" "$work/node0.log"
grep -q "node 1: 4 ranks in all, cpu;.*share='node'" "$work/node1.log"
no_server_left
