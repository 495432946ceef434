"""Named fields and many-file datasets through gpufeed.Loader, against h5py:
every sample once, every field byte-identical and aligned (row k of every
field is the same sample), as a tuple or a dict, and clear errors."""
import subprocess

import h5py
import numpy as np
import pytest
import torch

import gpufeed

N_FILES = 9


def field_values(k):
    """Sample k's fields: data [2, 4, 3] float32, mask [4, 3] int32, flag
    [2] bool, each encoding k."""
    data = (k * 100 + np.arange(24, dtype=np.float32)).reshape(2, 4, 3)
    mask = (k * 10 + np.arange(12, dtype=np.int32)).reshape(4, 3) % 7 + k * 1000
    flag = np.array([k % 2 == 0, k % 3 == 0])
    return data, mask, flag


@pytest.fixture(scope="module")
def per_file_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("deepcam_like")
    for k in range(N_FILES):
        data, mask, flag = field_values(k)
        with h5py.File(d / ("s_%03d.h5" % k), "w") as f:
            f.create_dataset("climate/data", data=data[None])
            f.create_dataset("climate/labels_0", data=mask[None], compression="gzip")
            f.create_dataset("flag", data=flag[None])
    return d


@pytest.fixture(scope="module")
def many_per_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("cosmo_like")
    k = 0
    for i, n in enumerate([8, 8, 5]):
        xs = np.stack([field_values(j)[0] for j in range(k, k + n)]).astype(np.int16)
        ys = np.arange(k, k + n, dtype=np.float32)[:, None] * np.ones(4, np.float32)
        with h5py.File(d / ("u_%d.h5" % i), "w") as f:
            f.create_dataset("x", data=xs, chunks=(4,) + xs.shape[1:], compression="gzip")
            f.create_dataset("y", data=ys)
        k += n
    return d, k


SPEC = ["data=/climate/data", "mask=/climate/labels_0", "flag=/flag"]


@pytest.mark.parametrize("order", ["block", "random", "sequential"])
def test_fields_as_tuple_equal_h5py(per_file_dir, order):
    loader = gpufeed.Loader(str(per_file_dir / "*.h5"), fields=SPEC, batch_size=4, order=order, seed=3, threads=2,
                            prefetch=2)
    seen = np.zeros(N_FILES, dtype=int)
    for data, mask, flag in loader:
        assert data.dtype == torch.float32 and tuple(data.shape[1:]) == (2, 4, 3)
        assert mask.dtype == torch.int32 and flag.dtype == torch.uint8
        for row in range(data.shape[0]):
            k = int(data[row].numpy().reshape(-1)[0]) // 100
            seen[k] += 1
            want_data, want_mask, want_flag = field_values(k)
            with h5py.File(per_file_dir / ("s_%03d.h5" % k), "r") as f:
                assert np.array_equal(f["climate/data"][0], want_data)
            assert np.array_equal(data[row].numpy(), want_data)
            assert np.array_equal(mask[row].numpy(), want_mask), "mask not aligned with data at row %d" % row
            assert np.array_equal(flag[row].numpy().astype(bool), want_flag)
    assert (seen == 1).all(), seen


def test_fields_as_dict_and_directory_and_list(per_file_dir, tmp_path):
    listing = tmp_path / "files.txt"
    listing.write_text("".join("%s\n" % p for p in sorted(per_file_dir.glob("*.h5"))))
    for data in (str(per_file_dir), str(listing)):
        loader = gpufeed.Loader(data, fields={"data": "/climate/data", "mask": "/climate/labels_0"}, batch_size=3,
                                order="sequential", output="numpy")
        got = []
        for b in loader:
            assert set(b) == {"data", "mask"}
            got.extend(int(r.reshape(-1)[0]) // 100 for r in b["data"])
            for r, m in zip(b["data"], b["mask"]):
                assert np.array_equal(m, field_values(int(r.reshape(-1)[0]) // 100)[1])
        assert got == list(range(N_FILES))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_many_samples_per_file_sharded_disjoint_and_complete(many_per_file, world):
    d, n = many_per_file
    seen = np.zeros(n, dtype=int)
    for rank in range(world):
        loader = gpufeed.Loader(str(d / "*.h5"), fields=["x=/x", "y=/y"], batch_size=2, order="block", seed=1,
                                rank=rank, world_size=world, drop_last=True, max_open_files=1)
        for x, y in loader:
            for row in range(x.shape[0]):
                k = int(y[row, 0])
                seen[k] += 1
                assert np.array_equal(x[row].numpy(), field_values(k)[0].astype(np.int16))
    per_rank = (n // world) // 2 * 2
    assert (seen <= 1).all() and seen.sum() == per_rank * world


def write_reference_layout(d):
    """DeepCAM's reference layout in `d`: r_K.h5 holds sample K, its
    /climate/data [H, W, C] and /climate/labels_0 [H, W] without a sample axis."""
    for k in range(N_FILES):
        data, mask, _ = field_values(k)
        with h5py.File(d / ("r_%03d.h5" % k), "w") as f:
            f.create_dataset("climate/data", data=data.transpose(1, 2, 0), chunks=(2, 3, 1), compression="gzip")
            f.create_dataset("climate/labels_0", data=mask)


def test_files_without_a_sample_axis_as_deepcam_stores_them(tmp_path):
    """DeepCAM's reference files: /climate/data [H, W, C] and
    /climate/labels_0 [H, W], one sample per file and no sample axis."""
    write_reference_layout(tmp_path)
    loader = gpufeed.Loader(str(tmp_path / "r_*.h5"), fields=["data=/climate/data", "mask=/climate/labels_0"],
                            no_sample_axis=True, batch_size=4, order="random", seed=5, output="numpy")
    seen = np.zeros(N_FILES, dtype=int)
    for data, mask in loader:
        assert data.shape[1:] == (4, 3, 2) and mask.shape[1:] == (4, 3)
        for row in range(data.shape[0]):
            k = int(data[row, 0, 0, 0]) // 100
            seen[k] += 1
            want_data, want_mask, _ = field_values(k)
            with h5py.File(tmp_path / ("r_%03d.h5" % k), "r") as f:
                assert np.array_equal(data[row], f["climate/data"][()])
            assert np.array_equal(data[row], want_data.transpose(1, 2, 0))
            assert np.array_equal(mask[row], want_mask)
    assert (seen == 1).all(), seen


def test_files_without_a_sample_axis_through_the_daemon(per_file_dir, gpufeed_cli, tmp_path):
    """`gpufeed serve --data REF --field ... --no-sample-axis`: the flag
    belongs to the --data before it (the other dataset keeps its sample
    axis); a client gets each reference file as one sample, the batches of a
    local Loader with no_sample_axis=True. Before any --data it is refused."""
    from conftest import serve
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    write_reference_layout(ref_dir)
    ref, per_file = str(ref_dir / "r_*.h5"), str(per_file_dir / "*.h5")
    ref_spec = ["data=/climate/data", "mask=/climate/labels_0"]
    args = ["--data", per_file] + sum((["--field", s] for s in SPEC), []) + \
           ["--data", ref] + sum((["--field", s] for s in ref_spec), []) + ["--no-sample-axis"]
    opts = dict(batch_size=4, order="random", seed=5, threads=2, prefetch=2, output="numpy")
    with serve(gpufeed_cli, args, tmp_path / "d.sock") as address:
        local = [tuple(a.copy() for a in b) for b in gpufeed.Loader(ref, fields=ref_spec, no_sample_axis=True, **opts)]
        remote = [tuple(a.copy() for a in b) for b in gpufeed.Loader(address, dataset=ref, fields=ref_spec, **opts)]
        assert len(remote) == len(local) > 1
        seen = np.zeros(N_FILES, dtype=int)
        for want, (data, mask) in zip(local, remote):
            assert data.shape[1:] == (4, 3, 2) and mask.shape[1:] == (4, 3)
            assert np.array_equal(data, want[0]) and np.array_equal(mask, want[1])
            for row in range(data.shape[0]):
                k = int(data[row, 0, 0, 0]) // 100
                seen[k] += 1
                assert np.array_equal(data[row], field_values(k)[0].transpose(1, 2, 0))
        assert (seen == 1).all(), seen
        first = next(iter(gpufeed.Loader(address, dataset=per_file, fields=SPEC, **opts)))
        assert first[0].shape == (4, 2, 4, 3)  # the first --data keeps its sample axis
    p = subprocess.run([gpufeed_cli, "serve", "--no-sample-axis", "--data", ref, "--listen",
                        "unix:" + str(tmp_path / "e.sock")], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "--no-sample-axis comes before any --data" in p.stderr, p.stderr


def test_feed_gives_a_class_field_as_the_labels(tmp_path):
    """An image field and one integer a sample (a class): the feed's CPU twin
    normalizes the image and delivers the class, named as its field, through
    the same echo gather."""
    n = 10
    x = np.stack([np.full((3, 4, 4), k, np.uint8) for k in range(n)])
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("x", data=x)
        f.create_dataset("cls", data=(np.arange(n) * 5 + 1).astype(np.int16))
    loader = gpufeed.Loader(str(tmp_path / "c.h5"), fields={"img": "/x", "cls": "/cls"}, batch_size=4,
                            dtype=torch.float32, mean=[0, 0, 0], std=[1, 1, 1], echo=2, order="random", seed=2)
    rows = 0
    for b in loader:
        img, cls = b["img"], b["cls"]
        assert img.dtype == torch.float32 and cls.dtype == torch.int64 and cls.shape == (img.shape[0],)
        for row in range(img.shape[0]):
            k = int(img[row, 0, 0, 0])
            assert int(cls[row]) == k * 5 + 1, (k, int(cls[row]))
            rows += 1
    assert rows == 2 * n


def test_feed_takes_a_volume_and_passes_its_targets_through(tmp_path):
    """CosmoFlow's sample through the feed (CPU twins here, the GPU on a GPU
    host): an int16 volume [C, D, H, W] normalized per channel, its float32
    targets and an id pair passed through as stored, a bool flag (one integer
    a sample) as the class, each row the same sample through the echo gather,
    in the order the fields are named."""
    n, shape = 13, (2, 3, 4, 5)
    vol = lambda k: (k * 300 + np.arange(np.prod(shape)).reshape(shape)).astype(np.int16)
    with h5py.File(tmp_path / "cosmo.h5", "w") as f:
        f.create_dataset("x", data=np.stack([vol(k) for k in range(n)]), chunks=(4,) + shape, compression="gzip")
        f.create_dataset("y", data=np.stack([[k, k / 2, -k, 1 / (k + 1)] for k in range(n)]).astype(np.float32))
        f.create_dataset("id", data=np.arange(n, dtype=np.int32)[:, None] * np.ones((1, 2), np.int32) + 1000)
        f.create_dataset("flag", data=np.arange(n) % 3 == 0)
    mean, std = [5.0, -7.0], [2.0, 4.0]
    loader = gpufeed.Loader(str(tmp_path / "cosmo.h5"), fields=["x=/x", "y=/y", "id=/id", "flag=/flag"],
                            batch_size=4, device="cpu", dtype=torch.float32, mean=mean, std=std, echo=2,
                            order="random", seed=3)
    rows, fresh = 0, []
    for x, y, ids, flag in loader:
        assert x.dtype == torch.float32 and tuple(x.shape[1:]) == shape
        assert y.dtype == torch.float32 and tuple(y.shape[1:]) == (4,)
        assert ids.dtype == torch.int32 and tuple(ids.shape[1:]) == (2,)
        assert flag.dtype == torch.int64 and tuple(flag.shape[1:]) == ()  # one integer a sample: the class
        for row in range(x.shape[0]):
            k = int(y[row, 0])
            assert y[row].tolist() == np.array([k, k / 2, -k, 1 / (k + 1)], np.float32).tolist()
            assert ids[row].tolist() == [1000 + k] * 2
            assert int(flag[row]) == int(k % 3 == 0)
            want = (vol(k).astype(np.float32) - np.array(mean, np.float32)[:, None, None, None]) \
                * (1 / np.array(std))[:, None, None, None].astype(np.float32)
            assert np.array_equal(x[row].numpy(), want), k
            rows += 1
            fresh.append(k)
    assert rows == 2 * n and sorted(set(fresh)) == list(range(n))


def test_mismatched_lengths_name_both(tmp_path):
    with h5py.File(tmp_path / "bad.h5", "w") as f:
        f.create_dataset("a", data=np.zeros((5, 2), np.float32))
        f.create_dataset("b", data=np.zeros((4,), np.int64))
    with pytest.raises(gpufeed.InvalidArgumentError, match=r"'b' \(/b\) has 4.*'a' \(/a\) has 5"):
        gpufeed.Loader(str(tmp_path / "bad.h5"), fields=["a=/a", "b=/b"])


def test_bad_field_spec_is_an_error():
    with pytest.raises(gpufeed.InvalidArgumentError, match="NAME=/hdf5/path"):
        gpufeed.Loader("x.h5", fields=["nopath"])


def test_feed_gives_a_mask_field_the_images_crop_and_flip(tmp_path):
    """An image field and an integer mask of its pixels through the feed (the
    CPU twins here, the GPU on a GPU host): the mask gets the same crop and
    flip, so it equals the image's pixel codes wherever they land."""
    n, h, w = 10, 5, 6
    for k in range(n):
        code = (k * 10000 + np.arange(h)[:, None] * 100 + np.arange(w)[None, :] + 1).astype(np.int32)
        with h5py.File(tmp_path / ("p_%02d.h5" % k), "w") as f:
            f.create_dataset("img", data=code[None, None].astype(np.float32))
            f.create_dataset("seg", data=code[None])
    loader = gpufeed.Loader(str(tmp_path / "*.h5"), fields=["img=/img", "seg=/seg"], batch_size=4, device="cpu",
                            dtype=torch.float32, crop_padding=2, flip=True, mean=[0], std=[1], seed=4)
    seen, moved = set(), 0
    for img, seg in loader:
        assert img.dtype == torch.float32 and tuple(img.shape[1:]) == (1, h, w)
        assert seg.dtype == torch.int64 and tuple(seg.shape[1:]) == (h, w)
        assert torch.equal(img[:, 0].to(torch.int64), seg), "mask not aligned with its image"
        for row in seg:
            nz = row[row != 0]
            seen.add(int(nz[0]) // 10000)
            moved += int((row != (row.flatten()[row.flatten() != 0][0] // 10000) * 10000
                          + torch.arange(h)[:, None] * 100 + torch.arange(w)[None, :] + 1).sum())
    assert seen == set(range(n))
    assert moved > 0, "no sample was cropped or flipped: the test checks nothing"


@pytest.mark.parametrize("shared_memory", [True, False])
def test_fields_through_the_daemon_equal_local(per_file_dir, many_per_file, gpufeed_cli, tmp_path, shared_memory):
    """`gpufeed serve --data GLOB --field ...` (each --field after its --data):
    a daemon client gets the same tuple / dict of fields as the local Loader."""
    from conftest import serve
    cosmo_dir, _ = many_per_file
    per_file, cosmo = str(per_file_dir / "*.h5"), str(cosmo_dir / "*.h5")
    cosmo_spec = ["x=/x", "y=/y"]
    args = ["--data", per_file] + sum((["--field", s] for s in SPEC), []) + \
           ["--data", cosmo] + sum((["--field", s] for s in cosmo_spec), [])
    opts = dict(batch_size=4, order="random", seed=3, threads=2, prefetch=2, output="numpy")
    with serve(gpufeed_cli, args, tmp_path / "d.sock") as address:
        for data, spec in ((per_file, SPEC), (cosmo, cosmo_spec)):
            local = [tuple(a.copy() for a in b) for b in gpufeed.Loader(data, fields=spec, **opts)]
            remote = [tuple(a.copy() for a in b)
                      for b in gpufeed.Loader(address, dataset=data, fields=spec, shared_memory=shared_memory, **opts)]
            assert len(remote) == len(local) > 1
            for want, got in zip(local, remote):
                assert len(got) == len(spec)
                for w, g in zip(want, got):
                    assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w)
        as_dict = dict(zip(("data", "mask", "flag"), ("/climate/data", "/climate/labels_0", "/flag")))
        first = next(iter(gpufeed.Loader(address, dataset=per_file, fields=as_dict, **opts)))
        assert sorted(first) == ["data", "flag", "mask"] and first["data"].shape == (4, 2, 4, 3)
        with pytest.raises(gpufeed.Error, match="serves fields"):
            gpufeed.Loader(address, dataset=per_file, fields=["mask=/climate/labels_0"], **opts)
