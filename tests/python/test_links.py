"""Datasets reached through HDF5 external links read their own file's bytes
(their chunk addresses are offsets in the linked file: read at those offsets
in the linking file they were other bytes, or "truncated"), and a path that
names a group says what the group holds."""
import h5py
import numpy as np
import pytest

import gpufeed
from conftest import index_of, sample_bytes

N = 200


def write_linked(tmp_path, chunks):
    target, linking = tmp_path / "target.h5", tmp_path / "linking.h5"
    images = np.stack([sample_bytes(k) for k in range(N)])
    with h5py.File(target, "w") as f:
        f.create_dataset("padding", data=np.zeros(1 << 16, np.uint8))  # the images start far into the file
        g = f.create_group("grp")
        g.create_dataset("d", data=images, chunks=(16,) + images.shape[1:] if chunks else None)
        g.create_dataset("labels", data=np.arange(N) % 10)
    with h5py.File(linking, "w") as f:
        # Larger than the target: a read at the target's offsets in this file
        # would find bytes, just the wrong ones.
        f.create_dataset("filler", data=np.full(1 << 18, 0xAB, np.uint8))
        f["pep"] = h5py.ExternalLink(str(target), "/grp")
        f["direct"] = h5py.ExternalLink(str(target), "/grp/d")
    return str(linking), images


@pytest.mark.parametrize("chunks", [True, False], ids=["chunked", "contiguous"])
@pytest.mark.parametrize("path", ["/pep/d", "/direct"])
def test_a_dataset_behind_an_external_link_reads_its_own_bytes(tmp_path, chunks, path):
    linking, images = write_linked(tmp_path, chunks)
    loader = gpufeed.Loader(linking + ":" + path, batch_size=50, order="sequential", output="numpy",
                            labels="/pep/labels")
    seen = []
    for batch, labels in loader:
        for row in np.asarray(batch):
            k = index_of(row)
            assert np.array_equal(row, images[k]), "sample %d: other bytes than h5py's" % k
            seen.append(k)
    assert sorted(seen) == list(range(N))


def test_a_group_is_named_with_what_it_holds(tmp_path):
    linking, _ = write_linked(tmp_path, True)
    with pytest.raises(gpufeed.InvalidArgumentError) as e:
        gpufeed.Loader(linking + ":/pep")
    message = str(e.value)
    assert "not a dataset: it is a group holding d, labels" in message, message
    assert linking + ":/pep/d" in message, message
