// The static CLI's HTTP client: no libcurl, every request refused with NeedsFullBinary.
#include <gtest/gtest.h>

#include "http/http_client.hpp"

namespace rlm::test {
namespace {

TEST(HttpStub, IsNotAvailable) {
  EXPECT_FALSE(http::available());
}

TEST(HttpStub, PerformThrowsNeedsFullBinary) {
  http::Request request;
  request.url = "http://localhost/_ping";
  try {
    http::perform(request);
    FAIL() << "perform returned";
  } catch (const NeedsFullBinary& error) {
    EXPECT_NE(std::string(error.what()).find("dynamically linked"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace rlm::test
