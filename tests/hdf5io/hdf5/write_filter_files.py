"""Writes one HDF5 file per plugin filter with h5py, for plugin_filters_test.

Usage: write_filter_files.py DIR. Run by Debian's /usr/bin/python3 (h5py,
hdf5plugin, bitshuffle). Every /images is index-valued: element j of sample k
of file dtype T is index_value(k, j) (below; the C++ test computes the same),
and h5py's own read of each file is checked against that array here, so a
gpufeed read equal to it is byte-identical to h5py's. For each file also
NAME_header.h5 (chunk 1's first 16 stored bytes set to 0xFF) and NAME_mid.h5
(chunk 1's middle bytes XORed), chunk1_masks.txt (NAME MASK: chunk 1's
filter mask, 1 where the filter was skipped), and unavailable.h5 with a filter no one has.
"""
import os
import sys

import h5py
import hdf5plugin
import numpy as np

import bitshuffle.h5 as bsh

N, SHAPE, CHUNK = 250, (3, 7), 15  # 17 chunks, the last of 10 samples; 315 elements a chunk


def index_value(dtype, noisy):
    k = np.arange(N, dtype=np.uint64)[:, None]
    j = np.arange(SHAPE[0] * SHAPE[1], dtype=np.uint64)[None, :]
    if noisy:  # incompressible but still a function of (k, j)
        v = ((k * np.uint64(2654435761) + j * np.uint64(40503)) >> np.uint64(7)) & np.uint64(0xFFFF)
    else:
        v = k * np.uint64(SHAPE[0] * SHAPE[1]) + j
    return (v % np.uint64(256 if np.dtype(dtype).itemsize == 1 else 65536)).astype(dtype).reshape((N,) + SHAPE)


def cases():
    b = hdf5plugin.Blosc
    return [
        # name, dtype, noisy, create_dataset kwargs
        ("lzf_i64", "i8", False, dict(compression="lzf")),
        ("lzf_noisy_u8", "u1", True, dict(compression="lzf")),
        ("blosc_lz4_shuffle_u16", "u2", False, dict(**b(cname="lz4", clevel=5, shuffle=b.SHUFFLE))),
        ("blosc_zstd_bitshuffle_f32", "f4", False, dict(**b(cname="zstd", clevel=3, shuffle=b.BITSHUFFLE))),
        ("blosc_noisy_u8", "u1", True, dict(**b(cname="blosclz", clevel=9, shuffle=b.NOSHUFFLE))),
        ("lz4_u16", "u2", False, dict(**hdf5plugin.LZ4(nbytes=0))),
        ("lz4_blocks_i64", "i8", False, dict(**hdf5plugin.LZ4(nbytes=200))),
        ("lz4_noisy_u16", "u2", True, dict(**hdf5plugin.LZ4(nbytes=64))),
        ("bshuf_lz4_u16", "u2", False, dict(compression=bsh.H5FILTER, compression_opts=(0, bsh.H5_COMPRESS_LZ4))),
        ("bshuf_lz4_blocks_f64", "f8", False, dict(compression=bsh.H5FILTER, compression_opts=(16, bsh.H5_COMPRESS_LZ4))),
        ("bshuf_lz4_noisy_u8", "u1", True, dict(compression=bsh.H5FILTER, compression_opts=(0, bsh.H5_COMPRESS_LZ4))),
        ("bshuf_none_i32", "i4", False, dict(compression=bsh.H5FILTER, compression_opts=(24, 0))),
    ]


def damage(src, dst, how):
    with h5py.File(src, "r") as f:
        info = f["images"].id.get_chunk_info(1)
    with open(src, "rb") as f:
        data = bytearray(f.read())
    off, size = info.byte_offset, info.size
    if how == "header":
        data[off:off + min(16, size)] = b"\xff" * min(16, size)
    else:
        for i in range(off + size // 3, off + 2 * size // 3):
            data[i] ^= 0x5A
    with open(dst, "wb") as f:
        f.write(data)


def main(out):
    masks = open(os.path.join(out, "chunk1_masks.txt"), "w")
    for name, dtype, noisy, kw in cases():
        x = index_value(dtype, noisy)
        path = os.path.join(out, name + ".h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("images", data=x, chunks=(CHUNK,) + SHAPE, **kw)
        with h5py.File(path, "r") as f:
            got = f["images"][...]
            assert got.dtype == x.dtype and (got == x).all(), name
            assert f["images"]._filters, name  # the filter was really applied
        with h5py.File(path, "r") as f:  # 1: the filter was skipped (incompressible chunk)
            masks.write(f"{name} {f['images'].id.get_chunk_info(1).filter_mask}\n")
        damage(path, os.path.join(out, name + "_header.h5"), "header")
        damage(path, os.path.join(out, name + "_mid.h5"), "mid")
    # A filter neither gpufeed nor any installed plugin decodes (optional, so
    # HDF5 lets it be declared; chunks written directly, as if filtered).
    with h5py.File(os.path.join(out, "unavailable.h5"), "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((CHUNK,) + SHAPE)
        dcpl.set_filter(32099, h5py.h5z.FLAG_OPTIONAL, ())
        space = h5py.h5s.create_simple((N,) + SHAPE)
        d = h5py.h5d.create(f.id, b"images", h5py.h5t.STD_U16LE, space, dcpl=dcpl)
        x = index_value("u2", False)
        for c in range((N + CHUNK - 1) // CHUNK):
            block = np.zeros((CHUNK,) + SHAPE, "u2")
            part = x[c * CHUNK:(c + 1) * CHUNK]
            block[:len(part)] = part
            d.write_direct_chunk((c * CHUNK, 0, 0), block.tobytes(), 0)


if __name__ == "__main__":
    main(sys.argv[1])
