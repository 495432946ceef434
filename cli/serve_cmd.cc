// `gpufeed serve`: runs the loader daemon (gpufeed/server.h) until SIGINT or
// SIGTERM, then stops gracefully and exits 0.
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "gpufeed/server.h"

namespace gpufeed::cli {

namespace {

// The flags that name what is served: --data, and each --field and
// --no-sample-axis, which belong to the --data before them. Their values
// are assigned to their --data once the command line is parsed (AssignFields).
struct ServeDataFlags {
  CLI::Option* data = nullptr;
  CLI::Option* field = nullptr;
  CLI::Option* no_axis = nullptr;
  std::shared_ptr<std::vector<std::string>> field_args = std::make_shared<std::vector<std::string>>();
  // Counted (repeatable: once per --data); which --data each belongs to
  // comes from the parse order (AssignFields).
  std::shared_ptr<int> no_axis_count = std::make_shared<int>(0);
};

ServeDataFlags AddServeDataFlags(CLI::App* cmd, ServerOptions* o) {
  ServeDataFlags f;
  f.data = cmd->add_option("--data", o->data,
                           "FILE.h5 or FILE.h5:/path (a single array or encoded images), or many files (a quoted "
                           "glob, a directory, a list) with --field; repeat to serve several")
               ->required();
  f.field = cmd->add_option(
      "--field", *f.field_args,
      "NAME=/hdf5/path: a named field of the --data before it (repeatable, in the order batches carry them)");
  f.no_axis = cmd->add_flag("--no-sample-axis", *f.no_axis_count,
                            "each file of the --data before it holds one sample, its datasets without a sample axis "
                            "(DeepCAM's reference files: /climate/data [768, 1152, 16])");
  return f;
}

// The server's own flags: where it listens, its threads, memory, limits,
// timeouts, log and lease.
void AddServeServerFlags(CLI::App* cmd, const std::shared_ptr<ServerOptions>& o) {
  cmd->add_option("--listen", o->listen, "unix:PATH (mode 0600) or tcp://HOST:PORT (HOST empty: loopback)")
      ->capture_default_str();
  AddTableOption(cmd, "threads", &o->loader_threads, "shared by the streams' loaders; here 0 is all cores");
  cmd->add_option("--io-threads", o->io_threads, "Asio threads")->capture_default_str();
  AddTableOption(cmd, "prefetch", &o->prefetch, "of each stream's loader")->capture_default_str();
  AddCacheBytesOption(cmd, &o->cache_bytes, "decoded-chunk cache of each stream (default 256 MiB)");
  AddBytesOption(cmd, "--memory-bytes", &o->memory_bytes, "budget for all streams' memory bounds (a size: 64GiB)")
      ->default_str(std::to_string(o->memory_bytes));
  cmd->add_option("--token-file", o->token_file, "shared secret clients must send (required for TCP)");
  cmd->add_option("--metrics", o->metrics_listen,
                  "PORT (on 127.0.0.1) or HOST:PORT for Prometheus GET /metrics; plain HTTP, for trusted networks");
  cmd->add_flag_function(
      "--metrics-without-token", [o](int64_t) { o->metrics_require_token = false; },
      "with --token-file, /metrics answers without \"Authorization: Bearer <token>\" (default: 401)");
  cmd->add_option("--max-connections", o->max_connections,
                  "connections past a valid HELLO; beyond this one is refused at its HELLO")
      ->capture_default_str();
  cmd->add_option("--max-pending-handshakes", o->max_pending_handshakes,
                  "connections without a valid HELLO yet; beyond this the oldest is dropped")
      ->capture_default_str();
  cmd->add_option("--handshake-timeout-ms", o->handshake_timeout_ms, "accept to a valid HELLO")->capture_default_str();
  cmd->add_option("--max-parked", o->max_parked, "warm Loaders kept for clients' next epochs; beyond, the oldest go")
      ->capture_default_str();
  cmd->add_option("--max-parked-bytes", o->max_parked_bytes,
                  "memory the parked Loaders may keep reserved (0: half of --memory-bytes)")
      ->capture_default_str();
  cmd->add_option("--idle-timeout-ms", o->idle_timeout_ms, "silence from a client before it is dropped")
      ->capture_default_str();
  cmd->add_option("--write-timeout-ms", o->write_timeout_ms, "a client that takes no frame this long is dropped")
      ->capture_default_str();
  cmd->add_option("--log-format", o->log_format, "the log on stderr: kv (key=value lines) or json (an object a line)")
      ->capture_default_str();
  cmd->add_option("--log-level", o->log_level, "debug, info, warn or error")->capture_default_str();
  cmd->add_option("--lease-file", o->lease_file,
                  "stop once no process holds a shared flock on this file (how gpufeed.Loader(share=\"node\") "
                  "ends the node's server with the job's last rank)");
  cmd->add_option("--lease-lock", o->lease_lock_file,
                  "the clients' start-up lock: when the lease ends and this lock is free, the lease file, this "
                  "file and the --lease-remove files are removed");
  cmd->add_option("--lease-remove", o->lease_remove, "a file to remove with the lease file (see --lease-lock)");
}

// Each --field and --no-sample-axis into o's entry of the --data before it
// (CLI11 records every value's and flag's option in command-line order).
// False, the error printed, when one comes before any --data.
bool AssignFields(const CLI::App& cmd, const ServeDataFlags& f, ServerOptions* o) {
  o->fields.assign(o->data.size(), {});
  o->no_sample_axis.assign(o->data.size(), false);
  size_t data_seen = 0, field_seen = 0;
  for (const CLI::Option* opt : cmd.parse_order()) {
    if (opt == f.data) {
      ++data_seen;
    } else if (opt == f.field && field_seen < f.field_args->size()) {
      if (data_seen == 0) {
        std::fprintf(stderr, "gpufeed serve: --field %s comes before any --data (put it after its dataset)\n",
                     (*f.field_args)[field_seen].c_str());
        return false;
      }
      o->fields[data_seen - 1].push_back((*f.field_args)[field_seen++]);
    } else if (opt == f.no_axis) {
      if (data_seen == 0) {
        std::fprintf(stderr,
                     "gpufeed serve: --no-sample-axis comes before any --data (put it after the dataset whose "
                     "files have no sample axis)\n");
        return false;
      }
      o->no_sample_axis[data_seen - 1] = true;
    }
  }
  return true;
}

// Starts the server and serves until it stops; the command's exit code.
int RunServe(const ServerOptions& o) {
  auto server = Server::Start(o);
  if (!server.ok()) {
    std::fprintf(stderr, "gpufeed serve: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("gpufeed serve: listening on %s%s%s (Ctrl-C stops)\n", (*server)->endpoint().c_str(),
              (*server)->metrics_endpoint().empty() ? "" : ", metrics on http://",
              (*server)->metrics_endpoint().empty() ? "" : ((*server)->metrics_endpoint() + "/metrics").c_str());
  std::fflush(stdout);
  Status st = (*server)->Wait();
  return st.ok() ? 0 : 1;
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<ServerOptions>();
  o->loader_threads = 0;  // ServerOptions: 0 is every core this process may use
  o->handle_signals = true;
  CLI::App* cmd = app.add_subcommand(
      "serve", "Run the loader daemon: stream batches to RemoteLoader clients over a Unix socket or TCP");
  const ServeDataFlags data = AddServeDataFlags(cmd, o.get());
  AddServeServerFlags(cmd, o);
  cmd->callback([o, exit_code, cmd, data] {
    if (!AssignFields(*cmd, data, o.get())) {
      *exit_code = 1;
      return;
    }
    *exit_code = RunServe(*o);
  });
}

}  // namespace gpufeed::cli
