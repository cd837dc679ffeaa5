#include "egress/credential_connection.hpp"

#include <openssl/crypto.h>
#include <poll.h>

#include <array>
#include <optional>

#include "egress/client_gate.hpp"
#include "egress/tls_stream.hpp"
#include "protocols/http_request.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::egress {
namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::uint8_t>;

constexpr std::size_t kChunk = 16384;

// Waits until the client's socket is ready for `client_event` (0: not watched) or the
// upstream's for `upstream_event`; false at `deadline` or stop. Called only when neither stream
// moved data on its last read, so only the sockets can bring more.
bool wait_either(const TlsStream& client, short client_event, const TlsStream& upstream,
                 short upstream_event, int stop_fd, Clock::time_point deadline) {
  pollfd fds[3] = {
      {stop_fd, POLLIN, 0}, {upstream.fd(), upstream_event, 0}, {client.fd(), client_event, 0}};
  for (;;) {
    const int ready = poll(fds, client_event != 0 ? 3 : 2, sys::poll_timeout_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    return ready > 0 && fds[0].revents == 0;
  }
}

}  // namespace

void serve_with_credentials(const ConnectionContext& context, int client,
                            const CredentialTarget& target,
                            const std::vector<const Injection*>& injections) {
  const auto& limits = context.egress.limits;
  const auto deny = [&](Denial kind, const std::string& name) {
    context.account.deny(kind, name, target.destination, target.port);
  };
  const SigpipeBlocked quiet_pipe;  // before the streams: they may write to a closed peer
  std::string why;
  TlsStream sandbox(context.credentials->sandbox_side(target.name), client);
  // A client that does not trust the sandbox's CA (its own trust store, a pinned key) ends here.
  if (!sandbox.accept(context.stop_fd, Clock::now() + limits.client_hello_wait, why))
    return deny(Denial::protocol, target.name);

  // One request's head, read through the host side's TLS within the hello's wait.
  const auto head_deadline = Clock::now() + limits.client_hello_wait;
  Bytes buffer;
  protocols::HttpRequestHead head;
  std::array<std::uint8_t, kChunk> chunk;
  for (;;) {
    const auto verdict =
        protocols::parse_http_request_head(buffer, kMaxHttpHead, kMaxHttpHeaders, head, why);
    if (verdict == protocols::HttpVerdict::complete) break;
    if (verdict == protocols::HttpVerdict::malformed) return deny(Denial::protocol, target.name);
    if (verdict == protocols::HttpVerdict::too_large) return deny(Denial::limit, target.name);
    std::size_t got = 0;
    const auto read = sandbox.read_some(
        std::span(chunk.data(), std::min(chunk.size(), kMaxHttpHead + 1 - buffer.size())), got);
    if (read == TlsStream::Read::data) {
      buffer.insert(buffer.end(), chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(got));
      continue;
    }
    if (read != TlsStream::Read::wants_read && read != TlsStream::Read::wants_write) return;
    // The deadline checked here too: poll() past it still reports a socket that is ready (a
    // sandbox that floods KeyUpdates it never lets us answer).
    if (Clock::now() >= head_deadline ||
        !wait_for(client, TlsStream::event_for(read), context.stop_fd, head_deadline))
      return deny(Denial::limit, target.name);
  }
  // TRACE (and TRACK) would have the upstream echo the request, credential and all.
  if (head.method == "CONNECT" || head.method == "TRACE" || head.method == "TRACK" || head.upgrade)
    return deny(Denial::protocol, target.name);
  if (head.host != target.name || (head.absolute_form && head.absolute_host != target.name) ||
      (head.host_port && *head.host_port != target.port))
    return deny(Denial::host_mismatch, head.absolute_form ? head.absolute_host : head.host);
  std::vector<std::string> added, replaced;
  Bytes prefix;
  struct Wipe {  // the copies of the secrets this connection made, however it ends
    std::vector<std::string>& headers;
    Bytes& head;
    ~Wipe() {
      for (auto& header : headers) OPENSSL_cleanse(header.data(), header.size());
      OPENSSL_cleanse(head.data(), head.size());
    }
  } wipe{added, prefix};
  for (const Injection* injection : injections) {
    added.push_back(injection->header + ": " + injection->value);
    replaced.push_back(injection->header);
  }
  prefix = protocols::rewrite_http_request_head(std::span(buffer.data(), head.head_bytes), added,
                                                replaced);
  const GateScope scope{context.account, target.name, target.destination, target.port};
  protocols::HttpBodyFramer body(head);
  const std::span rest(buffer.data() + head.head_bytes, buffer.size() - head.head_bytes);
  const auto taken = body.feed(rest, why);
  if (!taken) return deny(Denial::protocol, target.name);
  if (*taken < rest.size()) return deny_extra_request(scope, rest.subspan(*taken));
  prefix.insert(prefix.end(), rest.begin(), rest.end());

  const auto address = pick_upstream(context, target.name, target.destination, target.port);
  if (!address) return;
  if (context.rules.ended(target.token)) return deny(Denial::no_rule, target.name);
  const std::string upstream_address = to_string(address->address);
  auto socket = connect_upstream(context.upstream, *address, context.stop_fd, why);
  if (!socket)
    return context.account.deny(Denial::upstream, target.name, upstream_address, target.port);
  if (!context.rules.admit(target.token, {true, true, address->address, socket.get()}))
    return deny(Denial::no_rule, target.name);
  struct Release {
    LiveRules& rules;
    std::uint64_t token;
    ~Release() { rules.release_upstream(token); }
  } release{context.rules, target.token};  // before `socket` closes
  TlsStream upstream(context.credentials->upstream_side(), socket.get());
  // Verified against the host's CA store for the name itself: the credential goes to no one else.
  if (!upstream.connect(target.name, context.stop_fd,
                        Clock::now() + context.upstream.connect_timeout, why))
    return context.account.deny(Denial::upstream, target.name, upstream_address, target.port);

  const long entry = context.account.allow(target.name, upstream_address, target.port, target.rule);
  std::uint64_t out = head.head_bytes + rest.size(), in = 0;  // the sandbox's plaintext bytes
  const auto finish = [&] { context.account.finish(entry, out, in); };
  if (!upstream.write_all(prefix, context.stop_fd, Clock::now() + limits.idle)) return finish();
  // What each side's socket must do before its stream goes on; idle counts from the last data.
  short client_event = POLLIN, upstream_event = POLLIN;
  auto last_data = Clock::now();
  for (bool moved = true;;) {
    if (moved) {
      last_data = Clock::now();
    } else if (Clock::now() >= last_data + limits.idle ||
               !wait_either(sandbox, client_event, upstream, upstream_event, context.stop_fd,
                            last_data + limits.idle)) {
      break;
    }
    moved = false;
    if (out + in > limits.connection_bytes) {
      context.account.deny(Denial::limit, target.name, upstream_address, target.port);
      break;
    }
    std::size_t got = 0;
    if (client_event != 0) {  // 0: the sandbox ended its side; the response may still come
      const auto read = sandbox.read_some(chunk, got);
      if (read == TlsStream::Read::data) {
        const std::span bytes(chunk.data(), got);
        const auto admitted = body.feed(bytes, why);
        if (!admitted) {
          deny(Denial::protocol, target.name);
          break;
        }
        if (*admitted < got) {  // a second request: one a connection
          deny_extra_request(scope, bytes.subspan(*admitted));
          break;
        }
        if (!upstream.write_all(bytes, context.stop_fd, Clock::now() + limits.idle)) break;
        out += got;
        moved = true;
      } else if (read == TlsStream::Read::eof) {
        client_event = 0;
      } else if (read == TlsStream::Read::failed) {
        break;
      } else {
        client_event = TlsStream::event_for(read);
      }
    }
    const auto read = upstream.read_some(chunk, got);
    if (read == TlsStream::Read::data) {
      if (!sandbox.write_all(std::span(chunk.data(), got), context.stop_fd,
                             Clock::now() + limits.idle))
        break;
      in += got;
      moved = true;
    } else if (read == TlsStream::Read::wants_read || read == TlsStream::Read::wants_write) {
      upstream_event = TlsStream::event_for(read);
    } else {
      if (read == TlsStream::Read::eof) sandbox.close();
      break;
    }
  }
  finish();
}

}  // namespace rlm::egress
