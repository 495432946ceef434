#!/usr/bin/env bash
# Ctrl-C (SIGINT) or SIGTERM during `gpufeed convert` leaves neither a
# temporary file nor a partial output behind, and the target is untouched.
#   usage: convert_interrupt_test.sh GPUFEED_BINARY
set -uo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" bench gen --workload celeba-deflate --samples 3000 -o "$dir/src.h5" >/dev/null 2>&1 || exit 1
for sig in INT TERM; do
  echo "previous" >"$dir/out.h5"
  "$bin" convert "$dir/src.h5" -o "$dir/out.h5" --codec deflate --level 9 --threads 1 >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do  # until the temporary file exists (at most 10 s)
    ls "$dir"/out.h5.tmp-* >/dev/null 2>&1 && break
    sleep 0.1
  done
  kill -"$sig" "$pid"
  wait "$pid"
  rc=$?
  left=$(ls "$dir" | grep -c "tmp-" || true)
  if [ "$left" -ne 0 ] || [ "$(cat "$dir/out.h5")" != previous ] || [ "$rc" -lt 128 ]; then
    echo "FAIL SIG$sig: exit $rc, $left temporary files left: $(ls "$dir")"
    exit 1
  fi
  echo "SIG$sig: exit $rc, no temporary file, target untouched"
done
