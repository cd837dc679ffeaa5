// What a client may ask for: an offered policy, only tightened (docs/pools-and-server.md).
#include <fcntl.h>
#include <sys/stat.h>

#include "rlm_sandbox/tightening.hpp"
#include "server/connection.hpp"

namespace rlm::server {

using nlohmann::json;

Admitted admit(const Connection& connection, const json& frame) {
  const auto name = frame.find("policy");
  if (name == frame.end() || !name->is_string())
    throw Refusal("invalid", "the request names no \"policy\"");
  const std::string policy_name = name->get<std::string>();
  const auto offer = connection.offers.find(policy_name);
  if (offer == connection.offers.end()) {
    std::string offered;
    for (const auto& [key, value] : connection.offers)
      offered += (offered.empty() ? "" : ", ") + key;
    // The name is the client's: quoted only when short and printable.
    const bool printable = policy_name.size() <= 128 && policy_name.find_first_of(std::string(
                                                            "\0\n\r\t", 4)) == std::string::npos;
    throw Refusal("refused",
                  "policy " + (printable ? "'" + policy_name + "'" : std::string("(unprintable)")) +
                      " is not offered by this server (it offers: " + offered + ")");
  }
  Admitted admitted;
  admitted.offer = &offer->second;
  const auto overrides = frame.find("overrides");
  if (overrides == frame.end() || overrides->is_null()) return admitted;
  const Policy& base = offer->second.pool->policy();
  Policy candidate;
  try {
    candidate = policy_from_json(*overrides, "the client's overrides of " + policy_name);
  } catch (const PolicyError& error) {
    throw Refusal("invalid", error.what(), error.diagnostics());
  }
  candidate.name = base.name;
  if (candidate.to_json() == base.to_json()) return admitted;
  static const std::vector<PermittedBind> kNone;
  const auto permitted = connection.config.permitted_binds.find(connection.peer.uid);
  auto loosened =
      loosenings(base, candidate,
                 permitted == connection.config.permitted_binds.end() ? kNone : permitted->second);
  if (!loosened.empty()) {
    std::string message = "the request loosens policy '" + policy_name + "' (" +
                          std::to_string(loosened.size()) +
                          (loosened.size() == 1 ? " problem" : " problems") +
                          "); a client may only tighten what the server offers";
    for (const auto& d : loosened) message += "\n  " + d.to_string();
    throw Refusal("refused", message, std::move(loosened));
  }
  admitted.candidate = std::make_shared<const Policy>(std::move(candidate));
  return admitted;
}

void check_stdio_fd(int fd, const char* which) {
  const int flags = fcntl(fd, F_GETFL);
  struct stat status {};
  if (flags < 0 || (flags & O_PATH) || fstat(fd, &status) != 0)
    throw Refusal("invalid", std::string("the ") + which + " fd is not an open stream");
  const bool stream = S_ISFIFO(status.st_mode) || S_ISSOCK(status.st_mode) ||
                      S_ISCHR(status.st_mode) || S_ISREG(status.st_mode);
  if (!stream)
    throw Refusal("invalid", std::string("the ") + which +
                                 " fd must be a pipe, socket, character device or regular file");
}

}  // namespace rlm::server
