/* gpufeed's C interface (libgpufeed.so): the loader, the daemon client and
 * the GPU feed behind opaque handles, for Python (ctypes), C and any language
 * with a C FFI. In the manner of LevelDB's include/leveldb/c.h and DuckDB's
 * duckdb.h: no C++ type or exception crosses it, every failure is a code and
 * a message the library owns, and each call says who owns what and from
 * which threads it may be called.
 *
 *   gpufeed_options* o = gpufeed_options_create();
 *   gpufeed_options_set_batch_size(o, 256);
 *   gpufeed_error* err = NULL;
 *   gpufeed_loader* l = gpufeed_loader_open("train.h5", o, &err);  // or "unix:/run/gpufeed.sock"
 *   gpufeed_options_destroy(o);
 *   if (!l) { fprintf(stderr, "%s\n", gpufeed_error_message(err)); gpufeed_error_destroy(err); }
 *   gpufeed_loader_start_epoch(l, 0, 0, &err);
 *   gpufeed_batch* b;
 *   while (gpufeed_loader_next(l, -1, &b, &err) == GPUFEED_OK) {
 *     DLManagedTensor* images = gpufeed_batch_array_dlpack(b, 0, &err);  // "images"
 *     ... images->deleter(images);
 *     gpufeed_batch_destroy(b);   // the pool slot returns when the batch and all its tensors are gone
 *   }
 *   gpufeed_loader_destroy(l);
 *
 * Errors. A call that can fail returns a gpufeed_code (or NULL) and, when
 * `error` is not NULL, stores a new gpufeed_error there that the caller
 * frees with gpufeed_error_destroy (on success *error is left untouched). Its
 * message is the C++ Status's: it names the file, dataset, chunk or daemon
 * and the cause. Passing NULL for `error` is allowed (the code alone).
 *
 * CUDA. The library does not change the process's environment. A program
 * that decodes on the GPU beside a model does best with CUDA's 32 hardware
 * queues rather than its default 8: set CUDA_DEVICE_MAX_CONNECTIONS=32
 * before its first CUDA call, as the Python package (at import) and the
 * gpufeed CLI do (docs/python.md).
 *
 * Threads. Unless a call says otherwise, the calls on one gpufeed_loader are
 * made from one thread at a time (the consumer's, as with the C++ Loader).
 * gpufeed_loader_interrupt, gpufeed_batch_destroy and DLPack deleters may be
 * called from any thread at any time. Blocking calls wait for at most their
 * timeout and are woken by gpufeed_loader_interrupt.
 *
 * Batches. A batch is a set of named arrays ("images", "labels", and for
 * host batches "indices"; later versions may add more: find them by name,
 * never by a fixed count), each exported as a DLPack 0.6 DLManagedTensor
 * (Debian's libdlpack-dev, dlpack/dlpack.h) that views gpufeed's buffer. The
 * buffer is gpufeed's pool slot: it is reused only when the batch handle and
 * every tensor exported from it are released. Device batches (the GPU feed),
 * and host batches given a release stream, return their slot after the work
 * queued on that stream (gpufeed_batch_set_release_stream) at the time of
 * the last release.
 */
#ifndef GPUFEED_C_API_H_
#define GPUFEED_C_API_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GPUFEED_C_EXPORT __attribute__((visibility("default")))
#else
#define GPUFEED_C_EXPORT
#endif

/* Bumped on any incompatible change to this header (a removed or changed
 * call, struct or meaning). Added calls do not bump it. */
#define GPUFEED_C_API_VERSION 1

/* The library's version ("0.1.0") and the GPUFEED_C_API_VERSION it was built
 * with: a program compares the latter with its own header's. Thread-safe;
 * the string is static. */
GPUFEED_C_EXPORT const char* gpufeed_version(void);
GPUFEED_C_EXPORT int gpufeed_c_api_version(void);

/* ---- errors -------------------------------------------------------------- */

typedef enum {
  GPUFEED_OK = 0,
  /* The C++ StatusCode values, in order. */
  GPUFEED_INVALID_ARGUMENT = 1, /* bad option, bad spec, misuse (the message says which) */
  GPUFEED_NOT_FOUND = 2,        /* a file, dataset or daemon dataset that does not exist */
  GPUFEED_UNSUPPORTED = 3,      /* well-formed input gpufeed cannot handle */
  GPUFEED_CORRUPT = 4,          /* damaged bytes: truncated file, bad chunk, bad frame */
  GPUFEED_IO_ERROR = 5,         /* the OS or the connection failed */
  GPUFEED_INTERNAL = 6,         /* a library gpufeed calls failed unexpectedly */
  /* Outcomes of gpufeed_loader_next that are not failures of the stream. */
  GPUFEED_END = 100,        /* the epoch has no more batches */
  GPUFEED_TIMEOUT = 101,    /* no batch within the timeout; call again */
  GPUFEED_INTERRUPTED = 102 /* gpufeed_loader_interrupt woke the wait */
} gpufeed_code;

typedef struct gpufeed_error gpufeed_error;

/* The code and message of an error; the message lives until the error is
 * destroyed. Either call takes NULL (returns GPUFEED_OK / ""). */
GPUFEED_C_EXPORT gpufeed_code gpufeed_error_code(const gpufeed_error* error);
GPUFEED_C_EXPORT const char* gpufeed_error_message(const gpufeed_error* error);
/* Short stable name of a code: "NotFound", "Timeout", ... (static string). */
GPUFEED_C_EXPORT const char* gpufeed_code_name(gpufeed_code code);
GPUFEED_C_EXPORT void gpufeed_error_destroy(gpufeed_error* error); /* NULL is a no-op */

/* Frees memory this API returned with "free with gpufeed_free". */
GPUFEED_C_EXPORT void gpufeed_free(void* p);

/* ---- options --------------------------------------------------------------
 * One options object configures a loader: where it reads (file or daemon),
 * the C++ LoaderOptions, RemoteLoaderOptions and, when the feed is enabled,
 * FeedOptions. Defaults are the C++ structs' defaults (loader.h,
 * remote_loader.h, gpu_feed.h document each field). The loader copies the
 * options when it is opened; the object may then be destroyed. An options
 * object is not thread-safe; setters never fail: gpufeed_loader_open checks
 * every integer option's range and fails naming the setter and the value
 * (a -1 given to an unsigned setter shows as -1, not as 2^64 - 1); other
 * values are checked when the loader opens or the epoch starts, with a
 * message naming the option. */
typedef struct gpufeed_options gpufeed_options;
GPUFEED_C_EXPORT gpufeed_options* gpufeed_options_create(void);
GPUFEED_C_EXPORT void gpufeed_options_destroy(gpufeed_options* o); /* NULL is a no-op */

/* Every option by name, from one table (capi/options.cc), as DuckDB's
 * duckdb_set_config: gpufeed_options_set(o, "batch_size", "256") sets what
 * gpufeed_options_set_batch_size(o, 256) does, and checks it now:
 * INVALID_ARGUMENT for an unknown name (naming the nearest one), a value
 * that is not of the option's type ("bool": 1/true/yes/on or
 * 0/false/no/off; integers: whole numbers in the option's range) or out of
 * its range, naming the option, the value and the range. Strings naming a
 * choice ("order", "decode", ...) are checked when the loader opens.
 * gpufeed_options_get stores the option's value as text in *value (free
 * with gpufeed_free). The fields, feed_mean and feed_std have their own
 * setters below. Sizes (type "bytes": pool_bytes, cache_bytes) take a
 * byte count or a size as the CLI's flags do ("1GiB", "512MiB", "4G",
 * "512MB", "2GB"; "auto" for cache_bytes: half the memory available), and
 * gpufeed_options_get gives them back in bytes. The table is listed by
 * index: name, type ("uint64", "uint32", "int", "bool", "string" or
 * "bytes") and a line on what it is; NULL past the end. */
GPUFEED_C_EXPORT gpufeed_code gpufeed_options_set(gpufeed_options* o, const char* name, const char* value,
                                                  gpufeed_error** error);
GPUFEED_C_EXPORT gpufeed_code gpufeed_options_get(const gpufeed_options* o, const char* name, char** value,
                                                  gpufeed_error** error);
GPUFEED_C_EXPORT int gpufeed_option_count(void);
GPUFEED_C_EXPORT const char* gpufeed_option_name(int i);
GPUFEED_C_EXPORT const char* gpufeed_option_type(int i);
GPUFEED_C_EXPORT const char* gpufeed_option_doc(int i);
/* An integer option's values, [*least, *most], and 1; 0 for the others. */
GPUFEED_C_EXPORT int gpufeed_option_range(int i, int64_t* least, uint64_t* most);

/* LoaderOptions. order: "block" | "random" | "sequential". */
GPUFEED_C_EXPORT void gpufeed_options_set_batch_size(gpufeed_options* o, uint64_t v);
GPUFEED_C_EXPORT void gpufeed_options_set_order(gpufeed_options* o, const char* order);
GPUFEED_C_EXPORT void gpufeed_options_set_seed(gpufeed_options* o, uint64_t v);
GPUFEED_C_EXPORT void gpufeed_options_set_threads(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_prefetch(gpufeed_options* o, int v);
/* The batch pool's budget: fewer than prefetch + 1 buffers (3 at least)
   where that many batches would pass it; 0: no bound (default 2 GiB). */
GPUFEED_C_EXPORT void gpufeed_options_set_pool_bytes(gpufeed_options* o, uint64_t v);
GPUFEED_C_EXPORT void gpufeed_options_set_cache_bytes(gpufeed_options* o, uint64_t v);
GPUFEED_C_EXPORT void gpufeed_options_set_shuffle_window(gpufeed_options* o, uint64_t v);
GPUFEED_C_EXPORT void gpufeed_options_set_rank(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_world_size(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_drop_last(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_pin_memory(gpufeed_options* o, int v);

/* Opening a file: the labels dataset ("" = /labels when present, "none"),
 * and trust_files (OpenOptions::trust_files: skip the forked probe that
 * contains HDF5 crashes on hostile metadata; default 0). */
GPUFEED_C_EXPORT void gpufeed_options_set_labels_path(gpufeed_options* o, const char* path);
GPUFEED_C_EXPORT void gpufeed_options_set_trust_files(gpufeed_options* o, int v);
/* Direct-path I/O (OpenOptions::io): "auto" (direct when the file exceeds the
 * memory available to the page cache), "direct" (O_DIRECT; pread where
 * refused) or "buffered"; anything else fails gpufeed_loader_open. Unset:
 * auto, or the environment variable GPUFEED_IO. */
GPUFEED_C_EXPORT void gpufeed_options_set_io(gpufeed_options* o, const char* mode);

/* Named fields (OpenOptions::fields, fields.h): adds "NAME=/hdf5/path" to
 * the fields read, in order (a bad spec fails gpufeed_loader_open, naming
 * it). With fields, or with data naming many files (a glob such as "run*.h5", a
 * directory, a *.txt / *.list of paths), host batches carry one array per
 * field, named as the field, [B, *field shape] of the field's stored dtype
 * (h5py bool as uint8), plus "indices". The feed transforms the first field
 * as the image and delivers every later one, named as its field: a class as
 * int32/int64, integer masks of its pixels cropped and flipped with it, others
 * as stored (docs/format.md, "The GPU feed with fields"). max_open_files
 * bounds the files holding descriptors at once (default 256). A daemon's
 * fields are its own (gpufeed serve --data ... --field ...) and its batches
 * carry them the same way; fields added here must then equal them, in order
 * (InvalidArgument naming both otherwise). */
GPUFEED_C_EXPORT void gpufeed_options_add_field(gpufeed_options* o, const char* field);
GPUFEED_C_EXPORT void gpufeed_options_set_max_open_files(gpufeed_options* o, int v);
/* Each file holds one sample whose datasets have no sample axis (DeepCAM's
 * reference files: /climate/data [768, 1152, 16]); OpenOptions::no_sample_axis.
 * Default 0. */
GPUFEED_C_EXPORT void gpufeed_options_set_no_sample_axis(gpufeed_options* o, int v);
/* Directories, ':'-separated ("DIR:DIR"), that the files a dataset names
 * (external raw data, virtual-dataset sources, external links) may lie in
 * besides the dataset file's own (OpenOptions::allow_paths; also the
 * environment variable GPUFEED_ALLOW_PATHS). Default "": only the file's
 * own directory; a file reaching elsewhere fails gpufeed_loader_open with
 * INVALID_ARGUMENT naming the path. */
GPUFEED_C_EXPORT void gpufeed_options_set_allow_paths(gpufeed_options* o, const char* dirs);
/* Where a file's batches are made when a job runs several ranks on one host
 * (C++ SourceOptions::share): "node" (one node-local `gpufeed serve` for the
 * host's ranks, started by the first and ended after the last), "none" (a
 * loader in this process) or "auto" (the default: "node" under torchrun
 * with LOCAL_WORLD_SIZE > 1 unless labels_path, io or max_open_files is
 * set). Another value: gpufeed_loader_open fails with INVALID_ARGUMENT. */
GPUFEED_C_EXPORT void gpufeed_options_set_share(gpufeed_options* o, const char* v);

/* Encoded image datasets (gpufeed/encoded.h DecodeOptions; ignored for
 * others): output size (default 224 x 224), transform
 * ("random_resized_crop" | "center_crop"), layout ("NCHW" | "NHWC"), and
 * skip_corrupt (replace a sample that does not decode; default 0). A daemon
 * serving an encoded dataset decodes this client's batches with them. */
GPUFEED_C_EXPORT void gpufeed_options_set_image_height(gpufeed_options* o, uint32_t v);
GPUFEED_C_EXPORT void gpufeed_options_set_image_width(gpufeed_options* o, uint32_t v);
GPUFEED_C_EXPORT void gpufeed_options_set_image_transform(gpufeed_options* o, const char* transform);
GPUFEED_C_EXPORT void gpufeed_options_set_image_layout(gpufeed_options* o, const char* layout);
GPUFEED_C_EXPORT void gpufeed_options_set_skip_corrupt(gpufeed_options* o, int v);
/* Where an encoded image dataset's JPEGs are decoded when the feed is on
 * (C++ DecodeDevice): "gpu" (the GPU's JPEG decoder through nvJPEG, loaded at
 * run time; images it does not take are decoded by the loader), "cpu" (the
 * loader's threads) or "auto" (the default: "gpu" where the feed is on a GPU
 * and libnvjpeg makes a handle, else "cpu"). "gpu" where that is not so, or
 * another value: gpufeed_loader_open fails (UNSUPPORTED, INVALID_ARGUMENT)
 * naming why. gpufeed_loader_decode says what was chosen. */
GPUFEED_C_EXPORT void gpufeed_options_set_decode(gpufeed_options* o, const char* v);

/* RemoteLoaderOptions, used when the data argument is a daemon address. */
GPUFEED_C_EXPORT void gpufeed_options_set_dataset(gpufeed_options* o, const char* dataset);
GPUFEED_C_EXPORT void gpufeed_options_set_token(gpufeed_options* o, const char* token);
GPUFEED_C_EXPORT void gpufeed_options_set_token_file(gpufeed_options* o, const char* path);
GPUFEED_C_EXPORT void gpufeed_options_set_client_name(gpufeed_options* o, const char* name);
GPUFEED_C_EXPORT void gpufeed_options_set_compress(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_shared_memory(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_connect_timeout_ms(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_io_timeout_ms(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_keepalive_ms(gpufeed_options* o, int v);

/* FeedOptions. gpufeed_options_set_feed(o, 1) turns the feed on: batches are
 * then the GpuFeeder's normalized tensors (on the GPU, or on the CPU twins
 * where there is none or force_cpu is set) instead of the loader's uint8
 * ones. dtype: "float32" | "float16" | "bfloat16"; layouts: "NCHW" | "NHWC".
 * mean/std: `n` per-channel values in stored units (n = 0: the dataset's). */
GPUFEED_C_EXPORT void gpufeed_options_set_feed(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_device(gpufeed_options* o, int device);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_dtype(gpufeed_options* o, const char* dtype);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_layout(gpufeed_options* o, const char* layout);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_input_layout(gpufeed_options* o, const char* layout);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_mean(gpufeed_options* o, const double* mean, size_t n);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_std(gpufeed_options* o, const double* stddev, size_t n);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_echo(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_super_batch(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_crop_padding(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_flip(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_seed(gpufeed_options* o, uint64_t v);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_slots(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_labels_int32(gpufeed_options* o, int v);
GPUFEED_C_EXPORT void gpufeed_options_set_feed_force_cpu(gpufeed_options* o, int v);

/* ---- loader ---------------------------------------------------------------- */
typedef struct gpufeed_loader gpufeed_loader;
typedef struct gpufeed_batch gpufeed_batch;

/* Opens `data`: a dataset ("file.h5", "file.h5:/path") or a daemon address
 * ("unix:PATH", "tcp://HOST:PORT"; the dataset to read there and the token
 * come from the options). Returns NULL on failure (NotFound naming the file
 * or dataset, Corrupt, IOError naming the daemon, InvalidArgument for bad
 * options). The caller owns the loader (gpufeed_loader_destroy). */
GPUFEED_C_EXPORT gpufeed_loader* gpufeed_loader_open(const char* data, const gpufeed_options* options,
                                                     gpufeed_error** error);

/* Stops the epoch (its pipeline, connection and feed) and releases the
 * loader. Batches and tensors still held stay valid: the memory behind them
 * is freed when the last of them is released. A thread blocked in
 * gpufeed_loader_next on this loader must have returned first (interrupt it).
 * NULL is a no-op. */
GPUFEED_C_EXPORT void gpufeed_loader_destroy(gpufeed_loader* l);

/* What the loader reads, fixed at open. The strings live as long as the
 * loader. sample dims: the stored sample's shape ([C, H, W] or [H, W, C]);
 * dtype: the stored element type ("uint8", ...). num_samples: the whole
 * dataset, all ranks; num_batches: one epoch of this rank. */
GPUFEED_C_EXPORT const char* gpufeed_loader_name(const gpufeed_loader* l);
GPUFEED_C_EXPORT uint64_t gpufeed_loader_num_samples(const gpufeed_loader* l);
GPUFEED_C_EXPORT uint64_t gpufeed_loader_num_batches(const gpufeed_loader* l);
GPUFEED_C_EXPORT uint64_t gpufeed_loader_batch_size(const gpufeed_loader* l);
GPUFEED_C_EXPORT int gpufeed_loader_sample_ndim(const gpufeed_loader* l);
GPUFEED_C_EXPORT uint64_t gpufeed_loader_sample_dim(const gpufeed_loader* l, int i);
GPUFEED_C_EXPORT const char* gpufeed_loader_dtype(const gpufeed_loader* l);
GPUFEED_C_EXPORT int gpufeed_loader_has_labels(const gpufeed_loader* l);
/* 1 when batches are device memory (the feed on a GPU), else 0. Known after
 * the first gpufeed_loader_start_epoch; 0 before. */
GPUFEED_C_EXPORT int gpufeed_loader_on_gpu(const gpufeed_loader* l);
/* "node" when the loader reads through the node's server (share), else
 * "none"; and 1 when this process started that server. */
GPUFEED_C_EXPORT const char* gpufeed_loader_share(const gpufeed_loader* l);
/* Where the loader's images are decoded: "gpu (nvjpeg hardware)",
 * "gpu (nvjpeg gpu-hybrid)", "cpu (<why not the GPU>)", "server" (a daemon
 * decodes) or "none" (not an encoded image dataset). */
GPUFEED_C_EXPORT const char* gpufeed_loader_decode(const gpufeed_loader* l);
GPUFEED_C_EXPORT int gpufeed_loader_started_node_server(const gpufeed_loader* l);

/* Starts epoch `epoch` at batch `start_batch` (resume; 0: the start), ending
 * the previous epoch's stream. Batches of the previous epoch still held stay
 * valid. The order is a pure function of the options and (epoch, batch), so
 * a resumed epoch delivers exactly the batches a full one would from there.
 * With the feed on, start_batch counts loader batches and must be a multiple
 * of the feed's super_batch, with a fixed echo (not 0). Errors of the stream
 * (bad options, unreachable daemon) may also surface from the first next.
 * When next returns GPUFEED_END, a local loader starts the following epoch
 * at once (the last epoch + 1, or the same one if the last two starts were
 * of one epoch) so that its first batches are ready when it is asked for;
 * starting exactly that epoch at batch 0 takes it, any other start begins
 * anew. Until then next returns GPUFEED_END again and the statistics are the
 * ended epoch's. GPUFEED_NEXT_EPOCH_EARLY=0 in the environment turns it off.
 * Likewise a loader (local, or a daemon's) starts epoch 0 at batch 0 when it
 * is opened (its first batches read while the caller builds its model): the
 * first start of exactly that takes it; any other start, or a restore_state,
 * drops it.
 * GPUFEED_FIRST_EPOCH_EARLY=0 turns that off. */
GPUFEED_C_EXPORT gpufeed_code gpufeed_loader_start_epoch(gpufeed_loader* l, uint64_t epoch, uint64_t start_batch,
                                                         gpufeed_error** error);

/* Waits up to `timeout_ms` (< 0: no limit) for the epoch's next batch.
 * Returns GPUFEED_OK and a new batch in *batch (the caller owns it:
 * gpufeed_batch_destroy), GPUFEED_END at the end of the epoch,
 * GPUFEED_TIMEOUT (call again: the request stays queued, no batch is lost),
 * GPUFEED_INTERRUPTED after gpufeed_loader_interrupt, or the error that
 * ended the stream (with the message naming file, chunk or daemon). A
 * consumer that holds every pool slot (or every feed slot) gets
 * InvalidArgument naming the option to raise, not a hang. *batch is NULL
 * unless GPUFEED_OK. Without a started epoch: InvalidArgument. */
GPUFEED_C_EXPORT gpufeed_code gpufeed_loader_next(gpufeed_loader* l, int timeout_ms, gpufeed_batch** batch,
                                                  gpufeed_error** error);

/* Wakes a gpufeed_loader_next blocked on `l` (or the next one to block):
 * it returns GPUFEED_INTERRUPTED. Thread-safe, from any thread. */
GPUFEED_C_EXPORT void gpufeed_loader_interrupt(gpufeed_loader* l);

/* Where the consumer is: the epoch of the last start and how many of its
 * batches gpufeed_loader_next returned (with start_batch counted). With the
 * feed on, loader batches whose output batches were all returned. */
GPUFEED_C_EXPORT void gpufeed_loader_position(const gpufeed_loader* l, uint64_t* epoch, uint64_t* next_batch);

/* The position serialized (C++ LoaderState::Serialize: magic, version,
 * seed, epoch, batch, the shard, the order and dataset size) into a new
 * buffer of *size bytes; free with gpufeed_free. */
GPUFEED_C_EXPORT gpufeed_code gpufeed_loader_save_state(const gpufeed_loader* l, void** bytes, size_t* size,
                                                        gpufeed_error** error);
/* Parses saved state and starts its epoch at its batch. Fails with Corrupt
 * on damaged bytes and InvalidArgument when the state is another run's:
 * another seed, order (or shuffle window) or dataset size than the
 * loader's (the batches would not be those that remained; states saved
 * before the order and size were recorded are checked for the seed only),
 * or a world size or batch size it cannot resume at (gpufeed/loader.h,
 * ReshardFor). */
GPUFEED_C_EXPORT gpufeed_code gpufeed_loader_restore_state(gpufeed_loader* l, const void* bytes, size_t size,
                                                           gpufeed_error** error);
/* The checks of gpufeed_loader_restore_state alone, starting nothing: for a
 * caller that takes a state now and starts its epoch later (Python's
 * load_state_dict), so that another run's state is refused when it is
 * given. GPUFEED_OK when restore_state would take it; as the other loader
 * calls, not concurrent with another call on `l`. */
GPUFEED_C_EXPORT gpufeed_code gpufeed_loader_check_state(const gpufeed_loader* l, const void* bytes, size_t size,
                                                         gpufeed_error** error);

/* The current epoch's statistics (C++ LoaderStats and, with the feed,
 * FeedStats, and the session's first_batch_seconds and started_early:
 * SessionStats) as a JSON object of numbers in a new string; free with
 * gpufeed_free. Waits for a batch request still in flight. */
GPUFEED_C_EXPORT gpufeed_code gpufeed_loader_stats_json(gpufeed_loader* l, char** json, gpufeed_error** error);

/* ---- batches ---------------------------------------------------------------
 * A batch's accessors are read-only and may be called from any thread while
 * the caller holds the batch. */
/* The dtype name ("uint8", "bfloat16", ...) of a DLPack type code and bit
 * width, from the library's one dtype table; NULL for none it carries. */
GPUFEED_C_EXPORT const char* gpufeed_dtype_name_of_dlpack(uint8_t code, uint8_t bits);
GPUFEED_C_EXPORT uint64_t gpufeed_batch_epoch(const gpufeed_batch* b);
GPUFEED_C_EXPORT uint64_t gpufeed_batch_index(const gpufeed_batch* b); /* within the epoch */
GPUFEED_C_EXPORT uint64_t gpufeed_batch_size(const gpufeed_batch* b);  /* samples */
GPUFEED_C_EXPORT int gpufeed_batch_num_arrays(const gpufeed_batch* b);
/* Name of array i ("images", "labels", "indices"); NULL when i is out of
 * range. Static string. */
GPUFEED_C_EXPORT const char* gpufeed_batch_array_name(const gpufeed_batch* b, int i);
/* Index of the array named `name`, or -1. */
GPUFEED_C_EXPORT int gpufeed_batch_find_array(const gpufeed_batch* b, const char* name);

/* Exports array i as a new DLManagedTensor (DLPack 0.6) viewing the batch's
 * buffer: device kDLCUDA (the feed on a GPU) or kDLCPU, compact row-major
 * (strides NULL). The caller owns the tensor and calls its deleter exactly
 * once (or hands it to a consumer that will); the batch's slot returns when
 * the batch handle and every exported tensor are released, in any order,
 * from any thread. NULL with InvalidArgument when i is out of range. */
GPUFEED_C_EXPORT DLManagedTensor* gpufeed_batch_array_dlpack(gpufeed_batch* b, int i, gpufeed_error** error);

/* Calls t->deleter(t) when t and its deleter are not NULL: for FFIs that
 * cannot call a function pointer held in a struct. */
GPUFEED_C_EXPORT void gpufeed_dlpack_delete(DLManagedTensor* t);

/* A PyCapsule destructor (a PyObject* as void*) for a "dltensor" capsule that
 * owns a DLManagedTensor of this API: calls its deleter unless a consumer
 * took it (renamed "used_dltensor"). It runs no Python code, so a signal
 * cannot interrupt it half-way: a Python-level destructor swallowed Ctrl-C
 * (KeyboardInterrupt raised inside a ctypes callback is dropped) and leaked
 * the batch's slot. PyCapsule_IsValid and PyCapsule_GetPointer are looked up
 * in the process; gpufeed_dlpack_capsule_destructor_available() is 0 where
 * they are not found (then use a destructor of your own). */
GPUFEED_C_EXPORT void gpufeed_dlpack_capsule_destructor(void* capsule);
GPUFEED_C_EXPORT int gpufeed_dlpack_capsule_destructor_available(void);

/* Device batches: makes `stream` (a cudaStream_t; NULL: the legacy default
 * stream) wait on the device for the batch's transform (an event wait, no
 * host synchronization). A no-op for host batches. */
GPUFEED_C_EXPORT gpufeed_code gpufeed_batch_wait_stream(gpufeed_batch* b, void* stream, gpufeed_error** error);
/* The slot is reused only after the work queued on `stream` (a
 * cudaStream_t; NULL: the legacy default stream) when the batch's last
 * reference is released. Device batches: the default is the legacy default
 * stream; set it to the stream that reads the tensors. Host batches in
 * pinned memory: the default is the legacy default stream too, so that an
 * asynchronous copy to a GPU queued there (torch's x.cuda(non_blocking=True)
 * on its default stream) still reads this batch after its tensor is freed;
 * set it to the stream that copies them if that is another one (copies on
 * streams not named are not covered). Host batches in pageable memory, or
 * without CUDA (a CPU build, no device), are released at once. */
GPUFEED_C_EXPORT void gpufeed_batch_set_release_stream(gpufeed_batch* b, void* stream);

/* Releases the caller's handle. Tensors exported from the batch stay valid.
 * Thread-safe; NULL is a no-op. */
GPUFEED_C_EXPORT void gpufeed_batch_destroy(gpufeed_batch* b);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GPUFEED_C_API_H_ */
