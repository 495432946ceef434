// The image decode stage's CPU twin, and what both implementations share.
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/clock.h"
#include "gpu/image_decoder.h"
#include "gpu/resize_crop.h"
#include "gpufeed/gpu_feed.h"
#include "hdf5io/image/image_decode.h"

namespace gpufeed::gpu {

Status DecodeOnHost(const Batch& b, size_t i, const ImageDecodeShape& shape, uint8_t* out) {
  const EncodedSample& e = b.encoded()[i];
  const std::span<const std::byte> buf = b.buffer();
  if (e.offset + e.bytes > buf.size()) return Status::Internal("image decode: sample outside its batch buffer");
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(buf.data()) + e.offset, e.bytes);
  thread_local std::vector<uint8_t> rgb;
  int h = 0, w = 0;
  GPUFEED_RETURN_IF_ERROR(image::DecodeFull(bytes, &rgb, &h, &w));
  if (h != e.height || w != e.width) {
    return Status::Corrupt("decodes to " + std::to_string(h) + "x" + std::to_string(w) + ", its header says " +
                           std::to_string(e.height) + "x" + std::to_string(e.width));
  }
  const ResizeJob j = ResizeJobFor(e, rgb.data(), 0);
  return ResizeCropCpu(&j, 1, shape.height, shape.width, shape.nchw, out);
}

ResizeJob ResizeJobFor(const EncodedSample& e, const uint8_t* src, uint32_t dst_index) {
  ResizeJob j;
  j.src = src;
  j.pitch = uint64_t(3) * e.width;
  j.src_h = e.height;
  j.src_w = e.width;
  j.box = e.crop;
  j.dst_index = dst_index;
  return j;
}

Status ReplaceCorrupt(const Batch& b, const ImageDecodeShape& shape, std::vector<Status>& failed, int64_t* labels,
                      uint64_t* skipped, const std::function<Status(size_t from, size_t to)>& copy_sample) {
  const size_t n = failed.size();
  for (size_t i = 0; i < n; ++i) {
    if (failed[i].ok()) continue;
    const uint64_t sample = b.indices()[i];
    if (!shape.skip_corrupt) {
      return Status::Corrupt(shape.source + " sample " + std::to_string(sample) + ": " + failed[i].message() +
                             " (--skip-corrupt / skip_corrupt replaces corrupt samples)");
    }
    size_t j = n;
    for (size_t step = 1; step < n; ++step) {
      const size_t k = (i + step) % n;
      if (failed[k].ok()) {
        j = k;
        break;
      }
    }
    if (j == n) {
      return Status::Corrupt(shape.source + " sample " + std::to_string(sample) + ": " + failed[i].message() +
                             "; and no sample of its batch decodes to replace it");
    }
    GPUFEED_RETURN_IF_ERROR(copy_sample(j, i));
    if (labels != nullptr) labels[i] = labels[j];
    ++*skipped;
    LoggerOr(shape.logger)
        .Log(LogLevel::kWarning, "sample_replaced",
             shape.source + " sample " + std::to_string(sample) + " skipped (" + failed[i].message() +
                 "); replaced by sample " + std::to_string(b.indices()[j]));
  }
  return Status::Ok();
}

namespace {

class CpuImageDecoder final : public ImageBatchDecoder {
 public:
  explicit CpuImageDecoder(const ImageDecodeShape& shape) : shape_(shape) {}

  Status Decode(const Batch& b, uint8_t* dst, int64_t* labels, StreamRef /*stream*/) override {
    const double t0 = NowSeconds();
    const uint64_t sb = uint64_t(3) * shape_.height * shape_.width;
    const size_t n = b.size();
    if (b.encoded().size() != n) return Status::Internal("image decode: a batch without its encoded entries");
    std::vector<Status> failed(n);
    for (size_t i = 0; i < n; ++i) {
      const EncodedSample& e = b.encoded()[i];
      if (e.bytes == 0) {
        std::memcpy(dst + i * sb, b.buffer().data() + e.offset, sb);
        ++c_.host_samples;
        continue;
      }
      failed[i] = DecodeOnHost(b, i, shape_, dst + i * sb);
      if (failed[i].ok()) ++c_.device_samples;
    }
    Status st = ReplaceCorrupt(b, shape_, failed, labels, &c_.skipped, [&](size_t from, size_t to) {
      std::memcpy(dst + to * sb, dst + from * sb, sb);
      return Status::Ok();
    });
    c_.decode_seconds += NowSeconds() - t0;
    return st;
  }
  const ImageDecodeCounters& counters() const override { return c_; }
  std::string name() const override { return "cpu"; }

 private:
  ImageDecodeShape shape_;
  ImageDecodeCounters c_;
};

}  // namespace

std::unique_ptr<ImageBatchDecoder> MakeCpuImageDecoder(const ImageDecodeShape& shape) {
  return std::make_unique<CpuImageDecoder>(shape);
}

#ifndef GPUFEED_WITH_CUDA
Result<std::unique_ptr<ImageBatchDecoder>> MakeNvjpegDecoder(const ImageDecodeShape&, int, DeviceOps*) {
  return Status::Unsupported("nvJPEG: this build has no CUDA");
}
Status NvjpegAvailable(int, std::string*) { return Status::Unsupported("nvJPEG: this build has no CUDA"); }
#endif

}  // namespace gpufeed::gpu

namespace gpufeed {

Status GpuImageDecoder(int device, std::string* backend) { return gpu::NvjpegAvailable(device, backend); }

std::string DecodePlacement::Describe() const {
  return defer ? "gpu (nvjpeg " + backend + ")" : "cpu (" + cpu_reason + ")";
}

Result<DecodePlacement> PlaceDecode(DecodeDevice where, bool feed_on_gpu, int device) {
  DecodePlacement p;
  if (where == DecodeDevice::kCpu) {
    p.cpu_reason = "decode=\"cpu\"";
    return p;
  }
  if (!feed_on_gpu) {
    p.cpu_reason = "the feed is not on a GPU";
  } else if (Status av = GpuImageDecoder(device, &p.backend); !av.ok()) {
    p.cpu_reason = av.message();
  } else {
    p.defer = true;
    p.balance = where == DecodeDevice::kAuto;  // the loader's threads take a share measured to keep pace
  }
  if (where == DecodeDevice::kGpu && !p.defer) return Status::Unsupported(p.cpu_reason);
  return p;
}

}  // namespace gpufeed
