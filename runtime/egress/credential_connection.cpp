#include "egress/credential_connection.hpp"

#include <openssl/crypto.h>
#include <poll.h>

#include <array>
#include <optional>

#include "egress/client_gate.hpp"
#include "egress/tls_stream.hpp"
#include "protocols/http_request.hpp"

namespace rlm::egress {
namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::uint8_t>;

constexpr std::size_t kChunk = 16384;

// Waits until either socket turns readable (`client` only while `client_open`); false on idle or
// stop. Called only when neither stream returned data on its last read: then nothing decrypted
// waits inside OpenSSL, and only the socket can bring more (a partial record held back by the
// peer keeps it quiet, not busy).
bool wait_either(const TlsStream& client, bool client_open, const TlsStream& upstream, int stop_fd,
                 std::chrono::milliseconds idle) {
  pollfd fds[3] = {{upstream.fd(), POLLIN, 0}, {stop_fd, POLLIN, 0}, {client.fd(), POLLIN, 0}};
  for (;;) {
    const int ready = poll(fds, client_open ? 3 : 2, static_cast<int>(idle.count()));
    if (ready < 0 && errno == EINTR) continue;
    return ready > 0 && fds[1].revents == 0;
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
    if (read != TlsStream::Read::none_yet) return;
    if (!wait_for(client, POLLIN, context.stop_fd, head_deadline))
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
  bool client_open = true, moved = true;  // the first round reads before it waits
  while (moved || wait_either(sandbox, client_open, upstream, context.stop_fd, limits.idle)) {
    moved = false;
    if (out + in > limits.connection_bytes) {
      context.account.deny(Denial::limit, target.name, upstream_address, target.port);
      break;
    }
    std::size_t got = 0;
    if (client_open) {
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
        client_open = false;  // the response may still come
      } else if (read == TlsStream::Read::failed) {
        break;
      }
    }
    const auto read = upstream.read_some(chunk, got);
    if (read == TlsStream::Read::data) {
      if (!sandbox.write_all(std::span(chunk.data(), got), context.stop_fd,
                             Clock::now() + limits.idle))
        break;
      in += got;
      moved = true;
    } else if (read != TlsStream::Read::none_yet) {
      if (read == TlsStream::Read::eof) sandbox.close();
      break;
    }
  }
  finish();
}

}  // namespace rlm::egress
