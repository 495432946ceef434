#!/usr/bin/env bash
# The benches say what they verified, as timed, through the binary (CPU
# twins here; the GPU host runs the same commands on the GPU): bench feed
# with echo, crop and flip verifies every epoch it times; bench loader says
# "no index doubled" for --batches and checks the union of ranks; bench read
# compares every pass and prints the like-for-like ratio.
#   tests/bench/bench_verify_test.sh GPUFEED_CLI
set -uo pipefail
cli=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
expect() {  # expect PATTERN OUTPUT WHAT
  grep -qE -- "$1" <<<"$2" || { echo "FAIL: $3: no '$1' in: $2"; fail=1; }
}
"$cli" bench gen --workload celeba-raw --samples 300 -o "$tmp/d.h5" > /dev/null 2>&1 || { echo "gen failed"; exit 1; }
common=(--threads 2 --batch-size 32 --prefetch 4)

out=$("$cli" bench feed --data "$tmp/d.h5" "${common[@]}" --echo 2 --crop-padding 4 --flip --epochs 2 2>&1) ||
  { echo "FAIL: bench feed --echo 2 --crop-padding 4 --flip: $out"; fail=1; }
# 300 samples, echo 2: 600 rows an epoch, 1200 over the two timed epochs.
expect "all 2 epochs, 1200 samples delivered .*the reported epoch's 600" "$out" "bench feed verified count"
expect "1200 labels equal to the file's and 40 samples' values" "$out" "bench feed value checks"
out=$("$cli" bench feed --data "$tmp/d.h5" "${common[@]}" --dtype float16 --epochs 1 --json 2>&1)
expect '"values_checked": 10' "$out" "bench feed fp16"
# Auto echo with super-batches: the first uploads are used once while the
# factor is measured, later ones more; each epoch's fresh passes every index once.
out=$("$cli" bench feed --data "$tmp/d.h5" "${common[@]}" --echo 0 --super-batch 2 --epochs 2 2>&1) ||
  { echo "FAIL: bench feed --echo 0 --super-batch 2: $out"; fail=1; }
expect "verified, as timed .*all 2 epochs" "$out" "bench feed auto echo, super-batch 2"

out=$("$cli" bench loader --data "$tmp/d.h5" "${common[@]}" --batches 3 2>&1)
expect "partial epoch, no index doubled \(96 of 300 samples\)" "$out" "bench loader --batches"
grep -q "every index once" <<<"$out" && { echo "FAIL: a partial epoch claims every index once: $out"; fail=1; }
out=$("$cli" bench loader --data "$tmp/d.h5" "${common[@]}" --world-size 7 --rank 2 2>&1)
expect "rank 2 of 7: no index doubled \(43 of 300 samples\); all 7 ranks: every index, 1 padded repeats" "$out" \
  "bench loader --world-size 7"
out=$("$cli" bench loader --data "$tmp/d.h5" "${common[@]}" 2>&1)
expect "every index once, index/label checksum equal" "$out" "bench loader, whole epoch"

out=$("$cli" bench read --data "$tmp/d.h5" --threads 2 --repeats 1 2>&1)
expect "hash of all 5 passes .* equal to HDF5's" "$out" "bench read passes"
expect "ratio, 1 thread vs 1 thread: [0-9.]+x; gpufeed on 2 threads vs HDF5 on 1" "$out" "bench read ratio"
[ $fail -eq 0 ] && echo "bench_verify: each bench printed what it verified, as timed"
exit $fail
