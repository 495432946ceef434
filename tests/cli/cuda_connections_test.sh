#!/usr/bin/env bash
# The CLI gives CUDA its most hardware queues (CUDA_DEVICE_MAX_CONNECTIONS=32)
# before any context unless the job chose a value, and `devices` says which.
#   tests/cli/cuda_connections_test.sh GPUFEED_CLI
set -uo pipefail
cli=$1
fail=0
out=$(env -u CUDA_DEVICE_MAX_CONNECTIONS "$cli" devices --json 2>&1)
grep -q '"cuda_device_max_connections": "32"' <<<"$out" || { echo "FAIL: unset gave: $out"; fail=1; }
out=$(CUDA_DEVICE_MAX_CONNECTIONS=1 "$cli" devices --json 2>&1)
grep -q '"cuda_device_max_connections": "1"' <<<"$out" || { echo "FAIL: the job's 1 gave: $out"; fail=1; }
out=$(env -u CUDA_DEVICE_MAX_CONNECTIONS "$cli" devices 2>&1)
grep -q 'CUDA_DEVICE_MAX_CONNECTIONS=32' <<<"$out" || { echo "FAIL: the text form: $out"; fail=1; }
[ $fail -eq 0 ] && echo "PASS"
exit $fail
