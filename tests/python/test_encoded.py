"""Encoded image datasets from Python: h5py vlen uint8 JPEGs (as h5py users
store them) and gpufeed's bytes+offsets conversion of them decode to the same
batches; image k is a flat color encoding k, so each row names its index."""
import io
import json
import os
import subprocess
import time

import h5py
import numpy as np
import pytest

import gpufeed


def gpu_unavailable(why):
    """A GPU case that cannot run: a skip here, a failure on the GPU host
    (scripts/gpu-host-* set GPUFEED_REQUIRE_GPU=1)."""
    if os.environ.get("GPUFEED_REQUIRE_GPU") == "1":
        pytest.fail("GPUFEED_REQUIRE_GPU=1 (a GPU host), and this GPU case cannot run: " + why)
    pytest.skip(why)

N = 23


def color(k):
    return np.array([30 + (k * 53) % 190, 30 + (k * 97) % 190, 30 + (k * 29) % 190], np.float64)


@pytest.fixture(scope="module")
def vlen_file(tmp_path_factory):
    Image = pytest.importorskip("PIL.Image")
    path = tmp_path_factory.mktemp("enc") / "vlen.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("images", (N,), dtype=h5py.vlen_dtype(np.uint8))
        for k in range(N):
            buf = io.BytesIO()
            h, w = 40 + k, 70 - k
            Image.fromarray(np.tile(color(k).astype(np.uint8), (h, w, 1))).save(buf, "JPEG", quality=95)
            d[k] = np.frombuffer(buf.getvalue(), np.uint8)
        f["labels"] = np.arange(N, dtype=np.int64) % 4
    return str(path)


def batches(path, **kw):
    """(index the row's color names, label, row) for every delivered row, in order."""
    rows = []
    for x, y in gpufeed.Loader(path, batch_size=5, threads=2, seed=3, pin_memory=False, output="numpy", **kw):
        for row, label in zip(x, y):
            means = row.reshape(3, -1).mean(1)
            k = int(np.argmin([np.abs(means - color(j)).sum() for j in range(N)]))
            assert np.abs(means - color(k)).max() < 4
            rows.append((k, int(label), row.copy()))
    return rows


def test_vlen_and_converted_decode_alike(vlen_file, gpufeed_cli, tmp_path):
    converted = str(tmp_path / "conv.h5")
    subprocess.run([gpufeed_cli, "convert", vlen_file, "--keep-encoded", "-o", converted], check=True,
                   capture_output=True)
    a = batches(vlen_file, image_size=(16, 24), transform="random_resized_crop")
    b = batches(converted, image_size=(16, 24), transform="random_resized_crop")
    assert sorted(k for k, _, _ in a) == list(range(N))  # every sample once, each row names its index
    assert all(label == k % 4 for k, label, _ in a)
    assert all(r.shape == (3, 16, 24) and r.dtype == np.uint8 for _, _, r in a)
    assert [k for k, _, _ in a] == [k for k, _, _ in b]
    assert all(np.array_equal(ra, rb) for (_, _, ra), (_, _, rb) in zip(a, b))


def test_bad_transform_names_the_option(vlen_file):
    with pytest.raises(gpufeed.Error) as e:
        gpufeed.Loader(vlen_file, transform="spin", pin_memory=False)
    assert "random_resized_crop" in str(e.value)


@pytest.mark.parametrize("transform", ["center_crop", "random_resized_crop"])
def test_daemon_decodes_as_the_local_loader(vlen_file, gpufeed_cli, tmp_path, transform):
    """An encoded dataset served by `gpufeed serve`: each client's decode
    options (size, transform) give the local Loader's bytes."""
    from conftest import serve
    converted = str(tmp_path / "conv.h5")
    subprocess.run([gpufeed_cli, "convert", vlen_file, "--keep-encoded", "-o", converted], check=True,
                   capture_output=True)
    with serve(gpufeed_cli, ["--data", converted], tmp_path / "d.sock") as address:
        for size in ((16, 24), 20):
            local = batches(converted, image_size=size, transform=transform)
            remote = batches(address, image_size=size, transform=transform)
            assert [k for k, _, _ in remote] == [k for k, _, _ in local]
            assert all(np.array_equal(a, b) for (_, _, a), (_, _, b) in zip(local, remote))


def test_decode_says_where_and_gpu_needs_a_gpu_feed(vlen_file):
    # Without a GPU feed, "auto" decodes in the loader and says why;
    # "gpu" is refused naming what it needs; an unknown value names the choices.
    with gpufeed.Loader(vlen_file, batch_size=5, threads=2, pin_memory=False, output="numpy") as loader:
        assert loader.decode.startswith("cpu (") and "not on a GPU" in loader.decode, loader.decode
    with pytest.raises(gpufeed.Error) as e:
        gpufeed.Loader(vlen_file, batch_size=5, threads=2, decode="gpu", device="cpu", dtype="float32")
    assert 'decode="gpu"' in str(e.value) and "cuda" in str(e.value)
    with pytest.raises(gpufeed.Error) as e:
        gpufeed.Loader(vlen_file, batch_size=5, decode="nvjpeg")
    assert "auto, cpu or gpu" in str(e.value)


def test_train_decode_gpu_needs_a_gpu_and_cpu_training_is_reproducible(vlen_file, gpufeed_cli, tmp_path):
    """`gpufeed train --decode`: cpu (the default) gives the same weights every
    run; gpu on a CPU-only backend is refused naming why and what falls back;
    auto falls back to the loader's threads there."""
    base = [gpufeed_cli, "train", "--data", vlen_file, "--image-size", "16", "--model", "cnn", "--channels", "8",
            "--epochs", "1", "--batch-size", "4", "--device", "cpu", "--order", "sequential"]
    refused = subprocess.run(base + ["--decode", "gpu"], capture_output=True, text=True)
    assert refused.returncode != 0
    assert "--decode gpu" in refused.stderr and "not on a GPU" in refused.stderr, refused.stderr
    hashes = []
    for where in ["cpu", "auto"]:
        out = tmp_path / ("r-%s.json" % where)
        subprocess.run(base + ["--decode", where, "--json", str(out)], check=True, capture_output=True)
        hashes.append(json.load(open(out))["weights_hash"])
    assert hashes[0] == hashes[1]  # auto decoded in the loader here: the same pixels


def test_gpu_decoder_feed_made_at_open_serves_any_first_start(vlen_file):
    """With the GPU's decoder the C API makes epoch 0's feeder at open (its
    fill worker starts the decoder and the first upload while the caller gets
    ready). The first start of epoch 0 takes it; a first start of another
    epoch, or a resume, restarts it. Every epoch is every sample once, and an
    epoch's labels do not depend on which start came first. GPU host only."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        gpu_unavailable("no GPU here: this runs on the GPU host")
    kw = dict(batch_size=5, threads=2, seed=3, device="cuda", dtype="float32", decode="gpu")
    try:
        first = gpufeed.Loader(vlen_file, **kw)
    except gpufeed.UnsupportedError as e:
        gpu_unavailable("no GPU decoder here: %s" % e)

    def epochs(loader, which):
        out = []
        for e in which:
            loader.set_epoch(e)
            out.append([int(v) for _, y in loader for v in y.cpu()])
        return out

    time.sleep(0.3)  # the caller builds its model; the warm feeder fills meanwhile
    warm = epochs(first, [0, 1, 0])
    first.close()
    late = gpufeed.Loader(vlen_file, **kw)
    restarted = epochs(late, [1, 0])
    late.close()
    assert warm[0] == warm[2] == restarted[1]
    assert warm[1] == restarted[0]
    for labels in warm + restarted:
        assert sorted(labels) == sorted(int(v) for v in np.arange(N) % 4)
    # A resume as the first start restarts the warm feeder too: two batches
    # of epoch 1, then the rest from a new loader given the state.
    part = gpufeed.Loader(vlen_file, **kw)
    part.set_epoch(1)
    head = []
    for k, (_, y) in enumerate(part):
        head += [int(v) for v in y.cpu()]
        if k == 1:
            break
    state = part.state_dict()
    part.close()
    resumed = gpufeed.Loader(vlen_file, **kw)
    resumed.load_state_dict(state)
    rest = [int(v) for _, y in resumed for v in y.cpu()]
    resumed.close()
    assert head + rest == warm[1]
