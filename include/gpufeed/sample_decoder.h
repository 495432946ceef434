// SampleDecoder: the loader's decode stage (DALI's reader/decoder split).
// A source whose chunks hold encoded samples (ChunkSource::decodes_samples)
// serves their bytes (ChunkSource::EncodedBytes); the loader composes the
// decoder its samples need (ChunkSource::sample_decoder) and runs it in its
// own threads, straight into the batch. A corrupt sample's replacement
// (replaces_corrupt) is the loader's stage's, the same for every decoder.
//
// Two places decode images:
//   - on the host, here: MakeImageDecoder (libjpeg-turbo and libpng, the
//     crop and resize of DecodeOptions), one sample at a time;
//   - on the device, in the feed (gpu/image_decoder.h: nvJPEG batches and
//     its CPU twin), for the samples the loader leaves encoded
//     (LoaderOptions::defer_decode). PlanDevice is what the host stage tells
//     it of each sample: where the device decoder can take it, and its crop.
#ifndef GPUFEED_SAMPLE_DECODER_H_
#define GPUFEED_SAMPLE_DECODER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "gpufeed/crop_rect.h"
#include "gpufeed/status.h"

namespace gpufeed {

struct DecodeOptions;  // gpufeed/encoded.h

// What a decode may depend on besides the sample: random augmentation is a
// pure function of (seed, epoch, sample), never of threads or timing.
struct DecodeContext {
  uint64_t seed = 0;   // the loader's
  uint64_t epoch = 0;  // the stream's
};

// A sample a device decoder may take: its image's size, the box the host
// decoder would crop from it, and whether the device takes the stream
// (device_decodable false, with why_not: the host decodes it, so a corrupt
// or unusual stream meets the same checks and errors as on the CPU).
struct DevicePlan {
  int32_t height = 0, width = 0;  // the decoded image's size
  CropRect crop;                  // the box the host decoder would crop
  bool device_decodable = false;
  const char* why_not = "";  // a static string
};

class SampleDecoder {
 public:
  virtual ~SampleDecoder() = default;
  // "image decoder 224x224 NCHW random_resized_crop", for messages.
  virtual std::string name() const = 0;
  // Bytes of one decoded sample (the source's sample_bytes()).
  virtual uint64_t sample_bytes() const = 0;
  // Decodes one sample's encoded bytes into dst (sample_bytes()). An error
  // says what is wrong with the stream; the loader adds the source and the
  // sample. Thread-safe.
  virtual Status Decode(std::span<const std::byte> encoded, uint64_t sample, const DecodeContext& context,
                        std::span<std::byte> dst) const = 0;
  // True: a sample that does not decode is replaced by the next sample of
  // its chunk that does (DecodeOptions::skip_corrupt); false: it fails the
  // batch with an error naming it.
  virtual bool replaces_corrupt() const { return false; }
  // For a decoder on a device (LoaderOptions::defer_decode); reads headers
  // only. Thread-safe. Default: Unsupported (this decoder is host-only).
  virtual Status PlanDevice(std::span<const std::byte> encoded, uint64_t sample, const DecodeContext& context,
                            DevicePlan* plan) const {
    (void)encoded, (void)sample, (void)context, (void)plan;
    return Status::Unsupported(name() + ": no device decoding");
  }
};

// The host's image decoder for `decode`: JPEG or PNG by signature, the
// transform and crop of `decode` (its random choices drawn from
// (seed, epoch, sample)), 3 x height x width uint8 in decode.layout.
// InvalidArgument as ValidateDecodeOptions.
Result<std::shared_ptr<const SampleDecoder>> MakeImageDecoder(const DecodeOptions& decode);

}  // namespace gpufeed

#endif  // GPUFEED_SAMPLE_DECODER_H_
