"""Fixtures for the gpufeed Python tests: index-valued HDF5 files written by
h5py (sample k's bytes encode k), the built binaries, and a runner for code
that must run in a fresh process (resume, ranks, torch absent)."""
import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# GPUFEED_TEST_INSTALLED=1 tests the gpufeed this interpreter finds on its own
# (the wheel installed in its environment: tests/python/wheel_test.sh), not
# the checkout's python/: no PYTHONPATH for it here or in child processes.
INSTALLED = os.environ.get("GPUFEED_TEST_INSTALLED") == "1"


def python_path(*extra):
    """PYTHONPATH for a child interpreter: the checkout's package (unless
    testing the installed one), `extra`, and what was already set."""
    own = [] if INSTALLED else [str(ROOT / "python")]
    return os.pathsep.join(filter(None, own + [str(e) for e in extra] + [os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="session", autouse=True)
def _the_package_under_test():
    import gpufeed
    where = pathlib.Path(gpufeed.__file__).resolve()
    if INSTALLED and (ROOT / "python") in where.parents:
        pytest.exit("GPUFEED_TEST_INSTALLED=1 but gpufeed comes from the checkout (%s)" % where, returncode=1)
N_SAMPLES = 250      # not a multiple of the batch or chunk size: short last batch and chunk
SAMPLE_SHAPE = (3, 6, 5)
CHUNK = 16


def sample_bytes(k):
    """Sample k: bytes 0..2 are k little-endian, byte j >= 3 is (7k + j) mod 256."""
    n = int(np.prod(SAMPLE_SHAPE))
    a = (7 * k + np.arange(n)) % 256
    a[0], a[1], a[2] = k & 0xFF, (k >> 8) & 0xFF, (k >> 16) & 0xFF
    return a.astype(np.uint8).reshape(SAMPLE_SHAPE)


def index_of(row):
    """The sample index a delivered row encodes (uint8 row, any shape)."""
    flat = np.asarray(row).reshape(-1)
    return int(flat[0]) | int(flat[1]) << 8 | int(flat[2]) << 16


def write_index_file(path, n=N_SAMPLES, compression="gzip"):
    images = np.stack([sample_bytes(k) for k in range(n)])
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=images, chunks=(CHUNK,) + SAMPLE_SHAPE, compression=compression)
        f.create_dataset("labels", data=np.arange(n, dtype=np.int64) % 10)
    return str(path)


@pytest.fixture(scope="session")
def index_file(tmp_path_factory):
    return write_index_file(tmp_path_factory.mktemp("data") / "index.h5")


def _binary(env, name):
    path = os.environ.get(env)
    if path:
        return path
    if INSTALLED and name == "gpufeed" and shutil.which("gpufeed"):
        return shutil.which("gpufeed")  # the wheel's console command
    for build in ("build", "build-cpu"):
        p = ROOT / build / name
        if p.exists():
            return str(p)
    pytest.skip("%s not set and %s not built" % (env, name))


@pytest.fixture(scope="session")
def gpufeed_cli():
    return _binary("GPUFEED_CLI", "gpufeed")


@pytest.fixture(scope="session")
def order_dump():
    return _binary("GPUFEED_ORDER_DUMP", "gpufeed_order_dump")


def run_python(code, env=None, timeout=120):
    """Runs `code` in a new interpreter (this one) with this test's
    environment plus `env`; returns stdout; fails the test on an error."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = python_path()
    full_env.update(env or {})
    p = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, "child failed (%d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
    return p.stdout


@contextlib.contextmanager
def serve(gpufeed_cli, serve_args, sock, timeout=30):
    """Runs `gpufeed serve SERVE_ARGS --listen unix:SOCK` until the block
    ends (SIGTERM, then kill after 30 s); yields its address once it accepts."""
    proc = subprocess.Popen([gpufeed_cli, "serve"] + list(serve_args) + ["--listen", "unix:" + str(sock),
                                                                          "--threads", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError("gpufeed serve exited: " + proc.stderr.read().decode())
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(str(sock))
                break
            except OSError:
                if time.time() > deadline:
                    raise AssertionError("gpufeed serve did not listen on %s" % sock)
                time.sleep(0.05)
            finally:
                s.close()
        yield "unix:" + str(sock)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
