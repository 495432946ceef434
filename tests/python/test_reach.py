"""A file reaches only its own directory: a dataset whose raw data is an
external file elsewhere (h5py's external=, an absolute path) or a virtual
dataset whose source is elsewhere is refused by gpufeed.Loader, naming the
path and allow_paths; with allow_paths naming the directory it reads exactly
the external bytes, as does `gpufeed inspect` given --allow-paths."""
import subprocess

import h5py
import numpy as np
import pytest

import gpufeed

N, W = 12, 4


def raw(salt):
    return ((np.arange(N * W) // W) * 10 + np.arange(N * W) % W + salt).astype(np.uint8).reshape(N, W)


@pytest.fixture
def dirs(tmp_path):
    data, outside = tmp_path / "data", tmp_path / "outside"
    data.mkdir()
    outside.mkdir()
    (outside / "secret.bin").write_bytes(raw(1).tobytes())
    return data, outside


def external_file(data, outside):
    path = data / "ext.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("images", shape=(N, W), dtype=np.uint8,
                         external=[(str(outside / "secret.bin"), 0, N * W)])
    return str(path)


def read_all(loader):
    """Every sample, in order (the loader's order is sequential)."""
    return np.concatenate([np.asarray(images) for images, _ in loader])


def test_an_external_file_outside_is_refused_and_allowed_when_named(dirs):
    data, outside = dirs
    path = external_file(data, outside)
    with pytest.raises(gpufeed.InvalidArgumentError) as e:
        gpufeed.Loader(path, batch_size=4, output="numpy", share="none")
    message = str(e.value)
    assert str((outside / "secret.bin").resolve()) in message, message
    assert "allow_paths" in message, message
    for allowed in (str(outside), [outside]):
        loader = gpufeed.Loader(path, batch_size=4, order="sequential", output="numpy", share="none",
                                allow_paths=allowed, labels="none")
        assert np.array_equal(read_all(loader), raw(1))


def test_a_virtual_source_outside_is_refused(dirs):
    data, outside = dirs
    with h5py.File(outside / "src.h5", "w") as f:
        f.create_dataset("data", data=raw(2))
    layout = h5py.VirtualLayout(shape=(N, W), dtype=np.uint8)
    layout[:] = h5py.VirtualSource(str(outside / "src.h5"), "data", shape=(N, W))
    with h5py.File(data / "vds.h5", "w") as f:
        f.create_virtual_dataset("images", layout)
    with pytest.raises(gpufeed.InvalidArgumentError, match="allow_paths"):
        gpufeed.Loader(str(data / "vds.h5"), batch_size=4, output="numpy", share="none")


def test_allow_paths_takes_directories_only(dirs):
    data, outside = dirs
    with pytest.raises(gpufeed.InvalidArgumentError, match=r"^allow_paths="):
        gpufeed.Loader(external_file(data, outside), allow_paths=["/a:/b"])
    with pytest.raises(gpufeed.InvalidArgumentError, match=r"^allow_paths="):
        gpufeed.Loader(external_file(data, outside), allow_paths=[3])


def test_inspect_refuses_it_and_allow_paths_lets_it_through(dirs, gpufeed_cli):
    data, outside = dirs
    path, out = external_file(data, outside), data / "sample.npy"
    p = subprocess.run([gpufeed_cli, "inspect", path, "--sample", "1", "--out", str(out)], capture_output=True,
                       text=True)
    assert p.returncode != 0 and "--allow-paths" in p.stderr, p.stdout + p.stderr
    assert not out.exists()
    for flags in (["--allow-paths", str(outside), "inspect"], ["inspect", "--allow-paths", str(outside)]):
        p = subprocess.run([gpufeed_cli] + flags + [path, "--sample", "1", "--out", str(out)], capture_output=True,
                           text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        assert np.array_equal(np.load(out), raw(1)[1])
