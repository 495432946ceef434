// The imagenet-jpeg workload generator and the full-size decode ceiling.
#include "bench/jpeg_workload.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <turbojpeg.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/first_error.h"
#include "common/mutex.h"

namespace gpufeed::bench {
namespace {

uint64_t Mix(uint64_t* s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double U(uint64_t* s) { return static_cast<double>(Mix(s) >> 11) * 0x1.0p-53; }

// Value noise: a grid of random values every `cell` pixels, bilinearly
// interpolated (smooth texture at that scale).
struct ValueNoise {
  int cell, gw, gh;
  std::vector<float> g;
  ValueNoise(int w, int h, int cell_px, uint64_t* s) : cell(cell_px), gw(w / cell_px + 2), gh(h / cell_px + 2) {
    g.resize(size_t(gw) * gh);
    for (float& v : g) v = static_cast<float>(U(s) * 2 - 1);
  }
  float At(int x, int y) const {
    const float fx = float(x) / cell, fy = float(y) / cell;
    const int x0 = int(fx), y0 = int(fy);
    const float tx = fx - x0, ty = fy - y0;
    const float a = g[size_t(y0) * gw + x0], b = g[size_t(y0) * gw + x0 + 1];
    const float c = g[size_t(y0 + 1) * gw + x0], d = g[size_t(y0 + 1) * gw + x0 + 1];
    return (a + (b - a) * tx) * (1 - ty) + (c + (d - c) * tx) * ty;
  }
};

tjhandle ThreadCompressor() {
  struct H {
    tjhandle h = tjInitCompress();
    ~H() {
      if (h) tjDestroy(h);
    }
  };
  thread_local H h;
  return h.h;
}
tjhandle ThreadDecompressor() {
  struct H {
    tjhandle h = tjInitDecompress();
    ~H() {
      if (h) tjDestroy(h);
    }
  };
  thread_local H h;
  return h.h;
}

}  // namespace

Status MakeJpegSample(uint64_t k, uint64_t seed, int quality, std::vector<unsigned char>* jpeg) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull ^ (k + 1) * 0xD1B54A32D192ED03ull;
  Mix(&s);
  const int w = 400 + static_cast<int>(U(&s) * 101);  // 400..500
  const int h = 350 + static_cast<int>(U(&s) * 26);   // 350..375
  std::vector<uint8_t> rgb(size_t(w) * h * 3);
  // A background gradient, a few shapes of flat-ish color, then texture at
  // three scales whose strength varies over the image (smooth and busy
  // regions, as photos have).
  float base[3], grad[3][2];
  for (int c = 0; c < 3; ++c) {
    base[c] = static_cast<float>(40 + U(&s) * 170);
    grad[c][0] = static_cast<float>((U(&s) - 0.5) * 120 / w);
    grad[c][1] = static_cast<float>((U(&s) - 0.5) * 120 / h);
  }
  struct Shape {
    float cx, cy, rx, ry, col[3];
    bool ellipse;
  };
  std::vector<Shape> shapes(4 + Mix(&s) % 6);
  for (Shape& sh : shapes) {
    sh = {float(U(&s) * w),
          float(U(&s) * h),
          float(20 + U(&s) * w / 3),
          float(20 + U(&s) * h / 3),
          {float(U(&s) * 255), float(U(&s) * 255), float(U(&s) * 255)},
          U(&s) < 0.5};
  }
  ValueNoise coarse(w, h, 32, &s), mid(w, h, 8, &s), fine(w, h, 2, &s), busy(w, h, 64, &s);
  ValueNoise tint[3] = {ValueNoise(w, h, 16, &s), ValueNoise(w, h, 16, &s), ValueNoise(w, h, 16, &s)};
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      float v[3];
      for (int c = 0; c < 3; ++c) v[c] = base[c] + grad[c][0] * x + grad[c][1] * y;
      for (const Shape& sh : shapes) {
        const float dx = (x - sh.cx) / sh.rx, dy = (y - sh.cy) / sh.ry;
        const bool in = sh.ellipse ? dx * dx + dy * dy < 1 : std::abs(dx) < 1 && std::abs(dy) < 1;
        if (in)
          for (int c = 0; c < 3; ++c) v[c] = 0.25f * v[c] + 0.75f * sh.col[c];
      }
      const float b = 0.5f + 0.5f * busy.At(x, y);  // texture strength 0..1
      // Pixel-level grain (sensor noise, foliage, fabric) where it is busy.
      const float grain = static_cast<float>(U(&s) * 2 - 1);
      const float lum = 30 * coarse.At(x, y) + 22 * mid.At(x, y) + b * (56 * fine.At(x, y) + 112 * grain) + 16 * grain;
      for (int c = 0; c < 3; ++c) {
        const float t = v[c] + lum + 10 * tint[c].At(x, y);
        rgb[(size_t(y) * w + x) * 3 + c] = static_cast<uint8_t>(std::clamp(t, 0.0f, 255.0f));
      }
    }
  }
  tjhandle tj = ThreadCompressor();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  if (tj == nullptr || tjCompress2(tj, rgb.data(), w, 0, h, TJPF_RGB, &out, &size, TJSAMP_420, quality, 0) != 0) {
    if (out) tjFree(out);
    return Status::Internal("sample " + std::to_string(k) + ": JPEG encode failed: " + tjGetErrorStr2(tj));
  }
  jpeg->assign(out, out + size);
  tjFree(out);
  return Status::Ok();
}

Result<JpegGenSummary> GenImagenetJpeg(const JpegGenOptions& o) {
  namespace fs = std::filesystem;
  JpegGenSummary r;
  r.folder = o.folder.empty() ? o.output + ".jpg.d" : o.folder;
  std::error_code ec;
  fs::remove_all(r.folder, ec);
  for (int c = 0; c < o.classes; ++c) {
    char name[16];
    std::snprintf(name, sizeof name, "c%03d", c);
    fs::create_directories(fs::path(r.folder) / name, ec);
    if (ec) return Status::IOError(r.folder + ": cannot create: " + ec.message());
  }
  std::atomic<uint64_t> bytes{0}, done{0};
  FirstError first_error;
  Mutex progress_mu;  // one progress call at a time
  std::vector<uint32_t> widths(o.samples), heights(o.samples);
  tbb::parallel_for(uint64_t{0}, o.samples, [&](uint64_t k) {
    thread_local std::vector<unsigned char> jpeg;
    Status st = MakeJpegSample(k, o.seed, o.quality, &jpeg);
    if (st.ok()) {
      char name[48];
      std::snprintf(name, sizeof name, "c%03d/%08llu.jpg", int(k % o.classes), (unsigned long long)k);
      const std::string path = (fs::path(r.folder) / name).string();
      std::ofstream f(path, std::ios::binary);
      f.write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
      if (!f) st = Status::IOError(path + ": write failed");
      bytes += jpeg.size();
    }
    first_error.Set(std::move(st));  // kept if it is the first error
    const uint64_t d = ++done;
    if (o.progress && d % 256 == 0) {
      MutexLock lock(&progress_mu);
      o.progress(d, 2 * o.samples);
    }
  });
  if (first_error.failed()) return first_error.Get();
  r.samples = o.samples;
  r.file_bytes = bytes.load();
  ConvertOptions co;
  co.threads = o.threads;
  if (o.progress)
    co.progress = [&](uint64_t d, uint64_t n) { o.progress(o.samples + d * o.samples / n, 2 * o.samples); };
  auto conv = ConvertEncodedImageFolder(r.folder, o.output, co);
  if (!conv.ok()) return conv.status();
  r.convert = *conv;
  return r;
}

Result<DecodeCeiling> MeasureDecodeCeiling(const EncodedImageSource& source, uint64_t max_samples, uint64_t seed) {
  const uint64_t n = std::min(max_samples, source.num_samples());
  std::vector<std::vector<uint8_t>> files(n);
  for (uint64_t k = 0; k < n; ++k) GPUFEED_RETURN_IF_ERROR(source.ReadEncoded(k, &files[k]));
  tjhandle tj = ThreadDecompressor();
  std::vector<uint8_t> rgb, out(source.sample_bytes());
  DecodeCeiling c;
  constexpr uint64_t kBlock = 32;
  for (uint64_t b = 0; b < n; b += kBlock) {
    const uint64_t e = std::min(n, b + kBlock);
    auto t0 = std::chrono::steady_clock::now();
    for (uint64_t k = b; k < e; ++k) {
      int w = 0, h = 0, sub = 0, cs = 0;
      if (tjDecompressHeader3(tj, files[k].data(), files[k].size(), &w, &h, &sub, &cs) != 0) {
        return Status::Corrupt(source.name() + " sample " + std::to_string(k) + ": " + tjGetErrorStr2(tj));
      }
      rgb.resize(size_t(w) * h * 4);
      const TJPF pf = cs == TJCS_CMYK || cs == TJCS_YCCK ? TJPF_CMYK : TJPF_RGB;
      if (tjDecompress2(tj, files[k].data(), files[k].size(), rgb.data(), w, 0, h, pf, 0) != 0) {
        return Status::Corrupt(source.name() + " sample " + std::to_string(k) + ": " + tjGetErrorStr2(tj));
      }
    }
    auto t1 = std::chrono::steady_clock::now();
    for (uint64_t k = b; k < e; ++k) {
      GPUFEED_RETURN_IF_ERROR(DecodeImage(files[k], source.decode_options(), seed, 0, k, out.data()));
    }
    auto t2 = std::chrono::steady_clock::now();
    c.seconds += std::chrono::duration<double>(t1 - t0).count();
    c.transform_seconds += std::chrono::duration<double>(t2 - t1).count();
  }
  c.samples = n;
  return c;
}

Result<double> MeasureParallelDecode(const EncodedImageSource& source, uint64_t max_samples, int threads) {
  const uint64_t n = std::min(max_samples, source.num_samples());
  std::vector<std::vector<uint8_t>> files(n);
  for (uint64_t k = 0; k < n; ++k) GPUFEED_RETURN_IF_ERROR(source.ReadEncoded(k, &files[k]));
  std::atomic<bool> failed{false};
  tbb::task_arena arena(threads);
  const auto t0 = std::chrono::steady_clock::now();
  arena.execute([&] {
    tbb::parallel_for(uint64_t{0}, n, [&](uint64_t k) {
      thread_local std::vector<uint8_t> rgb;
      tjhandle tj = ThreadDecompressor();
      int w = 0, h = 0, sub = 0, cs = 0;
      if (tjDecompressHeader3(tj, files[k].data(), files[k].size(), &w, &h, &sub, &cs) != 0) {
        failed = true;
        return;
      }
      rgb.resize(size_t(w) * h * 4);
      const TJPF pf = cs == TJCS_CMYK || cs == TJCS_YCCK ? TJPF_CMYK : TJPF_RGB;
      if (tjDecompress2(tj, files[k].data(), files[k].size(), rgb.data(), w, 0, h, pf, 0) != 0) failed = true;
    });
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (failed) return Status::Corrupt(source.name() + ": a sample failed to decode");
  return s > 0 ? n / s : 0.0;
}

}  // namespace gpufeed::bench
