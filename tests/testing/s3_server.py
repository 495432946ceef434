"""A real S3-compatible server for the object-storage tests: s3rver (a Node
process, installed by scripts/setup) on 127.0.0.1, optionally behind a proxy
that adds a fixed latency to every request. Objects are uploaded with curl's
SigV4 signing, as any S3 client would.

    with S3Server(tmp_path, delay_ms=20) as s3:
        s3.make_bucket("data")
        s3.put("data", "train.h5", local_path)
        env = s3.env()     # AWS_* for gpufeed: endpoint, keys, region

s3rver checks the access key id (S3RVER) but not a SigV4 signature's value.
Also a command: python3 tests/testing/s3_server.py [--delay-ms N] prints the
endpoint and serves until stdin closes (the benchmark's server).
"""
import asyncio
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

KEY = "S3RVER"
SECRET = "S3RVER"
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def s3rver_path():
    """The s3rver launcher scripts/setup installs, or None where it is absent."""
    env = os.environ.get("GPUFEED_S3RVER")
    if env:
        return env if os.access(env, os.X_OK) else None
    tools = os.environ.get("GPUFEED_TOOLS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gpufeed-tools")
    path = os.path.join(tools, "s3rver", "node_modules", ".bin", "s3rver")
    return path if os.access(path, os.X_OK) and shutil.which("node") and shutil.which("curl") else None


def node_major():
    """The major version of the node that runs s3rver (0 when unknown)."""
    try:
        out = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30).stdout
        return int(out.strip().lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0


def die_with_parent():
    """preexec_fn: the child is killed when the test process ends, however
    it ends (a timeout's SIGKILL skips every teardown)."""
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("s3rver exited with status %s before listening" % proc.returncode)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nothing listens on 127.0.0.1:%d after %d s" % (port, timeout))


class DelayProxy:
    """TCP proxy on 127.0.0.1 that holds each piece of a client's request
    for `delay_ms` before passing it on (in order, pipelined: a request's
    latency grows by the delay once, whatever else is in flight), and
    passes responses straight back. Counts connections and the most
    requests in flight at once (pieces held or unanswered)."""

    def __init__(self, upstream_port, delay_ms, port=None):
        self.upstream_port = upstream_port
        self.delay = delay_ms / 1000.0
        self.port = port or free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()

    async def _client(self, reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        queue = asyncio.Queue()

        async def from_client():
            while True:
                data = await reader.read(65536)
                await queue.put((self.loop.time() + self.delay, data))
                if not data:
                    return

        async def to_upstream():
            while True:
                due, data = await queue.get()
                wait = due - self.loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    up_writer.write_eof() if up_writer.can_write_eof() else None
                    return
                up_writer.write(data)
                await up_writer.drain()

        async def to_client():
            while True:
                data = await up_reader.read(262144)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
            writer.close()

        tasks = [asyncio.ensure_future(t) for t in (from_client(), to_upstream(), to_client())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            await tasks[2]
        except (ConnectionError, OSError):
            pass
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for w in (writer, up_writer):
                try:
                    w.close()
                except Exception:
                    pass

    def close(self):
        async def shutdown():
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            if not self.thread.is_alive():
                self.loop.close()


class S3Server:
    def __init__(self, root=None, delay_ms=0, proxy=None):
        """root: the store's directory (a temporary one if None); delay_ms:
        latency added to every request (a proxy in front, started also when
        `proxy` is True with no delay, so that runs with and without latency
        go through the same path)."""
        exe = s3rver_path()
        if exe is None:
            raise FileNotFoundError("s3rver is not installed (scripts/setup installs it)")
        self._tmp = None
        if root is None:
            self._tmp = tempfile.mkdtemp(prefix="gpufeed-s3-")
            root = self._tmp
        self.root = pathlib.Path(root) / "s3rver-data"
        self.root.mkdir(parents=True, exist_ok=True)
        self.server_port = free_port()
        # s3rver makes ListObjectsV2's continuation tokens with DES, which
        # Node 17+ (OpenSSL 3) has only in its legacy provider: without it a
        # truncated listing's page is HTTP 500.
        node_env = dict(os.environ)
        if node_major() >= 17:  # older Node (OpenSSL 1.1) has DES and refuses the flag
            node_env["NODE_OPTIONS"] = (node_env.get("NODE_OPTIONS", "") + " --openssl-legacy-provider").strip()
        self.proc = subprocess.Popen(
            [exe, "-d", str(self.root), "-a", "127.0.0.1", "-p", str(self.server_port), "--silent"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent, env=node_env)
        try:
            wait_for_port(self.server_port, self.proc)
        except Exception:
            self.stop()
            raise
        # The proxy runs in a process of its own: a Python thread in the
        # caller's process would hold the GIL at the moments gpufeed forks
        # its probe, and h5py's hooks in HDF5 take the GIL in the child.
        self.proxy = None
        self.port = self.server_port
        if delay_ms or proxy:
            self.port = free_port()
            self.proxy = subprocess.Popen(
                [sys.executable, __file__, "--proxy", str(self.server_port), str(self.port), str(delay_ms)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
            try:
                wait_for_port(self.port, self.proxy)
            except Exception:
                self.stop()
                raise
        self.endpoint = "http://127.0.0.1:%d" % self.port

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def env(self, key=KEY, secret=SECRET):
        """The environment gpufeed reads: this endpoint, the keys, a region,
        and no profile or credentials file of the user's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret,
                   AWS_REGION="us-east-1", AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_CONFIG_FILE=os.devnull)
        return env

    def _curl(self, *args):
        # Straight to the server (not through the proxy): uploads are setup.
        base = ["curl", "-sS", "-f", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", KEY + ":" + SECRET]
        out = subprocess.run(base + list(args), capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError("curl %s: %s" % (" ".join(args), out.stderr.strip()))
        return out.stdout

    def make_bucket(self, bucket):
        self._curl("-X", "PUT", "-H", "x-amz-content-sha256: " + EMPTY_SHA256,
                   "http://127.0.0.1:%d/%s" % (self.server_port, bucket))

    def put(self, bucket, key, path):
        self._curl("-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-T", str(path),
                   "http://127.0.0.1:%d/%s/%s" % (self.server_port, bucket, key))

    def kill(self):
        """The server dies at once (SIGKILL): connections reset, nothing listens."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self):
        if getattr(self, "proxy", None):
            self.proxy.kill()
            self.proxy.wait(10)
            self.proxy.stdin.close()
            self.proxy = None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--proxy":  # S3Server's proxy process: until stdin closes
        proxy = DelayProxy(int(sys.argv[2]), float(sys.argv[4]), port=int(sys.argv[3]))
        sys.stdin.read()
        proxy.close()
        return
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--delay-ms", type=float, default=0)
    p.add_argument("--bucket", default="data")
    p.add_argument("--put", nargs=2, action="append", default=[], metavar=("KEY", "FILE"))
    a = p.parse_args()
    with S3Server(delay_ms=a.delay_ms, proxy=True) as s3:
        s3.make_bucket(a.bucket)
        for key, path in a.put:
            s3.put(a.bucket, key, path)
        print(s3.endpoint, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
