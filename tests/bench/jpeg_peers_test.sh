#!/usr/bin/env bash
# bench/peer/torch_jpeg_ddp.py on two CPU ranks (torchrun, gloo, a small CNN):
# the gpufeed loader and the DataLoader + PIL peer over one imagenet-jpeg
# file, each epoch's count and label sum checked across ranks by the script,
# its JSON read back and the summary table made; torchvision-gpu refused on
# the CPU with a message that says so. The GPU host runs the same script
# (scripts/gpu-host-jpeg-order).
#   tests/bench/jpeg_peers_test.sh GPUFEED_CLI   (GPUFEED_LIBRARY, PYTHONPATH set by CTest)
set -uo pipefail
cli=$1
root="$(cd "$(dirname "$0")/../.." && pwd)"
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
"$cli" bench gen --workload imagenet-jpeg --samples 256 -o "$tmp/inet.h5" > /dev/null 2>&1 || { echo "gen failed"; exit 1; }
# A port of our own (the other torchrun tests take 29400 under a CTest lock).
port=$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
common=(--data "$tmp/inet.h5" --device cpu --model tiny --batch-size 32 --epochs 2 --image-size 64)
for loader in gpufeed dataloader-pil; do
  extra=(--threads 1 --share none --order random)
  [ "$loader" = dataloader-pil ] && extra=(--workers 1 --peer-variant naive)
  # --redirects 1 --tee 1: Debian's torch 1.13 under Python 3.11 cannot parse the default redirects;
  # --monitor_interval: its agent looks at the ranks every 5 s by default (5 s lost a run).
  out=$(timeout -k 5 100 $py -m torch.distributed.run --nnodes 1 --nproc_per_node 2 --rdzv_backend c10d \
    --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "jpeg-peers-$$-$loader" --monitor_interval 0.5 --redirects 1 --tee 1 \
    "$root/bench/peer/torch_jpeg_ddp.py" "${common[@]}" --loader "$loader" "${extra[@]}" \
    --json "$tmp/$loader.json" 2>&1)
  rc=$?
  if [ "$rc" != 0 ]; then
    echo "FAIL: $loader: exit status $rc:"
    echo "$out" | tail -30
    fail=1
    continue
  fi
  echo "$out" | grep -E "^\[default0\]:" | grep -vE "Warning|warn"
  # What the JSON must hold: both epochs of the whole file on two ranks, each
  # rank's wait, rate and memory, and gpufeed's decode split (all on the CPU here).
  $py - "$tmp/$loader.json" "$loader" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
loader = sys.argv[2]
errs = []
want = {"loader": loader, "gpus": 2, "samples": 256, "epochs_run": 2}
errs += ["%s = %r, want %r" % (k, r.get(k), v) for k, v in want.items() if r.get(k) != v]
if not (r["ceiling"] > 0 and len(r["rates"]) == 2 and all(x > 0 for x in r["rates"]) and r["later"] > 0):
    errs.append("rates %r, ceiling %r" % (r["rates"], r["ceiling"]))
for rk in r["ranks"]:
    if sum(e["images"] for e in rk["epochs"]) != 256:  # 128 a rank an epoch
        errs.append("rank %d: %d images over 2 epochs, want 256" % (rk["rank"], sum(e["images"] for e in rk["epochs"])))
    if not rk["peak_rss"] or rk["tree_rss_peak"] < rk["peak_rss"] // 2:
        errs.append("rank %d: peak RSS %r, with children %r" % (rk["rank"], rk["peak_rss"], rk["tree_rss_peak"]))
    steps = [rk["ceiling_steps"]] + [e["steps"] for e in rk["epochs"]]
    if not all(st["steps"] > 0 and st["host_queue_ms"] > 0 and st["gpu_step_ms"] is None for st in steps):
        errs.append("rank %d: step times %r (host queueing > 0; no GPU time on the CPU)" % (rk["rank"], steps))
    if sum(st["steps"] for st in steps[1:]) != 256 // 32:  # batch 32 a rank
        errs.append("rank %d: %d steps timed, want 8" % (rk["rank"], sum(st["steps"] for st in steps[1:])))
    for e in rk["epochs"]:
        if not (e["wait_s"] >= 0 and e["images_per_s"] > 0 and e["first_batch_s"] is not None):
            errs.append("rank %d epoch: %r" % (rk["rank"], e))
        if loader == "gpufeed" and e["decode_split"] != {"gpu": 0.0, "cpu": 1.0}:
            errs.append("rank %d: decode split %r, want all on the CPU" % (rk["rank"], e["decode_split"]))
if loader == "dataloader-pil" and (r.get("workers") != 1 or r.get("h5py_file_kw") != {}):
    errs.append("workers %r, h5py keywords %r (naive: none)" % (r.get("workers"), r.get("h5py_file_kw")))
if r["node_rss_peak"] < sum(rk["peak_rss"] for rk in r["ranks"]) // 2:
    errs.append("node RSS %r" % r["node_rss_peak"])
print("\n".join("FAIL: %s: %s" % (loader, e) for e in errs) or "%s: JSON complete" % loader)
sys.exit(1 if errs else 0)
PY
done
if [ "$fail" = 0 ]; then
  table=$($py "$root/bench/peer/jpeg_ddp_summary.py" "$tmp/gpufeed.json" "$tmp/dataloader-pil.json" 2>&1)
  echo "$table"
  if ! grep -qE "^tiny +2 +gpufeed random/none t1 " <<<"$table" ||
     ! grep -qE "^tiny +2 +dataloader-pil naive w1 " <<<"$table"; then
    echo "FAIL: the summary has not both runs"
    fail=1
  fi
fi
# torchvision-gpu needs CUDA: refused before any rank starts, naming the fix.
out=$($py "$root/bench/peer/torch_jpeg_ddp.py" --data "$tmp/inet.h5" --device cpu --loader torchvision-gpu 2>&1)
rc=$?
if [ "$rc" = 0 ] || ! grep -q "decodes on a GPU.*--device cuda" <<<"$out"; then
  echo "FAIL: torchvision-gpu on the CPU: status $rc, said: $out"
  fail=1
fi
[ "$fail" = 0 ] && echo "jpeg peers: all checks passed"
exit "$fail"
