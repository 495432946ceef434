"""share="node": the local ranks of one job on one host read through one
node-local `gpufeed serve`, so a node decodes each chunk once and holds one
decoded-chunk cache instead of one per rank.

How the ranks meet, with nothing to run by hand:
- Every rank of the job on this host derives the same name from the job
  (torchrun's TORCHELASTIC_RUN_ID, GROUP_RANK and restart count, else
  MASTER_ADDR and MASTER_PORT) and from what the server opens (the data, its fields, the
  cache): PREFIX.sock, PREFIX.lease, PREFIX.lock, PREFIX.log in
  $GPUFEED_NODE_DIR, else $XDG_RUNTIME_DIR, else the temporary directory.
- A rank takes PREFIX.lock exclusively (the start-up mutex), then a shared
  flock on PREFIX.lease, which it holds until its Loader closes or the
  process ends; if nothing accepts on PREFIX.sock it starts
  `gpufeed serve --lease-file PREFIX.lease` in a session of its own and waits
  until it accepts; then it lets PREFIX.lock go.
- The server stops once no process holds the lease (ServerOptions::lease_file):
  after the job's last rank, and after a job whose ranks all died. A rank
  that dies drops only its own lock and connection; the others' streams go on.
"""
import fcntl
import hashlib
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

from . import _lib, errors

SHARES = ("auto", "node", "none")

# What a daemon client cannot ask of the server it attaches to: options the
# server would have to open the data with (gpufeed serve has no flag for
# them). With share="auto" such a loader reads locally; share="node" refuses.
_LOCAL_ONLY = ("labels", "io", "max_open_files")

_started = []  # Popen objects of servers this process started (reaped when they exit)


def local_world():
    """(local rank, local world size) from torchrun's environment."""
    def num(name, default):
        text = os.environ.get(name, "")
        try:
            return int(text) if text else default
        except ValueError:
            return default
    return num("LOCAL_RANK", 0), max(1, num("LOCAL_WORLD_SIZE", 1))


def resolve(share, data, local_only):
    """"node" or "none" for `share` ("auto", "node", "none"). local_only:
    {option: value} of the options given that only a local loader takes."""
    if share not in SHARES:
        raise errors.InvalidArgumentError(errors.INVALID_ARGUMENT,
                                          "share=%r: 'auto' (one decode per node under torchrun), 'node' or 'none'"
                                          % (share,))
    remote = str(data).startswith(("unix:", "tcp://"))
    given = [k for k in _LOCAL_ONLY if local_only.get(k) is not None]
    if share == "node":
        if remote:
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT, "share='node': %r is a daemon already; share applies to files" % (data,))
        if given:
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT, "share='node' cannot pass %s to the node's server; use share='none' (a "
                "loader in this process) or leave it out" % ", ".join("%s=" % k for k in given))
        return "node"
    if share == "auto":
        _, local_size = local_world()
        return "node" if local_size > 1 and not remote and not given else "none"
    return "none"


def _job_id():
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run:
        # GROUP_RANK: the node's rank, so two agents of one job on one host
        # (simulated nodes) keep a server each, as real nodes would.
        return "run=%s/node=%s/restart=%s" % (run, os.environ.get("GROUP_RANK", "0"),
                                              os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        return "master=%s:%s" % (addr, port)
    # Ranks started by hand with LOCAL_WORLD_SIZE and nothing else: the
    # processes of one launcher share its process group.
    return "pgid=%d" % os.getpgrp()


def _node_dir():
    for d in (os.environ.get("GPUFEED_NODE_DIR"), os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir()):
        if d and os.path.isdir(d) and os.access(d, os.W_OK):
            return d
    raise errors.IOFailureError(errors.IO_ERROR, "share='node': no writable directory for the node's socket "
                                "(set GPUFEED_NODE_DIR)")


def _cli_path():
    """The gpufeed executable that serves the node: GPUFEED_CLI, else the one
    beside the loaded libgpufeed.so (the bundle's bin/, a build tree, a
    wheel's package folder), else `gpufeed` on PATH."""
    env = os.environ.get("GPUFEED_CLI")
    if env:
        return env
    lib_dir = pathlib.Path(_lib.lib._name).resolve().parent
    for candidate in (lib_dir / "gpufeed", lib_dir.parent / "bin" / "gpufeed", lib_dir / "bin" / "gpufeed"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("gpufeed")
    if found:
        return found
    raise errors.NotFoundError(errors.NOT_FOUND, "share='node' starts `gpufeed serve`, but no gpufeed executable was "
                               "found beside %s or on PATH; set GPUFEED_CLI, or use share='none'" % lib_dir)


def _accepts(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(2.0)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _reap():
    for p in list(_started):
        if p.poll() is not None:
            _started.remove(p)


class NodeServer:
    """This process's hold on the node's server for one dataset: `address`
    and `dataset` are what its RemoteLoader connects with; close() (or the
    process's end) lets the server go once no other rank holds it."""

    def __init__(self, data, fields, no_sample_axis, trust_files, threads, cache_bytes, prefetch,
                 start_timeout_s=180.0):
        _reap()
        spec = str(data)
        if not any(c in spec for c in "*?[") and os.path.exists(spec.split(":", 1)[0]):
            path, _, inner = spec.partition(":")
            spec = os.path.abspath(path) + (":" + inner if inner else "")
        _, local_size = local_world()
        node_threads = int(threads) * local_size if threads else 0  # 0: the server takes every core
        key = repr((_job_id(), spec, list(fields), bool(no_sample_axis), bool(trust_files), node_threads,
                    int(cache_bytes), int(prefetch)))
        prefix = os.path.join(_node_dir(), "gpufeed-%d-%s" % (os.getuid(), hashlib.sha256(key.encode()).hexdigest()[:20]))
        self.dataset = spec
        self.socket_path = prefix + ".sock"
        self.address = "unix:" + self.socket_path
        self.log_path = prefix + ".log"
        self.started_here = False
        self._lease = None
        lock = open(prefix + ".lock", "a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            lease = open(prefix + ".lease", "a")
            try:
                # Waits while a server that found no holder is stopping (it
                # holds the lease exclusively until it exits).
                fcntl.flock(lease, fcntl.LOCK_SH)
                if not _accepts(self.socket_path):
                    self._start(prefix, spec, fields, no_sample_axis, trust_files, node_threads, cache_bytes,
                                prefetch, local_size, start_timeout_s)
                    self.started_here = True
            except BaseException:
                lease.close()
                raise
            self._lease = lease
        finally:
            lock.close()  # releases the start-up mutex

    def _start(self, prefix, spec, fields, no_sample_axis, trust_files, node_threads, cache_bytes, prefetch,
               local_size, timeout_s):
        cli = _cli_path()
        try:
            physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (OSError, ValueError):
            physical = 0
        # Room for every local rank's stream (its cache, batches and chunk
        # buffers), within 80% of the host's memory when that is known.
        budget = max(8 << 30, 2 * local_size * int(cache_bytes) + (4 << 30))
        if physical:
            budget = min(budget, int(physical * 0.8))
        cmd = [cli, "serve", "--data", spec]
        for f in fields:
            cmd += ["--field", f]
        if no_sample_axis:
            cmd.append("--no-sample-axis")
        cmd += ["--listen", self.address, "--lease-file", prefix + ".lease", "--cache-bytes", str(int(cache_bytes)),
                "--prefetch", str(int(prefetch)), "--memory-bytes", str(budget), "--log-level", "warn"]
        if node_threads:
            cmd += ["--threads", str(node_threads)]
        if trust_files:
            cmd.append("--trust-files")
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)  # a server that died without cleaning up
        with open(self.log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                    start_new_session=True, close_fds=True)
        _started.append(proc)
        deadline = time.monotonic() + timeout_s
        while not _accepts(self.socket_path):
            if proc.poll() is not None:
                raise errors.Error(errors.INTERNAL, "share='node': the node's server (%s) exited with %d: %s" % (
                    " ".join(cmd), proc.returncode, self._log_tail()))
            if time.monotonic() > deadline:
                proc.kill()
                raise errors.Error(errors.TIMEOUT, "share='node': the node's server did not listen on %s within %d s: %s"
                                   % (self.socket_path, timeout_s, self._log_tail()))
            time.sleep(0.02)

    def _log_tail(self):
        try:
            with open(self.log_path) as f:
                return f.read()[-2000:].strip() or "(nothing in %s)" % self.log_path
        except OSError:
            return "(no log at %s)" % self.log_path

    def close(self):
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.close()  # drops this process's shared lock
        _reap()
