// The loader's decode stage: a batch whose source serves encoded samples
// (ChunkSource::decodes_samples) becomes decoded samples in its pool slot,
// or, with deferred decoding (LoaderOptions::defer_decode), the samples a
// device decoder takes packed encoded for the feed and the rest decoded
// here. The stage composes the source (which serves bytes) with a
// SampleDecoder (which decodes them); a sample that does not decode is
// replaced here (SampleDecoder::replaces_corrupt) whatever the decoder.
#ifndef GPUFEED_LOADER_DECODE_STAGE_H_
#define GPUFEED_LOADER_DECODE_STAGE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include "gpufeed/chunk_source.h"
#include "gpufeed/loader.h"
#include "gpufeed/logger.h"
#include "gpufeed/sample_decoder.h"

namespace gpufeed::loader {

class DecodeStage {
 public:
  // decoder: source.sample_decoder() unless a caller composes another of
  // the same sample_bytes(). logger: where a replaced sample is said (null:
  // stderr).
  DecodeStage(const ChunkSource& source, std::shared_ptr<const SampleDecoder> decoder,
              std::shared_ptr<Logger> logger = nullptr);

  // The sample's chunk, as the cache holds it.
  struct Where {
    std::span<const std::byte> chunk_bytes;  // what ReadChunk wrote
    uint64_t chunk = 0;
  };
  // Decodes sample `sample` of `where` into dst (sample_bytes()). *delivered
  // is the sample written: `sample`, or with replaces_corrupt the next
  // sample of its chunk that decodes (cyclically: a pure function of the
  // data, so a batch is the same whatever the thread count). Corrupt names
  // the source and the sample. Thread-safe.
  Status Decode(const Where& where, uint64_t sample, const DecodeContext& context, std::span<std::byte> dst,
                uint64_t* delivered) const;

  struct BatchOptions {
    bool defer = false;  // leave what a device decoder takes encoded
    // With defer: the share of the device-decodable samples decoded here
    // anyway (LoaderOptions::balance_decode), picked by a hash of
    // (seed, epoch, sample).
    double host_share = 0;
    // Non-null: each host decode's time is added here (and counted), the
    // measure behind host_share.
    std::atomic<uint64_t>* decode_ns = nullptr;
    std::atomic<uint64_t>* decodes = nullptr;
  };
  struct BatchCounts {
    uint64_t deferred = 0;              // left encoded for the device
    uint64_t balanced = 0;              // device-decodable, decoded here by the share
    uint64_t skipped = 0;               // replaced (replaces_corrupt)
    const char* host_reason = nullptr;  // why the last sample decoded here was not deferred
  };
  // The slot's `count` samples (slot.indices, their chunks in where[i]):
  // decoded in parallel into the slot, or deferred as above (slot.encoded,
  // slot.deferred). Rewrites slot.indices and slot.labels of replaced
  // samples. The first error, if any.
  Status DecodeBatch(std::span<const Where> where, uint64_t count, const DecodeContext& context,
                     const BatchOptions& options, Batch::Slot& slot, BatchCounts* counts) const;

  const SampleDecoder& decoder() const { return *decoder_; }

 private:
  const ChunkSource& source_;
  const std::shared_ptr<const SampleDecoder> decoder_;
  const std::shared_ptr<Logger> logger_;
};

}  // namespace gpufeed::loader

#endif  // GPUFEED_LOADER_DECODE_STAGE_H_
