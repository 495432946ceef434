#!/usr/bin/env python3
"""A chunked-array peer in the same run (issue 30): decoded GB/s of gpufeed
reading an HDF5 zstd file (`gpufeed bench read`) against tensorstore reading
the same array as a zarr v3 store with zstd, which this script writes with
tensorstore from the HDF5 file's data: the same chunk shape (so both decode the
same bytes per chunk) and the HDF5 file's zstd level.

Steps: (1) write the zarr v3 store (codecs bytes + zstd, level from the HDF5
filter's parameter); (2) verify it: zarr.json read back from disk, and every
sample read through tensorstore compared with h5py's; (3) time tensorstore
with T threads (data_copy_concurrency and file_io_concurrency limits), reading
the whole array in one read() ("whole") and chunk by chunk in sample order
with a window of reads in flight ("chunks"), warm (page cache) and cold (the
store's files evicted with posix_fadvise DONTNEED before each pass, residency
checked with mincore); (4) `gpufeed bench read` on the HDF5 file with the same
T: warm with --io buffered, cold with --io direct after evicting the file (the
timed passes read with O_DIRECT, so they miss the page cache whatever it
holds); (5) the ceiling: every byte of each reader's own files read with
pread and no decode (warm: T threads; cold: O_DIRECT, the largest T). One
table and, with --out, a JSON of every figure.

A timed read is checked before its figure counts: gpufeed verifies every
sample against HDF5 itself (its JSON's "verified"); a tensorstore whole read
is compared with h5py's per-sample CRC-32s after the clock stops; a chunk read
has its shape and, where the file is index-valued (gpufeed bench gen writes
sample k's index into its first 8 bytes), every sample's index checked.

  python3 bench/peer/tensorstore_zarr.py --data celeba-zstd.h5 --gpufeed build/gpufeed --threads 1,16 --out ts.json
"""
import argparse
import ctypes
import json
import math
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import zlib

ZSTD_FILTER = 32015
PIECE = 8 << 20  # ceiling reads: 8 MiB requests, a multiple of any O_DIRECT alignment


def die(msg):
    print(f"tensorstore_zarr.py: {msg}", file=sys.stderr)
    sys.exit(1)


# ---- page cache: evict, measure residency -------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
PAGE = os.sysconf("SC_PAGE_SIZE")


def evict(paths):
    """Drops the files from the page cache (dirty pages are written first, or DONTNEED keeps them)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(paths):
    """Fraction of the files' pages in the page cache (mincore over a read-only mapping)."""
    have = total = 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr is None or addr == ctypes.c_void_p(-1).value:
                raise OSError(ctypes.get_errno(), f"mmap {p}")
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            try:
                if _libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {p}")
            finally:
                _libc.munmap(addr, size)
            have += sum(b & 1 for b in bytes(vec))
            total += pages
        finally:
            os.close(fd)
    return have / total if total else 1.0


def pread_all(paths, threads, direct):
    """The ceiling: reads every byte of `paths` with `threads` threads in PIECE requests, no decode.
    Returns (seconds, io). O_DIRECT where asked and allowed, else buffered pread."""
    io = "direct" if direct else "buffered"
    fds = []
    try:
        for p in paths:
            try:
                fds.append((os.open(p, os.O_RDONLY | (os.O_DIRECT if direct else 0)), os.path.getsize(p)))
            except OSError:
                if not direct:
                    raise
                io = "buffered (O_DIRECT refused)"
                fds.append((os.open(p, os.O_RDONLY), os.path.getsize(p)))
        jobs = [(fd, off, min(PIECE, size - off)) for fd, size in fds for off in range(0, size, PIECE)]
        bufs = [mmap.mmap(-1, PIECE) for _ in range(threads)]  # page-aligned, as O_DIRECT needs
        for b in bufs:
            b[::PAGE] = b"\1" * (PIECE // PAGE)  # fault the pages in before the clock starts
        start = threading.Barrier(threads + 1)
        errors = []

        def work(i):
            view = memoryview(bufs[i])
            try:
                start.wait()
                for fd, off, n in jobs[i::threads]:
                    want = (n + 4095) // 4096 * 4096  # O_DIRECT lengths are block multiples; EOF shortens the read
                    got = os.preadv(fd, [view[:want]], off)
                    if got < n:
                        raise OSError(f"short read: {got} of {n} bytes at {off}")
            except BaseException as e:  # handed to the caller below
                errors.append(e)
            finally:
                view.release()

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        start.wait()  # the threads exist and their buffers are faulted in: time the reads alone
        t0 = time.perf_counter()
        for w in workers:
            w.join()
        sec = time.perf_counter() - t0
        for b in bufs:
            b.close()
        if errors:
            raise errors[0]
        return sec, io
    finally:
        for fd, _ in fds:
            os.close(fd)


# ---- HDF5 side ----------------------------------------------------------------------------------

def hdf5_facts(h5py, path, dataset):
    """Shape, chunking, zstd level and how the chunks are stored, read with h5py."""
    with h5py.File(path, "r") as f:
        if dataset not in f:
            die(f"{path}: no dataset {dataset} (--dataset)")
        d = f[dataset]
        if d.chunks is None:
            die(f"{path}:{dataset} is not chunked; the peer needs the HDF5 chunk shape")
        dcpl = d.id.get_create_plist()
        filters = [dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]  # (id, flags, params, name)
        zstd = [flt for flt in filters if flt[0] == ZSTD_FILTER]
        if not zstd or len(filters) != 1:
            die(f"{path}:{dataset}: filters {[(flt[0], flt[3]) for flt in filters]}; this peer compares zstd "
                f"with zstd and expects the zstd filter ({ZSTD_FILTER}) alone: write the file with "
                f"`gpufeed bench gen --workload celeba-zstd`")
        params = list(zstd[0][2])
        level = int(params[0]) if params else 3
        stored = unfiltered = 0
        n_chunks = d.id.get_num_chunks()
        for i in range(n_chunks):
            info = d.id.get_chunk_info(i)
            stored += info.size
            unfiltered += bool(info.filter_mask & 1)
        return {"file": os.path.abspath(path), "dataset": dataset, "shape": list(d.shape), "dtype": d.dtype.str,
                "chunk_shape": list(d.chunks), "zstd_level": level, "chunks": n_chunks, "stored_bytes": stored,
                "chunks_stored_unfiltered": unfiltered,
                "file_bytes": os.path.getsize(path)}


def slabs(n, step):
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def index_of(x):
    """Each sample's first 8 bytes as a little-endian uint64 (gpufeed's index-valued samples)."""
    import numpy as np
    b = np.ascontiguousarray(x).reshape(len(x), -1).view(np.uint8)
    return b[:, :8].copy().view("<u8").ravel() if b.shape[1] >= 8 else None


def crc_per_sample(x):
    import numpy as np
    rows = np.ascontiguousarray(x).reshape(len(x), -1).view(np.uint8)
    return [zlib.crc32(r) for r in rows]


# ---- tensorstore side ---------------------------------------------------------------------------

def zarr_spec(store):
    return {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.abspath(store) + "/"}}


def ts_context(ts, threads):
    # cache_pool 0 (its default, stated): no chunk cache, every read decodes again.
    return ts.Context({"data_copy_concurrency": {"limit": threads}, "file_io_concurrency": {"limit": threads},
                       "cache_pool": {"total_bytes_limit": 0}})


def zarr_data_type(np_dtype):
    if np_dtype.kind not in "uif" or np_dtype.byteorder == ">":
        die(f"dtype {np_dtype.str}: only native little-endian integers and floats are handled")
    return np_dtype.name  # uint8, int16, float32, ... are zarr v3's names too


def write_store(ts, h5py, np, facts, store):
    """(1) The zarr v3 store, written by tensorstore from the HDF5 data, chunk by chunk."""
    if os.path.exists(store):
        if not os.path.isfile(os.path.join(store, "zarr.json")):
            die(f"{store} exists and is not a zarr store (no zarr.json): refusing to delete it; pick another --store")
        shutil.rmtree(store)
    dtype = np.dtype(facts["dtype"])
    bytes_codec = {"name": "bytes"} if dtype.itemsize == 1 else {"name": "bytes", "configuration": {"endian": "little"}}
    spec = dict(zarr_spec(store), metadata={
        "shape": facts["shape"],
        "data_type": zarr_data_type(dtype),
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": facts["chunk_shape"]}},
        "chunk_key_encoding": {"name": "default"},
        "codecs": [bytes_codec, {"name": "zstd", "configuration": {"level": facts["zstd_level"], "checksum": False}}],
    })
    t0 = time.perf_counter()
    out = ts.open(spec, create=True, context=ts.Context()).result()  # default context: all cores encode
    inflight = []  # (future, source array): the array stays referenced until its write commits
    with h5py.File(facts["file"], "r") as f:
        d = f[facts["dataset"]]
        for a, b in slabs(facts["shape"][0], facts["chunk_shape"][0]):
            x = d[a:b]
            inflight.append((out[a:b].write(x), x))
            if len(inflight) >= 2 * (os.cpu_count() or 1):
                inflight.pop(0)[0].result()
        for fut, _ in inflight:
            fut.result()
    return spec, time.perf_counter() - t0


def store_files(store):
    out = []
    for root, _, names in os.walk(store):
        out += [os.path.join(root, n) for n in names]
    return sorted(out)


def chunk_files(store):
    """The chunk files: under c/ (the "default" chunk key encoding), lock files left out."""
    return [p for p in store_files(store)
            if os.path.relpath(p, store).startswith("c" + os.sep) and not p.endswith(".__lock")]


def verify_store(ts, h5py, np, facts, store, spec):
    """(2) zarr.json as written on disk, then every sample through tensorstore against h5py.
    Returns the per-sample CRC-32s and whether the samples are index-valued."""
    with open(os.path.join(store, "zarr.json")) as fh:
        meta = json.load(fh)
    want = spec["metadata"]
    codecs = meta.get("codecs", [])
    names = [c["name"] if isinstance(c, dict) else c for c in codecs]
    zcfg = next((c.get("configuration", {}) for c in codecs if isinstance(c, dict) and c["name"] == "zstd"), {})
    problems = []
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        problems.append(f"zarr_format {meta.get('zarr_format')}, node_type {meta.get('node_type')}")
    if meta.get("shape") != want["shape"] or meta.get("data_type") != want["data_type"]:
        problems.append(f"shape {meta.get('shape')} {meta.get('data_type')}")
    if meta.get("chunk_grid", {}).get("configuration", {}).get("chunk_shape") != facts["chunk_shape"]:
        problems.append(f"chunk_grid {meta.get('chunk_grid')}")
    if names != ["bytes", "zstd"] or zcfg.get("level") != facts["zstd_level"]:
        problems.append(f"codecs {codecs}")
    if problems:
        die(f"{store}/zarr.json is not what was asked for: {'; '.join(problems)}")
    expect_chunks = math.prod(-(-s // c) for s, c in zip(facts["shape"], facts["chunk_shape"]))
    if len(chunk_files(store)) != expect_chunks:
        die(f"{store}: {len(chunk_files(store))} chunk files, expected {expect_chunks}")

    z = ts.open(zarr_spec(store), read=True, context=ts_context(ts, os.cpu_count() or 1)).result()
    n = facts["shape"][0]
    crcs, index_valued = [], True
    with h5py.File(facts["file"], "r") as f:
        d = f[facts["dataset"]]
        for a, b in slabs(n, facts["chunk_shape"][0]):
            h = d[a:b]
            got = z[a:b].read().result()
            if got.shape != h.shape or got.dtype != h.dtype or not np.array_equal(got, h):
                bad = [a + k for k in range(b - a) if not np.array_equal(got[k], h[k])] if got.shape == h.shape else []
                die(f"{store}: samples [{a}, {b}) differ from {facts['file']}:{facts['dataset']} "
                    f"(first differing sample {bad[:1]}, shape {got.shape} vs {h.shape}); refusing to time a wrong reader")
            crcs += crc_per_sample(h)
            idx = index_of(h)
            index_valued = index_valued and idx is not None and bool((idx == np.arange(a, b, dtype=np.uint64)).all())
    return meta, crcs, index_valued


def ts_pass(ts, np, store, threads, mode, window, n, step, crcs, index_valued):
    """(3) One timed tensorstore pass over the whole array; checked after (whole) or as it goes (chunks)."""
    z = ts.open(zarr_spec(store), read=True, context=ts_context(ts, threads)).result()  # opening is not timed
    if mode == "whole":
        t0 = time.perf_counter()
        x = z.read().result()
        sec = time.perf_counter() - t0
        if x.shape[0] != n or crc_per_sample(x) != crcs:
            die(f"tensorstore whole read ({threads} threads) returned data that differs from the HDF5 file")
        return sec
    inflight, seen = [], 0

    def check(a, b, x):
        if x.shape[0] != b - a:
            die(f"tensorstore chunk read [{a}, {b}) returned {x.shape[0]} samples")
        if index_valued and not (index_of(x) == np.arange(a, b, dtype=np.uint64)).all():
            die(f"tensorstore chunk read [{a}, {b}) returned other samples than asked for")
        return b - a

    t0 = time.perf_counter()
    for a, b in slabs(n, step):
        inflight.append((a, b, z[a:b].read()))
        if len(inflight) >= window:
            a0, b0, fut = inflight.pop(0)
            seen += check(a0, b0, fut.result())
    for a0, b0, fut in inflight:
        seen += check(a0, b0, fut.result())
    sec = time.perf_counter() - t0
    if seen != n:
        die(f"tensorstore chunk reads delivered {seen} of {n} samples")
    return sec


# ---- gpufeed side -------------------------------------------------------------------------------

def gpufeed_read(gpufeed, spec, threads, io, repeats, n, raw_bytes):
    """(4) `gpufeed --io IO bench read`: decodes every chunk once per pass, T threads, median of the passes;
    verifies every sample against HDF5's H5Dread first. Its timed passes hash each sample (XXH3) too."""
    cmd = [gpufeed, "--io", io, "bench", "read", "--data", spec, "--threads", str(threads), "--repeats", str(repeats),
           "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr.strip()}")
    j = json.loads(p.stdout)
    if not j.get("verified") or j["samples"] != n or j["raw_bytes"] != raw_bytes or j["threads"] != threads:
        die(f"{' '.join(cmd)}: unexpected result {j}")
    j["command"] = " ".join(cmd)
    return j


def gpufeed_io(gpufeed, spec, io):
    """The I/O a dataset opened with --io IO gets (direct may fall back to buffered: tmpfs, some overlays)."""
    p = subprocess.run([gpufeed, "--io", io, "inspect", "--json", spec], capture_output=True, text=True)
    if p.returncode != 0:
        die(f"gpufeed inspect {spec} failed:\n{p.stderr.strip()}")
    j = json.loads(p.stdout)
    return j.get("io", "?"), j.get("io_note", "")


# ---- main ---------------------------------------------------------------------------------------

def parse_list(s):
    try:
        out = [int(v) for v in s.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of integers, got {s!r}")
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"integers >= 1, got {s!r}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="the HDF5 file (gpufeed bench gen --workload celeba-zstd)")
    ap.add_argument("--dataset", default="/images", help="dataset in --data (default /images)")
    ap.add_argument("--gpufeed", default="build/gpufeed", help="gpufeed binary (default build/gpufeed)")
    ap.add_argument("--store", help="zarr v3 store to write (default: --data with .zarr for .h5; deleted first)")
    ap.add_argument("--threads", default="1,16", type=parse_list,
                    help="thread counts, comma-separated (default 1,16)")
    ap.add_argument("--modes", default="whole,chunks",
                    help="tensorstore reads: whole (one read() of the array), chunks (chunk by chunk in sample order)")
    ap.add_argument("--window", type=int, default=0, help="chunks mode: reads in flight (default 2 x threads)")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per figure; the median is reported")
    ap.add_argument("--no-cold", action="store_true", help="warm figures only")
    ap.add_argument("--out", help="write every figure as JSON here")
    a = ap.parse_args()
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or any(m not in ("whole", "chunks") for m in modes):
        ap.error(f"--modes: whole and/or chunks, got {a.modes!r}")
    if a.repeats < 1 or a.window < 0:
        ap.error("--repeats must be >= 1 and --window >= 0")
    if not os.path.isfile(a.data):
        ap.error(f"--data {a.data}: no such file")
    if not (os.path.isfile(a.gpufeed) and os.access(a.gpufeed, os.X_OK)):
        ap.error(f"--gpufeed {a.gpufeed}: not an executable (build it, or use dist/gpufeed/bin/gpufeed)")
    store = a.store or (a.data[:-3] if a.data.endswith(".h5") else a.data) + ".zarr"
    states = ["warm"] if a.no_cold else ["warm", "cold"]

    try:
        import tensorstore as ts
    except ImportError as e:
        die(f"`import tensorstore` failed in {sys.executable} ({e}): this peer needs it "
            f"(pip install tensorstore; it is installed on the GPU host)")
    # h5py reads the zstd filter through gpufeed's plugin where nothing else points HDF5 at one.
    if "HDF5_PLUGIN_PATH" not in os.environ:
        bindir = os.path.dirname(os.path.abspath(a.gpufeed))
        for cand in (os.path.join(bindir, "..", "lib", "hdf5-plugins"), os.path.join(bindir, "hdf5-plugins")):
            if os.path.isdir(cand):
                os.environ["HDF5_PLUGIN_PATH"] = os.path.realpath(cand)
                break
    try:
        import h5py
        import numpy as np
    except ImportError as e:
        die(f"h5py and numpy are needed ({e})")

    facts = hdf5_facts(h5py, a.data, a.dataset)
    n, step = facts["shape"][0], facts["chunk_shape"][0]
    raw_bytes = n * math.prod(facts["shape"][1:]) * np.dtype(facts["dtype"]).itemsize
    version = getattr(ts, "__version__", "?")
    print(f"HDF5 {facts['file']}:{a.dataset}: {facts['shape']} {facts['dtype']}, chunks {facts['chunk_shape']}, "
          f"zstd level {facts['zstd_level']}, {facts['stored_bytes'] / 1e9:.3f} GB stored for "
          f"{raw_bytes / 1e9:.3f} GB decoded ({raw_bytes / facts['stored_bytes']:.3f}x)")
    unfiltered_note = None
    if facts["chunks_stored_unfiltered"]:
        unfiltered_note = (f"{facts['chunks_stored_unfiltered']} of {facts['chunks']} HDF5 chunks are stored without "
                           f"the zstd filter (it did not shrink them, so the writer skipped it: filter_mask bit 0); "
                           f"gpufeed copies those chunks, it does not decompress them")
        print(f"  NOTE: {unfiltered_note}")

    spec, write_s = write_store(ts, h5py, np, facts, store)
    zfiles, zchunks = store_files(store), chunk_files(store)
    zstored = sum(os.path.getsize(p) for p in zchunks)
    print(f"zarr v3 {store}: written by tensorstore {version} in {write_s:.1f} s, {len(zchunks)} chunk files, "
          f"{zstored / 1e9:.3f} GB stored ({raw_bytes / zstored:.3f}x)")
    meta, crcs, index_valued = verify_store(ts, h5py, np, facts, store, spec)
    print(f"verified: all {n} samples read through tensorstore equal h5py's; zarr.json codecs {meta['codecs']}; "
          f"samples {'are' if index_valued else 'are not'} index-valued")

    h5spec = f"{facts['file']}:{a.dataset}"
    rows, notes, checksums = [], [unfiltered_note] if unfiltered_note else [], set()

    def row(reader, threads, state, sec, **extra):
        r = {"reader": reader, "threads": threads, "state": state, "seconds": sec,
             "gb_per_s": raw_bytes / sec / 1e9 if sec else None}
        r.update(extra)
        rows.append(r)
        return r

    def median_of(fn, paths, state):
        """Median seconds of a.repeats passes of fn(); cold passes evict `paths` first and record residency."""
        secs, res = [], []
        for _ in range(a.repeats):
            if state == "cold":
                evict(paths)
                res.append(resident(paths))
            secs.append(fn())
        if res and max(res) > 0.01:
            notes.append(f"eviction left up to {100 * max(res):.1f}% of {paths[0]}... resident before a cold pass")
        return statistics.median(secs), (max(res) if res else None)

    for t in a.threads:
        window = a.window or 2 * t
        for state in states:
            # The ceiling: each reader's own bytes with pread, no decode.
            ct = max(a.threads) if state == "cold" else t
            for label, paths in (("pread .h5", [facts["file"]]), ("pread zarr chunks", zchunks)):
                if state == "warm":
                    pread_all(paths, ct, False)  # fill the page cache
                io = []

                def ceil_pass(paths=paths, io=io):
                    sec, how = pread_all(paths, ct, state == "cold")
                    io.append(how)
                    return sec
                sec, res = median_of(ceil_pass, paths, state)
                row(f"ceiling: {label}" + (f" ({ct} thr)" if ct != t else ""), t, state, sec, io=io[-1],
                    ceiling_threads=ct, resident_before=res)
            # tensorstore, from its own files.
            for mode in modes:
                if state == "warm":
                    pread_all(zfiles, t, False)
                sec, res = median_of(lambda: ts_pass(ts, np, store, t, mode, window, n, step, crcs, index_valued),
                                     zfiles, state)
                row(f"tensorstore {mode}" + (f" (window {window})" if mode == "chunks" else ""), t, state, sec,
                    mode=mode, io="buffered", resident_before=res)
            # gpufeed: bench read verifies first (which warms the page cache); cold passes use O_DIRECT.
            io = "buffered" if state == "warm" else "direct"
            got_io, io_note = gpufeed_io(a.gpufeed, h5spec, io)
            res = None
            if state == "cold":
                evict([facts["file"]])
                res = resident([facts["file"]])
            j = gpufeed_read(a.gpufeed, h5spec, t, io, a.repeats, n, raw_bytes)
            valid = state == "warm" or got_io == "direct"
            if not valid:
                notes.append(f"gpufeed --io direct fell back to {got_io} ({io_note}): its timed passes read the page "
                             f"cache, so no cold gpufeed figure at {t} threads")
            row(f"gpufeed bench read --io {io}", t, state, j["direct_seconds"] if valid else None, io=got_io,
                io_note=io_note, resident_before=res, gpufeed=j)
            checksums.add(j["checksum"])
            if len(checksums) != 1:  # every run hashes the same samples: one value, whatever T and I/O
                die(f"gpufeed bench read checksums differ between runs: {sorted(checksums)}")

    # Ratios: to the reader's own ceiling, and gpufeed / tensorstore at the same threads and state.
    for r in rows:
        key = (r["threads"], r["state"])
        own = "ceiling: pread .h5" if r["reader"].startswith("gpufeed") else "ceiling: pread zarr chunks"
        c = next((x for x in rows if (x["threads"], x["state"]) == key and x["reader"].startswith(own)), None)
        g = next((x for x in rows if (x["threads"], x["state"]) == key and x["reader"].startswith("gpufeed")), None)
        if not r["reader"].startswith("ceiling") and r["gb_per_s"] and c and c["gb_per_s"]:
            r["of_ceiling"] = r["gb_per_s"] / c["gb_per_s"]
        if r["reader"].startswith("tensorstore") and r["gb_per_s"] and g and g["gb_per_s"]:
            r["gpufeed_over_this"] = g["gb_per_s"] / r["gb_per_s"]

    print(f"\ndecoded GB/s ({raw_bytes / 1e9:.3f} GB a pass, median of {a.repeats}); warm: page cache; cold: files "
          f"evicted before each pass (gpufeed: O_DIRECT); ceiling: the reader's files with pread, no decode "
          f"(cold: O_DIRECT, {max(a.threads)} threads)")
    hdr = f"{'reader':<34} {'threads':>7} {'state':>5} {'GB/s':>8} {'GB/s/thr':>8} {'of ceil':>7} {'gpufeed/this':>12}"
    print(hdr)
    print("-" * len(hdr))
    fmt = lambda v, f: (f % v) if v is not None else "-"
    for r in sorted(rows, key=lambda r: (r["threads"], r["state"] != "warm")):
        gb = r["gb_per_s"]
        print(f"{r['reader']:<34} {r['threads']:>7} {r['state']:>5} {fmt(gb, '%8.2f'):>8} "
              f"{fmt(gb / r.get('ceiling_threads', r['threads']) if gb else None, '%8.2f'):>8} {fmt(r.get('of_ceiling'), '%7.2f'):>7} "
              f"{fmt(r.get('gpufeed_over_this'), '%11.2fx'):>12}")
    for m in notes:
        print(f"NOTE: {m}")
    print("tensorstore's T is the limit of each of its two pools (file I/O and decode/copy); gpufeed's T threads "
          "read and decode (cold: with io_uring read-ahead); gpufeed's timed passes also hash every sample")

    if a.out:
        doc = {"what": "gpufeed bench read vs tensorstore zarr3, same array, same run (issue 30)",
               "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "nproc": os.cpu_count(),
               "python": sys.version.split()[0], "tensorstore": version, "h5py": h5py.__version__,
               "numpy": np.__version__, "hdf5": facts, "raw_bytes": raw_bytes,
               "zarr": {"store": os.path.abspath(store), "chunk_files": len(zchunks), "stored_bytes": zstored,
                        "zarr_json": meta, "write_seconds": write_s},
               "verified": {"samples": n, "how": "every sample through tensorstore equal to h5py's",
                            "index_valued": index_valued},
               "threads": a.threads, "modes": modes, "repeats": a.repeats, "rows": rows, "notes": notes}
        with open(a.out, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
