// Decode-time crop, scale and resample of encoded images (image_decode.h).
// JPEG through the libjpeg API (not TurboJPEG 2, which cannot crop): DCT
// scaling, jpeg_crop_scanline and jpeg_skip_scanlines decode only the rows
// and columns of the crop box, at the smallest scale that still covers the
// output; rows below the box are never decoded.
#include "hdf5io/image/image_decode.h"

#include <png.h>
#include <setjmp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#include "hdf5io/image/image_ops.h"

namespace gpufeed {

Status ValidateDecodeOptions(const DecodeOptions& o) {
  constexpr uint32_t kMaxSide = 1u << 15;
  if (o.height == 0 || o.width == 0 || o.height > kMaxSide || o.width > kMaxSide) {
    return Status::InvalidArgument("decode output size " + std::to_string(o.height) + "x" + std::to_string(o.width) +
                                   " is invalid; set height and width to 1.." + std::to_string(kMaxSide));
  }
  if (!kLayoutNames.Find(o.layout)) {
    return Status::InvalidArgument("decode layout '" + o.layout + "' is not " + kLayoutNames.List());
  }
  if (!(o.scale_min > 0 && o.scale_min <= o.scale_max && o.scale_max <= 1.0)) {
    return Status::InvalidArgument("random-resized-crop scale range (" + std::to_string(o.scale_min) + ", " +
                                   std::to_string(o.scale_max) + ") must satisfy 0 < min <= max <= 1");
  }
  if (!(o.ratio_min > 0 && o.ratio_min <= o.ratio_max && std::isfinite(o.ratio_max))) {
    return Status::InvalidArgument("random-resized-crop ratio range (" + std::to_string(o.ratio_min) + ", " +
                                   std::to_string(o.ratio_max) + ") must satisfy 0 < min <= max");
  }
  if (!(o.center_fraction > 0 && o.center_fraction <= 1.0)) {
    return Status::InvalidArgument("center-crop fraction " + std::to_string(o.center_fraction) +
                                   " must be in (0, 1] (0.875: 224 of 256)");
  }
  return Status::Ok();
}

namespace image {
namespace {

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double Uniform(uint64_t* state) { return static_cast<double>(SplitMix(state) >> 11) * 0x1.0p-53; }
// Uniform integer in [lo, hi] (torch.randint(lo, hi + 1)).
int RandInt(uint64_t* state, int lo, int hi) {
  return lo + static_cast<int>(std::min<double>(hi - lo, std::floor(Uniform(state) * (hi - lo + 1))));
}

constexpr int kMaxDecodeSide = 65535;               // JPEG's own limit
constexpr uint64_t kMaxDecodedPixels = 1ull << 28;  // 768 MiB of RGB: past this a header lies

// ---------------------------------------------------------------------------
// libjpeg with errors as values: error_exit and (corrupt-data) warnings
// longjmp back to the decode call, which returns Corrupt.

struct ErrorMgr {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void OnError(j_common_ptr c) {
  auto* e = reinterpret_cast<ErrorMgr*>(c->err);
  (*c->err->format_message)(c, e->message);
  longjmp(e->jump, 1);
}
// Warnings are fatal: libjpeg warns on truncated or damaged entropy data and
// then makes up the missing pixels (grey), which must not become a sample.
void OnMessage(j_common_ptr c, int level) {
  if (level < 0) OnError(c);
}

struct Decompressor {
  jpeg_decompress_struct cinfo;
  ErrorMgr err;
  Decompressor() {
    std::memset(&cinfo, 0, sizeof(cinfo));
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = OnError;
    err.pub.emit_message = OnMessage;
    err.message[0] = 0;
    jpeg_create_decompress(&cinfo);
  }
  ~Decompressor() { jpeg_destroy_decompress(&cinfo); }
};

Decompressor& ThreadDecompressor() {
  thread_local Decompressor d;
  return d;
}

bool LooksLikeJpeg(std::span<const uint8_t> b) { return b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF; }
bool LooksLikePng(std::span<const uint8_t> b) {
  static constexpr uint8_t kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return b.size() >= 8 && std::memcmp(b.data(), kSig, 8) == 0;
}

// What one libjpeg pass produced: rows [y0, y0 + rows) and columns
// [x0, x0 + cols) of the image scaled to sh x sw, as interleaved RGB in out.
struct Decoded {
  int h = 0, w = 0;    // image size
  int sh = 0, sw = 0;  // scaled image size
  int y0 = 0, x0 = 0, rows = 0, cols = 0;
  int scale_num = 8;
  bool partial = false;
};

// The libjpeg scale (num/8) for a pass: the smallest that keeps the box at
// least min_h x min_w (0: full size).
int ScaleFor(const CropRect& b, int min_h, int min_w) {
  if (min_h > 0 && min_w > 0) {
    // Only 1/8, 2/8, 4/8 and 8/8: libjpeg-turbo has SIMD IDCTs for those;
    // the others (7/8, 6/8, ...) run plain C IDCTs of odd sizes (and 14x14,
    // 12x12 for subsampled chroma) that cost more than they save.
    for (int n : {1, 2, 4}) {
      // libjpeg's scaled size is ceil(size * n / 8); the box's scaled extent
      // is at least floor(extent * n / 8).
      if (int64_t(b.width) * n / 8 >= min_w && int64_t(b.height) * n / 8 >= min_h) return n;
    }
  }
  return 8;
}

// Rows [y0, y1) and columns [x0, x1) of the image scaled to sh x sw that
// cover the box, widened to whole pixels; a pass that is not partial
// decodes every column and the rows from the top.
struct ScaledRows {
  int y0, y1, x0, x1;
};
ScaledRows ScaledBox(const CropRect& b, int h, int w, int sh, int sw, bool partial) {
  int y0 = static_cast<int>(std::floor(double(b.top) * sh / h));
  int y1 = static_cast<int>(std::ceil(double(b.top + b.height) * sh / h));
  int x0 = static_cast<int>(std::floor(double(b.left) * sw / w));
  int x1 = static_cast<int>(std::ceil(double(b.left + b.width) * sw / w));
  y0 = std::clamp(y0, 0, sh - 1);
  x0 = std::clamp(x0, 0, sw - 1);
  y1 = std::clamp(y1, y0 + 1, sh);
  x1 = std::clamp(x1, x0 + 1, sw);
  if (!partial) {
    y0 = 0;
    x0 = 0;
    x1 = sw;
  }
  return {y0, y1, x0, x1};
}

// n pixels of CMYK as RGB. Photoshop (the source of nearly all CMYK JPEGs)
// stores inverted CMYK: R = stored C * stored K / 255 (as OpenCV and Pillow
// do).
void CmykToRgb(const std::vector<uint8_t>& cmyk, size_t n, std::vector<uint8_t>* out) {
  out->resize(n * 3);
  for (size_t i = 0; i < n; ++i) {
    const unsigned k = cmyk[i * 4 + 3];
    for (int c = 0; c < 3; ++c) (*out)[i * 3 + c] = static_cast<uint8_t>((cmyk[i * 4 + c] * k + 127) / 255);
  }
}

// One libjpeg pass. `box` in source pixels (null: the whole image);
// min_h/min_w: the scale picked is the smallest n/8 that keeps the box at
// least that large (0: full size). partial: crop columns and skip rows.
// Plain C data only between setjmp and the calls that can longjmp.
bool JpegPass(std::span<const uint8_t> bytes, const CropRect* box, int min_h, int min_w, bool partial,
              std::vector<uint8_t>* out, Decoded* d, std::string* why, const DecodeOptions* plan = nullptr,
              uint64_t key = 0, CropRect* planned = nullptr) {
  Decompressor& dc = ThreadDecompressor();
  jpeg_decompress_struct* ci = &dc.cinfo;
  static thread_local std::vector<uint8_t> cmyk;
  if (setjmp(dc.err.jump)) {
    *why = dc.err.message;
    jpeg_abort_decompress(ci);
    return false;
  }
  jpeg_mem_src(ci, bytes.data(), static_cast<unsigned long>(bytes.size()));
  if (jpeg_read_header(ci, TRUE) != JPEG_HEADER_OK) {
    *why = "no image in the JPEG stream (tables only)";
    jpeg_abort_decompress(ci);
    return false;
  }
  const int w = static_cast<int>(ci->image_width), h = static_cast<int>(ci->image_height);
  if (w <= 0 || h <= 0 || w > kMaxDecodeSide || h > kMaxDecodeSide) {
    *why = "JPEG header holds an invalid image size " + std::to_string(w) + "x" + std::to_string(h);
    jpeg_abort_decompress(ci);
    return false;
  }
  const CropRect full{0, 0, h, w};
  // The crop is planned here, from this header, when the caller has none
  // (one header parse per sample).
  const CropRect b = box ? *box : plan ? PlanCrop(h, w, *plan, key) : full;
  if (planned) *planned = b;
  d->h = h;
  d->w = w;
  const int num = ScaleFor(b, min_h, min_w);
  ci->scale_num = static_cast<unsigned>(num);
  ci->scale_denom = 8;
  const bool cmyk_in = ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK;
  ci->out_color_space = cmyk_in ? JCS_CMYK : JCS_RGB;  // libjpeg-turbo converts greyscale to RGB itself
  jpeg_calc_output_dimensions(ci);
  const int sw = static_cast<int>(ci->output_width), sh = static_cast<int>(ci->output_height);
  const ScaledRows sb = ScaledBox(b, h, w, sh, sw, partial);
  const int y0 = sb.y0, y1 = sb.y1, x0 = sb.x0, x1 = sb.x1;
  if (uint64_t(y1 - y0) * uint64_t(x1 - x0) > kMaxDecodedPixels) {
    *why = "JPEG of " + std::to_string(w) + "x" + std::to_string(h) + " is too large to decode";
    jpeg_abort_decompress(ci);
    return false;
  }
  jpeg_start_decompress(ci);
  JDIMENSION xoff = static_cast<JDIMENSION>(x0), cols = static_cast<JDIMENSION>(x1 - x0);
  if (partial && (x0 > 0 || x1 < sw)) jpeg_crop_scanline(ci, &xoff, &cols);  // widens to iMCU edges
  if (partial && y0 > 0) {
    const JDIMENSION skipped = jpeg_skip_scanlines(ci, static_cast<JDIMENSION>(y0));
    if (skipped != static_cast<JDIMENSION>(y0)) {
      *why = "JPEG ended while skipping to row " + std::to_string(y0);
      jpeg_abort_decompress(ci);
      return false;
    }
  }
  const int comps = ci->output_components;  // 3, or 4 for CMYK
  const int rows = y1 - y0;
  std::vector<uint8_t>& dest = cmyk_in ? cmyk : *out;
  dest.resize(size_t(rows) * cols * comps);
  // Up to 16 rows a call (as TurboJPEG reads): the upsampler then writes
  // whole row groups in place instead of through its spare row.
  JSAMPROW rowp[16];
  while (static_cast<int>(ci->output_scanline) < y1) {
    const int at = static_cast<int>(ci->output_scanline);
    const int want = std::min(16, y1 - at);
    for (int r = 0; r < want; ++r) rowp[r] = dest.data() + size_t(at - y0 + r) * cols * comps;
    if (jpeg_read_scanlines(ci, rowp, static_cast<JDIMENSION>(want)) == 0) {
      *why = "JPEG data ended at row " + std::to_string(ci->output_scanline);
      jpeg_abort_decompress(ci);
      return false;
    }
  }
  // Rows below the box are never decoded; a full pass checks the trailer.
  if (static_cast<int>(ci->output_scanline) == sh) {
    jpeg_finish_decompress(ci);
  } else {
    jpeg_abort_decompress(ci);
  }
  if (cmyk_in) CmykToRgb(cmyk, size_t(rows) * cols, out);
  d->sh = sh;
  d->sw = sw;
  d->y0 = y0;
  d->x0 = static_cast<int>(xoff);
  d->rows = rows;
  d->cols = static_cast<int>(cols);
  d->scale_num = num;
  d->partial = partial;
  return true;
}

// Decodes a PNG of any bit depth / color type to 8-bit RGB. Transparent
// pixels are composited onto white: images with alpha are overwhelmingly
// logos and cut-outs drawn to be seen on a white page.
Status PngRgb(std::span<const uint8_t> bytes, std::vector<uint8_t>* out, int* h, int* w) {
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, bytes.data(), bytes.size())) {
    png_image_free(&img);
    return Status::Corrupt(std::string("not a decodable PNG: ") + img.message);
  }
  if (uint64_t(img.width) * img.height > kMaxDecodedPixels || img.width == 0 || img.height == 0) {
    png_image_free(&img);
    return Status::Corrupt("PNG of " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                           " is too large or empty");
  }
  if (img.format & PNG_FORMAT_FLAG_LINEAR) {
    // 16-bit samples. libpng's 8-bit output would treat them as linear light
    // and gamma-encode them (a grey of 32768 became 186); scale the stored
    // values instead (32768 -> 128), as every other reader does.
    img.format = PNG_FORMAT_LINEAR_RGB_ALPHA;  // alpha is premultiplied in linear formats
    thread_local std::vector<uint16_t> wide;
    wide.resize(PNG_IMAGE_SIZE(img) / sizeof(uint16_t));
    if (!png_image_finish_read(&img, nullptr, wide.data(), 0, nullptr)) {
      png_image_free(&img);
      return Status::Corrupt(std::string("PNG decode failed: ") + img.message);
    }
    const size_t pixels = static_cast<size_t>(img.width) * img.height;
    out->resize(pixels * 3);
    for (size_t i = 0; i < pixels; ++i) {
      const uint32_t a = wide[4 * i + 3];
      for (int c = 0; c < 3; ++c) {
        const uint32_t v = std::min<uint32_t>(65535, wide[4 * i + c] + (65535 - a));  // over white
        (*out)[3 * i + c] = static_cast<uint8_t>((v * 255 + 32767) / 65535);
      }
    }
  } else {
    img.format = PNG_FORMAT_RGB;
    out->resize(PNG_IMAGE_SIZE(img));
    const png_color white = {255, 255, 255};
    if (!png_image_finish_read(&img, &white, out->data(), 0, nullptr)) {
      png_image_free(&img);
      return Status::Corrupt(std::string("PNG decode failed: ") + img.message);
    }
  }
  // Warnings (PNG_IMAGE_WARNING) are accepted: libpng's are about metadata
  // such as a mismatched iCCP profile, not about pixels.
  *h = static_cast<int>(img.height);
  *w = static_cast<int>(img.width);
  return Status::Ok();
}

// PIL's antialiased bilinear weights for one axis: output i samples the
// source interval [b0 + i * scale, b0 + (i + 1) * scale) with a triangle of
// half-width max(1, scale), clipped to [0, n).
struct AxisWeights {
  std::vector<int> first;      // per output: first source index
  std::vector<int> count;      // per output: taps
  std::vector<float> weights;  // per output: `stride` weights
  int stride = 0;
};

void MakeWeights(int n, double b0, double extent, int out, AxisWeights* aw) {
  const double scale = extent / out;
  const double filterscale = std::max(1.0, scale);
  const double support = filterscale;  // bilinear's support is 1
  aw->stride = static_cast<int>(std::ceil(support)) * 2 + 1;
  aw->first.resize(out);
  aw->count.resize(out);
  aw->weights.assign(size_t(out) * aw->stride, 0.0f);
  for (int i = 0; i < out; ++i) {
    const double center = b0 + (i + 0.5) * scale;
    int lo = static_cast<int>(std::floor(center - support + 0.5));
    int hi = static_cast<int>(std::floor(center + support + 0.5));
    lo = std::max(lo, 0);
    hi = std::min(hi, n);
    if (hi <= lo) {  // the center lies outside the source: clamp to its edge
      lo = std::clamp(static_cast<int>(center), 0, n - 1);
      hi = lo + 1;
    }
    hi = std::min(hi, lo + aw->stride);
    double total = 0;
    float* wt = &aw->weights[size_t(i) * aw->stride];
    for (int x = lo; x < hi; ++x) {
      const double t = std::abs((x + 0.5 - center) / filterscale);
      const double v = t < 1.0 ? 1.0 - t : 0.0;
      wt[x - lo] = static_cast<float>(v);
      total += v;
    }
    if (total <= 0) {
      std::fill(wt, wt + (hi - lo), 0.0f);
      wt[std::clamp(static_cast<int>(center) - lo, 0, hi - lo - 1)] = 1.0f;
    } else {
      for (int x = 0; x < hi - lo; ++x) wt[x] = static_cast<float>(wt[x] / total);
    }
    aw->first[i] = lo;
    aw->count[i] = hi - lo;
  }
}

}  // namespace

uint64_t RandomKey(uint64_t seed, uint64_t epoch, uint64_t sample) {
  uint64_t s = seed ^ 0x6a09e667f3bcc908ull;
  uint64_t k = SplitMix(&s);
  s = k ^ epoch;
  k = SplitMix(&s);
  s = k ^ sample;
  return SplitMix(&s);
}

CropRect PlanCrop(int h, int w, const DecodeOptions& o, uint64_t key) {
  if (o.transform == ImageTransform::kCenterCrop) {
    // Resize so the shorter side is min(out) / fraction, crop out_h x out_w.
    const double resized_short = std::min(o.height, o.width) / o.center_fraction;
    const double f = resized_short / std::min(h, w);  // resize factor
    const int ch = std::clamp(static_cast<int>(std::lround(o.height / f)), 1, h);
    const int cw = std::clamp(static_cast<int>(std::lround(o.width / f)), 1, w);
    // torchvision's CenterCrop: top = round((h - ch) / 2).
    return {static_cast<int>(std::lround((h - ch) / 2.0)), static_cast<int>(std::lround((w - cw) / 2.0)), ch, cw};
  }
  uint64_t state = key;
  const double area = double(h) * w;
  const double log_r0 = std::log(o.ratio_min), log_r1 = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (o.scale_min + (o.scale_max - o.scale_min) * Uniform(&state));
    const double aspect = std::exp(log_r0 + (log_r1 - log_r0) * Uniform(&state));
    const int cw = static_cast<int>(std::lround(std::sqrt(target * aspect)));
    const int ch = static_cast<int>(std::lround(std::sqrt(target / aspect)));
    if (cw > 0 && ch > 0 && cw <= w && ch <= h) {
      const int top = RandInt(&state, 0, h - ch);
      const int left = RandInt(&state, 0, w - cw);
      return {top, left, ch, cw};
    }
  }
  // Fallback: the whole image, narrowed to the ratio range, centered.
  const double in_ratio = double(w) / h;
  int cw = w, ch = h;
  if (in_ratio < o.ratio_min) {
    ch = std::clamp(static_cast<int>(std::lround(w / o.ratio_min)), 1, h);
  } else if (in_ratio > o.ratio_max) {
    cw = std::clamp(static_cast<int>(std::lround(h * o.ratio_max)), 1, w);
  }
  return {(h - ch) / 2, (w - cw) / 2, ch, cw};
}

namespace {

// One output row of the horizontal pass: for output ox, taps
// [first[ox], first[ox] + count[ox]) of `row` (interleaved RGB floats) with
// weights `bw` pre-broadcast to 4 lanes each. Weights are non-negative and sum
// to 1, so r, g, b lie in [0.5, 255.5] and need no clamp below.
void HorizontalRow(const float* row, const AxisWeights& xs, const float* bw, int xlo, int out_w, uint8_t* d,
                   size_t plane, bool nchw) {
  for (int ox = 0; ox < out_w; ++ox) {
    const float* p = row + size_t(xs.first[ox] - xlo) * 3;
    const int n = xs.count[ox];
#if defined(__SSE2__)
    // One 4-lane multiply-add per tap: lanes r, g, b and the next pixel's r
    // (ignored; the row's zero padding keeps the last load in bounds).
    const float* w4 = bw + size_t(ox) * xs.stride * 4;
    __m128 acc = _mm_set1_ps(0.5f);  // + 0.5: round on truncation
    for (int k = 0; k < n; ++k) acc = _mm_add_ps(acc, _mm_mul_ps(_mm_load_ps(w4 + 4 * k), _mm_loadu_ps(p + 3 * k)));
    alignas(16) int32_t v[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(v), _mm_cvttps_epi32(acc));
    const uint8_t ur = static_cast<uint8_t>(std::min(255, v[0]));
    const uint8_t ug = static_cast<uint8_t>(std::min(255, v[1]));
    const uint8_t ub = static_cast<uint8_t>(std::min(255, v[2]));
#else
    (void)bw;
    const float* wt = &xs.weights[size_t(ox) * xs.stride];
    float r = 0.5f, g = 0.5f, b = 0.5f;  // + 0.5: round on truncation
    for (int k = 0; k < n; ++k) {
      r += wt[k] * p[3 * k];
      g += wt[k] * p[3 * k + 1];
      b += wt[k] * p[3 * k + 2];
    }
    const uint8_t ur = static_cast<uint8_t>(std::min(255, static_cast<int>(r)));
    const uint8_t ug = static_cast<uint8_t>(std::min(255, static_cast<int>(g)));
    const uint8_t ub = static_cast<uint8_t>(std::min(255, static_cast<int>(b)));
#endif
    if (nchw) {
      d[ox] = ur;
      d[plane + ox] = ug;
      d[2 * plane + ox] = ub;
    } else {
      d[3 * ox] = ur;
      d[3 * ox + 1] = ug;
      d[3 * ox + 2] = ub;
    }
  }
}

}  // namespace

void ResampleBox(const uint8_t* src, int h, int w, double by, double bx, double bh, double bw, uint8_t* dst, int out_h,
                 int out_w, bool nchw) {
  thread_local AxisWeights xs, ys;
  thread_local std::vector<float> rows;  // out_h rows of the box's columns [xlo, xhi), x 3, resampled vertically
  MakeWeights(w, bx, bw, out_w, &xs);
  MakeWeights(h, by, bh, out_h, &ys);
  const int xlo = xs.first[0];
  const int xhi = xs.first[out_w - 1] + xs.count[out_w - 1];
  const int span = (xhi - xlo) * 3;
  const int row_stride = span + 3 * xs.stride + 4;  // zero padding: taps (and 4-lane loads) past the end read zeros
  rows.resize(size_t(out_h) * row_stride);
  // Vertical first: its inner loop runs over contiguous bytes and
  // vectorizes; the horizontal pass (strided taps) then touches out_h rows
  // instead of the box's height.
  for (int oy = 0; oy < out_h; ++oy) {
    float* acc = &rows[size_t(oy) * row_stride];
    const float* wt = &ys.weights[size_t(oy) * ys.stride];
    const uint8_t* p = src + (size_t(ys.first[oy]) * w + xlo) * 3;
    const int n = ys.count[oy];
    const size_t src_row = size_t(w) * 3;
    int i = 0;
#if defined(__SSE2__)
    // 16 bytes a step, every tap accumulated in registers.
    const __m128i zero = _mm_setzero_si128();
    for (; i + 16 <= span; i += 16) {
      __m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int k = 0; k < n; ++k) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k * src_row + i));
        const __m128i lo = _mm_unpacklo_epi8(v, zero), hi = _mm_unpackhi_epi8(v, zero);
        const __m128 wk = _mm_set1_ps(wt[k]);
        a0 = _mm_add_ps(a0, _mm_mul_ps(wk, _mm_cvtepi32_ps(_mm_unpacklo_epi16(lo, zero))));
        a1 = _mm_add_ps(a1, _mm_mul_ps(wk, _mm_cvtepi32_ps(_mm_unpackhi_epi16(lo, zero))));
        a2 = _mm_add_ps(a2, _mm_mul_ps(wk, _mm_cvtepi32_ps(_mm_unpacklo_epi16(hi, zero))));
        a3 = _mm_add_ps(a3, _mm_mul_ps(wk, _mm_cvtepi32_ps(_mm_unpackhi_epi16(hi, zero))));
      }
      _mm_storeu_ps(acc + i, a0);
      _mm_storeu_ps(acc + i + 4, a1);
      _mm_storeu_ps(acc + i + 8, a2);
      _mm_storeu_ps(acc + i + 12, a3);
    }
#endif
    for (; i < span; ++i) {
      float a = 0;
      for (int k = 0; k < n; ++k) a += wt[k] * p[k * src_row + i];
      acc[i] = a;
    }
    std::fill(acc + span, acc + row_stride, 0.0f);
  }
  // The horizontal weights, each broadcast to 4 lanes (16-byte aligned).
  thread_local std::vector<float> bw_store;
  bw_store.resize(xs.weights.size() * 4 + 4);
  float* w4 = bw_store.data();
  while (reinterpret_cast<uintptr_t>(w4) % 16 != 0) ++w4;
  for (size_t i = 0; i < xs.weights.size(); ++i)
    w4[4 * i] = w4[4 * i + 1] = w4[4 * i + 2] = w4[4 * i + 3] = xs.weights[i];
  const size_t plane = size_t(out_h) * out_w;
  for (int oy = 0; oy < out_h; ++oy) {
    const float* row = &rows[size_t(oy) * row_stride];
    uint8_t* d = nchw ? dst + size_t(oy) * out_w : dst + size_t(oy) * out_w * 3;
    HorizontalRow(row, xs, w4, xlo, out_w, d, plane, nchw);
  }
}

Status ImageSize(std::span<const uint8_t> bytes, int* h, int* w) {
  if (LooksLikePng(bytes)) {
    png_image img;
    std::memset(&img, 0, sizeof(img));
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, bytes.data(), bytes.size())) {
      png_image_free(&img);
      return Status::Corrupt(std::string("not a decodable PNG: ") + img.message);
    }
    *h = static_cast<int>(img.height);
    *w = static_cast<int>(img.width);
    png_image_free(&img);
    return Status::Ok();
  }
  if (!LooksLikeJpeg(bytes)) {
    return Status::Corrupt("neither a JPEG nor a PNG (" + std::to_string(bytes.size()) + " bytes, unknown signature)");
  }
  Decompressor& dc = ThreadDecompressor();
  static thread_local std::string why;
  if (setjmp(dc.err.jump)) {
    jpeg_abort_decompress(&dc.cinfo);
    return Status::Corrupt(std::string("not a decodable JPEG: ") + dc.err.message);
  }
  jpeg_mem_src(&dc.cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  const int r = jpeg_read_header(&dc.cinfo, TRUE);
  *h = static_cast<int>(dc.cinfo.image_height);
  *w = static_cast<int>(dc.cinfo.image_width);
  jpeg_abort_decompress(&dc.cinfo);
  if (r != JPEG_HEADER_OK || *h <= 0 || *w <= 0) {
    return Status::Corrupt("JPEG header holds no image size (damaged header or tables-only stream)");
  }
  return Status::Ok();
}

namespace {
// The stream's last marker is EOI (trailing zero padding allowed: some
// writers add it).
bool EndsWithEoi(std::span<const uint8_t> bytes) {
  size_t end = bytes.size();
  while (end > 2 && bytes[end - 1] == 0) --end;
  return end >= 2 && bytes[end - 2] == 0xFF && bytes[end - 1] == 0xD9;
}
}  // namespace

Status ReadJpegInfo(std::span<const uint8_t> bytes, JpegInfo* info) {
  if (!LooksLikeJpeg(bytes)) return Status::Corrupt("not a JPEG (unknown signature)");
  const bool eoi = EndsWithEoi(bytes);
  Decompressor& dc = ThreadDecompressor();
  if (setjmp(dc.err.jump)) {
    jpeg_abort_decompress(&dc.cinfo);
    return Status::Corrupt(std::string("not a decodable JPEG: ") + dc.err.message);
  }
  jpeg_mem_src(&dc.cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  const int r = jpeg_read_header(&dc.cinfo, TRUE);
  const jpeg_decompress_struct& c = dc.cinfo;
  *info = JpegInfo{};
  info->height = static_cast<int>(c.image_height);
  info->width = static_cast<int>(c.image_width);
  info->components = c.num_components;
  info->precision = c.data_precision;
  info->progressive = c.progressive_mode != 0;
  info->arithmetic = c.arith_code != 0;
  info->adobe_cmyk = c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK;
  for (int i = 0; i < std::min(c.num_components, 4); ++i) {
    info->h_samp[i] = c.comp_info[i].h_samp_factor;
    info->v_samp[i] = c.comp_info[i].v_samp_factor;
  }
  jpeg_abort_decompress(&dc.cinfo);
  if (r != JPEG_HEADER_OK || info->height <= 0 || info->width <= 0) {
    return Status::Corrupt("JPEG header holds no image size (damaged header or tables-only stream)");
  }
  info->ends_with_eoi = eoi;
  return Status::Ok();
}

const char* DeviceUndecodableReason(const JpegInfo& i) {
  auto no = [](const char* reason) { return reason; };
  if (i.progressive) return no("progressive");
  if (i.arithmetic) return no("arithmetic coding");
  if (i.precision != 8) return no("not 8-bit");
  if (i.adobe_cmyk || (i.components != 1 && i.components != 3)) return no("CMYK or an unusual component count");
  if (i.height > kMaxDeviceDecodeSide || i.width > kMaxDeviceDecodeSide) return no("too large");
  if (!i.ends_with_eoi) return no("truncated (no EOI marker)");
  if (i.components == 3) {
    if (i.h_samp[1] != 1 || i.v_samp[1] != 1 || i.h_samp[2] != 1 || i.v_samp[2] != 1) {
      return no("unusual chroma sampling");
    }
    const int h = i.h_samp[0], v = i.v_samp[0];
    if (!((h == 1 && v == 1) || (h == 2 && v == 1) || (h == 2 && v == 2) || (h == 1 && v == 2))) {
      return no("chroma subsampling other than 4:4:4, 4:2:2, 4:2:0, 4:4:0");
    }
  }
  return nullptr;
}

Status DecodeCovering(std::span<const uint8_t> bytes, int min_h, int min_w, std::vector<uint8_t>* rgb, int* h, int* w) {
  if (LooksLikePng(bytes)) return PngRgb(bytes, rgb, h, w);
  if (!LooksLikeJpeg(bytes)) {
    return Status::Corrupt("neither a JPEG nor a PNG (" + std::to_string(bytes.size()) + " bytes, unknown signature)");
  }
  Decoded d;
  std::string why;
  CropRect whole{-1, -1, 0, 0};
  if (!JpegPass(bytes, nullptr, std::max(0, min_h), std::max(0, min_w), false, rgb, &d, &why, nullptr, 0, &whole)) {
    return Status::Corrupt((whole.height <= 0 ? "not a decodable JPEG: " : "JPEG decode failed: ") + why);
  }
  *h = d.sh;
  *w = d.sw;
  return Status::Ok();
}

Status DecodeFull(std::span<const uint8_t> bytes, std::vector<uint8_t>* rgb, int* h, int* w) {
  return DecodeCovering(bytes, 0, 0, rgb, h, w);
}

Status DecodeTransform(std::span<const uint8_t> bytes, const DecodeOptions& o, uint64_t key, uint8_t* dst,
                       DecodeStats* stats) {
  const int out_h = static_cast<int>(o.height), out_w = static_cast<int>(o.width);
  const bool nchw = LayoutOr(o.layout, Layout::kNCHW) == Layout::kNCHW;
  thread_local std::vector<uint8_t> pixels;
  if (LooksLikePng(bytes)) {
    int h = 0, w = 0;
    GPUFEED_RETURN_IF_ERROR(PngRgb(bytes, &pixels, &h, &w));
    const CropRect b = PlanCrop(h, w, o, key);
    ResampleBox(pixels.data(), h, w, b.top, b.left, b.height, b.width, dst, out_h, out_w, nchw);
    if (stats) *stats = {8, false, uint64_t(h) * w};
    return Status::Ok();
  }
  if (!LooksLikeJpeg(bytes)) {
    return Status::Corrupt("neither a JPEG nor a PNG (" + std::to_string(bytes.size()) + " bytes, unknown signature)");
  }
  CropRect b{-1, -1, 0, 0};
  Decoded d;
  std::string why;
  // Partial decoding first; a stream libjpeg cannot crop or skip in is
  // decoded whole before it is called corrupt.
  if (!JpegPass(bytes, nullptr, out_h, out_w, true, &pixels, &d, &why, &o, key, &b)) {
    if (b.height <= 0) return Status::Corrupt("not a decodable JPEG: " + why);  // the header failed
    std::string why_full;
    if (!JpegPass(bytes, &b, out_h, out_w, false, &pixels, &d, &why_full)) {
      return Status::Corrupt("JPEG decode failed: " + why_full);
    }
  }
  const int h = d.h, w = d.w;
  // The box in the decoded buffer's pixels.
  const double sy = double(d.sh) / h, sx = double(d.sw) / w;
  ResampleBox(pixels.data(), d.rows, d.cols, b.top * sy - d.y0, b.left * sx - d.x0, b.height * sy, b.width * sx, dst,
              out_h, out_w, nchw);
  if (stats) *stats = {d.scale_num, d.partial, uint64_t(d.rows) * d.cols};
  return Status::Ok();
}

}  // namespace image
}  // namespace gpufeed
