// CPU image geometry used by the image-folder source: resize-to-cover plus
// center crop. Internal to hdf5io/ (and its tests); defined in image_ops.cc.
#ifndef GPUFEED_IMAGE_IMAGE_OPS_H_
#define GPUFEED_IMAGE_IMAGE_OPS_H_

#include <cstdint>
#include <span>

namespace gpufeed::image {

// Resizes an interleaved 8-bit image `src` (src_h x src_w x channels, rows
// packed) by scale = max(dst_h / src_h, dst_w / src_w), so it covers
// dst_h x dst_w, and writes the centered dst_h x dst_w window to `dst`
// (interleaved, packed).
//
// Sampling is bilinear with pixel-center alignment: output pixel o samples the
// source at (o + 0.5 - dst/2) / scale + src/2 - 0.5, so the centers of source
// and output coincide and a same-size call is an exact copy. Downscales by 2x
// or more first average k x k blocks (k = floor(1 / scale)) so that bilinear
// never skips source pixels (plain bilinear aliases badly past 2x).
//
// Requires all sizes > 0, src.size() == src_h * src_w * channels and
// dst.size() == dst_h * dst_w * channels. Thread-safe (scratch is per thread).
void ResizeCoverCrop(std::span<const uint8_t> src, int src_h, int src_w, int channels, std::span<uint8_t> dst,
                     int dst_h, int dst_w);

}  // namespace gpufeed::image

#endif  // GPUFEED_IMAGE_IMAGE_OPS_H_
