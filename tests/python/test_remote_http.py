"""Objects over plain HTTP and HTTPS (issue 48): a local server
(tests/testing/range_server.py: Python's http.server with Range, over TLS
with a certificate `openssl req` makes for 127.0.0.1 here) serves an
index-valued file; gpufeed reads it through http:// and https:// as the
local file, trusting the server's CA when the user names it the way AWS,
curl and OpenSSL users do (AWS_CA_BUNDLE, CURL_CA_BUNDLE, SSL_CERT_FILE),
and refusing it, with an error that says which variable to set, when not."""
import shutil
import sys
import time

import numpy as np
import pytest

import gpufeed
from conftest import ROOT, index_of, write_index_file

sys.path.insert(0, str(ROOT / "tests" / "testing"))
import range_server  # noqa: E402

CA_VARS = ("AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (it makes the test's certificate)")
    root = tmp_path_factory.mktemp("http")
    write_index_file(root / "train.h5", n=300)
    cert, key = range_server.self_signed(tmp_path_factory.mktemp("tls"))
    with range_server.RangeServer(root) as plain, range_server.RangeServer(root, cert, key) as tls:
        yield dict(local=str(root / "train.h5"), http=plain.url, https=tls.url, cert=cert)


@pytest.fixture(autouse=True)
def no_ca_of_the_user(monkeypatch):
    for name in CA_VARS:
        monkeypatch.delenv(name, raising=False)


def batches(data):
    kw = dict(batch_size=64, order="random", seed=4, output="numpy", share="none", threads=2)
    return [(np.asarray(x).copy(), np.asarray(y).copy()) for x, y in gpufeed.Loader(data, **kw)]


def assert_same(got, want):
    assert len(got) == len(want) > 0
    for (gx, gy), (wx, wy) in zip(got, want):
        assert np.array_equal(gx, wx) and np.array_equal(gy, wy)
    assert sorted(index_of(r) for x, _ in got for r in x) == list(range(300))


def test_plain_http_reads_as_the_local_file(served):
    assert_same(batches(served["http"] + "/train.h5"), batches(served["local"]))


@pytest.mark.parametrize("variable", ["AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"])
def test_https_with_the_ca_named_reads_as_the_local_file(served, monkeypatch, variable):
    monkeypatch.setenv(variable, served["cert"])
    assert_same(batches(served["https"] + "/train.h5"), batches(served["local"]))


def test_an_untrusted_certificate_is_refused_naming_what_to_set(served):
    with pytest.raises(gpufeed.Error) as e:
        gpufeed.Loader(served["https"] + "/train.h5", batch_size=64, output="numpy", share="none")
    message = str(e.value)
    assert served["https"] + "/train.h5" in message, message
    assert "not signed by a CA in the system's CA store" in message and "AWS_CA_BUNDLE" in message, message


def test_a_ca_bundle_that_cannot_be_read_is_named(served, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_CA_BUNDLE", str(tmp_path / "absent.pem"))
    with pytest.raises(gpufeed.Error) as e:
        gpufeed.Loader(served["https"] + "/train.h5", batch_size=64, output="numpy", share="none")
    assert "AWS_CA_BUNDLE" in str(e.value) and "absent.pem" in str(e.value), str(e.value)


def write_one_sample_chunks(path, n):
    """n samples of 8 bytes, a chunk each (n chunks); sample k's first
    three bytes are k."""
    import h5py
    k = np.arange(n)
    images = np.zeros((n, 8), np.uint8)
    images[:, 0], images[:, 1], images[:, 2] = k & 0xFF, (k >> 8) & 0xFF, k >> 16
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=images, chunks=(1, 8))


def open_seconds(url, repeats=2):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        loader = gpufeed.Loader(url, batch_size=500, order="sequential", output="numpy", share="none")
        best = min(best, time.perf_counter() - t0)
    return best, loader


def test_a_many_chunk_objects_index_is_read_in_one_pass(tmp_path):
    # The chunk index walked once through the remote driver's reads
    # (hdf5io/hdf5/chunk_btree.h), not asked of HDF5 chunk by chunk (which
    # walks the index for each: 20,000 chunks took 7-9 s to open that way
    # here, against 0.2 s walked). Linear: ten times the chunks may take
    # about ten times as long; quadratic would be a hundred.
    small, big = tmp_path / "small.h5", tmp_path / "big.h5"
    write_one_sample_chunks(small, 2000)
    write_one_sample_chunks(big, 20000)
    with range_server.RangeServer(tmp_path) as server:
        t_small, _ = open_seconds(server.url + "/small.h5")
        t_big, loader = open_seconds(server.url + "/big.h5")
        print("open: 2,000 chunks %.3f s, 20,000 chunks %.3f s" % (t_small, t_big))
        assert t_big < max(30 * t_small, 1.5), (t_small, t_big)
        rows = []
        for images, _ in loader:
            rows += [index_of(r) for r in images]
            if len(rows) >= 1000:
                break
        # Closed while the server is up: a loader closed after its server
        # died reads its batches in flight to the end, each chunk through
        # its retries (minutes here).
        del loader
    assert rows == list(range(1000))
