"""gpufeed.jax: gpufeed's batches as jax.Arrays, zero-copy, sharded over a Mesh.

    import jax, gpufeed.jax
    loader = gpufeed.jax.Loader("train.h5", batch_size=512, seed=0, dtype="bfloat16", drop_last=True)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:   # jax.Arrays [512, C, H, W] bf16, sharded along the batch axis
            state, loss = train_step(state, images, labels)

How a batch is made (docs/python.md, "JAX", has the contracts in full):
- One feed per local device: each addressable device of the sharding gets a
  gpufeed.Loader of its own (device="cuda:N" on a GPU, "cpu" on CPU-only
  JAX) reading the rows of the global batch that the sharding gives it, as
  a torchrun rank would (rank = its first row / rows per device, world_size
  = the global batch / rows per device). Processes of a multi-host job
  (jax.distributed) get their rows from the same sharding, so the process
  index and count are taken as torchrun's rank and world size are.
- Zero-copy: each feed's device buffer goes to jax.dlpack.from_dlpack
  (copy=False on a GPU: JAX refuses rather than copies) and the per-device
  arrays become one global array with jax.make_array_from_single_device_arrays.
  JAX's DLPack import makes its external-ready stream wait on the feed's
  event (no host synchronization).
- Lifetime (the PyTorch path's rule): a batch's slot goes back when its
  jax.Array is deleted (its last reference dropped, or x.delete()), not when
  the next batch is taken. JAX releases a view of a foreign buffer once the
  computations queued on it are done, so a train step dispatched
  asynchronously keeps its batch until it has run. Labels (and other arrays
  of at most 64 bytes a sample) are copied on the device and hold no slot.
- Asynchronous dispatch: Python may queue steps ahead of the device, each
  holding its batch. The loader lets it run 2 steps ahead (1 with slots=2):
  before it takes a batch it waits on the device for a marker queued after
  the step of the batch before those, and only then lets that batch's
  views go, so the feed always has a slot to fill and a slot is reused only
  after the steps queued on it have run. A program that keeps more batches
  itself gets gpufeed.InvalidArgumentError naming `slots` (or `prefetch`),
  never a hang.

The sharding plan itself (plan_feeds, default_rows) is plain Python: it is
tested without JAX. `import gpufeed` does not import this module, and this
module imports jax only when a Loader is made.
"""
import collections
import os
import time

from . import _args, _lib, errors, options
from .loader import Loader as _FeedLoader

_STATE_FORMAT = "gpufeed.jax.Loader/1"
# Arrays of at most this many bytes a sample (labels, indices) are copied on
# the device: a program keeping them keeps no slot (as gpufeed.Loader does).
_SMALL_ROW = 64
# Keywords the sharding decides; given by the caller they would contradict it.
_DECIDED = {
    "rank": "the sharding's rows decide each feed's rank",
    "world_size": "the global batch over the rows a device holds decides it",
    "device": "each feed is on its device of the sharding",
    "output": "batches are jax.Arrays",
}


def _import_jax():
    """jax, or ImportError naming the package and how to install it."""
    try:
        import jax
        import jax.dlpack  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "gpufeed.jax needs JAX, and the 'jax' package is not importable from this Python (%s): install "
            "it (pip install -U jax, or 'jax[cuda13]' for NVIDIA GPUs); without JAX, gpufeed.Loader gives torch "
            "or NumPy batches" % (e,), name="jax") from e
    return jax


# -- the sharding plan: plain Python ------------------------------------------


class Feed(collections.namedtuple("Feed", "device start stop rank world_size")):
    """One local device's share of the global batch: rows [start, stop) of
    each global batch, read by a gpufeed.Loader with this rank and world size."""

    __slots__ = ()


def _bad(message):
    return errors.InvalidArgumentError(errors.INVALID_ARGUMENT, message)


def _multiples(n, k):
    """The multiples of k nearest n (for messages): (below, above)."""
    below = n - n % k
    return (below if below > 0 else k), below + k


def plan_feeds(batch_size, device_rows):
    """The feeds of one process: [Feed] in the order of `device_rows`.

    batch_size: the global batch (all processes, all devices).
    device_rows: [(device, start, stop)]: the rows of the global batch each
    of this process's devices holds (a sharding's
    addressable_devices_indices_map). Every device must hold the same number
    of rows b and b must divide the global batch: the feed of rows
    [start, stop) reads as rank start // b of batch_size // b ranks (the
    shard a torchrun rank of that index would read), so the ranks of all
    processes together read every sample of the epoch once (padding as
    gpufeed.Loader pads: docs/python.md). Devices holding the same rows
    (replicas along another mesh axis) get feeds of the same rank: the same
    samples, read by each. Anything else is refused with
    InvalidArgumentError saying what is wrong.
    """
    if isinstance(batch_size, bool) or not hasattr(type(batch_size), "__index__") or int(batch_size) < 1:
        raise _bad("batch_size=%r: the global batch, an integer >= 1" % (batch_size,))
    batch_size = int(batch_size)
    device_rows = list(device_rows)
    if not device_rows:
        raise _bad("the sharding gives this process no device of the batch (no addressable device)")
    sizes = {stop - start for _, start, stop in device_rows}
    if len(sizes) != 1:
        raise _bad("the sharding gives this process's devices unequal rows of the batch (%s): each feed reads "
                   "as many rows as every other" % ", ".join("%s: %d" % (d, stop - start)
                                                              for d, start, stop in device_rows))
    rows = sizes.pop()
    if rows < 1 or batch_size % rows:
        raise _bad("batch_size=%d does not split evenly over the devices of the batch axis (%d rows each): "
                   "use a multiple of the devices' count" % (batch_size, rows))
    feeds = []
    for device, start, stop in device_rows:
        if start < 0 or stop > batch_size or start % rows:
            raise _bad("the sharding gives %s rows [%d, %d) of a batch of %d: not a block of %d rows" % (
                device, start, stop, batch_size, rows))
        feeds.append(Feed(device, start, stop, start // rows, batch_size // rows))
    return feeds


def default_rows(batch_size, local_devices, process_index=0, process_count=1):
    """The rows each of this process's `local_devices` holds under the
    default 1-D mesh over every process's devices (process p's devices at
    positions p * D ... p * D + D - 1, as jax.devices() orders them), as
    [(device, start, stop)] for plan_feeds. The global batch must split into
    process_count * D equal blocks (InvalidArgumentError naming batch_size
    and the multiples nearest it otherwise)."""
    local_devices = list(local_devices)
    d = len(local_devices)
    if d < 1:
        raise _bad("no local device to feed")
    if not 0 <= process_index < process_count:
        raise _bad("process_index=%d with process_count=%d" % (process_index, process_count))
    world = d * process_count
    if isinstance(batch_size, bool) or not hasattr(type(batch_size), "__index__") or int(batch_size) < 1:
        raise _bad("batch_size=%r: the global batch, an integer >= 1" % (batch_size,))
    if batch_size % world:
        below, above = _multiples(batch_size, world)
        raise _bad("batch_size=%d is the global batch, split evenly over %d devices (%d processes x %d): use a "
                   "multiple of %d, such as %d or %d" % (batch_size, world, process_count, d, world, below, above))
    b = batch_size // world
    first = process_index * d
    return [(dev, (first + i) * b, (first + i + 1) * b) for i, dev in enumerate(local_devices)]


def _rows_of(sharding, batch_size):
    """[(device, start, stop)] of this process's devices, in the sharding's
    addressable-device order."""
    index_map = sharding.addressable_devices_indices_map((batch_size,))
    out = []
    for device in sorted(index_map, key=lambda d: d.id):
        index = index_map[device]
        s = index[0] if index else slice(None)
        start, stop, step = s.indices(batch_size)
        if step != 1:
            raise _bad("the sharding gives %s a strided slice of the batch" % (device,))
        out.append((device, start, stop))
    return out


# -- the loader -------------------------------------------------------------


def _dtype_name(dtype):
    """A dtype's name as gpufeed.Loader takes it: jnp.bfloat16, np.float16,
    "bf16", torch.float32 ... (None stays None)."""
    if dtype is None or isinstance(dtype, str):
        return dtype
    try:
        import numpy
        return numpy.dtype(dtype).name  # jnp.bfloat16 through ml_dtypes
    except (ImportError, TypeError):
        return str(dtype)


def _slot_pointer(array):
    """The data pointer of a gpufeed.Array's DLPack tensor (before it is handed over)."""
    t = _lib.DLManagedTensor.from_address(array._managed).dl_tensor
    return (t.data or 0) + t.byte_offset


class Loader:
    """gpufeed.Loader's batches as jax.Arrays on the devices of a sharding.

    data and every keyword of gpufeed.Loader (order, seed, threads, prefetch,
    cache_bytes, drop_last, labels, fields, dtype, layout, mean, std,
    crop_padding, flip, echo, slots, share, the daemon's options, ...) as
    there, except:
    - batch_size: the GLOBAL batch, the leading dimension of each jax.Array
      (all processes, all devices); each device's feed reads batch_size / W
      of it, W the devices of the batch axis.
    - mesh, batch_axis: the batch is sharded along `batch_axis` (a name of
      the mesh's axes, or a tuple of names) of `mesh` (default: a 1-D mesh
      ("batch",) over jax.devices(): every device of every process). Each
      array's sharding is NamedSharding(mesh, PartitionSpec(batch_axis)).
    - rank, world_size, device, output: decided by the sharding (refused).
    - dtype: also jnp.bfloat16 / jnp.float16 / jnp.float32 (or NumPy
      dtypes). On a GPU the feed runs (float32 unless dtype says); on CPU-only
      JAX the batches are host arrays (uint8 as stored, or the CPU feed's
      dtype when dtype, crop_padding or flip is given).
    - labels_int32: default True unless jax_enable_x64 is on (JAX keeps
      integers as int32 anyway).
    - threads=0 (default): the host's cores shared by the feeds of this process.
    - hold_wait_s: how long the loader waits for a slot that work queued on
      the device still holds before it raises (default 10 s).

    Iteration yields (images, labels) (labels None without labels); with
    fields=[...] a tuple of the fields in order, with fields={...} a dict;
    batches() yields dicts of every array ("indices" too on host batches).
    The last batch of an epoch may be smaller (drop_last=False); with jit,
    drop_last=True keeps one shape.
    """

    def __init__(self, data, *, batch_size=None, mesh=None, batch_axis=None, hold_wait_s=10.0, loader_options=None,
                 open_options=None, decode_options=None, feed_options=None, remote_options=None, output_options=None,
                 **keywords):
        self._feeds = []
        self._live = False
        jax = _import_jax()
        self._jax = jax
        for key, why in _DECIDED.items():
            if keywords.get(key) is not None:
                raise _bad("gpufeed.jax.Loader: %s=%r is not taken: %s" % (key, keywords[key], why))
        values = options.resolve({"loader_options": loader_options, "open_options": open_options,
                                  "decode_options": decode_options, "feed_options": feed_options,
                                  "remote_options": remote_options, "output_options": output_options},
                                 keywords if batch_size is None else dict(keywords, batch_size=batch_size))
        for key in _DECIDED:
            default = options.KEYWORDS[key][1]
            if values[key] is not None and values[key] != default:
                raise _bad("gpufeed.jax.Loader: %s=%r is not taken: %s" % (key, values[key], _DECIDED[key]))
            values.pop(key)
        self.hold_wait_s = float(hold_wait_s)

        from jax.sharding import Mesh, NamedSharding, PartitionSpec
        if mesh is None:
            import numpy
            mesh = Mesh(numpy.asarray(jax.devices()), ("batch",))
        if batch_axis is None:
            batch_axis = mesh.axis_names[0]
        self.mesh = mesh
        self.sharding = NamedSharding(mesh, PartitionSpec(batch_axis))
        self._global_batch = _args.integer("batch_size", values["batch_size"])
        axes = batch_axis if isinstance(batch_axis, (tuple, list)) else (batch_axis,)
        for ax in axes:
            if ax not in mesh.shape:
                raise _bad("batch_axis=%r: the mesh's axes are %s" % (ax, tuple(mesh.axis_names)))
        shards = 1
        for ax in axes:
            shards *= mesh.shape[ax]
        if self._global_batch % shards:
            below, above = _multiples(self._global_batch, shards)
            raise _bad("batch_size=%d is the global batch, split evenly over the %d devices of the mesh's batch "
                       "axis %s: use a multiple of %d, such as %d or %d" % (
                           self._global_batch, shards, "/".join(map(str, axes)), shards, below, above))
        feeds = plan_feeds(self._global_batch, _rows_of(self.sharding, self._global_batch))
        self.plan = feeds

        values["dtype"] = _dtype_name(values["dtype"])
        if values["labels_int32"] is False and "labels_int32" not in keywords and feed_options is None:
            import numpy
            # Without jax_enable_x64 JAX holds int64 as int32 (a conversion on the device).
            values["labels_int32"] = jax.dtypes.canonicalize_dtype(numpy.int64) != numpy.int64
        if values["threads"] == 0 and len(feeds) > 1:
            values["threads"] = max(1, (os.cpu_count() or 1) // len(feeds))
        self._per_device = feeds[0].stop - feeds[0].start
        values["batch_size"] = self._per_device
        self._on_gpu = feeds[0].device.platform == "gpu"
        feed_on = self._on_gpu or values["dtype"] is not None or values["crop_padding"] or values["flip"]
        # Batches the program may hold at once: the feed's output slots, or
        # the host pool's prefetch + 1 (gpufeed.Loader's own rule).
        self._slots = int(values["slots"]) if feed_on else int(values["prefetch"]) + 1
        # Steps the program may queue ahead of the device: 2 keep it busy
        # (one running, one waiting); fewer where the slots are fewer (each
        # queued step holds its batch's slot, and the next batch needs one).
        self._run_ahead = max(1, min(2, self._slots - 1))
        try:
            for f in feeds:
                device = "cuda:%d" % f.device.local_hardware_id if self._on_gpu else "cpu"
                self._feeds.append(_FeedLoader(data, rank=f.rank, world_size=f.world_size, device=device,
                                               output="dlpack", **values))
        except BaseException:
            self.close()
            raise
        self._fences = collections.deque()  # (markers, views) of the batches whose steps may be queued
        self._fence_fn = None
        self._fence_inputs = {}
        self._kept = []
        self.last_slot_pointers = {}

    # -- what it reads ------------------------------------------------------
    @property
    def batch_size(self):
        """The global batch: the leading dimension of each array."""
        return self._global_batch

    @property
    def local_batch_size(self):
        """Rows each device's feed reads."""
        return self._per_device

    @property
    def num_samples(self):
        return self._h().num_samples

    @property
    def sample_shape(self):
        return self._h().sample_shape

    @property
    def name(self):
        return self._h().name

    @property
    def feeds(self):
        """The gpufeed.Loader of each local device, in the plan's order."""
        return list(self._feeds)

    def __len__(self):
        """Global batches an epoch yields (each feed's batch count: every rank
        gets the same)."""
        return len(self._h())

    def stats(self):
        """Each feed's stats() (gpufeed.Loader.stats), in the plan's order."""
        return [f.stats() for f in self._feeds]

    # -- epochs, state --------------------------------------------------------
    def set_epoch(self, epoch):
        for f in self._feeds:
            f.set_epoch(epoch)

    def state_dict(self):
        """Where the program is, as plain JSON values (for an Orbax
        JsonSave, json, pickle): the epoch, batches received, the seed and
        each feed's state (hex). The feeds move in step, so any one of them
        resumes any other: a state saved with D devices loads with D'."""
        states = [f.state_dict() for f in self._h_all()]
        first = states[0]
        return {"format": _STATE_FORMAT, "epoch": int(first["epoch"]), "batch": int(first.get("batch", 0)),
                "seed": first.get("seed"), "batch_size": self._global_batch,
                "feeds": [None if s.get("state") is None else bytes(s["state"]).hex() for s in states]}

    def load_state_dict(self, state):
        """The next iteration continues where `state` was taken (checked by
        each feed as gpufeed.Loader.load_state_dict checks; nothing is
        changed when any refuses it). A state of as many feeds loads feed by
        feed; of another count, the first feed's state loads into each (the
        remaining samples re-cut over the new ranks: docs/python.md, State)."""
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise _bad("load_state_dict: not a %s state dict" % _STATE_FORMAT)
        saved = state.get("feeds") or [None]
        if not isinstance(saved, (list, tuple)):
            raise _bad("load_state_dict: 'feeds' is a list of each feed's state")
        feeds = self._h_all()
        per_feed = []
        for i, f in enumerate(feeds):
            s = saved[i] if len(saved) == len(feeds) else saved[0]
            try:
                raw = None if s is None else bytes.fromhex(s) if isinstance(s, str) else bytes(s)
            except (TypeError, ValueError):
                raise _bad("load_state_dict: feed %d's state is not hex text" % i) from None
            one = {"format": "gpufeed.Loader/1", "epoch": int(state["epoch"]), "batch": int(state.get("batch", 0)),
                   "seed": state.get("seed"), "state": raw}
            per_feed.append(one)
        before = [f.state_dict() for f in feeds]
        try:
            for f, one in zip(feeds, per_feed):
                f.load_state_dict(one)
        except BaseException:
            for f, old in zip(feeds, before):  # all or nothing
                f.load_state_dict(old)
            raise

    # -- iteration --------------------------------------------------------------
    def __iter__(self):
        # The inner iteration is closed here, not left to the garbage
        # collector: an iterator closed (or abandoned) early must end its
        # iteration at once, or the next iter() is refused as a second live
        # one (seen on the GPU host: close() then iter() raised).
        fields = self._feeds[0]._field_names if self._feeds else []
        names = tuple(fields) if fields else ("images", "labels")
        inner = self._iterate(names)
        try:
            if fields:
                as_dict = self._feeds[0]._fields_dict
                for arrays in inner:
                    yield dict(arrays) if as_dict else tuple(arrays[n] for n in names)
                return
            for arrays in inner:
                yield arrays.get("images"), arrays.get("labels")
        finally:
            inner.close()

    def batches(self):
        """Every array of every batch, as dicts {name: jax.Array}."""
        return self._iterate(None)

    def _iterate(self, names):
        if self._live:
            raise RuntimeError("gpufeed.jax.Loader: a second iteration while one is running; finish, break out of "
                               "or close() the first, or make a second Loader")
        feeds = self._h_all()
        self._live = True
        try:
            if self._kept:  # the last batch of an iteration left early: kept until its step has run
                self._fence()
            for f in feeds:
                f._start()
            while True:
                handles = []
                try:
                    for f in feeds:
                        handles.append(self._next_of(f))
                    if all(h is None for h in handles):
                        return
                    if any(h is None for h in handles):
                        raise errors.InternalError(errors.INTERNAL, "gpufeed.jax.Loader: the feeds ended at "
                                                   "different batches (every rank should get as many)")
                    per_feed = []
                    while handles:  # each handle, once converted, is owned by its arrays
                        per_feed.append(feeds[len(per_feed)]._convert(handles.pop(0), names))
                finally:
                    for h in handles:
                        if h is not None:
                            _lib.lib.gpufeed_batch_destroy(h)
                yield self._assemble(per_feed)
                self._fence()
        finally:
            self._live = False

    def _next_of(self, feed):
        """The feed's next batch handle (None at the epoch's end). A slot
        held only by work still queued on the device comes back once that
        work has run: waited for (the fences), then retried for up to
        hold_wait_s; a slot the program itself keeps raises gpufeed's error
        (naming slots or prefetch) after that."""
        deadline = None
        while True:
            try:
                return feed._next()
            except errors.InvalidArgumentError as e:
                if "holds all" not in str(e):
                    raise
                now = time.monotonic()
                if deadline is None:
                    self._drain_fences()
                    deadline = now + self.hold_wait_s
                elif now >= deadline:
                    raise errors.InvalidArgumentError(
                        e.code, "%s (gpufeed.jax: still held %.1f s after the device ran the work queued on them: the "
                        "program keeps these arrays: release them, or raise the option named above)" % (
                            e, self.hold_wait_s)) from None
                time.sleep(0.002)

    def _assemble(self, per_feed):
        jax = self._jax
        out = {}
        pointers = {}
        kept = []  # this batch's views of gpufeed's slots, kept until its step has run (_fence)
        for name in per_feed[0]:
            views = []
            ptrs = []
            for f_plan, arrays in zip(self.plan, per_feed):
                a = arrays[name]
                ptrs.append(_slot_pointer(a))
                if self._on_gpu:
                    # copy=False: JAX raises rather than copies (an unaligned
                    # or strided buffer); the feed's are neither.
                    view = jax.dlpack.from_dlpack(a, device=f_plan.device, copy=False)
                else:
                    # Host memory: JAX takes a DLPack CPU tensor as CPU device
                    # 0's; another CPU device (a forced host device count)
                    # gets a copy.
                    view = jax.dlpack.from_dlpack(a)
                    if view.devices() != {f_plan.device}:
                        view = jax.device_put(view, f_plan.device)
                if view.ndim > 0 and view.shape[0] > 0 and view.nbytes // view.shape[0] <= _SMALL_ROW:
                    view = jax.numpy.array(view, copy=True)  # labels: their own memory, no slot held
                else:
                    kept.append(view)
                views.append(view)
            pointers[name] = ptrs
            if any(v.shape != views[0].shape for v in views):
                raise errors.InternalError(errors.INTERNAL, "gpufeed.jax.Loader: the feeds of %r gave shapes %s" % (
                    name, [v.shape for v in views]))
            if len(views) == 1 and len(self.sharding.device_set) == 1:
                out[name] = views[0]
                continue
            rows = views[0].shape[0]
            global_shape = (rows * self.plan[0].world_size,) + tuple(views[0].shape[1:])
            out[name] = jax.make_array_from_single_device_arrays(global_shape, self.sharding, views)
        self.last_slot_pointers = pointers
        self._kept = kept
        return out

    # -- run-ahead bound --------------------------------------------------------
    def _fence(self):
        """Called when the program asks for the next batch, having dispatched
        its step on the last one: queues a marker on each device after that
        step, keeping the last batch's views alive with it, and waits for
        the marker of the batch _run_ahead back, then drops its views.

        So (1) the program runs at most _run_ahead steps ahead of the device,
        and the feed always has a slot to fill instead of finding every slot
        held by queued steps; (2) a slot goes back only after the device ran
        the steps queued on it before the program moved on, whenever JAX
        calls the DLPack deleter of a view the program deleted."""
        jax = self._jax
        if self._fence_fn is None:
            self._fence_fn = jax.jit(lambda x: x + 1)
            for f in self.plan:
                if f.device not in self._fence_inputs:
                    self._fence_inputs[f.device] = jax.device_put(jax.numpy.zeros((), jax.numpy.int32), f.device)
        kept, self._kept = self._kept, []
        self._fences.append(([self._fence_fn(x) for x in self._fence_inputs.values()], kept))
        while len(self._fences) > self._run_ahead:
            self._wait_oldest()

    def _wait_oldest(self):
        markers, kept = self._fences.popleft()
        for marker in markers:
            marker.block_until_ready()
        del kept

    def _drain_fences(self):
        while self._fences:
            self._wait_oldest()

    # -- lifetime ---------------------------------------------------------------
    def close(self):
        """Stops every feed, once the steps queued on the batches it keeps
        have run. Arrays still held stay valid."""
        if getattr(self, "_fences", None) is not None:
            if self._kept:
                self._fence()
            self._drain_fences()
        feeds, self._feeds = self._feeds, []
        for f in feeds:
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _h(self):
        if not self._feeds:
            raise _bad("gpufeed.jax.Loader: used after close()")
        return self._feeds[0]

    def _h_all(self):
        self._h()
        return self._feeds

    def __repr__(self):
        if not self._feeds:
            return "gpufeed.jax.Loader(closed)"
        return "gpufeed.jax.Loader(%r, %d samples, batch_size=%d over %d devices here, %d batches)" % (
            self.name, self.num_samples, self._global_batch, len(self._feeds), len(self))


__all__ = ["Loader", "Feed", "plan_feeds", "default_rows"]
