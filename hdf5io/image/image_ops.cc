// Resize-to-cover + center crop of hdf5io/image/image_ops.h (the image-folder
// source's CPU geometry).
#include "hdf5io/image/image_ops.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <span>
#include <vector>

namespace gpufeed {

// ---------------------------------------------------------------------------
// Resize + center crop (declared in hdf5io/image/image_ops.h).

namespace image {
namespace {

// Averages k x k blocks of `src` into `out` (ceil(h/k) x ceil(w/k)). Edge
// blocks average only the pixels that exist; their centers are then off by
// under half a block, which nobody can see at the scales where this runs.
void BoxShrink(std::span<const uint8_t> src, int h, int w, int channels, int k, std::vector<uint8_t>* out, int* out_h,
               int* out_w) {
  const int oh = (h + k - 1) / k, ow = (w + k - 1) / k;
  out->resize(static_cast<size_t>(oh) * ow * channels);
  std::vector<uint32_t> sums(static_cast<size_t>(ow) * channels);
  for (int by = 0; by < oh; ++by) {
    std::fill(sums.begin(), sums.end(), 0u);
    const int y_end = std::min(h, (by + 1) * k);
    for (int y = by * k; y < y_end; ++y) {
      const uint8_t* row = src.data() + static_cast<size_t>(y) * w * channels;
      for (int x = 0; x < w; ++x) {
        uint32_t* s = &sums[static_cast<size_t>(x / k) * channels];
        for (int c = 0; c < channels; ++c) s[c] += row[x * channels + c];
      }
    }
    const int rows = y_end - by * k;
    uint8_t* orow = out->data() + static_cast<size_t>(by) * ow * channels;
    for (int bx = 0; bx < ow; ++bx) {
      const uint32_t n = static_cast<uint32_t>(rows * (std::min(w, (bx + 1) * k) - bx * k));
      for (int c = 0; c < channels; ++c) {
        orow[bx * channels + c] = static_cast<uint8_t>((sums[bx * channels + c] + n / 2) / n);
      }
    }
  }
  *out_h = oh;
  *out_w = ow;
}

// One output coordinate's two source taps and the weight of the second.
struct Tap {
  int i0, i1;
  float frac;
};

// Taps for an output axis of dst_n pixels over a (possibly k-shrunk) source
// axis of src_n pixels whose unshrunk length was full_n. See image_ops.h for
// the mapping; dividing by k converts original to shrunk pixel units.
std::vector<Tap> AxisTaps(int dst_n, int src_n, int full_n, double scale, int k) {
  std::vector<Tap> taps(dst_n);
  for (int o = 0; o < dst_n; ++o) {
    double s = ((o + 0.5 - dst_n / 2.0) / scale + full_n / 2.0) / k - 0.5;
    s = std::clamp(s, 0.0, static_cast<double>(src_n - 1));
    const int i0 = static_cast<int>(s);
    taps[o] = {i0, std::min(i0 + 1, src_n - 1), static_cast<float>(s - i0)};
  }
  return taps;
}

}  // namespace

void ResizeCoverCrop(std::span<const uint8_t> src, int src_h, int src_w, int channels, std::span<uint8_t> dst,
                     int dst_h, int dst_w) {
  assert(src_h > 0 && src_w > 0 && dst_h > 0 && dst_w > 0 && channels > 0);
  assert(src.size() == static_cast<size_t>(src_h) * src_w * channels);
  assert(dst.size() == static_cast<size_t>(dst_h) * dst_w * channels);
  if (src_h == dst_h && src_w == dst_w) {
    std::memcpy(dst.data(), src.data(), dst.size());
    return;
  }
  const double scale = std::max(static_cast<double>(dst_h) / src_h, static_cast<double>(dst_w) / src_w);
  thread_local std::vector<uint8_t> shrunk;
  std::span<const uint8_t> s = src;
  int h = src_h, w = src_w, k = 1;
  if (scale <= 0.5) {
    k = static_cast<int>(1.0 / scale);
    BoxShrink(src, src_h, src_w, channels, k, &shrunk, &h, &w);
    s = shrunk;
  }
  const std::vector<Tap> xs = AxisTaps(dst_w, w, src_w, scale, k);
  const std::vector<Tap> ys = AxisTaps(dst_h, h, src_h, scale, k);
  const size_t src_row = static_cast<size_t>(w) * channels;
  for (int oy = 0; oy < dst_h; ++oy) {
    const uint8_t* r0 = s.data() + ys[oy].i0 * src_row;
    const uint8_t* r1 = s.data() + ys[oy].i1 * src_row;
    const float fy = ys[oy].frac;
    uint8_t* out = dst.data() + static_cast<size_t>(oy) * dst_w * channels;
    for (int ox = 0; ox < dst_w; ++ox) {
      const int a = xs[ox].i0 * channels, b = xs[ox].i1 * channels;
      const float fx = xs[ox].frac;
      for (int c = 0; c < channels; ++c) {
        const float top = r0[a + c] + (r0[b + c] - r0[a + c]) * fx;
        const float bottom = r1[a + c] + (r1[b + c] - r1[a + c]) * fx;
        const float v = top + (bottom - top) * fy;
        out[ox * channels + c] = static_cast<uint8_t>(std::clamp(v + 0.5f, 0.0f, 255.0f));
      }
    }
  }
}

}  // namespace image

}  // namespace gpufeed
