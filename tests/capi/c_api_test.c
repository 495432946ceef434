/* The C API from a C program (compiled as C11 with -pedantic -Werror, so
 * gpufeed/c_api.h is proven to be C): writes an index-valued HDF5 file with
 * HDF5's C API, then checks through libgpufeed.so that every sample arrives
 * once per epoch with its own bytes and label, that DLPack tensors keep
 * their slot until released in any order, that saved state resumes with the
 * remaining batches, that the CPU feed normalizes, and that errors carry
 * codes and messages naming the file.
 *
 * Usage: gpufeed_c_api_test SCRATCH.h5 */
#include <hdf5.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpufeed/c_api.h"

enum { kN = 100, kC = 1, kH = 4, kW = 4, kSampleBytes = kC * kH * kW, kChunk = 8, kBatch = 16 };

static int failures = 0;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

/* Sample k: bytes 0, 1 are k (little-endian), byte j >= 2 is (3k + j) mod 256. */
static uint8_t SampleByte(uint64_t k, int j) {
  if (j == 0) return (uint8_t)(k & 0xff);
  if (j == 1) return (uint8_t)(k >> 8);
  return (uint8_t)((3 * k + (uint64_t)j) & 0xff);
}

static int WriteFile(const char* path) {
  static uint8_t images[kN][kSampleBytes];
  static int64_t labels[kN];
  for (int k = 0; k < kN; ++k) {
    for (int j = 0; j < kSampleBytes; ++j) images[k][j] = SampleByte((uint64_t)k, j);
    labels[k] = k % 10;
  }
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) return -1;
  hsize_t dims[4] = {kN, kC, kH, kW}, chunk[4] = {kChunk, kC, kH, kW};
  hid_t space = H5Screate_simple(4, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 4, chunk);
  H5Pset_deflate(dcpl, 4);
  hid_t d = H5Dcreate2(f, "images", H5T_NATIVE_UINT8, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  herr_t st = H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, images);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
  hsize_t ldims[1] = {kN};
  space = H5Screate_simple(1, ldims, NULL);
  d = H5Dcreate2(f, "labels", H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  st |= H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels);
  H5Dclose(d);
  H5Sclose(space);
  H5Fclose(f);
  return st < 0 ? -1 : 0;
}

static gpufeed_loader* Open(const char* path, int feed) {
  gpufeed_options* o = gpufeed_options_create();
  gpufeed_options_set_batch_size(o, kBatch);
  gpufeed_options_set_order(o, "block");
  gpufeed_options_set_shuffle_window(o, 2);
  gpufeed_options_set_seed(o, 7);
  gpufeed_options_set_threads(o, 2);
  gpufeed_options_set_prefetch(o, 2);
  gpufeed_options_set_pool_bytes(o, 1); /* 3 buffers, as prefetch 2 gives: the pool's floor */
  gpufeed_options_set_pin_memory(o, 0);
  if (feed) {
    gpufeed_options_set_feed(o, 1);
    gpufeed_options_set_feed_force_cpu(o, 1);
    gpufeed_options_set_feed_dtype(o, "float32");
    gpufeed_options_set_feed_labels_int32(o, 1);
  }
  gpufeed_error* err = NULL;
  gpufeed_loader* l = gpufeed_loader_open(path, o, &err);
  gpufeed_options_destroy(o);
  if (l == NULL) {
    fprintf(stderr, "open %s: %s\n", path, gpufeed_error_message(err));
    gpufeed_error_destroy(err);
  }
  return l;
}

/* One epoch (from start_batch): checks every row's bytes and label against
 * its index, counts indices in seen[], appends them to order[] (may be NULL). */
static uint64_t RunEpoch(gpufeed_loader* l, uint64_t epoch, uint64_t start_batch, int* seen, int64_t* order,
                         uint64_t max_batches) {
  gpufeed_error* err = NULL;
  CHECK(gpufeed_loader_start_epoch(l, epoch, start_batch, &err) == GPUFEED_OK);
  uint64_t n = 0, batches = 0;
  gpufeed_batch* b = NULL;
  gpufeed_code c;
  while (batches < max_batches && (c = gpufeed_loader_next(l, 10000, &b, &err)) == GPUFEED_OK) {
    CHECK(gpufeed_batch_epoch(b) == epoch);
    CHECK(gpufeed_batch_index(b) == start_batch + batches);
    const int ii = gpufeed_batch_find_array(b, "images"), li = gpufeed_batch_find_array(b, "labels"),
              xi = gpufeed_batch_find_array(b, "indices");
    CHECK(ii >= 0 && li >= 0 && xi >= 0 && gpufeed_batch_num_arrays(b) >= 3);
    CHECK(gpufeed_batch_array_name(b, gpufeed_batch_num_arrays(b)) == NULL);
    DLManagedTensor* im = gpufeed_batch_array_dlpack(b, ii, &err);
    DLManagedTensor* lb = gpufeed_batch_array_dlpack(b, li, &err);
    DLManagedTensor* ix = gpufeed_batch_array_dlpack(b, xi, &err);
    /* The handle may go before its tensors: they keep the slot. */
    const uint64_t rows = gpufeed_batch_size(b);
    gpufeed_batch_destroy(b);
    CHECK(im->dl_tensor.ndim == 4 && im->dl_tensor.shape[0] == (int64_t)rows && im->dl_tensor.shape[1] == kC &&
          im->dl_tensor.shape[2] == kH && im->dl_tensor.shape[3] == kW);
    CHECK(im->dl_tensor.dtype.code == kDLUInt && im->dl_tensor.dtype.bits == 8);
    CHECK(im->dl_tensor.device.device_type == kDLCPU && im->dl_tensor.strides == NULL);
    CHECK(lb->dl_tensor.dtype.code == kDLInt && lb->dl_tensor.dtype.bits == 64 &&
          lb->dl_tensor.shape[0] == (int64_t)rows);
    const uint8_t* px = (const uint8_t*)im->dl_tensor.data;
    const int64_t* lab = (const int64_t*)lb->dl_tensor.data;
    const int64_t* idx = (const int64_t*)ix->dl_tensor.data;
    for (uint64_t r = 0; r < rows; ++r) {
      const int64_t k = idx[r];
      CHECK(k >= 0 && k < kN);
      if (k < 0 || k >= kN) continue;
      ++seen[k];
      if (order != NULL) order[n] = k;
      ++n;
      CHECK(lab[r] == k % 10);
      for (int j = 0; j < kSampleBytes; ++j) CHECK(px[r * kSampleBytes + (uint64_t)j] == SampleByte((uint64_t)k, j));
    }
    gpufeed_dlpack_delete(lb);
    im->deleter(im);
    gpufeed_dlpack_delete(ix);
    ++batches;
  }
  if (batches < max_batches) CHECK(c == GPUFEED_END);
  return n;
}

/* The option table: every option by name, set and read back as text; the
 * typed setter and the generic one set the same field; bad names, types and
 * ranges are refused when set, naming what is wrong. */
static void TestOptionTable(void) {
  gpufeed_options* o = gpufeed_options_create();
  gpufeed_error* err = NULL;
  char* got = NULL;
  const int n = gpufeed_option_count();
  CHECK(n >= 40 && gpufeed_option_name(n) == NULL && gpufeed_option_name(-1) == NULL);
  for (int i = 0; i < n; ++i) {
    const char* name = gpufeed_option_name(i);
    const char* type = gpufeed_option_type(i);
    CHECK(name != NULL && type != NULL && gpufeed_option_doc(i) != NULL && gpufeed_option_doc(i)[0] != 0);
    /* A value of the type, within every option's range, that no default has. */
    const char* value = strcmp(type, "string") == 0 ? "some-text" : strcmp(type, "bool") == 0 ? "1" : "7";
    if (strcmp(name, "rank") == 0) value = "0";
    err = NULL;
    CHECK(gpufeed_options_set(o, name, value, &err) == GPUFEED_OK);
    if (err) fprintf(stderr, "%s\n", gpufeed_error_message(err)), gpufeed_error_destroy(err);
    CHECK(gpufeed_options_get(o, name, &got, NULL) == GPUFEED_OK && strcmp(got, value) == 0);
    gpufeed_free(got);
  }
  /* One field, two doors. */
  gpufeed_options_set_prefetch(o, 5);
  CHECK(gpufeed_options_get(o, "prefetch", &got, NULL) == GPUFEED_OK && strcmp(got, "5") == 0);
  gpufeed_free(got);
  CHECK(gpufeed_options_set(o, "seed", "18446744073709551615", NULL) == GPUFEED_OK); /* any uint64 */
  CHECK(gpufeed_options_get(o, "seed", &got, NULL) == GPUFEED_OK && strcmp(got, "18446744073709551615") == 0);
  gpufeed_free(got);
  CHECK(gpufeed_options_set(o, "drop_last", "false", NULL) == GPUFEED_OK);
  CHECK(gpufeed_options_get(o, "drop_last", &got, NULL) == GPUFEED_OK && strcmp(got, "0") == 0);
  gpufeed_free(got);
  /* Sizes by name as the CLI's flags and Python's keywords take them (issue
   * 50: Python took "1GiB" but not "auto", the CLI "auto" but not "1GiB"). */
  struct {
    const char *name, *value, *bytes;
  } sizes[] = {
      {"cache_bytes", "1GiB", "1073741824"},   {"cache_bytes", "512MB", "512000000"},
      {"pool_bytes", "1.5 GiB", "1610612736"}, {"pool_bytes", "4k", "4096"},
      {"cache_bytes", "123", "123"},
  };
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
    CHECK(gpufeed_options_set(o, sizes[i].name, sizes[i].value, NULL) == GPUFEED_OK);
    CHECK(gpufeed_options_get(o, sizes[i].name, &got, NULL) == GPUFEED_OK && strcmp(got, sizes[i].bytes) == 0);
    gpufeed_free(got);
  }
  CHECK(gpufeed_options_set(o, "cache_bytes", "auto", NULL) == GPUFEED_OK); /* half the memory available */
  CHECK(gpufeed_options_get(o, "cache_bytes", &got, NULL) == GPUFEED_OK && strtoull(got, NULL, 10) > 0);
  gpufeed_free(got);
  struct {
    const char *name, *value, *says;
  } bad[] = {
      {"batchsize", "8", "did you mean 'batch_size'"},
      {"batch_size", "0", "samples per batch, 1 to"},
      {"batch_size", "-1", "gpufeed_options_set(\"batch_size\", \"-1\")"},
      {"batch_size", "12x", "a whole number"},
      {"prefetch", "5000", "batches in flight, 1 to 4096"},
      {"drop_last", "maybe", "1/true/yes/on or 0/false/no/off"},
      {"image_height", "-3", "0 to 4294967295"},
      {"cache_bytes", "1 parsec", "a size such as 512MiB, 1GiB"},
      {"pool_bytes", "auto", "a size such as"}, /* auto only where it means something */
      {"cache_bytes", "-1", "a byte count"},
      {"cache_bytes", "99999999999TiB", "below 2^64"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
    err = NULL;
    CHECK(gpufeed_options_set(o, bad[i].name, bad[i].value, &err) == GPUFEED_INVALID_ARGUMENT);
    CHECK(err != NULL && strstr(gpufeed_error_message(err), bad[i].says) != NULL);
    if (err && !strstr(gpufeed_error_message(err), bad[i].says)) fprintf(stderr, "%s\n", gpufeed_error_message(err));
    gpufeed_error_destroy(err);
  }
  /* A refused value leaves the option as it was. */
  CHECK(gpufeed_options_get(o, "prefetch", &got, NULL) == GPUFEED_OK && strcmp(got, "5") == 0);
  gpufeed_free(got);
  CHECK(gpufeed_options_get(o, "nope", &got, NULL) == GPUFEED_INVALID_ARGUMENT);
  CHECK(gpufeed_options_set(NULL, "seed", "1", NULL) == GPUFEED_INVALID_ARGUMENT);
  gpufeed_options_destroy(o);
}

static void TestErrors(const char* path) {
  gpufeed_error* err = NULL;
  gpufeed_options* o = gpufeed_options_create();
  CHECK(gpufeed_loader_open("/nonexistent/x.h5", o, &err) == NULL);
  CHECK(gpufeed_error_code(err) == GPUFEED_NOT_FOUND);
  CHECK(strstr(gpufeed_error_message(err), "/nonexistent/x.h5") != NULL);
  CHECK(strcmp(gpufeed_code_name(gpufeed_error_code(err)), "NotFound") == 0);
  gpufeed_error_destroy(err);
  err = NULL;
  gpufeed_options_set_order(o, "sideways");
  CHECK(gpufeed_loader_open(path, o, &err) == NULL);
  CHECK(gpufeed_error_code(err) == GPUFEED_INVALID_ARGUMENT);
  CHECK(strstr(gpufeed_error_message(err), "sideways") != NULL);
  gpufeed_error_destroy(err);
  gpufeed_options_destroy(o);
  /* Integer options out of range: refused by open, naming the setter and the
   * value as the caller passed it (-1 through an unsigned setter is -1). */
  struct {
    void (*set_u64)(gpufeed_options*, uint64_t);
    void (*set_int)(gpufeed_options*, int);
    int64_t value;
    const char* text;
  } bad[] = {
      {gpufeed_options_set_batch_size, NULL, -1, "gpufeed_options_set_batch_size(-1)"},
      {gpufeed_options_set_batch_size, NULL, 0, "gpufeed_options_set_batch_size(0)"},
      {NULL, gpufeed_options_set_threads, -1, "gpufeed_options_set_threads(-1)"},
      {NULL, gpufeed_options_set_prefetch, 0, "gpufeed_options_set_prefetch(0)"},
      {NULL, gpufeed_options_set_rank, 2, "gpufeed_options_set_rank(2)"},
      {gpufeed_options_set_shuffle_window, NULL, -5, "gpufeed_options_set_shuffle_window(-5)"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
    o = gpufeed_options_create();
    gpufeed_options_set_world_size(o, 2);
    if (bad[i].set_u64) bad[i].set_u64(o, (uint64_t)bad[i].value);
    if (bad[i].set_int) bad[i].set_int(o, (int)bad[i].value);
    err = NULL;
    CHECK(gpufeed_loader_open(path, o, &err) == NULL);
    CHECK(gpufeed_error_code(err) == GPUFEED_INVALID_ARGUMENT);
    CHECK(strstr(gpufeed_error_message(err), bad[i].text) != NULL);
    gpufeed_error_destroy(err);
    gpufeed_options_destroy(o);
  }
  /* NULL error pointers are allowed: the code alone. */
  o = gpufeed_options_create();
  CHECK(gpufeed_loader_open("/nonexistent/x.h5", o, NULL) == NULL);
  gpufeed_options_destroy(o);
  /* next before an epoch started, and an interrupt. */
  gpufeed_loader* l = Open(path, 0);
  gpufeed_batch* b = NULL;
  err = NULL;
  CHECK(gpufeed_loader_next(l, 0, &b, &err) == GPUFEED_INVALID_ARGUMENT && b == NULL);
  gpufeed_error_destroy(err);
  CHECK(gpufeed_loader_start_epoch(l, 0, 0, NULL) == GPUFEED_OK);
  gpufeed_loader_interrupt(l);
  CHECK(gpufeed_loader_next(l, -1, &b, NULL) == GPUFEED_INTERRUPTED && b == NULL);
  CHECK(gpufeed_loader_next(l, -1, &b, NULL) == GPUFEED_OK && b != NULL); /* the queued request's batch */
  CHECK(gpufeed_batch_index(b) == 0);
  gpufeed_batch_destroy(b);
  /* Damaged state bytes. */
  err = NULL;
  CHECK(gpufeed_loader_restore_state(l, "garbage!garbage!", 16, &err) == GPUFEED_CORRUPT);
  gpufeed_error_destroy(err);
  gpufeed_loader_destroy(l);
}

static void TestResume(const char* path) {
  /* A full epoch 3 for reference, then 2 batches, save, restore in a new loader. */
  static int seen[kN];
  static int64_t full[kN], tail[kN];
  gpufeed_loader* l = Open(path, 0);
  memset(seen, 0, sizeof(seen));
  const uint64_t n = RunEpoch(l, 3, 0, seen, full, (uint64_t)-1);
  CHECK(n == kN);
  memset(seen, 0, sizeof(seen));
  CHECK(RunEpoch(l, 3, 0, seen, NULL, 2) == 2 * kBatch);
  uint64_t epoch = 0, next = 0;
  gpufeed_loader_position(l, &epoch, &next);
  CHECK(epoch == 3 && next == 2);
  void* bytes = NULL;
  size_t size = 0;
  CHECK(gpufeed_loader_save_state(l, &bytes, &size, NULL) == GPUFEED_OK && size > 0);
  gpufeed_loader_destroy(l);

  l = Open(path, 0);
  CHECK(gpufeed_loader_restore_state(l, bytes, size, NULL) == GPUFEED_OK);
  gpufeed_free(bytes);
  gpufeed_batch* b = NULL;
  uint64_t m = 0;
  while (gpufeed_loader_next(l, 10000, &b, NULL) == GPUFEED_OK) {
    DLManagedTensor* ix = gpufeed_batch_array_dlpack(b, gpufeed_batch_find_array(b, "indices"), NULL);
    for (int64_t r = 0; r < ix->dl_tensor.shape[0] && m < kN; ++r) tail[m++] = ((const int64_t*)ix->dl_tensor.data)[r];
    ix->deleter(ix);
    gpufeed_batch_destroy(b);
  }
  CHECK(m == kN - 2 * kBatch);
  CHECK(memcmp(tail, full + 2 * kBatch, m * sizeof(int64_t)) == 0);
  gpufeed_loader_destroy(l);
}

static void TestFeedCpu(const char* path) {
  gpufeed_loader* l = Open(path, 1);
  CHECK(gpufeed_loader_start_epoch(l, 0, 0, NULL) == GPUFEED_OK);
  CHECK(gpufeed_loader_on_gpu(l) == 0);
  gpufeed_batch* b = NULL;
  int batches = 0, rows = 0;
  while (gpufeed_loader_next(l, 10000, &b, NULL) == GPUFEED_OK) {
    CHECK(gpufeed_batch_find_array(b, "indices") < 0); /* echo may permute: no indices on the feed */
    DLManagedTensor* im = gpufeed_batch_array_dlpack(b, gpufeed_batch_find_array(b, "images"), NULL);
    DLManagedTensor* lb = gpufeed_batch_array_dlpack(b, gpufeed_batch_find_array(b, "labels"), NULL);
    CHECK(im->dl_tensor.dtype.code == kDLFloat && im->dl_tensor.dtype.bits == 32 && im->dl_tensor.ndim == 4);
    CHECK(lb->dl_tensor.dtype.code == kDLInt && lb->dl_tensor.dtype.bits == 32);
    const float* px = (const float*)im->dl_tensor.data;
    const int32_t* lab = (const int32_t*)lb->dl_tensor.data;
    for (int64_t r = 0; r < im->dl_tensor.shape[0]; ++r) {
      /* No mean/std attributes in the file: x / 255. Bytes 0, 1 give k back. */
      const int k = (int)(px[r * kSampleBytes] * 255.0f + 0.5f) + 256 * (int)(px[r * kSampleBytes + 1] * 255.0f + 0.5f);
      CHECK(lab[r] == k % 10);
      for (int j = 2; j < kSampleBytes; ++j) {
        const float want = (float)SampleByte((uint64_t)k, j) / 255.0f;
        CHECK(px[r * kSampleBytes + j] > want - 1e-6f && px[r * kSampleBytes + j] < want + 1e-6f);
      }
      ++rows;
    }
    CHECK(gpufeed_batch_wait_stream(b, NULL, NULL) == GPUFEED_OK); /* CPU twins: ready already */
    gpufeed_batch_set_release_stream(b, NULL);
    gpufeed_batch_destroy(b);
    lb->deleter(lb);
    im->deleter(im);
    ++batches;
  }
  CHECK(batches == (kN + kBatch - 1) / kBatch && rows == kN);
  char* json = NULL;
  CHECK(gpufeed_loader_stats_json(l, &json, NULL) == GPUFEED_OK);
  CHECK(json != NULL && strstr(json, "\"feed_fresh_batches\": 7") != NULL);
  gpufeed_free(json);
  gpufeed_loader_destroy(l);
}

/* Batches released on another thread than the one calling next: the
 * consumer hands each batch's tensors to a releaser thread through a small
 * queue; every sample still arrives once (the pool gets its slots back from
 * the other thread). Under ThreadSanitizer this is the C API's race check. */
/* One batch queued plus one being released: the consumer holds at most 2
 * of the pool's 3 buffers when it asks for the next, so the stream never
 * reports holding every buffer however late the releaser runs. */
enum { kQueue = 1 };
static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  DLManagedTensor* items[kQueue];
  int count, done;
} q = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {NULL}, 0, 0};

static void* Releaser(void* arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&q.mu);
    while (q.count == 0 && !q.done) pthread_cond_wait(&q.cv, &q.mu);
    if (q.count == 0) {
      pthread_mutex_unlock(&q.mu);
      return NULL;
    }
    DLManagedTensor* t = q.items[--q.count];
    pthread_cond_broadcast(&q.cv);
    pthread_mutex_unlock(&q.mu);
    t->deleter(t);
  }
}

static void TestReleaseOnAnotherThread(const char* path) {
  static int seen[kN];
  memset(seen, 0, sizeof(seen));
  gpufeed_loader* l = Open(path, 0);
  pthread_t th;
  pthread_create(&th, NULL, Releaser, NULL);
  CHECK(gpufeed_loader_start_epoch(l, 5, 0, NULL) == GPUFEED_OK);
  gpufeed_batch* b = NULL;
  while (gpufeed_loader_next(l, 10000, &b, NULL) == GPUFEED_OK) {
    DLManagedTensor* ix = gpufeed_batch_array_dlpack(b, gpufeed_batch_find_array(b, "indices"), NULL);
    gpufeed_batch_destroy(b); /* the tensor alone holds the slot now */
    for (int64_t r = 0; r < ix->dl_tensor.shape[0]; ++r) ++seen[((const int64_t*)ix->dl_tensor.data)[r]];
    pthread_mutex_lock(&q.mu);
    while (q.count == kQueue) pthread_cond_wait(&q.cv, &q.mu);
    q.items[q.count++] = ix;
    pthread_cond_broadcast(&q.cv);
    pthread_mutex_unlock(&q.mu);
  }
  pthread_mutex_lock(&q.mu);
  q.done = 1;
  pthread_cond_broadcast(&q.cv);
  pthread_mutex_unlock(&q.mu);
  pthread_join(th, NULL);
  for (int k = 0; k < kN; ++k) CHECK(seen[k] == 1);
  gpufeed_loader_destroy(l);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SCRATCH.h5\n", argv[0]);
    return 2;
  }
  CHECK(gpufeed_c_api_version() == GPUFEED_C_API_VERSION);
  CHECK(strlen(gpufeed_version()) > 0);
  if (WriteFile(argv[1]) != 0) {
    fprintf(stderr, "cannot write %s\n", argv[1]);
    return 1;
  }
  TestOptionTable();
  TestErrors(argv[1]);

  /* Two epochs: each sample exactly once in each; different orders. */
  static int seen[kN];
  static int64_t order0[kN], order1[kN];
  gpufeed_loader* l = Open(argv[1], 0);
  CHECK(l != NULL);
  if (l == NULL) return 1;
  CHECK(gpufeed_loader_num_samples(l) == kN);
  CHECK(gpufeed_loader_num_batches(l) == (kN + kBatch - 1) / kBatch);
  CHECK(gpufeed_loader_sample_ndim(l) == 3 && gpufeed_loader_sample_dim(l, 1) == kH);
  CHECK(strcmp(gpufeed_loader_dtype(l), "uint8") == 0 && gpufeed_loader_has_labels(l) == 1);
  CHECK(strstr(gpufeed_loader_name(l), argv[1]) != NULL);
  for (int e = 0; e < 2; ++e) {
    memset(seen, 0, sizeof(seen));
    CHECK(RunEpoch(l, (uint64_t)e, 0, seen, e == 0 ? order0 : order1, (uint64_t)-1) == kN);
    for (int k = 0; k < kN; ++k) CHECK(seen[k] == 1);
  }
  CHECK(memcmp(order0, order1, sizeof(order0)) != 0);
  char* json = NULL;
  CHECK(gpufeed_loader_stats_json(l, &json, NULL) == GPUFEED_OK && strstr(json, "\"samples\": 100") != NULL);
  gpufeed_free(json);

  /* A tensor held past its loader's destroy stays readable. */
  CHECK(gpufeed_loader_start_epoch(l, 0, 0, NULL) == GPUFEED_OK);
  gpufeed_batch* b = NULL;
  CHECK(gpufeed_loader_next(l, 10000, &b, NULL) == GPUFEED_OK);
  DLManagedTensor* ix = gpufeed_batch_array_dlpack(b, gpufeed_batch_find_array(b, "indices"), NULL);
  gpufeed_batch_destroy(b);
  gpufeed_loader_destroy(l);
  CHECK(((const int64_t*)ix->dl_tensor.data)[0] == order0[0]);
  ix->deleter(ix);

  TestResume(argv[1]);
  TestFeedCpu(argv[1]);
  TestReleaseOnAnotherThread(argv[1]);
  if (failures == 0) printf("c_api_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
