#!/usr/bin/env bash
# `gpufeed convert` of many files (one file and shards) and `gpufeed inspect
# --stats --store` through the real binary: every sample's bytes of every
# field where they belong (exported as .npy and compared), the sidecar for
# a read-only file (left byte for byte) and attributes for a writable one,
# and options that do not apply refused with exit 2.
#   usage: stats_convert_cli_test.sh GPUFEED_BINARY
set -uo pipefail
bin=$1
dir=$(mktemp -d)
trap 'chmod -R u+w "$dir"; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
F=(--field data=/climate/data --field labels=/climate/labels_0)
# 6 DeepCAM-shaped samples, one a file: data float32 [16, 48, 72], labels int32 [48, 72].
"$bin" bench gen --workload deepcam --samples 6 --scale 16 -o "$dir/in" >/dev/null 2>&1 || fail "bench gen"
files=("$dir"/in/*.h5)
[ ${#files[@]} -eq 6 ] || fail "expected 6 input files, got ${#files[@]}"

"$bin" convert "$dir/in/*.h5" "${F[@]}" -o "$dir/one.h5" >/dev/null 2>&1 || fail "convert to one file"
# 2 samples a shard: 16*48*72*4 + 48*72*4 = 235008 bytes a sample.
"$bin" convert "$dir/in/*.h5" "${F[@]}" -o "$dir/sh.h5" --shard-size 470016 >/dev/null 2>&1 || fail "convert to shards"
[ -f "$dir/sh-00000.h5" ] && [ -f "$dir/sh-00002.h5" ] && [ ! -e "$dir/sh-00003.h5" ] || fail "shards: $(ls "$dir")"

same_sample() {  # FILE_A K_A FILE_B K_B PATH
  "$bin" --trust-files inspect "$1:$5" --sample "$2" --out "$dir/a.npy" >/dev/null 2>&1 || fail "export $1:$5 sample $2"
  "$bin" --trust-files inspect "$3:$5" --sample "$4" --out "$dir/b.npy" >/dev/null 2>&1 || fail "export $3:$5 sample $4"
  cmp -s "$dir/a.npy" "$dir/b.npy" || fail "$3:$5 sample $4 differs from $1 sample $2"
}
for k in 0 1 2 3 4 5; do
  for path in /climate/data /climate/labels_0; do
    same_sample "${files[$k]}" 0 "$dir/one.h5" $k $path
    same_sample "${files[$k]}" 0 "$dir/sh-0000$((k / 2)).h5" $((k % 2)) $path
  done
done
echo "convert: 6 files' samples x 2 fields identical in one file and in 3 shards"

# --stats --store: read-only -> sidecar, file untouched; writable -> attributes.
cp "${files[0]}" "$dir/ro.h5" && cp "${files[0]}" "$dir/rw.h5" && cp "$dir/ro.h5" "$dir/ro.copy" && chmod 0444 "$dir/ro.h5"
"$bin" inspect "$dir/ro.h5" "${F[@]}" --stats --store >/dev/null 2>&1 || fail "--store on a read-only file"
[ -f "$dir/ro.h5.gpufeed-stats.json" ] || fail "no sidecar"
cmp -s "$dir/ro.h5" "$dir/ro.copy" || fail "the read-only file changed"
"$bin" inspect "$dir/ro.h5:/climate/data" --json | grep -q "\"stats_from\": \"$dir/ro.h5.gpufeed-stats.json\"" ||
  fail "the loader does not read the sidecar"
"$bin" inspect "$dir/rw.h5" "${F[@]}" --stats --store >/dev/null 2>&1 || fail "--store on a writable file"
[ ! -e "$dir/rw.h5.gpufeed-stats.json" ] || fail "a sidecar for a writable file"
"$bin" inspect "$dir/rw.h5:/climate/data" --json | grep -q '"stats_from": "attributes"' || fail "no attributes"
echo "stats: sidecar beside the read-only file (unchanged), attributes in the writable one"

# DeepCAM's reference layout: one sample a file, no sample axis ([H, W, C]
# data, [H, W] labels); --no-sample-axis converts them into one file with one.
/usr/bin/python3 - "$dir/ref" <<'PY' || fail "writing reference-layout files"
import os, sys, h5py, numpy as np
d = sys.argv[1]; os.makedirs(d)
for k in range(3):
    with h5py.File(os.path.join(d, "r_%d.h5" % k), "w") as f:
        f["climate/data"] = (k * 1000 + np.arange(6 * 8 * 16, dtype=np.float32)).reshape(6, 8, 16)
        f.create_dataset("climate/labels_0", data=np.full((6, 8), k, np.int32), chunks=(3, 4), compression="gzip")
PY
"$bin" convert "$dir/ref/*.h5" "${F[@]}" --no-sample-axis --codec deflate -o "$dir/ref.h5" >/dev/null 2>"$dir/err" ||
  fail "convert --no-sample-axis: $(cat "$dir/err")"
/usr/bin/python3 - "$dir/ref.h5" <<'PY' || fail "--no-sample-axis output differs"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    assert f["climate/data"].shape == (3, 6, 8, 16), f["climate/data"].shape
    for k in range(3):
        assert np.array_equal(f["climate/data"][k], (k * 1000 + np.arange(768, dtype=np.float32)).reshape(6, 8, 16))
        assert (f["climate/labels_0"][k] == k).all()
PY
echo "convert --no-sample-axis: 3 reference-layout files into [3, 6, 8, 16] and [3, 6, 8]"

refused() {  # expects exit 2
  "$bin" "$@" >/dev/null 2>"$dir/err"
  [ $? -eq 2 ] || fail "not refused: $*"
  [ -s "$dir/err" ] || fail "no message: $*"
}
refused inspect "$dir/rw.h5" --store
refused inspect "$dir/rw.h5" "${F[@]}" --stats --sidecar
refused inspect "$dir/rw.h5" "${F[@]}" --stats --channel-axis 7
refused convert "$dir/in/*.h5" "${F[@]}" -o "$dir/x.h5" --shard-size 4XB
refused convert "$dir/in/*.h5" "${F[@]}" -o "$dir/x.h5" --labels /y
refused convert "$dir/rw.h5" -o "$dir/x.h5" --shard-size 1GiB
[ ! -e "$dir/x.h5" ] || fail "a refused convert wrote output"
echo "bad options: exit 2 with a message"
