#include "server/tls_gateway.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <functional>
#include <map>
#include <vector>

#include "host/sigpipe_blocked.hpp"
#include "host/stdio_pipe.hpp"
#include "rlm_sandbox/units.hpp"
#include "rlm_sys/sys.hpp"
#include "server/client_wire.hpp"

namespace rlm::server {
namespace {

using host::UniqueFd;
using nlohmann::json;

// A client that sends stdin faster than the payload reads it is not read further past this.
constexpr std::size_t kMaxPendingInput = 1u << 20;
// How long output pipes get to reach their end when an op ends, and how long a run's result waits
// while they are read out (the sandbox is gone: only a descendant that escaped its kill could
// still write).
constexpr auto kOutputDrain = std::chrono::seconds(5);
// How long a connection may wait between ops (clients keep it for 20 s at most).
constexpr auto kIdleConnection = std::chrono::seconds(30);
// How long the file of a load may take to arrive (as a session's context: 60 s).
constexpr auto kFileDeadline = std::chrono::seconds(60);
// How often a connection asks whether its client is still served (GatewayLimits::withdrawn).
constexpr auto kTrustLook = std::chrono::seconds(1);

struct Stream {
  StreamKind kind;
  UniqueFd fd;          // in: the pipe's write end; out: its read end; file_*: the memfd
  std::string pending;  // in: bytes waiting for room in the pipe
  bool ended = false;   // in, file_in: the client's eof came
  std::uint64_t bytes = 0;
  std::string role;  // a run's out streams: "stdout", "stderr"
};

[[noreturn]] void broken(const std::string& message) {
  throw WireError(message);
}

std::pair<UniqueFd, UniqueFd> make_pipe() {
  int ends[2];
  if (pipe2(ends, O_CLOEXEC) != 0) throw Error("pipe2: " + sys::errno_text(errno));
  return {UniqueFd(ends[0]), UniqueFd(ends[1])};
}

class Gateway {
 public:
  Gateway(TlsStream& tls, const std::function<UniqueFd()>& open_ops, const GatewayLimits& limits)
      : tls_(tls),
        open_ops_(open_ops),
        limits_(limits),
        reader_(limits.max_frame_bytes, limits.account) {}

  void run() {
    // The first op must come within the frame deadline; each later one within the idle time.
    Clock::time_point idle_until = Clock::now() + limits_.frame_timeout;
    for (;;) {
      std::vector<pollfd> polled;
      std::vector<std::uint32_t> ids;
      const bool paused = pending_input() > kMaxPendingInput;
      polled.push_back({tls_.fd(), static_cast<short>(paused ? 0 : POLLIN), 0});
      polled.push_back({ops_ ? ops_.get() : -1, POLLIN, 0});
      for (auto& [id, stream] : streams_) {
        short events = 0;
        if (stream.kind == StreamKind::out) events = POLLIN;
        if (stream.kind == StreamKind::in && !stream.pending.empty()) events = POLLOUT;
        if (!events) continue;
        polled.push_back({stream.fd.get(), events, 0});
        ids.push_back(id);
      }
      int timeout = !paused && tls_.buffered() ? 0 : -1;
      if (!ops_ && timeout != 0) {
        timeout = sys::poll_timeout_ms(idle_until);
        if (Clock::now() >= idle_until) return;  // idle too long: the connection is closed
      }
      // A frame begun must end within the frame deadline, a file sent for a load within its
      // own, as on the unix socket: a client trickling one holds budget and memory.
      if (reader_.held() == 0) {
        frame_until_.reset();
      } else if (!frame_until_) {
        frame_until_ = Clock::now() + limits_.frame_timeout;
      }
      if (limits_.withdrawn) {
        if (Clock::now() >= next_trust_look_) {
          next_trust_look_ = Clock::now() + kTrustLook;
          // "unavailable", as when the server stops: a client's session ends saying why.
          // Closing ops_ ends the op, and its sandbox goes.
          if (const std::string why = limits_.withdrawn(); !why.empty())
            throw Refused("unavailable", why);
        }
        const int left = sys::poll_timeout_ms(next_trust_look_);
        if (timeout < 0 || left < timeout) timeout = left;
      }
      for (const auto& until : {frame_until_, held_until_}) {
        if (!until) continue;
        if (Clock::now() >= *until) broken("a frame or a file did not arrive in time");
        const int left = sys::poll_timeout_ms(*until);
        if (timeout < 0 || left < timeout) timeout = left;
      }
      if (poll_after_flush(polled, timeout, outbox_, tls_, Clock::now() + limits_.frame_timeout) <
          0) {
        if (errno == EINTR) continue;
        return;
      }
      if (!paused && (polled[0].revents || tls_.buffered())) {
        if (!reader_.fill(tls_)) return;  // the client left: closing ops_ ends its run or session
        while (auto frame = reader_.next()) on_client_frame(std::move(*frame));
      }
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (polled[i + 2].revents) on_stream_ready(ids[i]);
      if (polled[1].revents) {
        auto frame = receive_frame(ops_.get(), Clock::now() + limits_.frame_timeout,
                                   limits_.frame_timeout, kMaxServerFrame);
        if (!frame) {
          // The op is over: what the payload wrote goes first, then "idle": the connection may
          // carry the client's next op (a client keeps it for its next run: no handshake).
          drain_outputs(Clock::now() + kOutputDrain, true);
          if (!streams_.empty() || held_) return;  // a stream left open: not reusable
          ops_.reset();
          output_cap_.reset();
          stopped_for_output_ = false;
          cut_stream_.clear();
          in_session_ = false;
          to_client({{"op", "idle"}});
          idle_until = Clock::now() + kIdleConnection;
          continue;
        }
        on_ops_frame(std::move(frame->message));
      }
    }
  }

  // What is held for the client, written.
  void flush() { outbox_.flush(tls_, Clock::now() + limits_.frame_timeout); }

  void refuse(const std::string& kind, const std::string& message) {
    try {
      outbox_.add(tls_, error_frame(kind, message), Clock::now() + std::chrono::seconds(1));
      outbox_.flush(tls_, Clock::now() + std::chrono::seconds(1));
    } catch (const Error&) {
    }
  }

 private:
  std::size_t pending_input() const {
    std::size_t total = 0;
    for (const auto& [id, stream] : streams_) total += stream.pending.size();
    return total;
  }

  void to_client(const json& frame) {
    outbox_.add(tls_, frame, Clock::now() + limits_.frame_timeout);
  }

  void on_client_frame(json frame) {
    const std::string op = frame["op"].get<std::string>();
    if (op == "data" || op == "eof") return on_client_stream(op, frame);
    if (op == "hangup") {  // the client is done with the op: as a unix client closing its socket
      if (ops_) shutdown(ops_.get(), SHUT_WR);
      for (auto& [id, stream] : streams_)
        if (stream.kind == StreamKind::in || stream.kind == StreamKind::file_in)
          stream.ended = true;
      std::erase_if(streams_, [](const auto& entry) {
        return entry.second.kind == StreamKind::in || entry.second.kind == StreamKind::file_in;
      });
      held_.reset();
      held_fds_.clear();
      return;
    }
    if (held_) broken("a frame came before the file its last frame carries had ended");
    if (!ops_) {
      ops_ = open_ops_();  // the connection's next op: the ops serve it afresh
      in_session_ = op == "session_open";
    }
    if (op == "load" && !in_session_) broken("load is an op of a session");
    std::vector<UniqueFd> passed;
    if (const auto declared = frame.find("streams"); declared != frame.end()) {
      passed = open_streams(op, *declared);
      frame.erase("streams");
    }
    for (const auto& [id, stream] : streams_)
      if (stream.kind == StreamKind::file_in && !stream.ended) {
        held_ = std::move(frame);
        held_fds_ = std::move(passed);
        held_until_ = Clock::now() + kFileDeadline;
        return;
      }
    to_ops(frame, passed);
  }

  // A frame of the client's to the op in progress. One the op no longer reads (a stop that
  // crossed the run's end: the client counts the cap too) is dropped; the op's end follows.
  void to_ops(const json& frame, const std::vector<UniqueFd>& passed) {
    std::vector<int> fds;
    for (const auto& fd : passed) fds.push_back(fd.get());
    try {
      send_frame(ops_.get(), frame, Clock::now() + limits_.frame_timeout, fds);
    } catch (const WireError&) {
      if (!passed.empty() || frame.value("op", "") != "stop") throw;
    }
  }

  // The fds the op gets for a frame's "streams"; ours are kept in streams_.
  std::vector<UniqueFd> open_streams(const std::string& op, const json& declared) {
    if (!declared.is_array() || declared.size() > kMaxFrameFds)
      broken("\"streams\" must be an array of at most " + std::to_string(kMaxFrameFds));
    const auto kinds = stream_kinds_of(op, declared.size());
    if (!kinds)
      broken("op \"" + op + "\" does not take " + std::to_string(declared.size()) + " streams");
    if (streams_.size() + declared.size() > kMaxOpenStreams)
      broken("more than " + std::to_string(kMaxOpenStreams) + " streams open at once");
    std::vector<UniqueFd> passed;
    std::size_t outs = 0;
    for (std::size_t i = 0; i < declared.size(); ++i) {
      const json& entry = declared[i];
      if (!entry.is_object() || !entry.contains("kind") || !entry["kind"].is_string() ||
          stream_kind_named(entry["kind"].get<std::string>()) != (*kinds)[i])
        broken("stream " + std::to_string(i) + " of \"" + op + "\" must be of kind " +
               std::string(to_string((*kinds)[i])));
      const std::uint32_t id = stream_of({{"stream", entry.value("id", json())}});
      if (streams_.count(id)) broken("stream id " + std::to_string(id) + " is already open");
      Stream stream{(*kinds)[i], UniqueFd(), {}, false, 0, {}};
      if (stream.kind == StreamKind::in || stream.kind == StreamKind::out) {
        auto [read_end, write_end] = make_pipe();
        // The payload may open its stdio by path under its sandbox uid, as a unix client's.
        host::open_pipe_to_its_holders(read_end.get());
        const bool in = stream.kind == StreamKind::in;
        stream.fd = in ? std::move(write_end) : std::move(read_end);
        fcntl(stream.fd.get(), F_SETFL, O_NONBLOCK);
        passed.push_back(in ? std::move(read_end) : std::move(write_end));
        if (!in) stream.role = outs++ == 0 ? "stdout" : "stderr";
      } else {
        stream.fd = UniqueFd(memfd_create(
            stream.kind == StreamKind::file_in ? "rlm-load" : "rlm-save", MFD_CLOEXEC));
        if (!stream.fd) throw Error("memfd_create: " + sys::errno_text(errno));
        passed.emplace_back(fcntl(stream.fd.get(), F_DUPFD_CLOEXEC, 0));
      }
      streams_.emplace(id, std::move(stream));
    }
    return passed;
  }

  void on_client_stream(const std::string& op, const json& frame) {
    const std::uint32_t id = stream_of(frame);
    const auto found = streams_.find(id);
    if (found == streams_.end() ||
        (found->second.kind != StreamKind::in && found->second.kind != StreamKind::file_in) ||
        found->second.ended)
      broken("a " + op + " frame for stream " + std::to_string(id) +
             ", which is not an open stream of the client's");
    Stream& stream = found->second;
    if (op == "data") {
      const std::string bytes = data_of(frame);
      stream.bytes += bytes.size();
      if (stream.kind == StreamKind::in) {
        stream.pending += bytes;
        write_pending(stream);
      } else {
        if (stream.bytes > limits_.max_file_bytes)
          broken("the file sent is over the limit of " + std::to_string(limits_.max_file_bytes) +
                 " bytes");
        for (std::string_view left = bytes; !left.empty();) {
          const ssize_t put = write(stream.fd.get(), left.data(), left.size());
          if (put < 0 && errno == EINTR) continue;
          if (put <= 0) throw Error("memfd: " + sys::errno_text(errno));
          left.remove_prefix(static_cast<std::size_t>(put));
        }
      }
      return;
    }
    stream.ended = true;
    if (stream.kind == StreamKind::in) {
      if (stream.pending.empty()) streams_.erase(found);  // the payload sees its EOF
      return;
    }
    lseek(stream.fd.get(), 0, SEEK_SET);
    streams_.erase(found);  // the op holds its own copy
    for (const auto& [other, open] : streams_)
      if (open.kind == StreamKind::file_in && !open.ended) return;
    if (held_) {
      json frame_held = std::move(*held_);
      held_.reset();
      held_until_.reset();
      to_ops(frame_held, held_fds_);
      held_fds_.clear();
    }
  }

  void write_pending(Stream& stream) {
    while (!stream.pending.empty()) {
      const ssize_t put = write(stream.fd.get(), stream.pending.data(), stream.pending.size());
      if (put > 0) {
        stream.pending.erase(0, static_cast<std::size_t>(put));
        continue;
      }
      if (put < 0 && errno == EINTR) continue;
      if (put < 0 && errno == EAGAIN) return;
      stream.pending.clear();  // the payload closed its stdin: what it did not read is dropped
      return;
    }
  }

  void on_stream_ready(std::uint32_t id) {
    const auto found = streams_.find(id);
    if (found == streams_.end()) return;
    Stream& stream = found->second;
    if (stream.kind == StreamKind::in) {
      write_pending(stream);
      if (stream.pending.empty() && stream.ended) streams_.erase(found);
      return;
    }
    if (read_output(id, stream) == Output::ended) streams_.erase(found);
  }

  enum class Output { read, none_now, ended };
  // One read of an out stream, sent on within the run's cap; ended at its end (eof sent).
  Output read_output(std::uint32_t id, Stream& stream) {
    std::array<char, kStreamChunk> chunk;
    const ssize_t got = read(stream.fd.get(), chunk.data(), chunk.size());
    if (got < 0 && errno == EINTR) return Output::read;
    if (got < 0 && errno == EAGAIN) return Output::none_now;
    if (got <= 0) {
      to_client(eof_frame(id));
      return Output::ended;
    }
    std::string_view bytes(chunk.data(), static_cast<std::size_t>(got));
    const std::uint64_t before = stream.bytes;
    stream.bytes += bytes.size();
    if (output_cap_ && stream.bytes > *output_cap_) {
      bytes = bytes.substr(0, before < *output_cap_ ? *output_cap_ - before : 0);
      if (!stopped_for_output_) {
        // As a unix client does when a stream passes the cap: the run stops, output_limit. The
        // run may have ended already (its result on the way): then the stop is not needed, and
        // the result is corrected when it comes (on_ops_frame).
        stopped_for_output_ = true;
        cut_stream_ = stream.role;
        try {
          send_frame(ops_.get(),
                     {{"op", "stop"}, {"reason", "output_limit"}, {"stream", stream.role}},
                     Clock::now() + limits_.frame_timeout);
        } catch (const WireError&) {
        }
      }
    }
    if (!bytes.empty()) to_client(data_frame(id, bytes));
    return Output::read;
  }

  // Every out stream read to its end, then ended: until its EOF or `deadline`; without
  // `wait_for_eof` (a run's result has come), only what it holds now. Once the result is in, every
  // process of the sandbox is dead (a run is reported after its PID 1 is reaped), so nothing more
  // can come, and the EOF itself may wait for the server to dispose of the used sandbox off the
  // run's critical path (as the unix client reads its pipes: client_run.cpp).
  void drain_outputs(Clock::time_point deadline, bool wait_for_eof) {
    for (auto it = streams_.begin(); it != streams_.end();) {
      if (it->second.kind != StreamKind::out) {
        ++it;
        continue;
      }
      bool open = true;
      while (open && Clock::now() < deadline) {
        const Output got = read_output(it->first, it->second);
        if (got == Output::ended) open = false;
        if (got != Output::none_now) continue;
        if (!wait_for_eof) break;
        pollfd entry{it->second.fd.get(), POLLIN, 0};
        if (poll(&entry, 1, sys::poll_timeout_ms(deadline)) <= 0) break;
      }
      if (open) to_client(eof_frame(it->first));
      it = streams_.erase(it);
    }
  }

  // A file_out stream's whole file, sent before the answer to the op that wrote it.
  void send_files() {
    for (auto it = streams_.begin(); it != streams_.end();) {
      if (it->second.kind != StreamKind::file_out) {
        ++it;
        continue;
      }
      std::array<char, kStreamChunk> chunk;
      for (off_t offset = 0;;) {
        const ssize_t got = pread(it->second.fd.get(), chunk.data(), chunk.size(), offset);
        if (got <= 0) break;
        offset += got;
        to_client(
            data_frame(it->first, std::string_view(chunk.data(), static_cast<std::size_t>(got))));
      }
      to_client(eof_frame(it->first));
      it = streams_.erase(it);
    }
  }

  void on_ops_frame(json frame) {
    const std::string op = frame.value("op", "");
    if (op == "started" && frame.contains("output_bytes") &&
        frame["output_bytes"].is_number_unsigned())
      output_cap_ = frame["output_bytes"].get<std::uint64_t>();
    if (op != "llm_call" && op != "started") send_files();
    if (op == "result") {
      drain_outputs(Clock::now() + kOutputDrain, false);
      // The client got the cap's bytes and no more: the result says so even when the run ended
      // before the stop reached it.
      if (!cut_stream_.empty() && frame["result"].is_object()) {
        json& result = frame["result"];
        result["status"] = "output_limit";
        result[cut_stream_ + "_truncated"] = true;
        result["detail"] =
            cut_stream_ + " exceeded the output limit of " + format_size(output_cap_.value_or(0));
      }
    }
    to_client(frame);
  }

  TlsStream& tls_;
  const std::function<UniqueFd()>& open_ops_;
  UniqueFd ops_;  // the op in progress's connection to the ops; empty between ops
  const GatewayLimits& limits_;
  TlsFrameReader reader_;
  FrameOutbox outbox_;  // frames for the client, written when the gateway would wait
  std::map<std::uint32_t, Stream> streams_;
  std::optional<json> held_;  // a frame waiting for the file it carries
  std::vector<UniqueFd> held_fds_;
  std::optional<std::uint64_t> output_cap_;
  bool stopped_for_output_ = false;
  std::string cut_stream_;   // the out stream cut at the cap ("stdout", "stderr")
  bool in_session_ = false;  // the op in progress is a session (load's file_in is for one only)
  std::optional<Clock::time_point> held_until_;   // a file_in must be whole by then
  std::optional<Clock::time_point> frame_until_;  // a frame begun must end by then
  Clock::time_point next_trust_look_ = Clock::now() + kTrustLook;
};

}  // namespace

void relay_tls_client(TlsStream& tls, const std::function<UniqueFd()>& open_ops,
                      const GatewayLimits& limits) {
  const host::SigpipeBlocked quiet_pipe;  // a payload that closed its stdin: EPIPE, not death
  Gateway gateway(tls, open_ops, limits);
  try {
    gateway.run();
    gateway.flush();
  } catch (const Refused& refused) {
    gateway.refuse(refused.kind, refused.what());
  } catch (const FrameRefused& refused) {
    gateway.refuse("unavailable", refused.what());
  } catch (const WireError& error) {
    gateway.refuse("invalid", std::string("TLS connection: ") + error.what());
  } catch (const std::exception& error) {
    gateway.refuse("internal", error.what());
  }
  tls.close_now();
}

}  // namespace rlm::server
