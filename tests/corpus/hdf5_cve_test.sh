#!/usr/bin/env bash
# The HDF Group's HDF5 CVE corpus (tests/corpus/data/hdf5-cve: files that
# crashed or hung HDF5) through every gpufeed entry that opens a file:
# inspect, convert, bench loader and serve. Each must end with a clear error
# (exit 1 and a "gpufeed ...:" line naming the file) or succeed; a signal,
# a sanitizer report or a hang fails the test.
#   usage: hdf5_cve_test.sh GPUFEED_BINARY [CORPUS_DIR]
set -uo pipefail
bin=$1
corpus=${2:-$(cd "$(dirname "$0")" && pwd)/data/hdf5-cve}
if [ ! -d "$corpus" ]; then
  echo "no corpus at $corpus (tests/corpus/data/hdf5-cve is in the repository)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
limit=${CORPUS_TIMEOUT:-60}   # per command; the probe's own limit is 10 s
files=0 errors=0 succeeded=0 bad=0

check() {  # check NAME FILE RC LOG
  local name=$1 f=$2 rc=$3 log=$4
  if [ "$rc" -eq 0 ]; then
    succeeded=$((succeeded + 1))
  elif [ "$rc" -eq 1 ] && grep -q "^gpufeed [a-z ]*: " "$log" && ! grep -qE "Sanitizer|runtime error" "$log"; then
    errors=$((errors + 1))
  else
    bad=$((bad + 1))
    echo "FAIL $name $(basename "$f"): exit $rc$([ "$rc" -eq 124 ] && echo ' (hang)')"
    tail -5 "$log" | sed 's/^/    /'
  fi
}

for f in "$corpus"/*; do
  case "$(basename "$f")" in COPYING|*.md) continue ;; esac
  files=$((files + 1))
  timeout "$limit" "$bin" inspect "$f" --sample 0 --out "$tmp/x.npy" >"$tmp/log" 2>&1
  check inspect "$f" $? "$tmp/log"
  timeout "$limit" "$bin" convert "$f" -o "$tmp/out.h5" >"$tmp/log" 2>&1
  check convert "$f" $? "$tmp/log"
  timeout "$limit" "$bin" bench loader --data "$f" --batches 2 --threads 2 >"$tmp/log" 2>&1
  check "bench loader" "$f" $? "$tmp/log"
  # serve: refuses the file at start (exit 1) or, for a file it can serve,
  # listens; a served file is stopped with SIGTERM and must exit 0.
  rm -f "$tmp/s.sock"
  "$bin" serve --data "$f" --listen "unix:$tmp/s.sock" >"$tmp/log" 2>&1 &
  pid=$!
  rc=
  for _ in $(seq 1 $((limit * 10))); do
    if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; rc=$?; break; fi
    if [ -S "$tmp/s.sock" ]; then kill -TERM "$pid"; wait "$pid"; rc=$?; break; fi
    sleep 0.1
  done
  if [ -z "$rc" ]; then kill -KILL "$pid"; wait "$pid" 2>/dev/null; rc=124; fi
  # serve logs as structured lines; its fatal error is its last line.
  if [ "$rc" -eq 1 ] && ! grep -q "^gpufeed [a-z ]*: " "$tmp/log"; then echo "gpufeed serve: $(tail -1 "$tmp/log")" >>"$tmp/log"; fi
  check serve "$f" "$rc" "$tmp/log"
done
echo "hdf5-cve corpus: $files files x 4 commands: $errors clear errors, $succeeded succeeded, $bad crashes/hangs/unclear"
[ "$files" -gt 0 ] && [ "$bad" -eq 0 ]
