#include "server/tls_relay.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include <array>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
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

// Connections the server said were idle between ops, kept for this process's next op on the same
// endpoint (a handshake, a TCP connection and the server's thread for it saved): at most 8 per
// endpoint, each for 20 s (the server keeps one 30 s). And the relays running, by endpoint, so
// that a connection about to be parked (its client's code done with it) is waited for rather
// than a new one made.
class IdleConnections {
 public:
  static IdleConnections& instance() {
    static IdleConnections* pool = new IdleConnections;  // never destroyed: relays may outlive main
    return *pool;
  }

  // Relay threads running. At the process's exit they get a moment (1 s at most) to end the op
  // they relay -- the server's "idle" is usually microseconds away -- and to free what OpenSSL
  // keeps for each thread; a thread still running at exit would leave its state behind.
  void thread_started() {
    std::lock_guard lock(mutex_);
    if (!exit_wait_registered_) {
      exit_wait_registered_ = true;
      std::atexit([] { instance().wait_for_threads(std::chrono::seconds(1)); });
    }
    ++threads_;
  }
  void thread_ended() {
    std::lock_guard lock(mutex_);
    --threads_;
    parked_.notify_all();
  }
  void wait_for_threads(std::chrono::milliseconds patience) {
    std::unique_lock lock(mutex_);
    parked_.wait_for(lock, patience, [this] { return threads_ == 0; });
  }

  // A parked connection to `endpoint` the server has not closed, or nullopt.
  std::optional<TlsStream> take(const std::string& endpoint) {
    std::unique_lock lock(mutex_);
    const auto give_up = Clock::now() + std::chrono::milliseconds(100);
    for (;;) {
      const auto found = idle_.find(endpoint);
      while (found != idle_.end() && !found->second.empty()) {
        auto& parked = found->second;
        Parked last = std::move(parked.back());
        parked.pop_back();
        pollfd entry{last.stream.fd(), POLLIN, 0};
        // Readable while idle means the server closed it (or broke the protocol).
        if (Clock::now() - last.since < kKeep && poll(&entry, 1, 0) == 0)
          return std::move(last.stream);
      }
      if (!finishing(endpoint) || Clock::now() >= give_up) return std::nullopt;
      parked_.wait_until(lock, give_up);
    }
  }
  // Parks `stream` and forgets the relay whose client end is `app`, at once: a take() between the
  // two would find neither.
  void park(const std::string& endpoint, TlsStream stream, int app) {
    std::lock_guard lock(mutex_);
    forget(endpoint, app);
    if (idle_.size() < kEndpoints || idle_.count(endpoint)) {
      auto& parked = idle_[endpoint];
      if (parked.size() < kPerEndpoint) parked.push_back({std::move(stream), Clock::now()});
    }
    parked_.notify_all();
  }
  void enter(const std::string& endpoint, int app) {
    std::lock_guard lock(mutex_);
    live_.emplace(endpoint, app);
  }
  void leave(const std::string& endpoint, int app) {
    std::lock_guard lock(mutex_);
    forget(endpoint, app);
    parked_.notify_all();
  }

 private:
  static constexpr auto kKeep = std::chrono::seconds(20);
  static constexpr std::size_t kPerEndpoint = 8, kEndpoints = 4096;
  struct Parked {
    TlsStream stream;
    Clock::time_point since;
  };
  void forget(const std::string& endpoint, int app) {
    for (auto [at, end] = live_.equal_range(endpoint); at != end; ++at)
      if (at->second == app) {
        live_.erase(at);
        break;
      }
  }
  // Whether a relay of `endpoint` has its client's code gone (its end hung up): it parks soon.
  bool finishing(const std::string& endpoint) const {
    for (auto [at, end] = live_.equal_range(endpoint); at != end; ++at) {
      pollfd entry{at->second, POLLIN, 0};
      if (poll(&entry, 1, 0) > 0 && (entry.revents & POLLHUP)) return true;
    }
    return false;
  }
  std::mutex mutex_;
  std::condition_variable parked_;
  std::size_t threads_ = 0;
  bool exit_wait_registered_ = false;
  std::map<std::string, std::vector<Parked>> idle_;
  std::multimap<std::string, int> live_;
};

// The relay of one connection; lives on its own thread until either side ends, or until the
// server says the op is over ("idle") and the connection is parked for the next one.
class Relay {
 public:
  // `key`: the endpoint and the client's files, under which the connection may be parked.
  Relay(TlsStream tls, UniqueFd app, std::string endpoint, std::string key)
      : tls_(std::move(tls)),
        app_(std::move(app)),
        endpoint_(std::move(endpoint)),
        key_(std::move(key)) {
    IdleConnections::instance().enter(key_, app_.get());
  }

  void run() {
    const host::SigpipeBlocked quiet_pipe;  // a client pipe whose reader left: EPIPE, not death
    try {
      loop();
    } catch (const std::exception& error) {
      // The client's code reads why, as the server's own refusal: with TLS 1.3 a certificate
      // the server rejects is told (an alert) only after the handshake, on the first read.
      if (app_ && !reader_.passing())  // never inside a frame half passed on
        send_frame_now(app_.get(), error_frame("unavailable", "TLS connection to " + endpoint_ +
                                                                  ": " + error.what()));
    }
    if (app_) IdleConnections::instance().leave(key_, app_.get());
    if (!parked_) tls_.close_now();
  }

 private:
  // The server ended the op and nothing of it is open: the client's code gets its EOF (as from
  // the unix socket), and the connection waits for the next op.
  bool park() {
    if (!sources_.empty() || !file_sources_.empty() || !sinks_.empty() || reader_.held() != 0 ||
        !outbox_.empty())
      return false;
    IdleConnections::instance().park(key_, std::move(tls_), app_.get());
    app_.reset();
    parked_ = true;
    return true;
  }

  void loop() {
    // Once the client's code hung up before the server said "idle", the op's end is waited for
    // this long; anything else ends the connection (the server then stops what it ran).
    std::optional<Clock::time_point> app_gone;
    for (;;) {
      if (app_gone && Clock::now() >= *app_gone) return;
      std::vector<pollfd> polled{{tls_.fd(), POLLIN, 0}, {app_gone ? -1 : app_.get(), POLLIN, 0}};
      std::vector<std::uint32_t> ids;
      for (auto& [id, fd] : sources_) {
        polled.push_back({fd.get(), POLLIN, 0});
        ids.push_back(id);
      }
      const int timeout = tls_.buffered() ? 0 : app_gone ? sys::poll_timeout_ms(*app_gone) : -1;
      if (poll_after_flush(polled, timeout, outbox_, tls_, Clock::now() + kServerFrameTimeout) <
          0) {
        if (errno == EINTR) continue;
        return;
      }
      if (polled[0].revents || tls_.buffered()) {
        // A large frame (a result, a cell result, an LM call) goes on as its bytes come.
        const auto pass = [this](std::string_view bytes) {
          send_encoded(app_.get(), bytes, Clock::now() + kServerFrameTimeout);
        };
        if (!reader_.fill(tls_, pass)) return;  // the server ended: the client's code sees EOF
        while (auto frame = reader_.next()) {
          if (frame->value("op", "") == "idle") {
            park();
            return;
          }
          if (app_gone) continue;  // the end of an op nobody reads any more
          from_server(std::move(*frame));
        }
      }
      if (polled[1].revents) {
        auto frame = receive_frame(app_.get(), Clock::now() + kServerFrameTimeout,
                                   kServerFrameTimeout, kMaxServerFrame);
        if (!frame) {                        // the client's code is done
          if (!op_begun_ && park()) return;  // it asked nothing: the connection is idle as it was
          // As a unix client's hangup: the server ends the op (a run stops), then says "idle".
          to_server({{"op", "hangup"}});
          sources_.clear();
          file_sources_.clear();
          sinks_.clear();
          app_gone = Clock::now() + std::chrono::seconds(1);
          continue;
        }
        op_begun_ = true;
        from_app(std::move(*frame));
      }
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (polled[i + 2].revents) read_source(ids[i]);
    }
  }

  void to_server(const json& frame) {
    outbox_.add(tls_, frame, Clock::now() + kServerFrameTimeout);
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
  std::string endpoint_, key_;
  bool parked_ = false;    // tls_ went to the idle connections
  bool op_begun_ = false;  // the client's code sent the server something
  TlsFrameReader reader_{kMaxServerFrame};
  FrameOutbox outbox_;  // frames for the server, written when the relay would wait
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
  // An idle connection of this process's to the same server with the same files, or a new one.
  const std::string key = endpoint + "\n" + files.cert + "\n" + files.key + "\n" + files.ca;
  std::optional<TlsStream> tls = IdleConnections::instance().take(key);
  if (!tls) {
    UniqueFd socket = connect_tcp(*where, deadline);
    try {
      tls.emplace(TlsStream::connect(context, std::move(socket), where->host, endpoint, deadline));
    } catch (const WireError& error) {
      throw ServerRefused("unavailable", error.what());
    }
  }
  int ends[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0)
    throw ServerRefused("unavailable", "socketpair: " + sys::errno_text(errno));
  UniqueFd app(ends[0]), relay_end(ends[1]);
  auto relay = std::make_unique<Relay>(std::move(*tls), std::move(relay_end), endpoint, key);
  IdleConnections::instance().thread_started();
  try {
    std::thread([relay = std::move(relay)]() mutable {
      pthread_setname_np(pthread_self(), "rlm-tls-relay");
      relay->run();
      relay.reset();
      OPENSSL_thread_stop();  // this thread's error queue and the like, freed now
      IdleConnections::instance().thread_ended();
    }).detach();
  } catch (const std::system_error& error) {
    IdleConnections::instance().thread_ended();
    throw ServerRefused("unavailable", std::string("no thread for the TLS relay: ") + error.what());
  }
  return app;
}

}  // namespace rlm::server
