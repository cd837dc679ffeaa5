#include "server/tls_relay.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "host/sigpipe_blocked.hpp"
#include "rlm_sys/sys.hpp"
#include "server/client_wire.hpp"
#include "server/remote_wire.hpp"
#include "server/tls.hpp"

namespace rlm::server {
namespace {

using host::UniqueFd;
using nlohmann::json;

// One context per set of files for the process: loading them costs more than a run, and the
// context keeps each endpoint's resumption ticket (a reconnect skips the certificate exchange).
std::shared_ptr<TlsContext> context_for(const TlsFiles& files) {
  static std::mutex mutex;
  static std::map<std::tuple<std::string, std::string, std::string>, std::shared_ptr<TlsContext>>
      contexts;
  std::lock_guard lock(mutex);
  auto& slot = contexts[{files.cert, files.key, files.ca}];
  if (!slot) slot = TlsContext::for_client(files.cert, files.key, files.ca);
  return slot;
}

bool write_whole(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t put = write(fd, bytes.data(), bytes.size());
    if (put > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(put));
    } else if (put < 0 && errno == EINTR) {
      continue;
    } else if (put < 0 && errno == EAGAIN) {
      pollfd entry{fd, POLLOUT, 0};
      poll(&entry, 1, 1000);
    } else {
      return false;
    }
  }
  return true;
}

// The relay of one connection; lives on its own thread until either side ends.
class Relay {
 public:
  Relay(TlsStream tls, UniqueFd app, std::string endpoint)
      : tls_(std::move(tls)), app_(std::move(app)), endpoint_(std::move(endpoint)) {}

  void run() {
    const host::SigpipeBlocked quiet_pipe;  // a client pipe whose reader left: EPIPE, not death
    try {
      loop();
    } catch (const std::exception& error) {
      // The client's code reads why, as the server's own refusal: with TLS 1.3 a certificate
      // the server rejects is told (an alert) only after the handshake, on the first read.
      send_frame_now(app_.get(), error_frame("unavailable", "TLS connection to " + endpoint_ +
                                                                ": " + error.what()));
    }
    tls_.close_now();
  }

 private:
  void loop() {
    for (;;) {
      std::vector<pollfd> polled{{tls_.fd(), POLLIN, 0}, {app_.get(), POLLIN, 0}};
      std::vector<std::uint32_t> ids;
      for (auto& [id, fd] : sources_) {
        polled.push_back({fd.get(), POLLIN, 0});
        ids.push_back(id);
      }
      if (poll(polled.data(), polled.size(), tls_.buffered() ? 0 : -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (polled[0].revents || tls_.buffered()) {
        // A large frame (a result, a cell result, an LM call) goes on as its bytes come.
        const auto pass = [this](std::string_view bytes) {
          send_encoded(app_.get(), bytes, Clock::now() + kServerFrameTimeout);
        };
        if (!reader_.fill(tls_, pass)) return;  // the server ended: the client's code sees EOF
        while (auto frame = reader_.next()) from_server(std::move(*frame));
      }
      if (polled[1].revents) {
        auto frame = receive_frame(app_.get(), Clock::now() + kServerFrameTimeout,
                                   kServerFrameTimeout, kMaxServerFrame);
        if (!frame) return;  // the client's code is done with the connection
        from_app(std::move(*frame));
      }
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (polled[i + 2].revents) read_source(ids[i]);
    }
  }

  void to_server(const json& frame) {
    send_tls_frame(tls_, frame, Clock::now() + kServerFrameTimeout);
  }

  // A frame of the client's code: its fds become streams.
  void from_app(Frame frame) {
    json& message = frame.message;
    if (!frame.fds.empty()) {
      const std::string op = message["op"].get<std::string>();
      const auto kinds = stream_kinds_of(op, frame.fds.size());
      if (!kinds) throw WireError("op \"" + op + "\" does not carry fds over TLS");
      json declared = json::array();
      std::vector<std::uint32_t> files_in;
      for (std::size_t i = 0; i < kinds->size(); ++i) {
        const std::uint32_t id = next_id_++;
        declared.push_back({{"id", id}, {"kind", to_string((*kinds)[i])}});
        UniqueFd& fd = frame.fds[i];
        switch ((*kinds)[i]) {
          case StreamKind::in:
            sources_.emplace(id, std::move(fd));
            break;
          case StreamKind::file_in:
            files_in.push_back(id);
            file_sources_.emplace(id, std::move(fd));
            break;
          case StreamKind::out:
          case StreamKind::file_out:
            sinks_.emplace(id, std::move(fd));
            break;
        }
      }
      message["streams"] = std::move(declared);
      to_server(message);
      for (const std::uint32_t id : files_in) send_file(id);
      return;
    }
    to_server(message);
  }

  void send_file(std::uint32_t id) {
    const auto found = file_sources_.find(id);
    std::array<char, kStreamChunk> chunk;
    for (off_t offset = 0;;) {
      const ssize_t got = pread(found->second.get(), chunk.data(), chunk.size(), offset);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      offset += got;
      to_server(data_frame(id, std::string_view(chunk.data(), static_cast<std::size_t>(got))));
    }
    to_server(eof_frame(id));
    file_sources_.erase(found);
  }

  void read_source(std::uint32_t id) {
    const auto found = sources_.find(id);
    if (found == sources_.end()) return;
    std::array<char, kStreamChunk> chunk;
    const ssize_t got = read(found->second.get(), chunk.data(), chunk.size());
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (got <= 0) {
      to_server(eof_frame(id));
      sources_.erase(found);
      return;
    }
    to_server(data_frame(id, std::string_view(chunk.data(), static_cast<std::size_t>(got))));
  }

  void from_server(json frame) {
    const std::string op = frame["op"].get<std::string>();
    if (op == "data" || op == "eof") {
      const std::uint32_t id = stream_of(frame);
      const auto found = sinks_.find(id);
      if (found == sinks_.end()) {
        // Ours closed (the client stopped reading): what comes after is dropped.
        if (sources_.count(id) || file_sources_.count(id))
          throw WireError("the server sent on a stream of ours");
        return;
      }
      if (op == "eof") {
        sinks_.erase(found);
      } else if (!write_whole(found->second.get(), data_of(frame))) {
        sinks_.erase(found);  // the reader is gone; the run's own cap or end stops the rest
      }
      return;
    }
    send_frame(app_.get(), frame, Clock::now() + kServerFrameTimeout);
  }

  TlsStream tls_;
  UniqueFd app_;
  std::string endpoint_;
  TlsFrameReader reader_{kMaxServerFrame};
  std::uint32_t next_id_ = 1;
  std::map<std::uint32_t, UniqueFd> sources_;       // in: what we read and send
  std::map<std::uint32_t, UniqueFd> file_sources_;  // file_in: sent whole after its frame
  std::map<std::uint32_t, UniqueFd> sinks_;         // out, file_out: where the server's bytes go
};

}  // namespace

bool is_tls_endpoint(std::string_view endpoint) {
  return endpoint.starts_with("tls://");
}

UniqueFd connect_tls(const std::string& endpoint, const TlsFiles& files,
                     Clock::time_point deadline) {
  const auto where = split_host_port(std::string_view(endpoint).substr(6));
  if (!where) throw ServerRefused("unavailable", "'" + endpoint + "' is not tls://HOST:PORT");
  std::shared_ptr<TlsContext> context;
  try {
    context = context_for(files);
  } catch (const Error& error) {
    throw ServerRefused("unavailable", std::string("TLS client files: ") + error.what() +
                                           " (--tls-cert, --tls-key, --tls-ca or "
                                           "RLM_SANDBOX_TLS_CERT, _KEY, _CA)");
  }
  UniqueFd socket = connect_tcp(*where, deadline);
  std::optional<TlsStream> tls;
  try {
    tls.emplace(TlsStream::connect(context, std::move(socket), where->host, endpoint, deadline));
  } catch (const WireError& error) {
    throw ServerRefused("unavailable", error.what());
  }
  int ends[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0)
    throw ServerRefused("unavailable", "socketpair: " + sys::errno_text(errno));
  UniqueFd app(ends[0]), relay_end(ends[1]);
  auto relay = std::make_unique<Relay>(std::move(*tls), std::move(relay_end), endpoint);
  try {
    std::thread([relay = std::move(relay)] {
      pthread_setname_np(pthread_self(), "rlm-tls-relay");
      relay->run();
    }).detach();
  } catch (const std::system_error& error) {
    throw ServerRefused("unavailable", std::string("no thread for the TLS relay: ") + error.what());
  }
  return app;
}

}  // namespace rlm::server
