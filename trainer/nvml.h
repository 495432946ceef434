// GPU utilization and memory through NVML, loaded at run time (dlopen of
// libnvidia-ml.so.1: the binary runs where NVML is missing, and there is no
// NVML header in the toolkit), sampled on a background thread.
#ifndef GPUFEED_TRAINER_NVML_H_
#define GPUFEED_TRAINER_NVML_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace gpufeed::trainer {

class NvmlSampler {
 public:
  struct Sample {
    double t = 0;     // seconds on the steady clock
    double util = 0;  // utilization.gpu, percent
    double mem_used_mb = 0;
  };
  // `pci_bus_id` as cudaDeviceGetPCIBusId writes it. When NVML cannot be
  // loaded or the device not found, ok() is false and error() says why.
  NvmlSampler(const std::string& pci_bus_id, double period_s);
  ~NvmlSampler();  // stops the thread (woken at once), unloads NVML
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  // Mean utilization and memory of the samples taken in [t0, t1]; -1 if none.
  void Mean(double t0, double t1, double* util, double* mem_mb) const;

 private:
  void Run();
  struct Api;
  std::unique_ptr<Api> api_;
  void* lib_ = nullptr;
  void* device_ = nullptr;
  bool ok_ = false;
  std::string error_;
  double period_s_;
  std::thread thread_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  bool failed_ GUARDED_BY(mu_) = false;  // sampling ended by an exception
  std::vector<Sample> samples_ GUARDED_BY(mu_);
};

}  // namespace gpufeed::trainer

#endif  // GPUFEED_TRAINER_NVML_H_
