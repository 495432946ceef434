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
