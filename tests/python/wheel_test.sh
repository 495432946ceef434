#!/usr/bin/env bash
# The wheel as a user gets it: scripts/wheel from this build, `pip install`
# into a clean virtual environment (Debian's torch, h5py and numpy through
# --system-site-packages), and then, with no PYTHONPATH, GPUFEED_LIBRARY,
# GPUFEED_CLI or HDF5_PLUGIN_PATH set: `import gpufeed`, the `gpufeed`
# command, h5py opening a file `gpufeed convert` wrote with its default codec
# (zstd), and the whole Python test suite against the installed package.
# Usage: wheel_test.sh BUILD_DIR WORK_DIR   (GPUFEED_ORDER_DUMP set by CTest)
set -euo pipefail
build="$1" work="$2"
root="$(cd "$(dirname "$0")/../.." && pwd)"
rm -rf "$work"
mkdir -p "$work"
BUILD_DIR="$build" "$root/scripts/wheel" --out "$work" --bundle-from "$build"
whl=$(ls "$work"/gpufeed-*.whl)
case "$(basename "$whl")" in gpufeed-*-py3-none-manylinux_2_*_x86_64.whl) ;; *) echo "bad name: $whl"; exit 1 ;; esac
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install -q --no-index "$whl"
clean=(env -u PYTHONPATH -u GPUFEED_LIBRARY -u GPUFEED_CLI -u HDF5_PLUGIN_PATH -u LD_LIBRARY_PATH
       PATH="$work/venv/bin:/usr/bin:/bin")
cd "$work"  # not the checkout: nothing of python/ on the path
"${clean[@]}" gpufeed --version
# zstd (not the default, deflate): the plugin the wheel installs is what lets h5py read it.
"${clean[@]}" gpufeed convert /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz \
  --labels /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz -o "$work/fm.h5" --codec zstd >/dev/null 2>&1
"${clean[@]}" python - "$work/fm.h5" <<'PY'
import os, sys
import h5py, numpy as np
import gpufeed
assert "site-packages" in gpufeed.__file__, gpufeed.__file__
with h5py.File(sys.argv[1], "r") as f:
    d = f["images"]
    assert 32015 in [d.id.get_create_plist().get_filter(i)[0] for i in range(d.id.get_create_plist().get_nfilters())]
    first = d[:100]
batch = next(iter(gpufeed.Loader(sys.argv[1], batch_size=100, order="sequential", output="numpy")))
got = batch[0] if isinstance(batch, (tuple, list)) else batch
assert np.array_equal(np.asarray(got).reshape(first.shape), first), "gpufeed and h5py read other bytes"
print("wheel: h5py reads gpufeed's zstd file, and the Loader delivers the same bytes")
PY
"${clean[@]}" GPUFEED_TEST_INSTALLED=1 GPUFEED_ORDER_DUMP="${GPUFEED_ORDER_DUMP:-}" \
  python -m pytest -q -p no:cacheprovider "$root/tests/python"
