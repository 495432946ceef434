"""What a new user meets (issue 50): a second live iteration is refused,
not allowed to end the first; a state of another seed, order or dataset is
refused at load_state_dict; a dtype the feed cannot take is refused when the
Loader is made, worded for its device; the Loader as a torch IterableDataset
for DataLoader(..., batch_size=None). Checks are exact: sample k's bytes
encode k."""
import h5py
import numpy as np
import pytest
import torch
import torch.utils.data

import gpufeed
from conftest import N_SAMPLES, index_of

OPTS = dict(batch_size=32, order="block", seed=5, threads=2, prefetch=3, shuffle_window=3)


def indices(batches):
    return [[index_of(row) for row in images.numpy()] for images, _ in batches]


# -- one iteration at a time ---------------------------------------------------
def test_zip_of_one_loader_raises_instead_of_ending_the_first(index_file):
    loader = gpufeed.Loader(index_file, **OPTS)
    with pytest.raises(RuntimeError, match="one at a time.*second gpufeed.Loader"):
        for _ in zip(loader, loader):
            pass
    # The refused one did not stop the first: a whole epoch still comes.
    assert sum(1 for _ in loader) == len(loader)


def test_a_second_iter_while_the_first_runs_raises(index_file):
    loader = gpufeed.Loader(index_file, **OPTS)
    first = iter(loader)
    next(first)
    second = loader.batches()
    with pytest.raises(RuntimeError, match="second iteration"):
        next(second)
    # The first goes on to its epoch's end...
    assert 1 + sum(1 for _ in first) == len(loader)
    # ...after which (and after a loop left by break, or close()) another starts.
    for _ in loader:
        break
    it = iter(loader)
    next(it)
    it.close()
    assert sum(1 for _ in loader) == len(loader)


def test_two_loaders_iterate_independently(index_file):
    a, b = gpufeed.Loader(index_file, **OPTS), gpufeed.Loader(index_file, **OPTS)
    pairs = [(index_of(x[0].numpy()), index_of(y[0].numpy())) for (x, _), (y, _) in zip(a, b)]
    assert len(pairs) == len(a) and all(i == j for i, j in pairs)


# -- states of another run refused at load_state_dict -----------------------------
def saved_state(path, **opts):
    loader = gpufeed.Loader(path, **dict(OPTS, **opts))
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    it.close()
    loader.close()
    return state


@pytest.mark.parametrize("change, words", [
    (dict(seed=8), r"seed 5, this loader has seed 8 \(seed=\)"),
    (dict(order="sequential"), r"order 'block', this loader has order 'sequential' \(order=\)"),
    (dict(shuffle_window=4), r"shuffle window 3, this loader has 4 \(shuffle_window=\)"),
])
def test_load_state_dict_refuses_another_run_at_once(index_file, change, words):
    state = saved_state(index_file)
    other = gpufeed.Loader(index_file, **dict(OPTS, **change))
    with pytest.raises(gpufeed.InvalidArgumentError, match=words):
        other.load_state_dict(state)
    # Refused, the loader is as it was: its own epoch 0 from the start.
    assert sum(1 for _ in other) == len(other)


def test_load_state_dict_refuses_another_dataset(index_file, tmp_path):
    from conftest import write_index_file
    state = saved_state(index_file)
    smaller = gpufeed.Loader(write_index_file(tmp_path / "smaller.h5", n=N_SAMPLES - 50), **OPTS)
    with pytest.raises(gpufeed.InvalidArgumentError, match="dataset of %d samples, this loader's has %d" % (N_SAMPLES, N_SAMPLES - 50)):
        smaller.load_state_dict(state)


def test_load_state_dict_of_the_same_run_is_taken(index_file):
    state = saved_state(index_file)
    loader = gpufeed.Loader(index_file, **OPTS)
    loader.load_state_dict(state)
    assert sum(1 for _ in loader) == len(loader) - 1


# -- dtype and device checked when the Loader is made --------------------------------
@pytest.fixture(scope="module")
def uint32_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("u32") / "u32.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=np.arange(64 * 3 * 4 * 4, dtype=np.uint32).reshape(64, 3, 4, 4),
                         chunks=(16, 3, 4, 4))
    return str(path)


def test_a_dtype_the_cpu_feed_cannot_take_is_refused_at_construction(uint32_file):
    with pytest.raises(gpufeed.UnsupportedError) as e:
        gpufeed.Loader(uint32_file, batch_size=16, threads=1, device="cpu", dtype=torch.float32, output="numpy")
    message = str(e.value)
    assert "GPU" not in message and "on the CPU" in message and "uint32" in message, message
    assert "dtype=" in message, message  # in the caller's terms: what to leave out
    # Without dtype the stored samples come as they are.
    images, _ = next(iter(gpufeed.Loader(uint32_file, batch_size=16, threads=1, output="numpy")))
    assert images.dtype == np.uint32


# -- a torch IterableDataset ---------------------------------------------------------
def test_a_loader_as_a_dataset_for_torch_dataloader(index_file):
    loader = gpufeed.Loader(index_file, **OPTS)
    dataset = loader.as_dataset()
    assert isinstance(dataset, torch.utils.data.IterableDataset)
    dl = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0)
    assert len(dl) == len(loader)
    want = indices(gpufeed.Loader(index_file, **OPTS))
    for epoch in range(2):
        dataset.set_epoch(epoch)
        got = indices(dl)
        if epoch == 0:
            assert got == want
        assert sorted(k for b in got for k in b) == list(range(N_SAMPLES))
    assert got != want  # epoch 1's order, set through the dataset
    # Its state is the loader's.
    assert dataset.state_dict()["epoch"] == 1


def test_the_loader_itself_in_a_dataloader_names_as_dataset(index_file):
    loader = gpufeed.Loader(index_file, **OPTS)
    with pytest.raises(TypeError, match=r"as_dataset\(\)"):
        next(iter(torch.utils.data.DataLoader(loader, batch_size=None)))


def test_dataloader_workers_are_refused_naming_threads(index_file):
    dataset = gpufeed.Loader(index_file, **OPTS).as_dataset()
    dl = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(Exception, match="num_workers=0"):
        next(iter(dl))


# -- convert's default opens in any HDF5 reader ----------------------------------------
READ_CHILD = r"""
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    print(int(f["images"][3].reshape(-1)[0]), int(f["images"][3].reshape(-1)[1]))
"""


def test_convert_by_default_writes_what_stock_hdf5_reads(index_file, gpufeed_cli, tmp_path):
    import os
    import subprocess
    import sys
    # No plugin path: h5py as a colleague's stock install has it.
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    out = tmp_path / "default.h5"
    p = subprocess.run([gpufeed_cli, "convert", index_file, "-o", str(out)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "plugin" not in p.stderr, p.stderr
    got = subprocess.run([sys.executable, "-c", READ_CHILD, str(out)], capture_output=True, text=True, env=env,
                         timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["3", "0"], got.stdout  # sample 3's bytes: 3, then 3 >> 8
    with h5py.File(out, "r") as f:
        filters = f["images"].id.get_create_plist()
        ids = [filters.get_filter(i)[0] for i in range(filters.get_nfilters())]
    assert ids == [h5py.h5z.FILTER_DEFLATE], ids  # uint8: no shuffle, which would change nothing
    # zstd stays one flag away, and convert says what a reader then needs.
    p = subprocess.run([gpufeed_cli, "convert", index_file, "-o", str(tmp_path / "z.h5"), "--codec", "zstd"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "HDF5_PLUGIN_PATH" in p.stderr and "32015" in p.stderr, p.stderr
