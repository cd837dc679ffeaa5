#include "egress/credentials.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::egress {
namespace {

constexpr std::size_t kMaxValueBytes = 64 * 1024;
constexpr std::size_t kMaxHostBundleBytes = 8 * 1024 * 1024;
// Debian's bundle, where the host's TLS clients find their trust; the sandbox's adds its CA to it.
constexpr const char* kHostBundle = "/etc/ssl/certs/ca-certificates.crt";

std::string path_of(std::size_t index, const char* key) {
  return "network.inject[" + std::to_string(index) + "]." + key;
}

// At most `limit` bytes of `path`; nullopt with errno when it cannot be read or is larger.
std::optional<std::string> read_bounded(const std::string& path, std::size_t limit) {
  host::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (!fd) return std::nullopt;
  std::string text;
  char buffer[8192];
  for (;;) {
    const ssize_t got = read(fd.get(), buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return std::nullopt;
    if (got == 0) return text;
    if (text.size() + static_cast<std::size_t>(got) > limit) {
      OPENSSL_cleanse(text.data(), text.size());
      errno = EFBIG;
      return std::nullopt;
    }
    text.append(buffer, static_cast<std::size_t>(got));
  }
}

std::string read_value(const NetworkInjection& injection, std::size_t index) {
  std::string value;
  if (!injection.value_from_env.empty()) {
    const char* text = std::getenv(injection.value_from_env.c_str());
    if (!text)
      throw Error(path_of(index, "value_from_env") + ": " + injection.value_from_env +
                  " is not set in the runtime's environment");
    value = text;
  } else {
    auto text = read_bounded(injection.value_from_file, kMaxValueBytes);
    if (!text)
      throw Error(path_of(index, "value_from_file") + ": cannot read " + injection.value_from_file +
                  ": " + sys::errno_text(errno));
    value = std::move(*text);
    // A file's last line end is not part of the value (`echo token > file`).
    while (!value.empty() && (value.back() == '\n' || value.back() == '\r')) value.pop_back();
  }
  const char* key = injection.value_from_env.empty() ? "value_from_file" : "value_from_env";
  if (value.empty()) throw Error(path_of(index, key) + ": the value is empty");
  if (value.size() > kMaxValueBytes)
    throw Error(path_of(index, key) + ": the value is over 64 KiB");
  if (value.find_first_of(std::string("\r\n\0", 3)) != std::string::npos) {
    OPENSSL_cleanse(value.data(), value.size());
    throw Error(path_of(index, key) +
                ": the value holds a line break or NUL, which would end the header it is sent in");
  }
  return value;
}

SslContext upstream_context(const UpstreamSettings& upstream) {
  SslContext context(SSL_CTX_new(TLS_client_method()));
  const bool trusted =
      context && SSL_CTX_set_min_proto_version(context.get(), TLS1_2_VERSION) &&
      (upstream.ca_file.empty()
           ? SSL_CTX_set_default_verify_paths(context.get()) == 1
           : SSL_CTX_load_verify_locations(context.get(), upstream.ca_file.c_str(), nullptr) == 1);
  if (!trusted) {
    char text[256] = "unknown error";
    if (const unsigned long code = ERR_get_error(); code != 0)
      ERR_error_string_n(code, text, sizeof text);
    ERR_clear_error();
    throw Error(
        "egress: cannot load the CA store upstreams of injected credentials are verified "
        "against" +
        (upstream.ca_file.empty() ? std::string() : " (" + upstream.ca_file + ")") + ": " + text);
  }
  SSL_CTX_set_verify(context.get(), SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_mode(context.get(),
                   SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return context;
}

}  // namespace

std::vector<std::string> injected_names(const Egress& egress) {
  std::vector<std::string> names;
  for (const auto& injection : egress.inject) {
    std::string name = injection.host.substr(0, injection.host.rfind(':'));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

Credentials::Credentials(const Egress& egress, const UpstreamSettings& upstream)
    : authority_(injected_names(egress)), upstream_(upstream_context(upstream)) {
  for (std::size_t i = 0; i < egress.inject.size(); ++i) {
    const auto& entry = egress.inject[i];
    const auto colon = entry.host.rfind(':');
    Injection injection;
    injection.name = entry.host.substr(0, colon);
    injection.port = static_cast<std::uint16_t>(std::stoul(entry.host.substr(colon + 1)));
    injection.header = entry.header;
    injection.value = read_value(entry, i);
    injections_.push_back(std::move(injection));
  }
}

Credentials::~Credentials() {
  for (auto& injection : injections_)
    OPENSSL_cleanse(injection.value.data(), injection.value.size());
}

std::vector<const Injection*> Credentials::for_host(const std::string& name,
                                                    std::uint16_t port) const {
  std::vector<const Injection*> found;
  for (const auto& injection : injections_)
    if (injection.name == name && injection.port == port) found.push_back(&injection);
  return found;
}

std::string Credentials::trust_bundle() const {
  std::string bundle = read_bounded(kHostBundle, kMaxHostBundleBytes).value_or("");
  if (!bundle.empty() && bundle.back() != '\n') bundle += '\n';
  return bundle + authority_.certificate_pem();
}

}  // namespace rlm::egress
