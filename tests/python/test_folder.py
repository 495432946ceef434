"""An image folder (DIR/<class>/<image>, torchvision's ImageFolder layout)
read as it is by gpufeed.Loader: every image once an epoch in either order,
its label its class folder's index, each image decoded to the size asked
for (image k is a flat colour that encodes k)."""
import numpy as np
import pytest
from PIL import Image

import gpufeed

N = 23


def colour(k):
    return (20 + 9 * k, 200 - 7 * k, (40 + 31 * k) % 220)


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "imgs"
    for k in range(N):
        cls = root / ("c%d" % (k % 3))
        cls.mkdir(parents=True, exist_ok=True)
        ext = "png" if k % 4 == 0 else "jpg"
        Image.new("RGB", (40 + k, 30 + k), colour(k)).save(cls / ("%03d.%s" % (k, ext)), quality=95)
    return root


@pytest.mark.parametrize("order", ["random", "block"])
def test_a_folder_is_read_as_it_is(folder, order):
    loader = gpufeed.Loader(str(folder), batch_size=5, order=order, seed=3, threads=2, device="cpu",
                            output="numpy", image_size=16, transform="center_crop")
    # The folder's files in ImageFolder's order: class by class, names sorted.
    files = sorted(folder.glob("c*/*"), key=lambda p: (p.parent.name, p.name))
    seen = []
    for images, labels in loader:
        assert images.shape[1:] == (3, 16, 16)
        for img, label in zip(images, labels):
            mean = img.reshape(3, -1).mean(axis=1)
            # Which image: the one whose colour this is (they are far apart).
            k = min(range(N), key=lambda j: np.abs(mean - np.array(colour(j))).sum())
            assert np.abs(mean - np.array(colour(k))).max() < 6, (mean, colour(k))
            index = [p.name for p in files].index("%03d.%s" % (k, "png" if k % 4 == 0 else "jpg"))
            assert label == int(files[index].parent.name[1:]), (k, label)
            seen.append(k)
    assert sorted(seen) == list(range(N))


# Issue 48's check at its size: 10,000 JPEGs in 10 class folders (tiny
# ones: 24x8 grey, about 400 bytes each, so the suite stays quick), read
# once an epoch with the labels torchvision's ImageFolder gives. The class
# names sort differently as strings than as numbers ("10" < "8"), and so do
# the file names; image k's three 8x8 blocks are its digits in base 22.
BIG_N = 10000
BIG_CLASSES = 10


def big_levels(k):
    return [10 + 10 * ((k // 22 ** i) % 22) for i in (2, 1, 0)]


@pytest.fixture(scope="module")
def big_folder(tmp_path_factory):
    import io
    root = tmp_path_factory.mktemp("big") / "imgs"
    blobs = {}
    for k in range(BIG_N):
        cls = root / str(8 + k % BIG_CLASSES)
        cls.mkdir(parents=True, exist_ok=True)
        img = Image.new("L", (24, 8))
        for i, level in enumerate(big_levels(k)):
            img.paste(level, (8 * i, 0, 8 * i + 8, 8))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=95)
        (cls / ("%d.jpg" % k)).write_bytes(buf.getvalue())
    return root


def big_image_folder_order(root):
    """(image index, label) in torchvision's ImageFolder order: classes are
    the sorted subfolder names, a class's label its index there; files in a
    class sorted by name."""
    import os
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    return [(int(name[:-4]), label) for label, c in enumerate(classes) for name in sorted(os.listdir(root / c))]


def big_index(img):
    # 7x21 from 8x24 with center_crop is a crop, no resampling: column c is
    # the source's column c + 1 or c + 2; columns 3, 11 and 19 lie inside
    # blocks 0, 1 and 2.
    digits = []
    for col in (3, 11, 19):
        level = float(img[:, :, col].mean())
        d = int(round((level - 10) / 10))
        assert abs(level - (10 + 10 * d)) < 4, (col, level)
        digits.append(d)
    return digits[0] * 22 * 22 + digits[1] * 22 + digits[2]


@pytest.mark.parametrize("order", ["sequential", "random"])
def test_ten_thousand_jpegs_once_an_epoch_with_image_folder_labels(big_folder, order):
    want = big_image_folder_order(big_folder)
    assert len(want) == BIG_N and want[:2] != [(0, 0), (1, 0)]  # the orders are not the trivial ones
    label_of = dict(want)
    loader = gpufeed.Loader(str(big_folder), batch_size=500, order=order, seed=5, threads=2, device="cpu",
                            output="numpy", image_size=(7, 21), transform="center_crop")
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = []
        for images, labels in loader:
            assert images.shape[1:] == (3, 7, 21)
            for img, label in zip(images, labels):
                k = big_index(img)
                assert int(label) == label_of[k], (k, int(label), label_of[k])
                got.append(k)
        assert sorted(got) == list(range(BIG_N)), "epoch %d: not every image once" % epoch
        if order == "sequential":
            assert got == [k for k, _ in want]
