"""Objects over plain HTTP and HTTPS (issue 48): a local server
(tests/testing/range_server.py: Python's http.server with Range, over TLS
with a certificate `openssl req` makes for 127.0.0.1 here) serves an
index-valued file; gpufeed reads it through http:// and https:// as the
local file, trusting the server's CA when the user names it the way AWS,
curl and OpenSSL users do (AWS_CA_BUNDLE, CURL_CA_BUNDLE, SSL_CERT_FILE),
and refusing it, with an error that says which variable to set, when not."""
import shutil
import sys

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
