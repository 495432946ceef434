#!/usr/bin/env bash
# The wheel as a user gets it: scripts/wheel from this build, `pip install`
# into a clean virtual environment (Debian's torch, h5py and numpy through
# --system-site-packages), and then, with no PYTHONPATH, GPUFEED_LIBRARY,
# GPUFEED_CLI or HDF5_PLUGIN_PATH set: `import gpufeed`, the `gpufeed`
# command, h5py opening a file `gpufeed convert` wrote with its default codec
# (zstd), and a smoke subset of the Python tests against the installed package
# (the whole suite runs against the same build in CTest's python_api).
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
# The smoke subset: one test of each thing the wheel carries or finds on its own:
# the bundled library and its HDF5 reading the index file (and the C++ order),
# a child interpreter finding the installed package (resume), DLPack, the wheel's
# `gpufeed` command as a daemon (batches, fields, JPEG decode) and as the node's
# server (share="node"), its convert read by stock h5py, an image folder (the
# bundled image libraries), and the option table the library carries. A test
# renamed or removed fails here ("not found"): update the list with it.
t=$root/tests/python
smoke=(
  "$t/test_loader.py::test_every_sample_once_with_h5py_bytes"
  "$t/test_loader.py::test_same_batches_as_cpp_loader"
  "$t/test_loader.py::test_state_dict_resumes_in_new_process"
  "$t/test_loader.py::test_dlpack_arrays_for_any_consumer"
  "$t/test_loader.py::test_daemon_client_equals_local_loader"
  "$t/test_fields.py::test_fields_through_the_daemon_equal_local"
  "$t/test_encoded.py::test_daemon_decodes_as_the_local_loader"
  "$t/test_ddp.py::test_node_share_every_sample_once_one_server"
  "$t/test_new_user.py::test_convert_by_default_writes_what_stock_hdf5_reads"
  "$t/test_folder.py::test_a_folder_is_read_as_it_is"
  "$t/test_args.py::test_options_go_through_the_libraries_option_table"
)
"${clean[@]}" GPUFEED_TEST_INSTALLED=1 GPUFEED_ORDER_DUMP="${GPUFEED_ORDER_DUMP:-}" \
  python -m pytest -q -p no:cacheprovider "${smoke[@]}"
