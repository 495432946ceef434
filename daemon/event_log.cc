#include "daemon/event_log.h"

#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <mutex>

namespace gpufeed::daemon {

namespace {

// Hands each formatted line to a callback (ServerOptions::log: tests, embedders).
class CallbackSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit CallbackSink(std::function<void(std::string_view)> f) : f_(std::move(f)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    std::string_view line(buf.data(), buf.size());
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
    f_(line);
  }
  void flush_() override {}

 private:
  std::function<void(std::string_view)> f_;
};

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      static const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

bool ParseLevel(const std::string& s, spdlog::level::level_enum* l) {
  if (s == "debug")
    *l = spdlog::level::debug;
  else if (s == "info")
    *l = spdlog::level::info;
  else if (s == "warn")
    *l = spdlog::level::warn;
  else if (s == "error")
    *l = spdlog::level::err;
  else
    return false;
  return true;
}

}  // namespace

Result<std::unique_ptr<EventLog>> EventLog::Create(const std::string& format, const std::string& level,
                                                   std::function<void(std::string_view)> sink) {
  if (format != "kv" && format != "json") {
    return Status::InvalidArgument("--log-format '" + format + "': use kv (key=value, the default) or json");
  }
  spdlog::level::level_enum min{};
  if (!ParseLevel(level, &min)) {
    return Status::InvalidArgument("--log-level '" + level + "': use debug, info, warn or error");
  }
  spdlog::sink_ptr s;
  if (sink) {
    s = std::make_shared<CallbackSink>(std::move(sink));
  } else {
    s = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  }
  auto logger = std::make_shared<spdlog::logger>("gpufeed-serve", std::move(s));
  // The time is spdlog's (UTC, milliseconds); level and event are ours (%v),
  // so the level names stay debug/info/warn/error in both formats.
  logger->set_formatter(std::make_unique<spdlog::pattern_formatter>(
      format == "json" ? "{\"ts\":\"%Y-%m-%dT%H:%M:%S.%eZ\",%v}" : "ts=%Y-%m-%dT%H:%M:%S.%eZ %v",
      spdlog::pattern_time_type::utc));
  logger->set_level(min);
  logger->flush_on(spdlog::level::debug);  // a daemon's log is read while it runs
  return std::unique_ptr<EventLog>(new EventLog(format == "json", std::move(logger)));
}

EventLog::EventLog(bool json, std::shared_ptr<spdlog::logger> logger) : json_(json), logger_(std::move(logger)) {}
EventLog::~EventLog() = default;

void EventLog::Log(const char* level, const std::string& event, const std::string& fields) {
  spdlog::level::level_enum l = spdlog::level::info;
  if (!ParseLevel(level, &l)) l = spdlog::level::info;
  if (!logger_->should_log(l)) return;
  std::string body;
  if (json_) {
    body = "\"level\":" + JsonString(level) + ",\"event\":" + JsonString(event);
    for (const auto& [k, v] : SplitKv(fields)) body += "," + JsonString(k) + ":" + JsonString(v);
  } else {
    body = std::string("level=") + level + " " + Kv("event", event) + (fields.empty() ? "" : " " + fields);
  }
  logger_->log(l, spdlog::string_view_t(body.data(), body.size()));
}

std::string Kv(const std::string& key, const std::string& value) {
  bool plain = !value.empty();
  for (char c : value) plain = plain && c > ' ' && c != '"' && c != '=' && c != '\\';
  if (plain) return key + "=" + value;
  std::string q = key + "=\"";
  for (char c : value) {
    if (c == '"' || c == '\\') q += '\\';
    q += c == '\n' ? ' ' : c;
  }
  return q + "\"";
}
std::string Kv(const std::string& key, uint64_t value) { return key + "=" + std::to_string(value); }

std::vector<std::pair<std::string, std::string>> SplitKv(std::string_view f) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t i = 0;
  while (i < f.size()) {
    while (i < f.size() && f[i] == ' ') ++i;
    if (i >= f.size()) break;
    const size_t eq = f.find('=', i);
    const size_t sp = f.find(' ', i);
    if (eq == std::string_view::npos || (sp != std::string_view::npos && sp < eq)) {  // a bare word
      const size_t end = sp == std::string_view::npos ? f.size() : sp;
      out.emplace_back(std::string(f.substr(i, end - i)), "");
      i = end;
      continue;
    }
    std::string key(f.substr(i, eq - i)), value;
    i = eq + 1;
    if (i < f.size() && f[i] == '"') {
      for (++i; i < f.size() && f[i] != '"'; ++i) {
        if (f[i] == '\\' && i + 1 < f.size()) ++i;
        value += f[i];
      }
      ++i;  // the closing quote
    } else {
      const size_t end = f.find(' ', i);
      value = std::string(f.substr(i, (end == std::string_view::npos ? f.size() : end) - i));
      i = end == std::string_view::npos ? f.size() : end;
    }
    out.emplace_back(std::move(key), std::move(value));
  }
  return out;
}

}  // namespace gpufeed::daemon
