#!/usr/bin/env python3
# The bitshuffle library's own rate (Debian's python3 bitshuffle, its C core),
# LZ4 + bit unshuffle of every chunk of a 32008 dataset, one thread, best of 3.
import sys, time
import h5py, numpy as np, bitshuffle
f = h5py.File(sys.argv[1], 'r'); d = f['images']
chunks = []
for i in range(0, d.shape[0], d.chunks[0]):
    _, data = d.id.read_direct_chunk((i, 0, 0, 0))
    chunks.append(np.frombuffer(data, np.uint8))
elems = int(np.prod(d.chunks))
best = 0
for rep in range(3):
    t0 = time.perf_counter(); total = 0
    for c in chunks:
        size = int.from_bytes(c[:8].tobytes(), 'big'); block = int.from_bytes(c[8:12].tobytes(), 'big')
        out = bitshuffle.decompress_lz4(c[12:], (size,), np.dtype(np.uint8), block)
        total += out.nbytes
    dt = time.perf_counter() - t0
    best = max(best, total / dt)
print("bitshuffle library%s, 1 thread: %.2f GB/s decoded (%d chunks, %.1f MB)" % (
    "", best / 1e9, len(chunks), total / 1e6))
