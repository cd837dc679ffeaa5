// rlm::http in the statically linked CLI, which leaves libcurl out: every request is refused with
// NeedsFullBinary, which the CLI answers by re-executing its dynamically linked sibling.
#include "http/http_client.hpp"

namespace rlm::http {

bool available() {
  return false;
}

Response perform(const Request& request) {
  throw NeedsFullBinary("this rlm-sandbox binary is linked statically without an HTTP client (" +
                        request.method + " " + request.url +
                        "); run the dynamically linked rlm-sandbox, which has libcurl");
}

}  // namespace rlm::http
