// Checkpoint writing and reading (format in checkpoint.h).
#include "trainer/checkpoint.h"

#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "common/atomic_file.h"

namespace gpufeed::trainer {
namespace {

constexpr char kMagic[8] = {'G', 'P', 'F', 'D', 'C', 'K', 'P', 'T'};

class Writer {
 public:
  void Raw(const void* p, size_t n) { buf.append(static_cast<const char*>(p), n); }
  template <class T>
  void Pod(const T& v) {
    Raw(&v, sizeof v);
  }
  void Str(const std::string& s) {
    Pod<uint32_t>(static_cast<uint32_t>(s.size()));
    Raw(s.data(), s.size());
  }
  std::string buf;
};

class Reader {
 public:
  Reader(std::string_view d, std::string path) : d_(d), path_(std::move(path)) {}
  Status Raw(void* p, size_t n) {
    if (n > d_.size() - pos_) return Status::Corrupt("checkpoint " + path_ + ": truncated payload");
    std::memcpy(p, d_.data() + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  template <class T>
  Status Pod(T* v) {
    return Raw(v, sizeof *v);
  }
  Status Str(std::string* s) {
    uint32_t n;
    GPUFEED_RETURN_IF_ERROR(Pod(&n));
    if (n > d_.size() - pos_) return Status::Corrupt("checkpoint " + path_ + ": truncated string");
    s->assign(d_.data() + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  bool done() const { return pos_ == d_.size(); }

 private:
  std::string_view d_;
  size_t pos_ = 0;
  std::string path_;
};

// The tensors a checkpoint holds, in a fixed order, as (address, bytes).
std::vector<std::pair<void*, size_t>> Tensors(Model* model) {
  std::vector<std::pair<void*, size_t>> t;
  for (Param& p : model->params()) {
    t.emplace_back(p.master, p.n * 4);
    if (p.quantized()) {
      const size_t blocks = (p.n + kQuantBlock - 1) / kQuantBlock;
      t.emplace_back(p.q1, p.n);
      t.emplace_back(p.a1, blocks * 4);
      if (p.q2) t.emplace_back(p.q2, p.n), t.emplace_back(p.a2, blocks * 4);
      continue;
    }
    t.emplace_back(p.s1, p.n * 4);
    if (p.s2) t.emplace_back(p.s2, p.n * 4);
  }
  for (auto& [b, n] : model->buffers()) t.emplace_back(b, n * 4);
  return t;
}

}  // namespace

Status SaveCheckpoint(const std::string& path, Ops* ops, Model* model, const CheckpointMeta& meta) {
  Writer w;
  w.Str(meta.model);
  w.Str(meta.config);
  w.Pod<int32_t>(meta.next_epoch);
  w.Pod<int64_t>(meta.step);
  w.Pod(meta.scaler);
  w.Str(meta.loader.Serialize());
  const auto tensors = Tensors(model);
  w.Pod<uint32_t>(static_cast<uint32_t>(tensors.size()));
  std::vector<uint8_t> host;
  for (auto& [p, bytes] : tensors) {
    host.resize(bytes);
    GPUFEED_RETURN_IF_ERROR(ops->Download(host.data(), p, bytes));
    w.Pod<uint64_t>(bytes);
    w.Raw(host.data(), bytes);
  }
  Writer head;
  head.Raw(kMagic, 8);
  head.Pod<uint32_t>(kCheckpointVersion);
  head.Pod<uint32_t>(0);
  head.Pod<uint64_t>(w.buf.size());
  head.Pod<uint64_t>(XXH64(w.buf.data(), w.buf.size(), 0));
  AtomicFile f(path);
  Status st = f.Write(head.buf.data(), head.buf.size());
  if (st.ok()) st = f.Write(w.buf.data(), w.buf.size());
  if (st.ok()) st = f.Commit();
  if (!st.ok()) return st.WithContext("checkpoint");
  return Status::Ok();
}

Status LoadCheckpoint(const std::string& path, Ops* ops, Model* model, const CheckpointMeta& expect,
                      CheckpointMeta* meta) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::NotFound("checkpoint " + path + ": cannot open (no such file?)");
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (data.size() < 32 || std::memcmp(data.data(), kMagic, 8) != 0)
    return Status::Corrupt("checkpoint " + path + ": not a gpufeed checkpoint (bad magic)");
  uint32_t version;
  uint64_t size, hash;
  std::memcpy(&version, data.data() + 8, 4);
  std::memcpy(&size, data.data() + 16, 8);
  std::memcpy(&hash, data.data() + 24, 8);
  if (version != kCheckpointVersion && version != 1)
    return Status::Unsupported("checkpoint " + path + ": version " + std::to_string(version) + ", this build reads " +
                               std::to_string(kCheckpointVersion));
  if (size != data.size() - 32)
    return Status::Corrupt("checkpoint " + path + ": payload is " + std::to_string(data.size() - 32) +
                           " bytes, header says " + std::to_string(size) + " (truncated file?)");
  if (XXH64(data.data() + 32, size, 0) != hash)
    return Status::Corrupt("checkpoint " + path + ": checksum mismatch (the file is damaged)");
  Reader r(std::string_view(data).substr(32), path);
  GPUFEED_RETURN_IF_ERROR(r.Str(&meta->model));
  GPUFEED_RETURN_IF_ERROR(r.Str(&meta->config));
  if (meta->model != expect.model)
    return Status::InvalidArgument("checkpoint " + path + " holds model '" + meta->model + "', this run builds '" +
                                   expect.model + "'");
  if (meta->config != expect.config)
    return Status::InvalidArgument("checkpoint " + path + " was trained with '" + meta->config + "', this run has '" +
                                   expect.config + "'");
  int32_t next_epoch;
  GPUFEED_RETURN_IF_ERROR(r.Pod(&next_epoch));
  meta->next_epoch = next_epoch;
  GPUFEED_RETURN_IF_ERROR(r.Pod(&meta->step));
  GPUFEED_RETURN_IF_ERROR(r.Pod(&meta->scaler));
  std::string ls;
  GPUFEED_RETURN_IF_ERROR(r.Str(&ls));
  auto state = LoaderState::Deserialize(ls);
  if (!state.ok()) return Status::Corrupt("checkpoint " + path + ": " + state.status().message());
  meta->loader = *state;
  const auto tensors = Tensors(model);
  uint32_t count;
  GPUFEED_RETURN_IF_ERROR(r.Pod(&count));
  if (count != tensors.size())
    return Status::Corrupt("checkpoint " + path + ": " + std::to_string(count) + " tensors, the model has " +
                           std::to_string(tensors.size()));
  std::vector<uint8_t> host;
  for (auto& [p, bytes] : tensors) {
    uint64_t len;
    GPUFEED_RETURN_IF_ERROR(r.Pod(&len));
    if (version == 1) len *= 4;  // version 1 counted fp32 values
    if (len != bytes) return Status::Corrupt("checkpoint " + path + ": tensor size mismatch");
    host.resize(bytes);
    GPUFEED_RETURN_IF_ERROR(r.Raw(host.data(), bytes));
    GPUFEED_RETURN_IF_ERROR(ops->Upload(p, host.data(), bytes));
  }
  if (!r.done()) return Status::Corrupt("checkpoint " + path + ": trailing bytes");
  // Compute copies follow the restored masters.
  for (Param& p : model->params())
    if (p.copy && p.copy != p.master) GPUFEED_RETURN_IF_ERROR(ops->Cast(p.master, p.copy, model->spec().dtype, p.n));
  return Status::Ok();
}

}  // namespace gpufeed::trainer
