#!/usr/bin/env bash
# Interop with h5py (the peer's reader): files h5py writes (gzip, shuffle+gzip,
# zstd through our plugin, no filter, contiguous, auto chunks) are read by
# gpufeed exactly, and files gpufeed writes (deflate, zstd) read back
# identical in h5py, zstd through HDF5_PLUGIN_PATH. Also h5dump on zstd.
# Usage: h5py_interop.sh GPUFEED_BIN PLUGIN_DIR
set -euo pipefail
gpufeed=$(realpath "$1")
export HDF5_PLUGIN_PATH=$(realpath "$2")
py=/usr/bin/python3  # Debian's python, where python3-h5py lives
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

"$py" - <<'PY'
import h5py, numpy as np
rng = np.random.default_rng(7)
n = 157
x = rng.integers(0, 256, size=(n, 3, 10, 12), dtype=np.uint8)
x[:, 0, 0, 0] = np.arange(n) % 256          # index-valued first byte
y = (np.arange(n) % 10).astype(np.int64)
np.save("x.npy", x); np.save("y.npy", y)
u16 = rng.integers(0, 65536, size=(n, 5, 6), dtype=np.uint16)
np.save("u16.npy", u16)
def write(name, data=x, **kw):
    with h5py.File(name, "w") as f:
        f.create_dataset("images", data=data, **kw)
        f.create_dataset("labels", data=y)
write("gzip.h5", compression="gzip", chunks=(10, 3, 10, 12))
write("shuffle_gzip.h5", compression="gzip", shuffle=True, chunks=(7, 3, 10, 12))
# h5py's high-level API refuses a filter that is not loaded yet (HDF5 1.10's
# H5Zfilter_avail and H5Dcreate do not search plugins; only the filter
# pipeline does), so: an optional filter 32015 in the DCPL, which HDF5 loads
# from our plugin on write. hdf5plugin users get the same file.
with h5py.File("zstd.h5", "w") as f:
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk((16, 3, 10, 12))
    dcpl.set_filter(32015, h5py.h5z.FLAG_OPTIONAL, (3,))
    space = h5py.h5s.create_simple(x.shape)
    h5py.h5d.create(f.id, b"images", h5py.h5t.STD_U8LE, space, dcpl=dcpl)
    f["images"][...] = x
    f.create_dataset("labels", data=y)
write("raw_chunked.h5", chunks=(32, 3, 10, 12))
write("contiguous.h5")
write("auto_chunks.h5", compression="gzip", chunks=True)
write("split.h5", compression="gzip", chunks=(5, 1, 10, 6))
write("u16_shuffle_gzip.h5", data=u16, compression="gzip", shuffle=True, chunks=(9, 5, 6))
with h5py.File("nested.h5", "w") as f:
    f.create_dataset("train/pixels", data=x, compression="gzip", chunks=(10, 3, 10, 12))
    f.create_dataset("train/targets", data=y)
PY

fail=0
check() {  # check SPEC LABELS EXPECT_PATH NPY CODEC
  local spec=$1 labels=$2 want_path=$3 npy=$4 codec=$5
  local out="out_$(echo "$spec" | tr '/:.' '___')_$codec.h5"
  local path
  path=$("$gpufeed" inspect "$spec" ${labels:+--labels "$labels"} --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["read_path"])')
  if [ "$path" != "$want_path" ]; then echo "FAIL $spec: read path $path, expected $want_path"; fail=1; fi
  "$gpufeed" convert "$spec" ${labels:+--labels "$labels"} -o "$out" --codec "$codec" >/dev/null
  if "$py" - "$out" "$npy" <<'PY'
import sys, h5py, numpy as np
out, npy = sys.argv[1], sys.argv[2]
want = np.load(npy); y = np.load("y.npy")
with h5py.File(out, "r") as f:
    got = f["images"][...]
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    bad = np.nonzero((got != want).reshape(len(want), -1).any(axis=1))[0]
    assert len(bad) == 0, f"samples differ: {bad[:10]}"
    assert (f["labels"][...] == y).all(), "labels differ"
PY
  then echo "ok   $spec ($path path) -> gpufeed $codec -> h5py identical"
  else echo "FAIL $spec -> $codec"; fail=1; fi
}

check gzip.h5 "" direct x.npy zstd
check shuffle_gzip.h5 "" direct x.npy deflate
check zstd.h5 "" direct x.npy deflate
check raw_chunked.h5 "" direct x.npy zstd
check contiguous.h5 "" direct x.npy none
check auto_chunks.h5 "" "$("$py" -c "
import h5py; c=h5py.File('auto_chunks.h5')['images'].chunks; print('direct' if c[1:]==(3,10,12) else 'hdf5')")" x.npy zstd
check split.h5 "" hdf5 x.npy zstd
check u16_shuffle_gzip.h5 "" direct u16.npy zstd
check nested.h5:/train/pixels /train/targets direct x.npy deflate

# h5dump decodes gpufeed's zstd through the plugin.
"$gpufeed" convert x.npy --labels y.npy -o gf_zstd.h5 --codec zstd --chunk-samples 20 >/dev/null
if h5dump -d /images -s "3,0,0,0" -c "1,1,1,1" gf_zstd.h5 | grep -q "(3,0,0,0): 3"; then
  echo "ok   h5dump reads gpufeed's zstd file through HDF5_PLUGIN_PATH"
else
  echo "FAIL h5dump on gpufeed's zstd file"; fail=1
fi
# What convert writes by default opens in stock HDF5, with no plugin path
# (issue 50: its zstd default printed as an empty DATA {} in h5dump).
"$gpufeed" convert x.npy --labels y.npy -o gf_default.h5 --chunk-samples 20 >/dev/null 2>&1
if env -u HDF5_PLUGIN_PATH h5dump -d /images -s "3,0,0,0" -c "1,1,1,1" gf_default.h5 | grep -q "(3,0,0,0): 3"; then
  echo "ok   h5dump reads gpufeed's default file without a plugin"
else
  echo "FAIL h5dump without a plugin on gpufeed's default file"; fail=1
fi
exit $fail
