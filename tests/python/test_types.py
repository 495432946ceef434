"""HDF5 enum and bit-field datasets read as their integer base type, as h5py
reads them (they were refused: PyTables' bool is H5T_STD_B8LE); an enum's
names are in `gpufeed inspect`; h5py's own bool stays a bool."""
import json
import subprocess

import h5py
import numpy as np
import pytest

import gpufeed

N = 120


def read_all(spec):
    out = []
    for batch in gpufeed.Loader(spec, batch_size=32, order="sequential", output="numpy", labels="none"):
        out.append(np.array(batch[0] if isinstance(batch, (tuple, list)) else batch))
    return np.concatenate(out)


@pytest.mark.parametrize("base", ["i1", "u2", "i4", "<i8"])
def test_an_enum_reads_as_its_base_integers(tmp_path, base):
    path = tmp_path / "enum.h5"
    values = (np.arange(N * 6) % 3).reshape(N, 6).astype(base)
    with h5py.File(path, "w") as f:
        f.create_dataset("colors", data=values, chunks=(16, 6),
                         dtype=h5py.enum_dtype({"RED": 0, "GREEN": 1, "BLUE": 2}, basetype=base))
        expect = f["colors"][...]
    got = read_all("%s:/colors" % path)
    assert got.dtype == np.dtype(base).newbyteorder("=") and np.array_equal(got, expect)


def test_a_bitfield_reads_as_its_unsigned_integers(tmp_path):
    path = tmp_path / "bits.h5"
    values = (np.arange(N * 4) * 37 % 256).astype(np.uint8).reshape(N, 4)
    with h5py.File(path, "w") as f:
        space = h5py.h5s.create_simple(values.shape)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((16, 4))
        dset = h5py.h5d.create(f.id, b"flags", h5py.h5t.STD_B8LE, space, dcpl=dcpl)
        dset.write(h5py.h5s.ALL, h5py.h5s.ALL, values, mtype=h5py.h5t.NATIVE_B8)
    got = read_all("%s:/flags" % path)
    assert got.dtype == np.uint8 and np.array_equal(got, values)


def test_inspect_names_the_enum_and_h5py_bool_stays_bool(tmp_path, gpufeed_cli):
    path = tmp_path / "enum.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("colors", data=np.zeros((N, 2), np.int16),
                         dtype=h5py.enum_dtype({"RED": 0, "GREEN": 1, "BLUE": -2}, basetype="i2"))
        f.create_dataset("mask", data=np.arange(N * 2).reshape(N, 2) % 2 == 0)
    out = subprocess.run([gpufeed_cli, "inspect", "%s:/colors" % path, "--json"], check=True, capture_output=True,
                         text=True).stdout
    info = json.loads(out)
    assert info["dtype"] == "int16" and sorted(info["enum"]) == ["BLUE=-2", "GREEN=1", "RED=0"], info
    text = subprocess.run([gpufeed_cli, "inspect", "%s:/colors" % path], check=True, capture_output=True,
                          text=True).stdout
    assert "enum         " + ", ".join(info["enum"]) + " (read as the integers)" in text, text
    mask = subprocess.run([gpufeed_cli, "inspect", "%s:/mask" % path, "--json"], check=True, capture_output=True,
                          text=True).stdout
    assert sorted(json.loads(mask)["enum"]) == ["FALSE=0", "TRUE=1"]
