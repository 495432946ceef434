#!/usr/bin/env bash
# GPUFEED_REQUIRE_GPU=1 (set by scripts/gpu-host-*) turns a GPU case that
# cannot run into a failure: with the devices hidden, a GPU case must skip
# without the switch and fail with it (tests/testing/gpu_required.h).
#   tests/gpu/require_gpu_test.sh GPUFEED_TESTS
set -uo pipefail
tests=$1
fail=0
for filter in TransformGpuTest.MatchesTheCpuReferenceBitForBit CpuAndGpu/FeederTest.DeliversExactlyTheLoadersBytes/Gpu; do
  out=$(CUDA_VISIBLE_DEVICES= GPUFEED_REQUIRE_GPU= "$tests" --gtest_filter="$filter" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q "SKIPPED" <<<"$out"; then
    echo "FAIL: without the switch $filter should skip (exit $rc): $out"; fail=1
  fi
  out=$(CUDA_VISIBLE_DEVICES= GPUFEED_REQUIRE_GPU=1 "$tests" --gtest_filter="$filter" 2>&1)
  rc=$?
  if [ $rc -eq 0 ] || ! grep -q "GPUFEED_REQUIRE_GPU=1" <<<"$out"; then
    echo "FAIL: with GPUFEED_REQUIRE_GPU=1 $filter should fail (exit $rc): $out"; fail=1
  fi
done
[ $fail -eq 0 ] && echo "require_gpu: GPU cases skip without a GPU, and fail under GPUFEED_REQUIRE_GPU=1"
exit $fail
