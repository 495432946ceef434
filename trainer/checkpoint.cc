// Checkpoint writing and reading (format in checkpoint.h).
#include "trainer/checkpoint.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "common/atomic_file.h"
#include "hdf5io/io/read_file.h"

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

}  // namespace

std::vector<std::pair<void*, size_t>> ParamTensors(Model* model) {
  std::vector<std::pair<void*, size_t>> t;
  for (Param& p : model->params()) {
    t.emplace_back(p.master, p.n * 4);
    if (p.frozen()) continue;  // no optimizer state
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
  return t;
}

std::vector<std::pair<void*, size_t>> BufferTensors(Model* model) {
  std::vector<std::pair<void*, size_t>> t;
  for (auto& [b, n] : model->buffers()) t.emplace_back(b, n * 4);
  return t;
}

namespace {

// The tensors a checkpoint of one model holds, in order, as (address, bytes).
std::vector<std::pair<void*, size_t>> Tensors(Model* model) {
  auto t = ParamTensors(model);
  for (auto& b : BufferTensors(model)) t.push_back(b);
  return t;
}

// The file's payload (after the checked header) and its format version.
Status ReadPayload(const std::string& path, std::string* data, uint32_t* version) {
  // Read whole through io (hdf5io/io/read_file.h).
  if (Status read = io::ReadWholeFile(path, data); !read.ok()) {
    if (read.code() == StatusCode::kNotFound) {
      return Status::NotFound("checkpoint " + path + ": cannot open (no such file?)");
    }
    return read.WithContext("checkpoint");
  }
  if (data->size() < 32 || std::memcmp(data->data(), kMagic, 8) != 0)
    return Status::Corrupt("checkpoint " + path + ": not a gpufeed checkpoint (bad magic)");
  uint64_t size, hash;
  std::memcpy(version, data->data() + 8, 4);
  std::memcpy(&size, data->data() + 16, 8);
  std::memcpy(&hash, data->data() + 24, 8);
  if (*version != kCheckpointVersion && *version != 1)
    return Status::Unsupported("checkpoint " + path + ": version " + std::to_string(*version) + ", this build reads " +
                               std::to_string(kCheckpointVersion));
  if (size != data->size() - 32)
    return Status::Corrupt("checkpoint " + path + ": payload is " + std::to_string(data->size() - 32) +
                           " bytes, header says " + std::to_string(size) + " (truncated file?)");
  if (XXH64(data->data() + 32, size, 0) != hash)
    return Status::Corrupt("checkpoint " + path + ": checksum mismatch (the file is damaged)");
  return Status::Ok();
}

// A "key=value" of a config string ("precision=bf16 optimizer=adamw ..."); empty if absent.
std::string ConfigValue(const std::string& config, const std::string& key) {
  const std::string k = key + "=";
  for (size_t at = 0; at < config.size();) {
    size_t end = config.find(' ', at);
    if (end == std::string::npos) end = config.size();
    if (config.compare(at, k.size(), k) == 0) return config.substr(at + k.size(), end - at - k.size());
    at = end + 1;
  }
  return "";
}

// "cnn 1x28x28-c64-c128-10" without its classes: "cnn 1x28x28-c64-c128".
std::string WithoutHead(const std::string& model) { return model.substr(0, model.rfind('-')); }

// The config without the keys of the batch split (batch, accum, world).
std::string WithoutSplit(const std::string& config) {
  std::string out;
  for (size_t at = 0; at < config.size();) {
    size_t end = config.find(' ', at);
    if (end == std::string::npos) end = config.size();
    const std::string item = config.substr(at, end - at);
    const std::string key = item.substr(0, item.find('='));
    if (key != "batch" && key != "accum" && key != "world") out += (out.empty() ? "" : " ") + item;
    at = end + 1;
  }
  return out;
}

uint64_t ConfigNumber(const std::string& config, const std::string& key) {
  const std::string v = ConfigValue(config, key);
  return v.empty() ? 0 : std::strtoull(v.c_str(), nullptr, 10);
}

}  // namespace

Status CheckResumeConfig(const std::string& path, const std::string& saved, const std::string& ours) {
  if (WithoutSplit(saved) != WithoutSplit(ours))
    return Status::InvalidArgument("checkpoint " + path + " was trained with '" + saved + "', this run has '" + ours +
                                   "'");
  const uint64_t sb = ConfigNumber(saved, "batch"), sa = ConfigNumber(saved, "accum"),
                 sw = ConfigNumber(saved, "world");
  const uint64_t ob = ConfigNumber(ours, "batch"), oa = ConfigNumber(ours, "accum"), ow = ConfigNumber(ours, "world");
  if (sb == ob && sa == oa) return Status::Ok();  // the same per rank: any world size
  auto split = [](uint64_t b, uint64_t a, uint64_t w) {
    return "--batch-size " + std::to_string(b) + " x --accum " + std::to_string(a) + " x " + std::to_string(w) +
           (w == 1 ? " rank" : " ranks");
  };
  if (sw == 0)
    return Status::InvalidArgument("checkpoint " + path + " was trained with --batch-size " + std::to_string(sb) +
                                   " --accum " + std::to_string(sa) +
                                   " and does not record its ranks (an older gpufeed wrote it): resume with that "
                                   "--batch-size and --accum");
  const uint64_t global = sb * sa * sw;
  if (ow > 0 && global == ob * oa * ow) return Status::Ok();  // the same training at another width
  std::string fits;
  if (ow > 0 && global % (ow * oa) == 0)
    fits = "--batch-size " + std::to_string(global / (ow * oa)) + " --accum " + std::to_string(oa);
  else if (ow > 0 && global % ow == 0)
    fits = "--batch-size " + std::to_string(global / ow) + " --accum 1";
  return Status::InvalidArgument(
      "checkpoint " + path + " was trained with a global batch of " + std::to_string(global) + " (" +
      split(sb, sa, sw) + "), this run's is " + std::to_string(ob * oa * ow) + " (" + split(ob, oa, ow) +
      "): resume with the same global batch" + (fits.empty() ? "" : " (here: " + fits + ")") +
      ", or with the checkpoint's --batch-size " + std::to_string(sb) + " and --accum " + std::to_string(sa) +
      " at any number of ranks");
}

Status WriteCheckpoint(const std::string& path, const CheckpointMeta& meta, const std::vector<std::string>& tensors) {
  Writer w;
  w.Str(meta.model);
  w.Str(meta.config);
  w.Pod<int32_t>(meta.next_epoch);
  w.Pod<int64_t>(meta.step);
  w.Pod(meta.scaler);
  w.Str(meta.loader.Serialize());
  w.Pod<uint32_t>(static_cast<uint32_t>(tensors.size()));
  for (const std::string& t : tensors) {
    w.Pod<uint64_t>(t.size());
    w.Raw(t.data(), t.size());
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

Status SaveCheckpoint(const std::string& path, Ops* ops, Model* model, const CheckpointMeta& meta) {
  std::vector<std::string> host;
  for (auto& [p, bytes] : Tensors(model)) {
    host.emplace_back(bytes, '\0');
    GPUFEED_RETURN_IF_ERROR(ops->Download(host.back().data(), p, bytes));
  }
  return WriteCheckpoint(path, meta, host);
}

Status ReadCheckpoint(const std::string& path, const CheckpointMeta& expect, const std::vector<size_t>& sizes,
                      CheckpointMeta* meta, std::vector<std::string>* tensors) {
  std::string data;
  uint32_t version = 0;
  GPUFEED_RETURN_IF_ERROR(ReadPayload(path, &data, &version));
  Reader r(std::string_view(data).substr(32), path);
  GPUFEED_RETURN_IF_ERROR(r.Str(&meta->model));
  GPUFEED_RETURN_IF_ERROR(r.Str(&meta->config));
  if (meta->model != expect.model)
    return Status::InvalidArgument("checkpoint " + path + " holds model '" + meta->model + "', this run builds '" +
                                   expect.model + "'");
  GPUFEED_RETURN_IF_ERROR(CheckResumeConfig(path, meta->config, expect.config));
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
  uint32_t count;
  GPUFEED_RETURN_IF_ERROR(r.Pod(&count));
  if (count != sizes.size())
    return Status::Corrupt("checkpoint " + path + ": " + std::to_string(count) + " tensors, the model has " +
                           std::to_string(sizes.size()));
  tensors->clear();
  for (size_t bytes : sizes) {
    uint64_t len;
    GPUFEED_RETURN_IF_ERROR(r.Pod(&len));
    if (version == 1) len *= 4;  // version 1 counted fp32 values
    if (len != bytes) return Status::Corrupt("checkpoint " + path + ": tensor size mismatch");
    tensors->emplace_back(bytes, '\0');
    GPUFEED_RETURN_IF_ERROR(r.Raw(tensors->back().data(), bytes));
  }
  if (!r.done()) return Status::Corrupt("checkpoint " + path + ": trailing bytes");
  return Status::Ok();
}

Status LoadCheckpoint(const std::string& path, Ops* ops, Model* model, const CheckpointMeta& expect,
                      CheckpointMeta* meta) {
  const auto tensors = Tensors(model);
  std::vector<size_t> sizes;
  for (auto& t : tensors) sizes.push_back(t.second);
  std::vector<std::string> host;
  GPUFEED_RETURN_IF_ERROR(ReadCheckpoint(path, expect, sizes, meta, &host));
  for (size_t i = 0; i < tensors.size(); ++i)
    GPUFEED_RETURN_IF_ERROR(ops->Upload(tensors[i].first, host[i].data(), tensors[i].second));
  // Compute copies follow the restored masters.
  for (Param& p : model->params())
    if (p.copy && p.copy != p.master) GPUFEED_RETURN_IF_ERROR(ops->Cast(p.master, p.copy, model->spec().dtype, p.n));
  return Status::Ok();
}

Status LoadWeights(const std::string& path, Ops* ops, Model* model, std::string* note) {
  std::string data;
  uint32_t version = 0;
  GPUFEED_RETURN_IF_ERROR(ReadPayload(path, &data, &version));
  Reader r(std::string_view(data).substr(32), path);
  std::string their_model, config;
  GPUFEED_RETURN_IF_ERROR(r.Str(&their_model));
  GPUFEED_RETURN_IF_ERROR(r.Str(&config));
  const std::string ours = model->Describe();
  if (WithoutHead(their_model) != WithoutHead(ours))
    return Status::InvalidArgument("--init " + path + " holds model '" + their_model + "', this run builds '" + ours +
                                   "' (the same layers are needed; only the classes may differ)");
  int32_t next_epoch;
  int64_t step;
  ScalerState scaler;
  std::string loader;
  GPUFEED_RETURN_IF_ERROR(r.Pod(&next_epoch));
  GPUFEED_RETURN_IF_ERROR(r.Pod(&step));
  GPUFEED_RETURN_IF_ERROR(r.Pod(&scaler));
  GPUFEED_RETURN_IF_ERROR(r.Str(&loader));
  // The checkpoint's layout of optimizer state, from the config it was
  // trained with: which tensors follow each master.
  if (!ConfigValue(config, "lora").empty())
    return Status::InvalidArgument("--init " + path +
                                   " holds LoRA adapters; start from the checkpoint --merge-lora wrote for that run");
  const std::string opt = ConfigValue(config, "optimizer");
  const bool adam = opt == "adamw" || opt == "adamw8bit";
  const bool quantized = opt == "adamw8bit" || opt == "sgd8bit";
  if (!adam && opt != "sgd" && opt != "sgd8bit")
    return Status::Corrupt("checkpoint " + path + ": unknown optimizer in '" + config + "'");
  std::vector<std::string> their_frozen;
  for (std::string f = ConfigValue(config, "freeze"); !f.empty();) {
    const size_t comma = f.find(',');
    their_frozen.push_back(f.substr(0, comma));
    f = comma == std::string::npos ? "" : f.substr(comma + 1);
  }
  uint32_t count;
  GPUFEED_RETURN_IF_ERROR(r.Pod(&count));
  auto next = [&](uint64_t* len) -> Status {
    if (count == 0) return Status::Corrupt("checkpoint " + path + ": fewer tensors than its model has");
    --count;
    GPUFEED_RETURN_IF_ERROR(r.Pod(len));
    if (version == 1) *len *= 4;
    return Status::Ok();
  };
  std::vector<uint8_t> host, skip;
  auto& params = model->params();
  int head_kept = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    Param& p = params[i];
    // This run's adapters are not in a checkpoint without LoRA: they start fresh.
    if (p.name.find(".lora_") != std::string::npos) continue;
    const bool head = i + Model::kHeadParams >= params.size();
    uint64_t len;
    GPUFEED_RETURN_IF_ERROR(next(&len));
    host.resize(len);
    GPUFEED_RETURN_IF_ERROR(r.Raw(host.data(), len));
    if (len == p.n * 4) {
      GPUFEED_RETURN_IF_ERROR(ops->Upload(p.master, host.data(), len));
      if (head) ++head_kept;
    } else if (!head) {
      return Status::Corrupt("checkpoint " + path + ": " + p.name + " holds " + std::to_string(len / 4) +
                             " values, the model has " + std::to_string(p.n));
    }
    // Skip the optimizer state the checkpoint keeps after this master.
    const uint64_t n = len / 4;
    const bool was_frozen = std::any_of(their_frozen.begin(), their_frozen.end(),
                                        [&](const std::string& f) { return p.name.compare(0, f.size(), f) == 0; });
    const int states = was_frozen ? 0 : (quantized && n >= kQuantMinElems ? (adam ? 4 : 2) : (adam ? 2 : 1));
    for (int k = 0; k < states; ++k) {
      GPUFEED_RETURN_IF_ERROR(next(&len));
      skip.resize(len);
      GPUFEED_RETURN_IF_ERROR(r.Raw(skip.data(), len));
    }
  }
  for (auto& [b, n] : model->buffers()) {
    uint64_t len;
    GPUFEED_RETURN_IF_ERROR(next(&len));
    if (len != n * 4) return Status::Corrupt("checkpoint " + path + ": batchnorm statistics of another size");
    host.resize(len);
    GPUFEED_RETURN_IF_ERROR(r.Raw(host.data(), len));
    GPUFEED_RETURN_IF_ERROR(ops->Upload(b, host.data(), len));
  }
  if (count != 0 || !r.done()) return Status::Corrupt("checkpoint " + path + ": more tensors than its model has");
  for (Param& p : params)
    if (p.copy && p.copy != p.master) GPUFEED_RETURN_IF_ERROR(ops->Cast(p.master, p.copy, model->spec().dtype, p.n));
  *note = "weights of " + path + " ('" + their_model + "', epoch " + std::to_string(next_epoch) + ")";
  if (head_kept < Model::kHeadParams) *note += "; its head has other classes: the head starts fresh";
  return Status::Ok();
}

}  // namespace gpufeed::trainer
