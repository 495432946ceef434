// NVML through dlopen: the few entry points we need, declared here with the
// ABI from NVIDIA's documentation (nvmlReturn_t is an int, 0 = success).
#include "common/clock.h"
#include "trainer/nvml.h"

#include <dlfcn.h>

#include <chrono>

namespace gpufeed::trainer {

namespace {
struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};
}  // namespace

struct NvmlSampler::Api {
  int (*init)();
  int (*shutdown)();
  int (*by_pci)(const char*, void**);
  int (*utilization)(void*, NvmlUtilization*);
  int (*memory)(void*, NvmlMemory*);
  const char* (*error_string)(int);
};

NvmlSampler::NvmlSampler(const std::string& pci_bus_id, double period_s) : period_s_(period_s) {
  lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib_) {
    error_ = std::string("NVML not available (") + dlerror() + ")";
    return;
  }
  api_ = std::make_unique<Api>();
  auto sym = [&](const char* name) { return dlsym(lib_, name); };
  api_->init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
  api_->shutdown = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
  api_->by_pci = reinterpret_cast<int (*)(const char*, void**)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
  api_->utilization = reinterpret_cast<int (*)(void*, NvmlUtilization*)>(sym("nvmlDeviceGetUtilizationRates"));
  api_->memory = reinterpret_cast<int (*)(void*, NvmlMemory*)>(sym("nvmlDeviceGetMemoryInfo"));
  api_->error_string = reinterpret_cast<const char* (*)(int)>(sym("nvmlErrorString"));
  if (!api_->init || !api_->shutdown || !api_->by_pci || !api_->utilization || !api_->memory) {
    error_ = "NVML library lacks the expected entry points";
    return;
  }
  if (int r = api_->init(); r != 0) {
    error_ = std::string("nvmlInit failed: ") + (api_->error_string ? api_->error_string(r) : std::to_string(r));
    api_->shutdown = nullptr;
    return;
  }
  if (int r = api_->by_pci(pci_bus_id.c_str(), &device_); r != 0) {
    error_ = "NVML does not know the device " + pci_bus_id + ": " +
             (api_->error_string ? api_->error_string(r) : std::to_string(r));
    return;
  }
  ok_ = true;
  thread_ = std::thread([this] { Run(); });
}

NvmlSampler::~NvmlSampler() {
  if (thread_.joinable()) {
    {
      MutexLock l(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    thread_.join();
  }
  if (api_ && api_->shutdown) api_->shutdown();
  if (lib_) dlclose(lib_);
}

void NvmlSampler::Run() {
  // A thread root: telemetry is optional, so a failure here (bad_alloc while
  // recording a sample) ends sampling and leaves the figures it has, rather
  // than terminating the training run.
  try {
    for (;;) {
      {
        MutexLock l(&mu_);
        if (stop_) return;
      }
      NvmlUtilization u{};
      NvmlMemory m{};
      const bool good = api_->utilization(device_, &u) == 0 && api_->memory(device_, &m) == 0;
      const double t = NowSeconds();
      MutexLock l(&mu_);
      if (good) samples_.push_back({t, double(u.gpu), double(m.used) / 1048576.0});
      // A period, or until the destructor asks to stop.
      const auto until =
          std::chrono::steady_clock::now() +
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(period_s_));
      while (!stop_) {
        const auto left = until - std::chrono::steady_clock::now();
        if (left <= left.zero() || !cv_.WaitFor(&mu_, left)) break;
      }
    }
  } catch (...) {
    MutexLock l(&mu_);
    failed_ = true;
  }
}

void NvmlSampler::Mean(double t0, double t1, double* util, double* mem_mb) const {
  MutexLock l(&mu_);
  double su = 0, sm = 0;
  int n = 0;
  for (const Sample& s : samples_)
    if (s.t >= t0 && s.t <= t1) su += s.util, sm += s.mem_used_mb, ++n;
  *util = n ? su / n : -1;
  *mem_mb = n ? sm / n : -1;
}

}  // namespace gpufeed::trainer
