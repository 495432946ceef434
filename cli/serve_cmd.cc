// `gpufeed serve`: runs the loader daemon (gpufeed/server.h) until SIGINT or
// SIGTERM, then stops gracefully and exits 0.
#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "gpufeed/server.h"

namespace gpufeed::cli {

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<ServerOptions>();
  o->loader_threads = static_cast<int>(std::thread::hardware_concurrency());
  o->handle_signals = true;
  CLI::App* cmd = app.add_subcommand(
      "serve", "Run the loader daemon: stream batches to RemoteLoader clients over a Unix socket or TCP");
  cmd->add_option("--data", o->data, "FILE.h5 or FILE.h5:/path (repeat to serve several)")->required();
  cmd->add_option("--listen", o->listen, "unix:PATH (mode 0600) or tcp://HOST:PORT (HOST empty: loopback)")
      ->capture_default_str();
  cmd->add_option("--threads", o->loader_threads, "TBB threads of each stream's loader (default: all cores)");
  cmd->add_option("--io-threads", o->io_threads, "Asio threads")->capture_default_str();
  cmd->add_option("--prefetch", o->prefetch, "batches each stream's loader prepares ahead")->capture_default_str();
  cmd->add_option("--cache-bytes", o->cache_bytes, "decoded-chunk cache of each stream")->capture_default_str();
  cmd->add_option("--memory-bytes", o->memory_bytes, "budget for all streams' memory bounds")->capture_default_str();
  cmd->add_option("--token-file", o->token_file, "shared secret clients must send (required for TCP)");
  cmd->add_option("--metrics", o->metrics_listen, "HOST:PORT for Prometheus GET /metrics");
  cmd->add_option("--max-connections", o->max_connections, "connections beyond this are refused")
      ->capture_default_str();
  cmd->add_option("--handshake-timeout-ms", o->handshake_timeout_ms, "accept to HELLO")->capture_default_str();
  cmd->add_option("--idle-timeout-ms", o->idle_timeout_ms, "silence from a client before it is dropped")
      ->capture_default_str();
  cmd->add_option("--write-timeout-ms", o->write_timeout_ms, "a client that takes no frame this long is dropped")
      ->capture_default_str();
  cmd->add_option("--log-format", o->log_format, "the log on stderr: kv (key=value lines) or json (an object a line)")
      ->capture_default_str();
  cmd->add_option("--log-level", o->log_level, "debug, info, warn or error")->capture_default_str();
  cmd->callback([o, exit_code] {
    auto server = Server::Start(*o);
    if (!server.ok()) {
      std::fprintf(stderr, "gpufeed serve: %s\n", server.status().ToString().c_str());
      *exit_code = 1;
      return;
    }
    std::printf("gpufeed serve: listening on %s%s%s (Ctrl-C stops)\n", (*server)->endpoint().c_str(),
                (*server)->metrics_endpoint().empty() ? "" : ", metrics on http://",
                (*server)->metrics_endpoint().empty() ? "" : ((*server)->metrics_endpoint() + "/metrics").c_str());
    std::fflush(stdout);
    Status st = (*server)->Wait();
    *exit_code = st.ok() ? 0 : 1;
  });
}

}  // namespace gpufeed::cli
