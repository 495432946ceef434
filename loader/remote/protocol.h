// The daemon's wire protocol (docs/protocol.md): length-prefixed binary
// frames with a magic, a version, a type and an XXH3-64 checksum of header
// and payload; messages encoded little-endian with every length checked
// against a limit before anything is allocated.
//
// This file only encodes and decodes bytes; it does no I/O, so both the
// Asio server and the blocking client use it, and tests feed it garbage.
#ifndef GPUFEED_DAEMON_PROTOCOL_H_
#define GPUFEED_DAEMON_PROTOCOL_H_

#include <xxhash.h>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/encoded.h"
#include "gpufeed/loader.h"
#include "gpufeed/status.h"

namespace gpufeed::daemon {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian and is copied to and from memory as is");

inline constexpr uint32_t kMagic = 0x57465047;  // bytes "GPFW"
// 1: the first; 2: shared-memory batches (BATCH_REF, SLOTS); 3: named fields
// (HELLO_OK's field list, BATCH payloads field by field) and decode options
// in HELLO. A peer of another version is refused (docs/protocol.md).
// 4: HELLO carries the loader's reshard; 5: deferred decoding (HELLO's
// defer_decode, HELLO_OK's encoded_batches, a batch's encoded-sample table).
inline constexpr uint16_t kVersion = 5;
inline constexpr size_t kHeaderBytes = 32;

// Limits, checked before any allocation.
inline constexpr uint32_t kMaxControlPayload = 64 << 10;  // any frame but kBatch
inline constexpr uint32_t kMaxString = 4096;              // token, names, messages
inline constexpr uint32_t kMaxRank = 8;                   // sample rank (dims)
inline constexpr uint32_t kMaxChannels = 64;              // mean/std entries
inline constexpr uint64_t kMaxBatchSize = 1 << 20;        // samples per batch
inline constexpr uint32_t kMaxCredits = 1024;             // outstanding batches a client may grant
inline constexpr uint32_t kMaxShmSlots = 256;             // slots of a client's shared memory
inline constexpr uint32_t kMaxFields = 64;                // named fields of a sample (HELLO_OK)
inline constexpr uint64_t kMaxSampleBytes = 1ull << 31;   // one sample, all fields

enum class FrameType : uint16_t {
  kHello = 1,     // client -> server: token and stream parameters
  kHelloOk = 2,   // server -> client: what the stream delivers
  kCredit = 3,    // client -> server: permission to send N more batches
  kBatch = 4,     // server -> client: one batch
  kEnd = 5,       // server -> client: the epoch is complete
  kError = 6,     // either way: why the connection is being closed
  kShutdown = 7,  // server -> client: the daemon is stopping; resume elsewhere or later
  kBatchRef = 8,  // server -> client: one batch, its fields already in a shared-memory slot
  kSlots = 9,     // client -> server: these shared-memory slots may be filled
  kPing = 10,     // client -> server, empty: alive, holding every slot (resets the idle timeout)
};
std::string_view FrameTypeName(FrameType t);

inline constexpr uint32_t kFlagZstd = 1;  // payload is one zstd frame of raw_bytes bytes

struct FrameHeader {
  FrameType type = FrameType::kError;
  uint32_t flags = 0;
  uint32_t payload_bytes = 0;  // bytes on the wire after the header
  uint32_t raw_bytes = 0;      // payload bytes after decompression (== payload_bytes unless kFlagZstd)
  uint64_t checksum = 0;       // XXH3-64 of header bytes [0, 24) then the payload as sent
};

using HeaderBytes = std::array<std::byte, kHeaderBytes>;

// A header for a payload sent as the concatenation of `pieces`. `version`
// other than kVersion only for the ERROR frame that answers a peer of
// another version in its own (the header and ERROR layouts are the same in
// every version, so that peer can read why it is refused).
HeaderBytes MakeHeader(FrameType type, uint32_t flags, uint32_t raw_bytes,
                       std::initializer_list<std::span<const std::byte>> pieces, uint16_t version = kVersion);
HeaderBytes MakeHeader(FrameType type, uint32_t flags, uint32_t raw_bytes,
                       std::span<const std::span<const std::byte>> pieces, uint16_t version = kVersion);

// The version a header claims when its magic is ours (0 otherwise): lets a
// peer answer, or read, the ERROR frame of another version.
uint16_t HeaderVersion(std::span<const std::byte, kHeaderBytes> bytes);
// The message for a peer speaking `theirs`: which versions each side speaks
// and which side to upgrade.
std::string VersionMismatch(std::string_view peer, uint16_t theirs);

// Checks magic, version, type, flags and both lengths against `max_payload`
// (and raw_bytes against `max_raw`). `peer` names the other side in messages.
Result<FrameHeader> ParseHeader(std::span<const std::byte, kHeaderBytes> bytes, uint32_t max_payload, uint32_t max_raw,
                                std::string_view peer);

// Incremental checksum, for payloads read piece by piece.
class Checksum {
 public:
  explicit Checksum(std::span<const std::byte, kHeaderBytes> header);
  ~Checksum();
  Checksum(const Checksum&) = delete;
  Checksum& operator=(const Checksum&) = delete;
  void Update(std::span<const std::byte> bytes);
  uint64_t Digest() const;

 private:
  XXH3_state_t* state_;
};
Status VerifyChecksum(const FrameHeader& h, std::span<const std::byte, kHeaderBytes> header,
                      std::span<const std::byte> payload, std::string_view peer);

// zstd level 1 (fast enough for links slower than ~1 GB/s).
std::vector<std::byte> Compress(std::initializer_list<std::span<const std::byte>> pieces);
std::vector<std::byte> Compress(std::span<const std::span<const std::byte>> pieces);
Status Decompress(std::span<const std::byte> src, std::span<std::byte> dst, std::string_view peer);

// --- messages ---------------------------------------------------------------

struct Hello {
  std::string token;
  std::string dataset;      // one of the daemon's --data; empty: its first
  std::string client_name;  // for logs and metrics
  LoaderOptions loader;     // batch_size, order, seed, shuffle_window, rank, world_size, drop_last, reshard are sent
  uint64_t epoch = 0;
  uint64_t start_batch = 0;
  bool compress = false;
  bool describe_only = false;  // answer kHelloOk and close (RemoteLoader::Connect)
  // Shared memory (Unix sockets): the HELLO frame carries a sealed memfd
  // (SCM_RIGHTS) of shm_slots x shm_stride bytes, slot i (a batch, every
  // field of it, planar) at i x shm_stride. 0: batches travel in BATCH frames.
  uint32_t shm_slots = 0;
  uint64_t shm_stride = 0;
  // Encoded image datasets (gpufeed/encoded.h): how the daemon's Loader
  // decodes this stream's samples (output size, layout, transform,
  // skip_corrupt). Checked with ValidateDecodeOptions on decode; ignored
  // for datasets that are not encoded.
  DecodeOptions decode;
  // loader.defer_decode is sent too (version 5): the client's feed decodes
  // the JPEGs its device decoder takes, so the daemon leaves them encoded.
};

struct HelloOk {
  // name, dtype, sample_shape, sample_bytes, num_samples, batch_size,
  // has_labels, mean, stddev and fields are sent. Decoded fields are
  // checked (each shape's bytes, the sum of their bytes = sample_bytes) and
  // get their offsets (the running sum), as ChunkSource::fields() has them.
  // encoded_batches (version 5): the daemon leaves the samples a device
  // decoder takes encoded (the client asked, with loader.defer_decode, and
  // the dataset is encoded images); its batches then carry an encoded table.
  BatchSourceInfo info;
  uint64_t num_batches = 0;  // in this epoch, for this rank
  uint64_t client_id = 0;
  bool compress = false;
  bool shm = false;  // the daemon mapped the client's memfd: BATCH_REF frames, SLOTS grants
  // With info.encoded_batches (version 5): the bytes of a batch slot per
  // sample (SlotSampleBytes, loader/batch_pool.h), from sample_bytes to
  // kMaxSampleBytes: the daemon's Loader lays each batch out in a slot of
  // batch_size x this, so the client's slots (its pool, its shared memory)
  // are that size. 0 otherwise.
  uint64_t slot_sample_bytes = 0;
};

// One entry of a deferred batch's encoded table (EncodedSample): u64
// offset, u64 bytes, i32 height, i32 width, i32 crop top, left, height,
// width.
inline constexpr uint64_t kEncodedEntryBytes = 40;
// JPEG's largest side: an entry's image may be no larger.
inline constexpr int32_t kMaxImageSide = 65535;

// The part of a kBatch payload before the samples' bytes (every field's,
// field after field: count x the field's sample bytes each; or, for an
// encoded batch, the slot's first data_bytes bytes).
struct BatchHead {
  uint64_t epoch = 0;
  uint64_t index = 0;
  uint32_t count = 0;
  bool has_labels = false;
  // Deferred decoding (version 5, flags bit 1): an encoded table of count
  // entries follows the labels.
  bool encoded = false;
  uint64_t sample_bytes = 0;
  // Encoded batches: the end of the table's last sample in the slot
  // (EncodedTableEnd), the bytes a BATCH frame carries after its head.
  uint64_t data_bytes = 0;
  static constexpr size_t kFixedBytes = 32;
  // Fixed part + indices + labels (+ the encoded table).
  uint64_t head_bytes() const {
    return kFixedBytes + uint64_t{count} * 8 * (has_labels ? 2 : 1) + (encoded ? count * kEncodedEntryBytes : 0);
  }
  uint64_t payload_bytes() const { return head_bytes() + (encoded ? data_bytes : uint64_t{count} * sample_bytes); }
};

// A BATCH_REF payload: BatchHead's fixed part, the slot (u32, then 4 zero
// bytes), indices and labels (and an encoded batch's table); the fields (or
// the encoded samples) are in the slot.
struct BatchRef {
  BatchHead head;
  uint32_t slot = 0;
  static constexpr size_t kFixedBytes = BatchHead::kFixedBytes + 8;
  uint64_t payload_bytes() const { return head.head_bytes() + 8; }
};

struct End {
  uint64_t epoch = 0;
  uint64_t batches = 0;  // the epoch's batch count
};

struct ErrorMsg {
  StatusCode code = StatusCode::kInternal;
  std::string message;
};

std::vector<std::byte> EncodeHello(const Hello& m);
Result<Hello> DecodeHello(std::span<const std::byte> p);
std::vector<std::byte> EncodeHelloOk(const HelloOk& m);
Result<HelloOk> DecodeHelloOk(std::span<const std::byte> p);
std::vector<std::byte> EncodeCredit(uint32_t batches);
Result<uint32_t> DecodeCredit(std::span<const std::byte> p);
// The fixed part, indices and labels of `b` (and its encoded table when
// b.encoded() is not empty); its fields follow on the wire (BatchFieldBytes).
std::vector<std::byte> EncodeBatchHead(const Batch& b);
// The fixed part only (32 bytes); indices and labels are read by the caller.
Result<BatchHead> DecodeBatchFixed(std::span<const std::byte> p);
std::vector<std::byte> EncodeBatchRef(const Batch& b, uint32_t slot);
// The bytes of a batch on the wire after its head: field f's rows of `b`
// (b.field(f)), in field order; one span (b.images()) for a one-field batch;
// for an encoded batch, its buffer's first EncodedTableEnd bytes.
std::vector<std::span<const std::byte>> BatchFieldBytes(const Batch& b);
// Where the last entry of `table` ends in its slot (an encoded sample's
// bytes, a decoded one's sample_bytes): the bytes an encoded batch uses.
uint64_t EncodedTableEnd(std::span<const EncodedSample> table, uint64_t sample_bytes);
// An encoded table from the wire (`count` entries of kEncodedEntryBytes),
// checked as a hostile peer's: entries in slot order without overlap, each
// inside the slot's `slot_bytes`; an encoded one (bytes > 0) of an image of
// sides 1 to kMaxImageSide whose crop lies inside it; a decoded one (bytes
// 0, its sample_bytes at offset) with no size or crop. Corrupt naming the
// entry and the rule otherwise. Returns the table's end (EncodedTableEnd).
Result<uint64_t> DecodeEncodedTable(std::span<const std::byte> p, uint32_t count, uint64_t sample_bytes,
                                    uint64_t slot_bytes, std::vector<EncodedSample>* out);
// The fixed part and slot; checks that `p` is exactly as long as its count
// says. Indices and labels follow at BatchRef::kFixedBytes.
Result<BatchRef> DecodeBatchRef(std::span<const std::byte> p);
// SLOTS: a u32 count (1 to kMaxShmSlots) and that many u32 slot numbers.
std::vector<std::byte> EncodeSlots(std::span<const uint32_t> slots);
Result<std::vector<uint32_t>> DecodeSlots(std::span<const std::byte> p);
std::vector<std::byte> EncodeEnd(const End& m);
Result<End> DecodeEnd(std::span<const std::byte> p);
std::vector<std::byte> EncodeError(const ErrorMsg& m);
Result<ErrorMsg> DecodeError(std::span<const std::byte> p);

// A whole control frame (header + payload) in one buffer.
std::vector<std::byte> MakeFrame(FrameType type, std::span<const std::byte> payload);

// Compares in time independent of where the strings differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace gpufeed::daemon

#endif  // GPUFEED_DAEMON_PROTOCOL_H_
