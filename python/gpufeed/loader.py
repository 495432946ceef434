"""gpufeed.Loader: the C API's loader as a Python iterable of tensors.

Contracts (docs/python.md has them in full):
- Lifetimes: each tensor views gpufeed's buffer (zero-copy); the buffer's
  pool slot returns when every tensor of its batch is freed. Holding more
  batches than the pool has slots raises gpufeed.InvalidArgumentError naming
  `prefetch` (or `slots` on the feed) instead of waiting forever.
- Streams: on device="cuda" each batch is made ready on torch's current
  stream when it is yielded (an event wait queued on that stream, no host
  synchronization), and its slot is reused only after the work queued on
  that stream by the time its last tensor is freed. Host batches (torch
  output) once torch has initialized CUDA: likewise, so that
  x.cuda(non_blocking=True) on the current stream may outlive x; copies on
  another stream must finish (or keep x) before x is freed.
- One iteration at a time: a second one started while one runs (zip(loader,
  loader)) raises RuntimeError; make a second Loader for another pass.
- Threads: iterate a Loader from one thread. The blocking wait runs in the
  library with the GIL released, in slices of `poll_ms`, so Ctrl-C raises
  KeyboardInterrupt within that time and other threads keep running.
"""
import ctypes
import json
import os
import sys

from . import _args, _dlpack, _lib, errors, options
from ._lib import lib

_STATE_FORMAT = "gpufeed.Loader/1"

_DTYPE_NAMES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}


def _dtype_name(dtype):
    if dtype is None:
        return None
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    if name not in _DTYPE_NAMES:
        raise errors.InvalidArgumentError(
            errors.INVALID_ARGUMENT, "dtype %r: the feed makes float32, float16 or bfloat16" % (dtype,))
    return _DTYPE_NAMES[name]


def _parse_device(device):
    """("cpu", None) or ("cuda", index); "cuda" alone takes LOCAL_RANK."""
    text = str(device) if device is not None else "cpu"
    if text == "cpu":
        return "cpu", None
    if text == "cuda":
        return "cuda", int(os.environ.get("LOCAL_RANK", "0"))
    if text.startswith("cuda:"):
        return "cuda", int(text[len("cuda:"):])
    raise errors.InvalidArgumentError(errors.INVALID_ARGUMENT, "device %r: 'cpu', 'cuda' or 'cuda:N'" % (device,))


def _distributed_defaults():
    """(rank, world_size) from torch.distributed when it is initialized, else
    from torchrun's RANK / WORLD_SIZE, else (0, 1). torch is not imported
    for this: a program that uses torch.distributed has imported it."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _pick_output(output):
    if output not in ("auto", "torch", "numpy", "dlpack"):
        raise errors.InvalidArgumentError(errors.INVALID_ARGUMENT,
                                          "output %r: 'auto', 'torch', 'numpy' or 'dlpack'" % (output,))
    if output in ("auto", "torch"):
        try:
            import torch  # noqa: F401
            import torch.utils.dlpack  # noqa: F401
            return "torch"
        except ImportError:
            if output == "torch":
                raise
    if output in ("auto", "numpy"):
        try:
            import numpy  # noqa: F401
            return "numpy"
        except ImportError:
            if output == "numpy":
                raise
    return "dlpack"


def _parse_fields(fields):
    """(names, "NAME=/path" specs, as_dict) from fields=None, a list of
    "NAME=/path" strings or (name, path) pairs, or a dict {name: path}."""
    if fields is None:
        return [], [], False
    as_dict = isinstance(fields, dict)
    items = list(fields.items()) if as_dict else list(fields)
    names, specs = [], []
    for item in items:
        if isinstance(item, str):
            if "=" not in item:
                raise errors.InvalidArgumentError(
                    errors.INVALID_ARGUMENT, "field %r: expected 'NAME=/hdf5/path' (for example 'data=/climate/data')"
                    % (item,))
            name, path = item.split("=", 1)
        else:
            name, path = item
        names.append(name)
        specs.append("%s=%s" % (name, path))
    return names, specs, as_dict


# Arrays of at most this many bytes a sample (labels, indices, a few
# per-sample scalars) are handed out as copies of their own: a user keeping
# them (for metrics, say) keeps no batch slot of the pool, which holds
# prefetch + 1 batches and otherwise stops the loader when all are held.
_SMALL_ROW = 64


class Loader:
    """Batches of a dataset ("file.h5", "file.h5:/path") or of a `gpufeed
    serve` daemon ("unix:PATH", "tcp://HOST:PORT" with `dataset=`), as
    (images, labels) per iteration.

    Loader options (C++ LoaderOptions): batch_size, order ("block", "random",
    "sequential"), seed, threads (0: all cores), prefetch (batches in flight;
    the pool has prefetch + 1 slots), pool_bytes (the pool's budget: fewer
    slots, 3 at least, where prefetch + 1 batches would pass it; 0: no
    bound; default 2 GiB), cache_bytes, shuffle_window, rank,
    world_size (default: torch.distributed, else RANK / WORLD_SIZE), drop_last,
    pin_memory; labels: the labels dataset path ("none": no labels);
    trust_files: skip the forked probe that contains HDF5 crashes on hostile
    files (OpenOptions::trust_files; GPUFEED_TRUST_FILES=1 does the same);
    io: "auto", "direct" (O_DIRECT, the page cache left alone; pread where
    refused) or "buffered" (OpenOptions::io; default: auto, or GPUFEED_IO).
    allow_paths: directories (one, or a list) that the files a dataset names
    (external raw data, virtual-dataset sources, external links) may lie in
    besides the dataset file's own; anything else is refused with
    InvalidArgumentError naming it (OpenOptions::allow_paths; default: none;
    GPUFEED_ALLOW_PATHS=DIR:DIR does the same).

    Encoded image datasets (JPEG/PNG files stored by `gpufeed convert DIR
    --keep-encoded`, or h5py vlen uint8), decoded by the loader's threads:
    image_size (S or (H, W), default 224), transform ("random_resized_crop"
    for training, "center_crop" for evaluation), image_layout ("NCHW" /
    "NHWC"), skip_corrupt. A daemon serving an encoded dataset decodes with
    these options. decode: where the JPEGs are decoded when the feed runs:
    "gpu" (the GPU's hardware JPEG decoder through nvJPEG; images it does
    not take, such as progressive ones or PNGs, are decoded by the loader's
    threads), "cpu" (the loader's threads) or "auto" (the default: "gpu" on
    a CUDA device where libnvjpeg loads, the loader's threads decoding a
    share of the engine's images measured so that neither waits, else
    "cpu"); `Loader.decode` says what was chosen and why.

    Daemon options (RemoteLoaderOptions): dataset, token, token_file,
    client_name, compress, shared_memory, connect_timeout_ms, io_timeout_ms,
    keepalive_ms.

    Outputs: device="cpu" without dtype gives the stored uint8 samples
    [B, *sample_shape] and int64 labels. device="cuda" (the GPU given by
    LOCAL_RANK; "cuda:N" to choose), or any of dtype / crop_padding / flip,
    runs the feed (C++ FeedOptions): dtype (torch.float32 / bfloat16 /
    float16 or their names; default float32), layout and input_layout ("NCHW"
    / "NHWC"), mean and std per channel in stored units (default: the
    dataset's attributes, else 0 and 255), echo, super_batch, crop_padding,
    flip, augment_seed (default: seed), slots (device batches the consumer
    may hold), labels_int32. On the CPU the feed runs its CPU twins.
    fields: named fields (C++ OpenOptions::fields), as ["data=/climate/data",
    "mask=/climate/labels_0"] (iteration yields a tuple in that order) or
    {"data": "/climate/data", "mask": "/climate/labels_0"} (a dict). data may
    also name many files: a glob ("deepcam/*.h5"), a directory or a *.txt
    list of paths. Each field arrives as [B, *field shape] in its stored
    dtype; sample k of every field is row k. max_open_files bounds the files
    holding descriptors at once (default 256). no_sample_axis: each file is
    one sample and its datasets have no sample axis (DeepCAM's reference
    files: /climate/data [768, 1152, 16]); such a field arrives as
    [B, *dataset shape]. A daemon serving named fields
    (`gpufeed serve --data ... --field ...`) delivers them the same way;
    fields= then names them (the same names and paths, in order) for the
    tuple or dict. With the feed, the first field is the image (transformed
    as above) and every later one arrives too: a class (one integer a
    sample) as labels_int32 decides, integer masks of the image's pixels
    cropped and flipped with it, anything else (a float target) as stored.
    output: "torch", "numpy", "dlpack" (gpufeed.Array objects) or "auto"
    (torch if importable, else NumPy, else DLPack arrays).

    share: "node" reads a file through one server for all the local ranks of
    a torchrun job on this host (one reader, one decoded-chunk cache, one set
    of decode threads: every core of the host, or threads x the local ranks
    when threads is given), started by the first rank to open it and ended
    after the last closes; each rank keeps its own shard (rank, world_size),
    slots and GPU feed. "none": a loader in this process (threads=0 then
    takes this rank's share of the host's cores). "auto" (default): "node"
    when torchrun started more than one local rank (LOCAL_WORLD_SIZE > 1)
    and no option only a local loader takes (labels, io, max_open_files) is
    given and the file is not one of encoded images this rank's GPU decodes
    (decode on a GPU with the engine), else "none". For those, "node" sends
    each rank the JPEGs its GPU takes encoded (read and cached once for the
    node; each rank decodes on its own GPU, as a loader per rank does), but
    "auto" keeps a loader per rank until that is measured on a GPU host to
    be at least as good. The chosen mode is `loader.share`; docs/python.md
    has the details.
    """

    def __init__(self, data, *, loader_options=None, open_options=None, decode_options=None, feed_options=None,
                 remote_options=None, output_options=None, **keywords):
        self._handle = None
        values = options.resolve({"loader_options": loader_options, "open_options": open_options,
                                  "decode_options": decode_options, "feed_options": feed_options,
                                  "remote_options": remote_options, "output_options": output_options}, keywords)
        self._open(data, values)

    def _open(self, data, v):
        """Opens `data` with every keyword's value `v` (options.resolve):
        each checked here, in the caller's terms, not at the first
        iteration, then set on the library's options by the option it names
        (options.ROWS)."""
        self._handle = None
        self._field_names, field_specs, self._fields_dict = _parse_fields(v["fields"])
        kind, index = _parse_device(v["device"])
        feed = kind == "cuda" or v["dtype"] is not None or v["crop_padding"] or v["flip"]
        dist_rank, dist_world = _distributed_defaults()
        for k in ("batch_size", "seed", "threads", "prefetch", "shuffle_window", "echo", "super_batch", "crop_padding",
                  "slots", "poll_ms", "connect_timeout_ms", "io_timeout_ms", "keepalive_ms"):
            v[k] = _args.integer(k, v[k])
        for k in ("augment_seed", "max_open_files"):
            if v[k] is not None:
                v[k] = _args.integer(k, v[k])
        if v["allow_paths"] is not None:
            v["allow_paths"] = _args.directories("allow_paths", v["allow_paths"])
        for k in ("cache_bytes", "pool_bytes"):
            v[k] = _args.size_bytes(k, v[k])
        height, width = _args.image_size(v["image_size"])
        v["rank"], v["world_size"] = _args.shard(dist_rank if v["rank"] is None else v["rank"],
                                                 dist_world if v["world_size"] is None else v["world_size"])
        self._seed = int(v["seed"])
        self._echo = int(v["echo"]) if feed else 1
        self._output = _pick_output(v["output"])
        self._cuda_index = index if kind == "cuda" else None
        self._host_batches = not feed
        self._poll_ms = v["poll_ms"]
        # Each option of the table from the keyword that sets it; the feed's
        # only when the feed runs, and those Python decides from others.
        decided = {"feed": bool(feed), "image_height": height, "image_width": width}
        if feed:
            decided.update({"feed_device": index or 0, "feed_force_cpu": kind == "cpu",
                            "feed_dtype": _dtype_name(v["dtype"]) or "float32",
                            "feed_seed": v["seed"] if v["augment_seed"] is None else v["augment_seed"]})
        values = {}
        for name, row in options.ROWS.items():
            for option in row.options:
                if option.startswith("feed_") and not feed:
                    continue
                values[option] = decided[option] if option in decided else v[name]
        values["feed"] = decided["feed"]
        mean, std = v["mean"], v["std"]
        opts = lib.gpufeed_options_create()
        try:
            for key, value in values.items():
                if value is not None:
                    _lib.set_option(opts, key, value)
            for setter, seq in ((lib.gpufeed_options_set_feed_mean, mean), (lib.gpufeed_options_set_feed_std, std)):
                if feed and seq is not None:
                    arr = (ctypes.c_double * len(seq))(*[float(v) for v in seq])
                    setter(opts, arr, len(seq))
            for spec in field_specs:
                lib.gpufeed_options_add_field(opts, spec.encode())
            err = ctypes.c_void_p()
            handle = lib.gpufeed_loader_open(str(data).encode(), opts, ctypes.byref(err))
            if not handle:
                _lib.take_error(err)
        finally:
            lib.gpufeed_options_destroy(opts)
        self._handle = handle
        self._next_handle, self._next_err = ctypes.c_void_p(), ctypes.c_void_p()
        self._next_args = (self._poll_ms, ctypes.byref(self._next_handle), ctypes.byref(self._next_err))
        self._array_cache = {}
        self._epoch = 0
        self._pending = None     # (epoch, saved state bytes) from load_state_dict
        self._started = False
        self._generation = 0     # bumped by close(): a live generator then stops
        self._live = False       # an iteration is running (_iterate)
        self._torch = None
        if self._output == "torch":
            import torch
            import torch.utils.dlpack
            self._torch = torch
            # torch.utils.dlpack.from_dlpack without its per-call protocol
            # checks: a capsule goes straight to the converter.
            self._from_dlpack = getattr(torch._C, "_from_dlpack", torch.utils.dlpack.from_dlpack)
            if self._host_batches:
                self._check_torch_takes(lib.gpufeed_loader_dtype(handle).decode())
        elif self._output == "numpy":
            import numpy
            self._from_dlpack = numpy.from_dlpack

    def _check_torch_takes(self, dtype):
        """Host batches of `dtype` as torch tensors: said here, naming what to
        do, when this torch cannot take them (torch before 2.3 has no
        uint16/uint32/uint64 tensors; its DLPack converter raised
        "Unsupported kUInt bits 32" at the first batch)."""
        if dtype not in ("uint16", "uint32", "uint64"):
            return
        try:
            import numpy
        except ImportError:
            if hasattr(self._torch, dtype):  # torch.uint32 and its kin exist from torch 2.3 on
                return
        else:
            try:
                self._torch.utils.dlpack.from_dlpack(numpy.zeros(1, dtype=dtype))
                return
            except Exception:  # torch's own error is the answer probed for
                pass
        name = self.name
        self.close()
        raise errors.UnsupportedError(
            errors.UNSUPPORTED, "%s: %s samples, which torch %s cannot hold as tensors; use output='numpy' (NumPy "
            "arrays, as stored), or a dataset of a signed or float type" % (name, dtype, self._torch.__version__))

    # -- what it reads --------------------------------------------------------
    @property
    def share(self):
        """"node" when batches come through the node's server, else "none"."""
        return lib.gpufeed_loader_share(self._h()).decode()

    @property
    def decode(self):
        """Where images are decoded: "gpu (nvjpeg hardware)", "cpu (<why not
        the GPU>)", "server" (a daemon decodes) or "none" (no encoded images)."""
        return lib.gpufeed_loader_decode(self._h()).decode()

    @property
    def started_node_server(self):
        """True when this process started the node's server (share="node")."""
        return bool(lib.gpufeed_loader_started_node_server(self._h()))

    @property
    def name(self):
        return lib.gpufeed_loader_name(self._h()).decode()

    @property
    def num_samples(self):
        """Samples in the whole dataset (all ranks)."""
        return lib.gpufeed_loader_num_samples(self._h())

    @property
    def sample_shape(self):
        h = self._h()
        return tuple(lib.gpufeed_loader_sample_dim(h, i) for i in range(lib.gpufeed_loader_sample_ndim(h)))

    @property
    def batch_size(self):
        return lib.gpufeed_loader_batch_size(self._h())

    def __len__(self):
        """Batches one epoch yields on this rank (echoed batches counted)."""
        return lib.gpufeed_loader_num_batches(self._h()) * max(1, self._echo)

    # -- epochs, state --------------------------------------------------------
    def set_epoch(self, epoch):
        """The epoch the next iteration runs (as DistributedSampler.set_epoch).
        A state loaded for another epoch is dropped."""
        self._epoch = int(epoch)
        if self._pending is not None and self._pending[0] != self._epoch:
            self._pending = None

    def state_dict(self):
        """Where the consumer is: epoch and batches received, with the seed.
        Plain Python values (torch.save / pickle / json of bytes)."""
        if not self._started:
            if self._pending is not None:
                return {"format": _STATE_FORMAT, "epoch": self._pending[0], "state": self._pending[1]}
            return {"format": _STATE_FORMAT, "epoch": self._epoch, "batch": 0, "seed": self._seed, "state": None}
        epoch, batch = ctypes.c_uint64(), ctypes.c_uint64()
        lib.gpufeed_loader_position(self._h(), ctypes.byref(epoch), ctypes.byref(batch))
        buf, size, err = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_void_p()
        _lib.check(lib.gpufeed_loader_save_state(self._h(), ctypes.byref(buf), ctypes.byref(size), ctypes.byref(err)),
                   err)
        try:
            state = ctypes.string_at(buf, size.value)
        finally:
            lib.gpufeed_free(buf)
        return {"format": _STATE_FORMAT, "epoch": epoch.value, "batch": batch.value, "seed": self._seed,
                "state": state}

    def load_state_dict(self, state):
        """The next iteration continues where `state` was taken: the same
        remaining batches, in a new process too. A state of another run
        (another seed, order or dataset, or a world size or batch size it
        cannot resume at) is refused here, with InvalidArgumentError naming
        the keyword, and the loader is left as it was."""
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise errors.InvalidArgumentError(errors.INVALID_ARGUMENT,
                                              "load_state_dict: not a %s state dict" % _STATE_FORMAT)
        saved = state.get("state")
        if saved is not None:
            saved = bytes(saved)
            err = ctypes.c_void_p()
            _lib.check(lib.gpufeed_loader_check_state(self._h(), saved, len(saved), ctypes.byref(err)), err)
        elif state.get("seed") is not None and int(state["seed"]) != self._seed:
            # Saved before its first batch: an epoch and the seed only.
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT, "load_state_dict: the state is of a run with seed=%d, this loader has "
                "seed=%d: resume it with the run's options, or start this loader without the state"
                % (int(state["seed"]), self._seed))
        self._epoch = int(state["epoch"])
        self._pending = (self._epoch, saved) if saved is not None else None

    def stats(self):
        """The current epoch's statistics (C++ LoaderStats, and FeedStats as
        feed_*), as a dict of numbers."""
        if not self._started:
            return {}
        out, err = ctypes.c_void_p(), ctypes.c_void_p()
        _lib.check(lib.gpufeed_loader_stats_json(self._h(), ctypes.byref(out), ctypes.byref(err)), err)
        try:
            return json.loads(ctypes.string_at(out).decode())
        finally:
            lib.gpufeed_free(out)

    # -- iteration --------------------------------------------------------------
    def __iter__(self):
        """(images, labels) per batch (labels None without labels). With
        fields=[...]: a tuple of the fields' arrays in the order named; with
        fields={...}: a dict {name: array}."""
        if self._field_names:
            names = tuple(self._field_names)
            for arrays in self._iterate(names):
                yield dict(arrays) if self._fields_dict else tuple(arrays[n] for n in names)
            return
        for arrays in self._iterate(("images", "labels")):
            yield arrays.get("images"), arrays.get("labels")

    def __getitem__(self, index):
        # torch's DataLoader takes what is not an IterableDataset as a
        # map-style dataset and indexes it ("'Loader' object is not
        # subscriptable"): say what it takes instead.
        raise TypeError("gpufeed.Loader is iterated, not indexed; for torch's DataLoader (and Lightning) pass "
                        "loader.as_dataset(): DataLoader(loader.as_dataset(), batch_size=None, num_workers=0)")

    def as_dataset(self):
        """This loader as a torch.utils.data.IterableDataset, for code that
        wants a DataLoader (Lightning, many training scripts):
        torch.utils.data.DataLoader(loader.as_dataset(), batch_size=None,
        num_workers=0) yields exactly the loader's batches (batch_size=None:
        they are batched already; num_workers=0: the loader's own threads
        read in parallel, and a worker process could not use them). The
        dataset's len(), set_epoch, state_dict and load_state_dict are the
        loader's; it shares the loader's one iteration at a time."""
        return _dataset_class()(self)

    def batches(self):
        """Every array of every batch, as dicts {name: tensor}: "images",
        "labels" and, for host batches, "indices" (the global sample index
        of each row)."""
        return self._iterate(None)

    def _iterate(self, names):
        # One live iteration at a time: the library has one stream, so a
        # second iteration would restart it under the first (zip(loader,
        # loader) gave 1 pair of 235). Live: started (a first next()) and not
        # yet ended, closed or freed; a loop left by `break` frees its own.
        if self._live:
            raise RuntimeError(
                "gpufeed.Loader: a second iteration while one is running (zip(loader, loader), or two iter()s "
                "both in use); iterate one at a time: finish, break out of or close() the first (it.close(), or "
                "del it), or make a second gpufeed.Loader for another pass over the data")
        self._live = True
        try:
            self._start()
            self._generation += 1
            generation = self._generation
            while generation == self._generation:
                handle = self._next()
                if handle is None:
                    return
                yield self._convert(handle, names)
        finally:
            self._live = False

    def _start(self):
        err = ctypes.c_void_p()
        if self._pending is not None:
            epoch, state = self._pending
            self._pending = None
            _lib.check(lib.gpufeed_loader_restore_state(self._h(), state, len(state), ctypes.byref(err)), err)
            self._epoch = epoch
        else:
            _lib.check(lib.gpufeed_loader_start_epoch(self._h(), self._epoch, 0, ctypes.byref(err)), err)
        self._started = True
        if self._cuda_index is not None and not lib.gpufeed_loader_on_gpu(self._h()):
            # The feed falls back to its CPU twins without a GPU; a caller who
            # asked for cuda tensors should hear it, not get CPU ones.
            raise errors.UnsupportedError(
                errors.UNSUPPORTED, "device=%r: no CUDA device for the feed (libgpufeed.so without CUDA, no GPU or "
                "no driver); use device='cpu'" % ("cuda:%d" % self._cuda_index))

    def _next(self):
        # The byref arguments are built once per loader: this runs per batch.
        h, args, handle, err = self._h(), self._next_args, self._next_handle, self._next_err
        while True:
            # Slices of poll_ms with the GIL released: KeyboardInterrupt is
            # raised between them; the request stays queued in the library.
            code = lib.gpufeed_loader_next(h, *args)
            if code == errors.OK:
                return handle.value
            if code == errors.END:
                return None
            if code in (errors.TIMEOUT, errors.INTERRUPTED):
                continue
            e, err.value = err.value, None
            _lib.check(code, e)

    def _array_indexes(self, handle, names):
        """(name, index) of the wanted arrays; a batch's arrays depend only on
        the loader (host or feed, labels or not), so this is looked up once."""
        key = names
        found = self._array_cache.get(key)
        if found is None:
            count = lib.gpufeed_batch_num_arrays(handle)
            all_names = [lib.gpufeed_batch_array_name(handle, i).decode() for i in range(count)]
            wanted = all_names if names is None else names
            found = tuple((n, all_names.index(n)) for n in wanted if n in all_names)
            self._array_cache[key] = found
        return found

    def _convert(self, handle, names):
        out = {}
        err = ctypes.c_void_p()
        export = lib.gpufeed_batch_array_dlpack
        if self._output == "torch":
            try:
                if self._cuda_index is not None and lib.gpufeed_loader_on_gpu(self._h()):
                    stream = self._torch.cuda.current_stream(self._cuda_index).cuda_stream or None
                    _lib.check(lib.gpufeed_batch_wait_stream(handle, stream, ctypes.byref(err)), err)
                    lib.gpufeed_batch_set_release_stream(handle, stream)
                elif self._host_batches and self._torch.cuda.is_initialized():
                    # x.cuda(non_blocking=True) copies from this pinned slot
                    # after the tensor may be gone: the slot goes back to the
                    # pool only when the current stream has run that copy.
                    stream = self._torch.cuda.current_stream().cuda_stream or None
                    lib.gpufeed_batch_set_release_stream(handle, stream)
                for name, i in self._array_indexes(handle, names):
                    managed = export(handle, i, ctypes.byref(err))
                    if not managed:
                        _lib.take_error(err)
                    t = self._from_dlpack(_dlpack.capsule(managed))
                    if t.dim() > 0 and t.shape[0] > 0 and t.element_size() * t.numel() // t.shape[0] <= _SMALL_ROW:
                        t = t.clone()  # labels and scalars: kept freely, they do not hold the batch's slot
                    out[name] = t
            finally:
                lib.gpufeed_batch_destroy(handle)  # the tensors hold the slot now
            return out
        ref = _dlpack.BatchRef(handle)
        for name, i in self._array_indexes(handle, names):
            managed = export(handle, i, ctypes.byref(err))
            if not managed:
                _lib.take_error(err)
            array = _dlpack.Array(managed, ref)
            if self._output == "numpy":
                a = self._from_dlpack(array)
                if a.ndim > 0 and a.shape[0] > 0 and a.nbytes // a.shape[0] <= _SMALL_ROW:
                    a = a.copy()  # as above: a small field of its own
                out[name] = a
            else:
                out[name] = array
        return out

    # -- lifetime ---------------------------------------------------------------
    def interrupt(self):
        """Wakes a wait in another thread's iteration (it then retries).
        Thread-safe."""
        if self._handle:
            lib.gpufeed_loader_interrupt(self._handle)

    def close(self):
        """Stops the pipeline and releases the loader. Tensors still held stay
        valid (their memory goes with the last of them)."""
        self._generation += 1
        handle, self._handle = self._handle, None
        if handle:
            lib.gpufeed_loader_destroy(handle)  # then the node's server may stop (share="node")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_handle", None):
                self.close()
        except Exception:  # interpreter shutdown: module globals may be gone
            pass

    def _h(self):
        if not self._handle:
            raise errors.InvalidArgumentError(errors.INVALID_ARGUMENT, "gpufeed.Loader: used after close()")
        return self._handle

    def __repr__(self):
        if not self._handle:
            return "gpufeed.Loader(closed)"
        return "gpufeed.Loader(%r, %d samples, batch_size=%d, %d batches)" % (
            self.name, self.num_samples, self.batch_size, len(self))


# Loader's keywords, their defaults and what they are, from the keyword rows
# (options.py) and so from the library's option table: its signature (for
# help(), inspect and editors) and the end of its docstring.
Loader.__init__.__signature__ = options.signature()
if Loader.__doc__:  # None under python -OO
    Loader.__doc__ += options.keyword_doc()

_DATASET_CLASS = None


def _dataset_class():
    """LoaderDataset, made at its first use: torch is imported only then."""
    global _DATASET_CLASS
    if _DATASET_CLASS is not None:
        return _DATASET_CLASS
    import torch.utils.data

    class LoaderDataset(torch.utils.data.IterableDataset):
        """A gpufeed.Loader as a torch IterableDataset (Loader.as_dataset())."""

        def __init__(self, loader):
            super().__init__()
            self.loader = loader

        def __iter__(self):
            if torch.utils.data.get_worker_info() is not None:
                raise RuntimeError(
                    "gpufeed.Loader.as_dataset() in a DataLoader worker process: use num_workers=0 (the loader "
                    "reads with its own threads, which a worker process does not have; threads= sets how many)")
            return iter(self.loader)

        def __len__(self):
            return len(self.loader)

        def __reduce__(self):
            raise TypeError("gpufeed.Loader.as_dataset() cannot go to DataLoader worker processes: use "
                            "num_workers=0 (the loader reads with its own threads)")

        def set_epoch(self, epoch):
            self.loader.set_epoch(epoch)

        def state_dict(self):
            return self.loader.state_dict()

        def load_state_dict(self, state):
            self.loader.load_state_dict(state)

        def __repr__(self):
            return "LoaderDataset(%r)" % (self.loader,)

    _DATASET_CLASS = LoaderDataset
    return LoaderDataset
