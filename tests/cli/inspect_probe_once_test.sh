#!/usr/bin/env bash
# `gpufeed inspect` and `gpufeed train` probe a file once: a file that hangs HDF5's metadata
# parser (cve-2018-15671) is answered within one probe's 10 s, naming it, not
# after a second probe (it took 20.1 s when Dataset::Open probed again after
# DetectEncoded). A good file still inspects.
#   tests/cli/inspect_probe_once_test.sh GPUFEED_CLI TESTDATA (tests/corpus/data)
set -uo pipefail
cli=$1
testdata=$2
hang=$testdata/hdf5-cve/cve-2018-15671.h5
[ -f "$hang" ] || { echo "no $hang (tests/corpus/data is in the repository)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
start=$(date +%s%N)
out=$("$cli" inspect "$hang" 2>&1)
rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
# (Under a sanitizer's allocator HDF5 may crash on it instead: contained too.)
if [ $rc -eq 0 ] || ! grep -Eq "did not finish reading|crashed reading" <<<"$out" || ! grep -q "cve-2018-15671" <<<"$out"; then
  echo "FAIL: inspect of a file that hangs HDF5 exited $rc: $out"
  fail=1
fi
if [ "$ms" -ge 15000 ]; then
  echo "FAIL: inspect took $ms ms: probed more than once (one probe waits 10 s)"
  fail=1
fi
# The same for train (DetectEncoded, then Dataset::Open, probed twice too).
start=$(date +%s%N)
out=$("$cli" train --data "$hang" --device cpu --epochs 1 2>&1)
rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
if [ $rc -eq 0 ] || ! grep -Eq "did not finish reading|crashed reading" <<<"$out" || [ "$ms" -ge 15000 ]; then
  echo "FAIL: train on a file that hangs HDF5 exited $rc after $ms ms (one probe waits 10 s): $out"
  fail=1
fi
"$cli" bench gen --workload celeba-raw --samples 50 -o "$tmp/d.h5" > /dev/null 2>&1 || { echo "gen failed"; exit 1; }
if ! "$cli" inspect "$tmp/d.h5" > "$tmp/out.txt" 2>&1 || ! grep -q "50" "$tmp/out.txt"; then
  echo "FAIL: inspect of a good file: $(cat "$tmp/out.txt")"
  fail=1
fi
[ $fail -eq 0 ] && echo "ok: answered in $ms ms, one probe"
exit $fail
