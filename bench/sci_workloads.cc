// The deepcam and cosmoflow generators (bench/sci_workloads.h).
#include "bench/sci_workloads.h"

#include <hdf5.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "common/first_error.h"

namespace gpufeed::bench {
namespace {

// An HDF5 identifier released when it goes out of scope (bench/ writes these
// files with HDF5's C API directly: it uses gpufeed's public API only).
class Hid {
 public:
  explicit Hid(hid_t id) : id_(id) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() {
    if (id_ >= 0) H5Idec_ref(id_);
  }
  bool valid() const { return id_ >= 0; }
  hid_t get() const { return id_; }

 private:
  hid_t id_;
};

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Status WriteDataset(hid_t file, const char* path, hid_t type, const std::vector<hsize_t>& dims,
                    const std::vector<hsize_t>& chunk, int deflate, const void* data, const std::string& what) {
  Hid lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE));
  if (!chunk.empty()) {
    H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    if (deflate > 0) H5Pset_deflate(dcpl.get(), static_cast<unsigned>(deflate));
  }
  Hid space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  Hid ds(H5Dcreate2(file, path, type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
  if (!ds.valid() || H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    return Status::IOError(what + ":" + path + ": HDF5 write failed (disk full or not writable?)");
  }
  return Status::Ok();
}

}  // namespace

bool IsSciWorkload(const std::string& name) { return name == "deepcam" || name == "cosmoflow"; }

Result<SciGenResult> GenerateSciWorkload(const SciGenOptions& o) {
  if (!IsSciWorkload(o.workload)) {
    return Status::InvalidArgument("workload '" + o.workload + "': deepcam or cosmoflow");
  }
  if (o.scale < 1 || o.samples < 1 || o.per_file < 1) {
    return Status::InvalidArgument("--scale, --samples and --samples-per-file must be at least 1");
  }
  std::error_code ec;
  std::filesystem::create_directories(o.output, ec);
  if (ec) return Status::IOError(o.output + ": cannot create the directory: " + ec.message());
  const bool deepcam = o.workload == "deepcam";
  const uint64_t H = 768 / o.scale, W = 1152 / o.scale, D = 128 / o.scale;
  if ((deepcam && (H == 0 || W == 0)) || (!deepcam && D == 0)) {
    return Status::InvalidArgument("--scale " + std::to_string(o.scale) + " leaves no pixels");
  }
  const uint64_t per_file = deepcam ? 1 : o.per_file;
  const uint64_t files = (o.samples + per_file - 1) / per_file;
  SciGenResult r;
  r.files = files;
  r.samples = o.samples;
  r.fields = deepcam ? "--field data=/climate/data --field labels=/climate/labels_0" : "--field x=/x --field y=/y";
  std::atomic<uint64_t> next{0}, raw{0};
  FirstError first_error;
  auto worker = [&] {
    for (uint64_t f = next++; f < files; f = next++) {
      const uint64_t first = f * per_file, n = std::min(per_file, o.samples - first);
      char name[64];
      std::snprintf(name, sizeof name, "%s_%06llu.h5", deepcam ? "sample" : "univ", static_cast<unsigned long long>(f));
      const std::string path = (std::filesystem::path(o.output) / name).string();
      Status st;
      Hid file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
      if (!file.valid()) {
        st = Status::IOError(path + ": cannot create (does the folder exist and is it writable?)");
      } else if (deepcam) {
        const uint64_t k = first;
        std::vector<float> data(16 * H * W);
        std::vector<int32_t> labels(H * W);
        for (uint64_t i = 0; i < data.size(); ++i) {
          // Smooth-ish fields (a value per 8x8 patch per channel) plus noise.
          const uint64_t c = i / (H * W), y = (i / W) % H, x = i % W;
          const uint64_t patch = Mix(o.seed ^ (k << 20) ^ (c << 40) ^ ((y / 8) << 10) ^ (x / 8));
          data[i] = float(patch % 1000) * 0.01f + float(Mix(i ^ (k << 32)) % 100) * 1e-4f;
        }
        data[0] = float(k);
        for (uint64_t i = 0; i < labels.size(); ++i) {
          labels[i] = static_cast<int32_t>(Mix(o.seed ^ (k << 24) ^ ((i / W / 16) << 8) ^ (i % W / 16)) % 3);
        }
        labels[0] = static_cast<int32_t>(k % 3);
        st = WriteDataset(file.get(), "/climate/data", H5T_NATIVE_FLOAT, {1, 16, H, W}, {}, 0, data.data(), path);
        if (st.ok()) {
          st = WriteDataset(file.get(), "/climate/labels_0", H5T_NATIVE_INT32, {1, H, W}, {}, 0, labels.data(), path);
        }
        raw += data.size() * 4 + labels.size() * 4;
      } else {
        const uint64_t vol = 4 * D * D * D;
        std::vector<int16_t> x(n * vol);
        std::vector<float> y(n * 4);
        for (uint64_t s = 0; s < n; ++s) {
          const uint64_t k = first + s;
          int16_t* v = x.data() + s * vol;
          for (uint64_t i = 0; i < vol; ++i) {
            // Sparse counts: mostly 0-3 over 4^3 blocks, with noise (deflate
            // ~3-4x, like CosmoFlow's particle counts).
            const uint64_t z = (i / (D * D)) % D, yy = (i / D) % D, xx = i % D, c = i / (D * D * D);
            const uint64_t block = Mix(o.seed ^ (k << 24) ^ (c << 48) ^ ((z / 4) << 32) ^ ((yy / 4) << 16) ^ (xx / 4));
            v[i] = static_cast<int16_t>((block % 4) + ((Mix(i ^ (k << 36)) % 16) == 0 ? 1 : 0));
          }
          v[0] = static_cast<int16_t>(k % 32768);
          for (int t = 0; t < 4; ++t) y[s * 4 + t] = t == 0 ? float(k) : float(Mix(k * 4 + t) % 1000) / 1000.f;
        }
        st = WriteDataset(file.get(), "/x", H5T_NATIVE_INT16, {n, 4, D, D, D}, {1, 4, D, D, D}, 4, x.data(), path);
        if (st.ok()) st = WriteDataset(file.get(), "/y", H5T_NATIVE_FLOAT, {n, 4}, {n, 4}, 4, y.data(), path);
        raw += x.size() * 2 + y.size() * 4;
      }
      if (!st.ok()) {
        first_error.Set(std::move(st));
        return;
      }
    }
  };
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (first_error.failed()) return first_error.Get();
  r.raw_bytes = raw;
  for (const auto& e : std::filesystem::directory_iterator(o.output, ec)) {
    if (e.is_regular_file(ec)) r.file_bytes += e.file_size(ec);
  }
  return r;
}

}  // namespace gpufeed::bench
