#include "docker/request_checks.hpp"

#include "http/http_client.hpp"

namespace rlm::docker {

void require_runnable(const Request& request) {
  if (!http::available())
    throw NeedsFullBinary(
        "the docker backend needs the HTTP client, which this build of rlm-sandbox leaves out");
  if (!request.inherit_fds.empty())
    throw Error(
        "Request.inherit_fds: the docker backend cannot pass file descriptors into a container; "
        "use the namespace or local backend");
}

}  // namespace rlm::docker
