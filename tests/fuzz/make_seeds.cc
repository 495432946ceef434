// Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/): valid
// inputs made by gpufeed's own encoders, so the fuzzers start past the magic,
// version and checksum checks, plus edge cases (empty lists, zero sizes,
// truncations). Run by `scripts/fuzz --seeds`; the output is committed.
//   make_seeds OUT_DIR
#include <xxhash.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "loader/remote/protocol.h"
#include "gpufeed/loader.h"
#include "hdf5io/codec/codec.h"
#include "tests/fuzz/checkpoint_fixture.h"

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

namespace {

fs::path out_dir;

void Put(const std::string& target, const std::string& name, const void* p, size_t n) {
  fs::create_directories(out_dir / target);
  std::ofstream f(out_dir / target / name, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
}
void Put(const std::string& target, const std::string& name, const Bytes& b) { Put(target, name, b.data(), b.size()); }
// A selector byte in front of a payload.
Bytes With(uint8_t first, const Bytes& rest) {
  Bytes b{std::byte{first}};
  b.insert(b.end(), rest.begin(), rest.end());
  return b;
}
Bytes Of(const std::string& s) {
  Bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}
template <typename T>
void Append(Bytes& b, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  b.insert(b.end(), p, p + sizeof v);
}

void Protocol() {
  using namespace gpufeed::daemon;
  const std::string t = "protocol";
  Hello h;
  h.token = "tok";
  h.client_name = "rank0";
  h.loader.batch_size = 32;
  h.loader.world_size = 2;
  h.loader.rank = 1;
  h.shm_slots = 4;
  h.shm_stride = 4096;
  h.decode.height = 160;
  h.decode.width = 128;
  h.decode.layout = "NHWC";
  h.decode.transform = gpufeed::ImageTransform::kCenterCrop;
  const Bytes hello = EncodeHello(h);
  Put(t, "frame-hello", With(0, MakeFrame(FrameType::kHello, hello)));
  Put(t, "frame-ping", With(0, MakeFrame(FrameType::kPing, {})));
  Put(t, "hello", With(1, hello));
  Put(t, "hello-empty-strings", With(1, EncodeHello(Hello{.loader = {.batch_size = 1}})));
  Put(t, "hello-truncated", With(1, Bytes(hello.begin(), hello.begin() + hello.size() / 2)));
  Hello resumed = h;  // a run resumed at another world size (version 4)
  resumed.loader.reshard = {5, 3, 334, 96};
  Put(t, "hello-reshard", With(1, EncodeHello(resumed)));
  Hello defer = h;  // a client whose feed decodes JPEGs (version 5)
  defer.loader.defer_decode = true;
  Put(t, "hello-defer", With(1, EncodeHello(defer)));
  HelloOk ok;
  ok.info.name = "train.h5:/images";
  ok.info.dtype = gpufeed::DType::kUInt8;
  ok.info.sample_shape = {3, 4, 5};
  ok.info.sample_bytes = 60;
  ok.info.num_samples = 100;
  ok.info.batch_size = 8;
  ok.info.has_labels = true;
  ok.info.mean = {0.5, 0.25, 0.125};
  ok.info.stddev = {1, 2, 3};
  ok.num_batches = 13;
  ok.info.fields = {gpufeed::FieldInfo{"images", "/images", gpufeed::DType::kUInt8, false, {3, 4, 5}, 60, 0}};
  Put(t, "hello-ok", With(2, EncodeHelloOk(ok)));
  HelloOk encoded = ok;  // encoded batches in slots of 256 bytes a sample (version 5)
  encoded.info.encoded_batches = true;
  encoded.slot_sample_bytes = 256;
  Put(t, "hello-ok-encoded", With(2, EncodeHelloOk(encoded)));
  // Named fields (version 3): float32 [2, 3], bool [3], float64 scalar.
  HelloOk fields = ok;
  fields.info.sample_shape = {35};
  fields.info.sample_bytes = 35;
  fields.info.fields = {
      gpufeed::FieldInfo{"data", "/climate/data", gpufeed::DType::kFloat32, false, {2, 3}, 24, 0},
      gpufeed::FieldInfo{"mask", "/climate/mask", gpufeed::DType::kUInt8, true, {3}, 3, 0},
      gpufeed::FieldInfo{"target", "/y", gpufeed::DType::kFloat64, false, {}, 8, 0},
  };
  Put(t, "hello-ok-fields", With(2, EncodeHelloOk(fields)));
  ok.info.sample_shape.clear();
  ok.info.mean.clear();
  ok.info.stddev.clear();
  ok.info.sample_bytes = 1;
  ok.info.fields = {gpufeed::FieldInfo{"images", "", gpufeed::DType::kUInt8, false, {}, 1, 0}};
  Put(t, "hello-ok-scalar", With(2, EncodeHelloOk(ok)));
  Put(t, "credit", With(3, EncodeCredit(4)));
  Put(t, "credit-zero", With(3, EncodeCredit(0)));
  // BATCH / BATCH_REF heads (their encoders take a loader Batch): the fixed
  // part, then the slot, then indices and labels.
  Bytes head;
  Append<uint64_t>(head, 1);   // epoch
  Append<uint64_t>(head, 2);   // index
  Append<uint32_t>(head, 2);   // count
  Append<uint32_t>(head, 1);   // labels
  Append<uint64_t>(head, 60);  // sample bytes
  Put(t, "batch-fixed", With(4, head));
  Bytes ref = head;
  Append<uint32_t>(ref, 3);  // slot
  Append<uint32_t>(ref, 0);
  for (uint64_t v : {7ull, 9ull, 1ull, 0ull}) Append<uint64_t>(ref, v);  // indices, labels
  Put(t, "batch-ref", With(5, ref));
  // An encoded batch (version 5, flags bit 1): the table's entries after
  // the labels; one JPEG of 20 x 30 cropped 10 x 12 at (5, 6), one decoded.
  Bytes table;
  auto entry = [&](uint64_t offset, uint64_t bytes, std::vector<int32_t> dims) {
    Append<uint64_t>(table, offset);
    Append<uint64_t>(table, bytes);
    for (int32_t v : dims) Append<int32_t>(table, v);
  };
  entry(0, 300, {20, 30, 5, 6, 10, 12});
  entry(300, 0, {0, 0, 0, 0, 0, 0});
  Bytes ref_encoded = ref;
  ref_encoded[20] = std::byte{3};  // flags: labels | encoded
  ref_encoded.insert(ref_encoded.end(), table.begin(), table.end());
  Put(t, "batch-ref-encoded", With(5, ref_encoded));
  Bytes table_input;  // case 11: count, sample bytes, slot bytes / 256, entries
  Append<uint16_t>(table_input, 2);
  Append<uint16_t>(table_input, 60);
  Append<uint16_t>(table_input, 2);
  table_input.insert(table_input.end(), table.begin(), table.end());
  Put(t, "encoded-table", With(11, table_input));
  const uint32_t slots[] = {0, 1, 255};
  Put(t, "slots", With(6, EncodeSlots(slots)));
  Put(t, "slots-empty", With(6, EncodeSlots({})));
  Put(t, "end", With(7, EncodeEnd({.epoch = 3, .batches = 40})));
  Put(t, "error", With(8, EncodeError({gpufeed::StatusCode::kInvalidArgument, "batch size 0"})));
  Put(t, "error-empty", With(8, EncodeError({gpufeed::StatusCode::kInternal, ""})));
  const Bytes raw = Of(std::string(300, 'a') + "tail");
  Bytes zstd;
  Append<uint16_t>(zstd, static_cast<uint16_t>(raw.size()));
  const Bytes z = Compress({raw});
  zstd.insert(zstd.end(), z.begin(), z.end());
  Put(t, "zstd", With(9, zstd));
  Put(t, "ct-equal", With(10, Of("abcabc")));
}

void Codec() {
  using namespace gpufeed::codec;
  const std::string t = "codec";
  Bytes raw(600);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = std::byte(i % 7 == 0 ? i / 7 : 0);
  // Header: mode (filters = mode % 4, 0x80 round trip), filter bytes
  // (id = f % 8: shuffle, deflate, zstd, unsupported, then lzf, blosc, lz4,
  // bitshuffle, which have no encoder here: the fuzzer reaches them from
  // these seeds by mutation; elem size 1 + f >> 4),
  // mask, u16 decoded size, u16 wanted bytes; then the data.
  struct Case {
    const char* name;
    std::vector<uint8_t> filters;  // as the fuzz target reads them
  };
  const Case cases[] = {{"none", {}},
                        {"deflate", {1}},
                        {"zstd", {2}},
                        {"shuffle4-deflate", {0x30, 1}},
                        {"shuffle2-zstd", {0x10, 2}},
                        {"shuffle8-deflate-zstd", {0x70, 1, 2}}};
  for (const Case& c : cases) {
    std::vector<FilterStep> pipeline;
    for (uint8_t f : c.filters) {
      static constexpr int kIds[] = {kFilterShuffle, kFilterDeflate, kFilterZstd, 4};
      pipeline.push_back({kIds[f % 4], size_t{1} + (f >> 4)});  // every f here is < 4 mod 8
    }
    DecodeScratch scratch;
    Bytes stored;
    unsigned mask = 0;
    EncodeChunk(pipeline, 3, raw, stored, &mask, scratch);
    for (bool round_trip : {false, true}) {
      Bytes b{std::byte(c.filters.size() | (round_trip ? 0x80 : 0))};
      for (uint8_t f : c.filters) b.push_back(std::byte{f});
      b.push_back(std::byte(mask));
      Append<uint16_t>(b, static_cast<uint16_t>(raw.size()));
      Append<uint16_t>(b, static_cast<uint16_t>(raw.size() - 37));  // a partial last chunk
      const Bytes& data = round_trip ? raw : stored;
      b.insert(b.end(), data.begin(), data.end());
      Put(t, std::string(c.name) + (round_trip ? "-roundtrip" : "-stored"), b);
    }
  }
  Put(t, "empty-chunk", Bytes{std::byte{1}, std::byte{1}, std::byte{0}, std::byte{0}, std::byte{0}});
}

// A .npy file (format 1.0) with this header dict and payload.
Bytes Npy(const std::string& dict, size_t payload) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  Bytes b = Of(std::string("\x93NUMPY\x01\x00", 8));
  Append<uint16_t>(b, static_cast<uint16_t>(header.size()));
  const Bytes h = Of(header);
  b.insert(b.end(), h.begin(), h.end());
  for (size_t i = 0; i < payload; ++i) b.push_back(std::byte(i));
  return b;
}

void NpyCorpus() {
  const std::string t = "npy";
  Put(t, "u8-4x2x3", Npy("{'descr': '|u1', 'fortran_order': False, 'shape': (4, 2, 3), }", 24));
  Put(t, "f4-3x2", Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 24));
  Put(t, "i8-labels-5", Npy("{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }", 40 + 1));  // odd last byte
  Put(t, "u2-empty", Npy("{'descr': '<u2', 'fortran_order': False, 'shape': (0, 7), }", 0));
  Put(t, "fortran", Npy("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 2), }", 4));
  Put(t, "big-endian", Npy("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", 4));
  Put(t, "truncated", Npy("{'descr': '|u1', 'fortran_order': False, 'shape': (100, 100), }", 10));
}

// An IDX file: 00 00 08 rank, big-endian dims, the bytes.
Bytes Idx(const std::vector<uint32_t>& dims, size_t payload) {
  Bytes b{std::byte{0}, std::byte{0}, std::byte{8}, std::byte(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(std::byte((d >> s) & 0xff));
  }
  for (size_t i = 0; i < payload; ++i) b.push_back(std::byte(i * 13));
  return b;
}

Bytes Gzip(const Bytes& raw) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 16 + 15, 8, Z_DEFAULT_STRATEGY);  // 16: gzip wrapper
  Bytes out(deflateBound(&z, raw.size()) + 32);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(raw.data()));
  z.avail_in = static_cast<uInt>(raw.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

void IdxCorpus() {
  const std::string t = "idx";
  const Bytes images = Idx({5, 3, 4}, 60);
  Put(t, "images-5x3x4", images);
  Put(t, "images-5x3x4.gz", Gzip(images));
  Put(t, "labels-7", Idx({7}, 7));
  Put(t, "rank4-2x1x2x3", Idx({2, 1, 2, 3}, 12));
  Put(t, "zero-samples", Idx({0, 28, 28}, 0));
  Put(t, "truncated", Idx({10, 28, 28}, 100));
  const Bytes gz = Gzip(images);
  Put(t, "gzip-cut", Bytes(gz.begin(), gz.begin() + gz.size() / 2));
}

void LoaderStateCorpus() {
  gpufeed::LoaderState s;
  s.seed = 42;
  s.epoch = 3;
  s.next_batch = 17;
  s.world_size = 2;
  s.share = 500;
  s.consumed = 17 * 32;
  const std::string bytes = s.Serialize();
  Put("loader_state", "state", bytes.data(), bytes.size());
  Put("loader_state", "state-short", bytes.data(), 12);
  s.base = {3, 4, 250, 64};  // mid-way through an epoch resumed from 4 ranks
  const std::string resumed = s.Serialize();
  Put("loader_state", "state-resumed", resumed.data(), resumed.size());
}

void CheckpointCorpus() {
  using namespace gpufeed::trainer;
  CheckpointFixture f;
  CheckpointMeta meta = f.expect;
  meta.next_epoch = 2;
  meta.step = 40;
  meta.loader.seed = 1;
  meta.loader.epoch = 2;
  const fs::path tmp = out_dir / "checkpoint.tmp";
  if (!SaveCheckpoint(tmp.string(), f.ops.get(), f.model.get(), meta).ok()) gpufeed::fuzz::Fail("save");
  std::ifstream in(tmp, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(tmp);
  const Bytes whole = Of(file);
  // Even first byte: the payload, the target writes the header; odd: a whole file.
  Put("checkpoint", "payload", With(0, Bytes(whole.begin() + 32, whole.end())));
  Put("checkpoint", "file", With(1, whole));
  Put("checkpoint", "payload-other-model", With(0, Bytes(whole.begin() + 32, whole.begin() + 48)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  Protocol();
  Codec();
  NpyCorpus();
  IdxCorpus();
  LoaderStateCorpus();
  CheckpointCorpus();
  return 0;
}
