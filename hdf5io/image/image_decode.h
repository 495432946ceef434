// Decode-time image transforms for encoded samples: plan a crop box
// (random-resized-crop or resize + center crop), decode only what the box
// needs (libjpeg's DCT scaling, jpeg_crop_scanline, jpeg_skip_scanlines),
// and resample the box to the output size with an antialiased bilinear
// filter. Internal to hdf5io/ (and its tests and benchmarks).
#ifndef GPUFEED_IMAGE_IMAGE_DECODE_H_
#define GPUFEED_IMAGE_IMAGE_DECODE_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpufeed/crop_rect.h"
#include "gpufeed/decode_options.h"
#include "gpufeed/status.h"

namespace gpufeed::image {

// A crop in source pixels: CropRect (gpufeed/crop_rect.h).

// The counter-based generator behind every random choice: a pure function of
// its key, so a sample's crop depends on (seed, epoch, sample) only.
uint64_t RandomKey(uint64_t seed, uint64_t epoch, uint64_t sample);

// The crop box of an image of src_h x src_w for `options`:
//   kRandomResizedCrop: torchvision's RandomResizedCrop.get_params (10 tries
//     of an area fraction in [scale_min, scale_max] and a log-uniform aspect
//     ratio in [ratio_min, ratio_max] that fit, else the center crop clamped
//     to the ratio range), with randomness from `key`.
//   kCenterCrop: Resize(shorter side = min(out) / center_fraction) then
//     CenterCrop(out), expressed as a box in source pixels.
// Requires src_h, src_w > 0.
CropRect PlanCrop(int src_h, int src_w, const DecodeOptions& options, uint64_t key);

// Resamples the box (fractional, in pixels of `src`) of an interleaved RGB
// image src (h x w x 3) to out_h x out_w with PIL's antialiased bilinear
// filter (triangle of support max(1, scale)); writes dst planar (nchw) or
// interleaved. dst holds 3 * out_h * out_w bytes. Thread-safe.
void ResampleBox(const uint8_t* src, int h, int w, double box_y, double box_x, double box_h, double box_w, uint8_t* dst,
                 int out_h, int out_w, bool nchw);

// What a decode did, for tests and benchmarks.
struct DecodeStats {
  int scale_num = 8;            // DCT scale used, over 8
  bool partial = false;         // crop/skip decoding was used
  uint64_t decoded_pixels = 0;  // pixels produced by the decoder
};

// Decodes a JPEG or PNG (by signature) and applies options' transform with
// the crop from `key`, writing 3 x out_h x out_w bytes (options.layout) to
// dst. Greyscale becomes RGB; CMYK/YCCK (Adobe, inverted) becomes RGB; a
// PNG's alpha is composited over white and 16-bit samples are scaled
// (32768 -> 128).
// Corrupt data (libjpeg errors and warnings, truncation, an unknown
// signature) returns Corrupt with the reason (the caller adds the sample).
// Thread-safe (per-thread decompressors and scratch).
Status DecodeTransform(std::span<const uint8_t> bytes, const DecodeOptions& options, uint64_t key, uint8_t* dst,
                       DecodeStats* stats = nullptr);

// Decodes a whole JPEG or PNG (by signature) to interleaved RGB: a JPEG at
// the smallest DCT scale (1/8, 2/8, 4/8 or 8/8) whose size is still at least
// min_h x min_w (0 x 0: full size), a PNG at full size; h and w are the
// decoded size. Greyscale, CMYK, alpha and 16-bit PNGs as DecodeTransform.
// The image-folder source's decoder. Thread-safe.
Status DecodeCovering(std::span<const uint8_t> bytes, int min_h, int min_w, std::vector<uint8_t>* rgb, int* h, int* w);

// Full-size decode to interleaved RGB (the benchmark's ceiling and tests'
// reference); JPEG via libjpeg with the same settings as DecodeTransform.
Status DecodeFull(std::span<const uint8_t> bytes, std::vector<uint8_t>* rgb, int* h, int* w);

// Reads a JPEG's or PNG's size without decoding it.
Status ImageSize(std::span<const uint8_t> bytes, int* h, int* w);

// A JPEG's header, as a device decoder needs it before it is handed the
// stream (read with libjpeg up to the first scan; nothing decoded).
struct JpegInfo {
  int height = 0, width = 0;
  int components = 0;  // 1 (grey), 3 (YCbCr/RGB), 4 (CMYK/YCCK)
  int precision = 8;   // bits per sample
  bool progressive = false, arithmetic = false;
  bool adobe_cmyk = false;             // CMYK or YCCK colour space
  int h_samp[4] = {}, v_samp[4] = {};  // sampling factors per component
  bool ends_with_eoi = false;          // the stream's last marker is EOI (FF D9): not truncated
};
// Corrupt for a stream that is no JPEG or whose header libjpeg rejects.
Status ReadJpegInfo(std::span<const uint8_t> bytes, JpegInfo* info);

// Whether a stream of this header goes to the GPU's JPEG decoder (nvJPEG's
// hardware engine takes baseline and extended sequential Huffman JPEGs of 8
// bits with 1 or 3 components in 4:4:4, 4:2:2, 4:2:0 or 4:4:0; the rest —
// progressive, arithmetic, CMYK, 4:1:1, 12-bit, truncated — is decoded on the
// CPU). Returns nullptr when it does, else why not (a static string, for
// the stats). Side limit: kMaxDeviceDecodeSide.
constexpr int kMaxDeviceDecodeSide = 16384;
const char* DeviceUndecodableReason(const JpegInfo& info);

}  // namespace gpufeed::image

#endif  // GPUFEED_IMAGE_IMAGE_DECODE_H_
