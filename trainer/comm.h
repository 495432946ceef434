// Collectives among the trainer's data-parallel ranks, one process (or, in
// tests, one thread) per rank: NCCL on the GPU (comm_nccl.cu, on a stream of
// its own that waits on an event of the compute stream, as llm.c does), and
// a shared-memory form for CPU ranks (comm_shm.cc) that CI runs, with the
// same contract:
//
// - Every rank calls the same collectives in the same order.
// - AllReduce sums in place and every rank gets the same bits (NCCL's ring
//   hands each reduced slice out from one rank; the shared-memory form sums
//   the ranks' copies in rank order on every rank). So every rank's
//   gradients, inf/NaN check, skipped steps and weights are the same.
// - Every wait ends: a rank that errs (Abort) or dies, or a rendezvous that
//   does not complete within the timeout, is an error naming the rank, not a
//   hang. (NCCL's own kernels cannot see a peer die; `gpufeed train --gpus`
//   and torchrun stop the other ranks when one exits with an error.)
#ifndef GPUFEED_TRAINER_COMM_H_
#define GPUFEED_TRAINER_COMM_H_

#include <cstddef>
#include <memory>
#include <string>

#include "gpufeed/status.h"

namespace gpufeed::trainer {

struct CommOptions {
  int rank = 0, world_size = 1;
  // Path prefix every rank of the job derives alike (RendezvousPrefix);
  // rank 0 writes PREFIX.id there for the others.
  std::string prefix;
  double timeout_s = 300;  // for the rendezvous and every wait on a peer
};

// The prefix for `world_size` ranks of this job: $GPUFEED_RENDEZVOUS_DIR
// (needed when the ranks span hosts: a directory all of them see), else the
// node directory (common/job.h), and a hash of the job's name (JobId).
Result<std::string> RendezvousPrefix(int world_size, int local_world_size);

// Rank 0 publishes `payload` (rank 0's; ignored elsewhere) in PREFIX.id; every
// rank returns it. Non-zero ranks wait for the file up to the timeout.
Result<std::string> Rendezvous(const CommOptions& o, const std::string& payload);
// Rank 0 removes PREFIX.id once every rank has read it (after a collective).
void RendezvousDone(const CommOptions& o);

class Comm {
 public:
  virtual ~Comm() = default;
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  virtual std::string Describe() const = 0;  // "nccl 2.27.7" / "shared memory"

  // Sums `count` fp32 tensors across the ranks, in place. On the GPU it is
  // queued after what the compute stream has queued so far and runs on the
  // collectives' stream; the compute stream sees the sums after Join(). On
  // the CPU it is done when it returns.
  virtual Status AllReduce(float* const* bufs, const size_t* sizes, int count) = 0;
  // Rank `root`'s n values into every rank's `buf`, ordered as AllReduce.
  virtual Status Broadcast(float* buf, size_t n, int root) = 0;
  // Makes the compute stream wait for every collective queued so far.
  virtual Status Join() = 0;
  // Host values, blocking: every rank's `bytes` at `mine` land in
  // all[rank * bytes .. ] on every rank.
  virtual Status AllGather(const void* mine, size_t bytes, void* all) = 0;
  // Ends the others' waits with an error naming this rank (this rank failed).
  virtual void Abort() = 0;

  // Timing of the collectives (GPU): while on, each AllReduce's time on the
  // collectives' stream is recorded; BusyMs() waits for them and returns
  // their sum since the last call. -1 where not measured (the CPU).
  virtual void SetTiming(bool on) { (void)on; }
  virtual double BusyMs() { return -1; }

 protected:
  Comm(int rank, int world) : rank_(rank), world_(world) {}

 private:
  int rank_, world_;
};

// CPU ranks: a shared-memory segment rank 0 creates (PREFIX.shm) and the
// others map; sums in rank order.
Result<std::unique_ptr<Comm>> MakeShmComm(const CommOptions& o);
// GPU ranks: NCCL (libnccl.so.2, loaded at run time) on `device`, ordered
// after `compute_stream` (a cudaStream_t). Unsupported without CUDA or NCCL.
Result<std::unique_ptr<Comm>> MakeNcclComm(const CommOptions& o, int device, void* compute_stream);

}  // namespace gpufeed::trainer

#endif  // GPUFEED_TRAINER_COMM_H_
