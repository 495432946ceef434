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
