#!/usr/bin/env bash
# Integer options refuse negative values, naming the option, before any work
# (CLI11 wrapped "--batch-size -5" to 2^64 - 5 and ran; "convert --threads
# -3" exited 0).
#   tests/cli/negative_counts_test.sh GPUFEED_CLI
set -uo pipefail
cli=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
refused() {  # refused OPTION ARGS...: the command exits non-zero naming OPTION
  local opt=$1; shift
  local out
  out=$("$cli" "$@" 2>&1)
  local rc=$?
  if [ $rc -eq 0 ] || ! grep -q -- "$opt" <<<"$out"; then
    echo "FAIL: gpufeed $* exited $rc without naming $opt: $out"
    fail=1
  fi
}
"$cli" bench gen --workload celeba-raw --samples 200 -o "$tmp/d.h5" > /dev/null 2>&1 || { echo "gen failed"; exit 1; }
refused --batch-size bench loader --data "$tmp/d.h5" --batch-size -5
refused --batches bench loader --data "$tmp/d.h5" --batches -2
refused --threads bench loader --data "$tmp/d.h5" --threads -3
refused --prefetch bench loader --data "$tmp/d.h5" --prefetch -1
refused --threads convert "$tmp/d.h5" -o "$tmp/o.h5" --threads -3
refused --chunk-samples convert "$tmp/d.h5" -o "$tmp/o.h5" --chunk-samples -1
refused --epochs train --data "$tmp/d.h5" --epochs -1
refused --threads serve --data "$tmp/d.h5" --threads -2
[ -e "$tmp/o.h5" ] && { echo "FAIL: a refused convert wrote its output"; fail=1; }
refused --level convert "$tmp/d.h5" -o "$tmp/o.h5" --level -5
# Zero and positive values still pass the parser.
"$cli" bench loader --data "$tmp/d.h5" --threads 0 --batches 1 > /dev/null 2>&1 ||
  { echo "FAIL: bench loader --threads 0 --batches 1 was refused"; fail=1; }
[ $fail -eq 0 ] && echo "negative_counts: every negative count refused, naming its option"
exit $fail
