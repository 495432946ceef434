#!/usr/bin/env bash
# `gpufeed train` with ranks on the CPU (the CPU form of the NCCL path):
# --gpus 2 --device cpu starts two ranks that meet through shared memory and
# learn Fashion-MNIST; torchrun --no_python starting the same command gives
# the same weights; pipeline stages x 2 replicas train the weights of --accum
# on 2 ranks; a rank killed mid-run stops the job with an error naming
# it (no hang, no rank left behind); wrong rank settings are named.
# Usage: train_ranks_test.sh GPUFEED_CLI WORK_DIR
set -euo pipefail
cli="$1" work="$2"
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=tests/python/fashion_mnist.sh
. "$root/tests/python/fashion_mnist.sh"
node_dir=$(mktemp -d /tmp/gpufeed-ci-ranks.XXXXXX)
trap 'rm -rf "$node_dir"' EXIT
export GPUFEED_NODE_DIR="$node_dir"
train=("$cli" train --data "$work/fashion-mnist-train.h5" --test "$work/fashion-mnist-t10k.h5" --device cpu
       --batch-size 128 --threads 1)
field() { /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

"${train[@]}" --epochs 1 --gpus 2 --json "$node_dir/gpus.json" | tee "$node_dir/gpus.log"
grep -q "data parallel: 2 ranks, shared memory" "$node_dir/gpus.log"
grep -q "  rank 1: " "$node_dir/gpus.log"
[ "$(field "$node_dir/gpus.json" 'len(r["ranks"])')" = 2 ]
[ "$(field "$node_dir/gpus.json" 'r["epochs"][0]["samples"]')" = 59904 ]  # 2 x 234 batches of 128
[ "$(field "$node_dir/gpus.json" 'r["epochs"][0]["test_accuracy"] >= 0.80')" = True ]

/usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 --redirects 1 --tee 1 --no_python \
  "${train[@]}" --epochs 1 --json "$node_dir/torchrun.json" >"$node_dir/torchrun.log" 2>&1 ||
  { cat "$node_dir/torchrun.log"; exit 1; }
a=$(field "$node_dir/gpus.json" 'r["weights_hash"]') b=$(field "$node_dir/torchrun.json" 'r["weights_hash"]')
[ "$a" = "$b" ] || { echo "--gpus 2 and torchrun trained other weights: $a vs $b"; exit 1; }

# A rank killed mid-run: the job ends within seconds, naming it.
"${train[@]}" --epochs 200 --gpus 2 >"$node_dir/killed.log" 2>&1 &
job=$!
for _ in $(seq 100); do
  ranks=$(pgrep -P "$job" || true)
  [ "$(wc -w <<<"$ranks")" = 2 ] && break
  sleep 0.1
done
[ "$(wc -w <<<"$ranks")" = 2 ] || { echo "the two ranks did not start"; cat "$node_dir/killed.log"; exit 1; }
sleep 2
victim=$(awk '{print $2}' <<<"$(echo $ranks)")
kill -9 "$victim"
rc=0
timeout 60 tail --pid="$job" -f /dev/null || { echo "the job did not end after a rank was killed"; exit 1; }
wait "$job" || rc=$?
[ "$rc" != 0 ] || { echo "the job exited 0 after a rank was killed"; exit 1; }
grep -Eq "rank [01] of 2 was killed by Killed" "$node_dir/killed.log" || { cat "$node_dir/killed.log"; exit 1; }
for p in $ranks; do
  if kill -0 "$p" 2>/dev/null; then echo "rank pid $p outlived the job"; exit 1; fi
done

# Wrong settings are named.
out=$(RANK=0 WORLD_SIZE=2 "${train[@]}" --gpus 3 2>&1) && exit 1
grep -q "\-\-gpus 3, but the job's WORLD_SIZE is 2" <<<"$out" || { echo "$out"; exit 1; }
out=$(RANK=2 WORLD_SIZE=2 "${train[@]}" 2>&1) && exit 1
grep -q "RANK='2' is not in \[0, WORLD_SIZE=2)" <<<"$out" || { echo "$out"; exit 1; }
out=$("$cli" train --data "$work/fashion-mnist-train.h5" --gpus 2 2>&1) && exit 1
grep -q "add --device cpu to train 2 CPU ranks" <<<"$out" || { echo "$out"; exit 1; }
cat "$node_dir/killed.log" | grep -v "^epoch"

# Pipeline stages on the CPU (a stage a thread): the weights of --accum (the
# schedule by its other name: simple is gpipe), and wrong pipeline settings
# named.
"${train[@]}" --epochs 1 --accum 4 --json "$node_dir/accum.json" >/dev/null
"${train[@]}" --epochs 1 --pipeline-stages 2 --micro-batches 4 --schedule simple --partition-by memory \
  --json "$node_dir/pipe.json" | tee "$node_dir/pipe.log"
grep -q "pipeline: 2 stages, gpipe, 4 micro-batches a step, cut by memory" "$node_dir/pipe.log"
grep -q "  stage 1: layers " "$node_dir/pipe.log"
grep -q "  bubble: " "$node_dir/pipe.log"
a=$(field "$node_dir/accum.json" 'r["weights_hash"]') b=$(field "$node_dir/pipe.json" 'r["weights_hash"]')
[ "$a" = "$b" ] || { echo "--pipeline-stages 2 trained other weights than --accum 4: $b vs $a"; exit 1; }
[ "$(field "$node_dir/pipe.json" 'len(r["stages"])')" = 2 ]
out=$("${train[@]}" --pipeline-stages 2 --schedule zigzag 2>&1) && exit 1
grep -q "\-\-schedule 'zigzag': gpipe (alias simple) or 1f1b (alias interleaved)" <<<"$out" || { echo "$out"; exit 1; }
# interleaved (1f1b's other name) is taken: the run gets past the schedule to
# the option that is wrong.
out=$("${train[@]}" --pipeline-stages 2 --schedule interleaved --epochs 0 2>&1) && exit 1
grep -q "\-\-epochs must be >= 1" <<<"$out" || { echo "$out"; exit 1; }
out=$("${train[@]}" --pipeline-stages 2 --partition-by luck 2>&1) && exit 1
grep -q "\-\-partition-by 'luck': time or memory" <<<"$out" || { echo "$out"; exit 1; }
# Stages x data parallel: --gpus 4 --pipeline-stages 2 is two replicas (ranks)
# of a 2-stage pipeline, each stage's gradients summed with the other
# replica's: the weights of --accum 4 on 2 ranks, bit for bit.
"${train[@]}" --epochs 1 --gpus 2 --accum 4 --json "$node_dir/accum2.json" >/dev/null
"${train[@]}" --epochs 1 --gpus 4 --pipeline-stages 2 --micro-batches 4 --json "$node_dir/pipe2.json" \
  | tee "$node_dir/pipe2.log"
grep -q "2 replicas (each stage's gradients summed among them)" "$node_dir/pipe2.log"
a=$(field "$node_dir/accum2.json" 'r["weights_hash"]') b=$(field "$node_dir/pipe2.json" 'r["weights_hash"]')
[ "$a" = "$b" ] || { echo "--gpus 4 --pipeline-stages 2 trained other weights than --gpus 2 --accum 4: $b vs $a"; exit 1; }
out=$("${train[@]}" --pipeline-stages 2 --gpus 3 2>&1) && exit 1
grep -q "\-\-gpus must be a multiple of the stages" <<<"$out" || { echo "$out"; exit 1; }
out=$(RANK=0 WORLD_SIZE=2 "${train[@]}" --pipeline-stages 2 --gpus 2 2>&1) && exit 1
grep -q "\-\-gpus 2, but the job's WORLD_SIZE is 2 x --pipeline-stages 2" <<<"$out" || { echo "$out"; exit 1; }
out=$("${train[@]}" --memory-limit 1000 2>&1) && exit 1
grep -q "but the memory limit is 0.0 MiB: raise --memory-limit" <<<"$out" || { echo "$out"; exit 1; }
echo "train ranks: ok"
