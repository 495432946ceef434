"""A plain HTTP(S) file server for the object-storage tests: serves the files
of a directory with Range requests (206 and Content-Range, an ETag from the
file's size and mtime), over TLS when given a certificate. Run as its own
process (a Python thread in the test's process would hold the GIL while
gpufeed forks its probe):

    python3 tests/testing/range_server.py DIR [--cert CERT.pem --key KEY.pem]

prints its port on the first line of stdout and serves until stdin closes.
`RangeServer(dir, cert=..., key=...)` starts and stops it from a test;
`self_signed(dir)` makes a certificate for 127.0.0.1 with `openssl req`.
"""
import http.server
import os
import pathlib
import re
import socketserver
import ssl
import subprocess
import sys
import threading


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms wait between them
    root = "."

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        path = os.path.join(self.root, self.path.split("?")[0].lstrip("/"))
        if not os.path.isfile(path):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        st = os.stat(path)
        etag = '"%x-%x"' % (st.st_size, st.st_mtime_ns)
        first, last = 0, st.st_size - 1
        m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        if m:
            first = int(m.group(1))
            last = min(int(m.group(2)) if m.group(2) else st.st_size - 1, st.st_size - 1)
            if first > last:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % st.st_size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        if_match = self.headers.get("If-Match")
        if if_match and if_match != etag:
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with open(path, "rb") as f:
            f.seek(first)
            body = f.read(last - first + 1)
        self.send_response(206 if m else 200)
        if m:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (first, last, st.st_size))
        self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 256  # gpufeed opens a connection per request in flight (64): the default 5 drops SYNs


def self_signed(directory):
    """(cert, key) for 127.0.0.1, made by openssl (a CA certificate: it
    signs itself, so a client trusts it when given it as its CA file)."""
    d = pathlib.Path(directory)
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


class ChildServer:
    """A server in a process of its own (its own session: a test's Ctrl-C
    does not reach it) that prints its port on its first line and runs
    until its stdin closes."""

    def _start(self, args, name):
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError("%s did not start: %r" % (name, line))
        return int(line)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class RangeServer(ChildServer):
    def __init__(self, directory, cert=None, key=None):
        args = [sys.executable, __file__, str(directory)]
        if cert:
            args += ["--cert", cert, "--key", key]
        self.port = self._start(args, "range_server")
        self.url = "%s://127.0.0.1:%d" % ("https" if cert else "http", self.port)

def main():
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--cert")
    p.add_argument("--key")
    a = p.parse_args()
    Handler.root = a.dir
    server = Server(("127.0.0.1", 0), Handler)
    if a.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.cert, a.key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()  # until the test closes it (or dies)
    server.shutdown()


if __name__ == "__main__":
    main()
