#include "egress/connection.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <memory>
#include <vector>

#include "egress/client_gate.hpp"
#include "egress/credential_connection.hpp"
#include "egress/relay.hpp"
#include "egress/rules.hpp"
#include "protocols/client_hello.hpp"
#include "protocols/http_request.hpp"

namespace rlm::egress {
namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::uint8_t>;

constexpr std::size_t kMaxDnsQueriesPerStream = 256;

enum class Read { more, eof, timed_out, failed };

// Appends what `fd` has (at most up to `limit` bytes in all), waiting until `deadline`.
Read read_more(int fd, Bytes& buffer, std::size_t limit, int stop_fd, Clock::time_point deadline) {
  for (;;) {
    if (!wait_for(fd, POLLIN, stop_fd, deadline)) return Read::timed_out;
    const std::size_t had = buffer.size();
    buffer.resize(limit);
    const ssize_t got = recv(fd, buffer.data() + had, limit - had, MSG_DONTWAIT);
    buffer.resize(had + static_cast<std::size_t>(got > 0 ? got : 0));
    if (got > 0) return Read::more;
    if (got == 0) return Read::eof;
    if (errno != EAGAIN && errno != EINTR) return Read::failed;
  }
}

// Peeks what `fd` has into `buffer` (at most `limit` bytes), waiting until more than the buffer
// holds has come; nothing is consumed. eof when no more will.
Read peek_more(int fd, Bytes& buffer, std::size_t limit, int stop_fd, Clock::time_point deadline) {
  const std::size_t had = buffer.size();
  wake_beyond(fd, had);
  if (!wait_for(fd, POLLIN, stop_fd, deadline)) return Read::timed_out;
  buffer.resize(limit);
  const ssize_t got = recv(fd, buffer.data(), limit, MSG_PEEK | MSG_DONTWAIT);
  buffer.resize(got > 0 ? static_cast<std::size_t>(got) : had);
  if (got < 0) return errno == EAGAIN || errno == EINTR ? Read::more : Read::failed;
  return static_cast<std::size_t>(got) > had ? Read::more : Read::eof;
}

// Takes `count` bytes known to be waiting on `fd` off it.
bool consume(int fd, std::size_t count) {
  std::array<std::uint8_t, 4096> sink;
  while (count > 0) {
    const ssize_t got = recv(fd, sink.data(), std::min(count, sink.size()), MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    count -= static_cast<std::size_t>(got);
  }
  return true;
}

bool write_all(int fd, std::span<const std::uint8_t> bytes, int stop_fd,
               Clock::time_point deadline) {
  while (!bytes.empty()) {
    const ssize_t sent = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      bytes = bytes.subspan(static_cast<std::size_t>(sent));
      continue;
    }
    if (sent < 0 && errno != EAGAIN && errno != EINTR) return false;
    if (!wait_for(fd, POLLOUT, stop_fd, deadline)) return false;
  }
  return true;
}

// The sandbox's DNS over TCP: two-byte length, message; answered the same as over UDP.
void serve_dns_stream(const ConnectionContext& context, int client) {
  const auto idle = context.egress.limits.idle;
  Bytes buffer;
  for (std::size_t answered = 0; answered < kMaxDnsQueriesPerStream;) {
    while (buffer.size() >= 2) {
      const std::size_t length = (std::size_t{buffer[0]} << 8) | buffer[1];
      if (buffer.size() < 2 + length) break;
      auto answer = context.dns.answer(std::span(buffer.data() + 2, length));
      buffer.erase(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(2 + length));
      if (answer.empty()) return;
      Bytes framed{static_cast<std::uint8_t>(answer.size() >> 8),
                   static_cast<std::uint8_t>(answer.size())};
      framed.insert(framed.end(), answer.begin(), answer.end());
      if (!write_all(client, framed, context.stop_fd, Clock::now() + idle)) return;
      ++answered;
    }
    if (read_more(client, buffer, 2 + 65535, context.stop_fd, Clock::now() + idle) != Read::more)
      return;
  }
}

struct Checked {
  bool allowed = false;
  Bytes prefix;                     // the bytes read while checking, to send upstream first
  std::uint64_t sandbox_bytes = 0;  // how many of the sandbox's bytes they stand for
  std::optional<protocols::HttpBodyFramer> body;  // http://: the first request's, fed so far
  bool tls = false;                               // a TLS entry: later hellos checked too
};

// `keep_hello`: the hello stays unread, for the host side's own TLS (credential_connection.hpp).
Checked check_tls(const ConnectionContext& context, int client, const std::string& name,
                  const std::string& destination, std::uint16_t port, bool keep_hello = false) {
  const auto& limits = context.egress.limits;
  const auto deadline = Clock::now() + limits.client_hello_wait;
  Checked checked;
  Bytes& buffer = checked.prefix;
  protocols::ClientHello hello;
  for (;;) {
    const auto verdict = protocols::parse_client_hello(buffer, limits.client_hello_bytes, hello);
    if (verdict == protocols::HelloVerdict::complete) break;
    if (verdict == protocols::HelloVerdict::not_tls ||
        verdict == protocols::HelloVerdict::malformed) {
      context.account.deny(Denial::not_tls, name, destination, port);
      return checked;
    }
    if (verdict == protocols::HelloVerdict::too_large) {
      context.account.deny(Denial::limit, name, destination, port);
      return checked;
    }
    switch (peek_more(client, buffer, limits.client_hello_bytes + 1, context.stop_fd, deadline)) {
      case Read::more:
        continue;
      case Read::timed_out:  // a slow or silent hello: the wait is a limit
        context.account.deny(Denial::limit, name, destination, port);
        return checked;
      case Read::eof:
      case Read::failed:
        return checked;
    }
  }
  if (hello.encrypted_client_hello) {
    context.account.deny(Denial::ech, name, destination, port);
    return checked;
  }
  if (!hello.server_name || hello.server_name_invalid || *hello.server_name != name) {
    context.account.deny(Denial::sni_mismatch, hello.server_name.value_or(""), destination, port);
    return checked;
  }
  // Exactly the hello goes first; what the client sent after it is the gate's (TlsGate: a second
  // hello after a HelloRetryRequest is checked the same way), still unread.
  wake_beyond(client, 0);
  buffer.resize(hello.bytes);
  if (!keep_hello && !consume(client, hello.bytes)) return checked;
  checked.sandbox_bytes = buffer.size();
  checked.tls = true;
  checked.allowed = true;
  return checked;
}

Checked check_http(const ConnectionContext& context, int client, const std::string& name,
                   const std::string& destination, std::uint16_t port) {
  const auto& limits = context.egress.limits;
  const auto deadline = Clock::now() + limits.client_hello_wait;
  Checked checked;
  Bytes buffer;
  protocols::HttpRequestHead head;
  for (;;) {
    std::string why;
    const auto verdict =
        protocols::parse_http_request_head(buffer, kMaxHttpHead, kMaxHttpHeaders, head, why);
    if (verdict == protocols::HttpVerdict::complete) break;
    if (verdict == protocols::HttpVerdict::malformed) {
      context.account.deny(Denial::protocol, name, destination, port);
      return checked;
    }
    if (verdict == protocols::HttpVerdict::too_large) {
      context.account.deny(Denial::limit, name, destination, port);
      return checked;
    }
    switch (read_more(client, buffer, kMaxHttpHead + 1, context.stop_fd, deadline)) {
      case Read::more:
        continue;
      case Read::timed_out:
        context.account.deny(Denial::limit, name, destination, port);
        return checked;
      case Read::eof:
      case Read::failed:
        return checked;
    }
  }
  if (head.method == "CONNECT" || head.upgrade) {
    context.account.deny(Denial::protocol, name, destination, port);
    return checked;
  }
  const std::string presented = head.absolute_form ? head.absolute_host : head.host;
  if (head.host != name || (head.absolute_form && head.absolute_host != name) ||
      (head.host_port && *head.host_port != port)) {
    context.account.deny(Denial::host_mismatch, presented, destination, port);
    return checked;
  }
  checked.prefix =
      protocols::rewrite_http_request_head(std::span(buffer.data(), head.head_bytes), {});
  checked.sandbox_bytes = head.head_bytes;
  // What came with the head belongs to its body, unless it runs past it: a second request.
  protocols::HttpBodyFramer framer(head);
  const std::span rest(buffer.data() + head.head_bytes, buffer.size() - head.head_bytes);
  std::string why;
  const auto taken = framer.feed(rest, why);
  if (!taken) {
    context.account.deny(Denial::protocol, name, destination, port);
    return checked;
  }
  if (*taken < rest.size()) {
    deny_extra_request({context.account, name, destination, port}, rest.subspan(*taken));
    return checked;
  }
  checked.prefix.insert(checked.prefix.end(), rest.begin(), rest.end());
  checked.sandbox_bytes += rest.size();
  checked.body = framer;
  checked.allowed = true;
  return checked;
}

}  // namespace

std::optional<Endpoint> pick_upstream(const ConnectionContext& context, const std::string& name,
                                      const std::string& destination, std::uint16_t port) {
  std::string why;
  const auto addresses = resolve(context.upstream, name, context.stop_fd, why);
  if (addresses.empty()) {
    context.account.deny(Denial::upstream, name, destination, port);
    return std::nullopt;
  }
  const IpAddress* refused = nullptr;
  for (const auto& address : addresses) {
    if (address_denied(context.egress, address, port)) continue;
    if (is_private(address) && !context.egress.allow_private &&
        !rule_for_address(context.egress, address, port)) {
      if (!refused) refused = &address;
      continue;
    }
    return Endpoint{address, port};
  }
  context.account.deny(Denial::private_address, name, refused ? to_string(*refused) : destination,
                       port);
  return std::nullopt;
}

void serve_connection(const ConnectionContext& context, host::UniqueFd client) {
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  if (getsockname(client.get(), reinterpret_cast<sockaddr*>(&local), &length) != 0) return;
  const auto dialled = endpoint_from(local);
  if (!dialled) return;
  const std::uint16_t port = dialled->port;
  const std::string destination = to_string(dialled->address);
  const auto name = context.names.name_of(dialled->address);

  const NetworkRule* rule = name ? rule_for_name(context.egress, *name, port)
                            : SyntheticNames::synthetic(dialled->address)
                                ? nullptr
                                : rule_for_address(context.egress, dialled->address, port);
  if (!rule) {
    if (port == 53) return serve_dns_stream(context, client.get());
    context.account.deny(Denial::no_rule, name.value_or(""), destination, port);
    return;
  }

  // Registered from here, so that a narrowing of the list (a live session's) ends it wherever it
  // is: while it is checked, before it resolves or dials, or while it is relayed.
  const auto token = context.rules.enter(name, dialled->address, port, client.get());
  if (!token) {
    context.account.deny(Denial::no_rule, name.value_or(""), destination, port);
    return;
  }
  struct Forget {
    LiveRules& rules;
    std::uint64_t token;
    ~Forget() { rules.forget(token); }
  } forget{context.rules, *token};  // before `client` closes
  const auto cut = [&] {
    context.account.deny(Denial::no_rule, name.value_or(""), destination, port);
  };

  if (name && context.credentials) {
    if (const auto injections = context.credentials->for_host(*name, port); !injections.empty()) {
      if (!check_tls(context, client.get(), *name, destination, port, /*keep_hello=*/true).allowed)
        return;
      if (context.rules.ended(*token)) return cut();
      return serve_with_credentials(context, client.get(),
                                    {*name, destination, port, rule->text, *token}, injections);
    }
  }
  Checked checked;
  checked.allowed = true;
  if (name && expects_tls(*rule, port))
    checked = check_tls(context, client.get(), *name, destination, port);
  else if (name && rule->scheme == NetworkRule::Scheme::http)
    checked = check_http(context, client.get(), *name, destination, port);
  if (!checked.allowed) return;
  if (context.rules.ended(*token)) return cut();  // nothing is resolved for a name dropped since

  const auto target = name ? pick_upstream(context, *name, destination, port) : dialled;
  if (!target) return;
  if (context.rules.ended(*token)) return cut();
  std::string why;
  auto upstream = connect_upstream(context.upstream, *target, context.stop_fd, why);
  if (!upstream) {
    context.account.deny(Denial::upstream, name.value_or(""), to_string(target->address), port);
    return;
  }
  // Checked against the list as it was when the connection came: the list as it is now has the
  // last word on all it passed (its checks, its pinned upstream).
  if (!context.rules.admit(
          *token, {checked.tls, checked.body.has_value(), target->address, upstream.get()}))
    return cut();
  struct Release {
    LiveRules& rules;
    std::uint64_t token;
    ~Release() { rules.release_upstream(token); }
  } release{context.rules, *token};  // before `upstream` closes
  const long entry =
      context.account.allow(name.value_or(""), to_string(target->address), port, rule->text);
  RelayCount count;
  count.out = checked.sandbox_bytes;
  std::unique_ptr<ClientGate> gate;
  if (name && checked.body)
    gate = std::make_unique<HttpGate>(GateScope{context.account, *name, destination, port},
                                      *checked.body);
  else if (name && checked.tls)
    gate = std::make_unique<TlsGate>(GateScope{context.account, *name, destination, port},
                                     context.egress.limits.client_hello_bytes);
  if (write_all(upstream.get(), checked.prefix, context.stop_fd,
                Clock::now() + context.egress.limits.idle))
    if (relay(client.get(), upstream.get(), context.stop_fd, context.egress.limits.idle, gate.get(),
              count, context.egress.limits.connection_bytes) == RelayEnd::limit)
      context.account.deny(Denial::limit, name.value_or(""), to_string(target->address), port);
  context.account.finish(entry, count.out, count.in);
}

}  // namespace rlm::egress
