// rlm::http::perform over libcurl against tests/http/echo_server.py, over TCP and a unix socket.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>
#include <vector>

#include "http/echo_server.hpp"
#include "http/http_client.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

class HttpClient : public WithEchoServer {};

TEST_F(HttpClient, IsAvailable) {
  EXPECT_TRUE(http::available());
}

TEST_F(HttpClient, GetReturnsStatusLowerCasedHeadersAndBody) {
  http::Request request;
  request.url = server().url("/hello?x=1");
  request.headers = {"X-Custom: yes"};
  const http::Response response = http::perform(request);
  ASSERT_EQ(response.error, "");
  EXPECT_EQ(response.status, 200);
  EXPECT_FALSE(response.aborted);
  EXPECT_EQ(response.headers.at("content-type"), "application/json");
  EXPECT_EQ(response.headers.at("x-test-server"), "echo");
  const json received = json::parse(response.body);
  EXPECT_EQ(received["method"], "GET");
  EXPECT_EQ(received["path"], "/hello?x=1");
  EXPECT_EQ(received["headers"]["x-custom"], "yes");
  EXPECT_EQ(received["body"], "");
}

TEST_F(HttpClient, PostSendsBodyAndHeadersAsGiven) {
  http::Request request;
  request.method = "POST";
  request.url = server().url("/submit");
  request.headers = {"Content-Type: application/json"};
  // Large enough that libcurl would ask for 100-continue if left to itself.
  const std::string body = json{{"prompt", std::string(2 << 20, 'p')}}.dump();
  request.body = body;
  const http::Response response = http::perform(request);
  ASSERT_EQ(response.error, "");
  EXPECT_EQ(response.status, 200);
  const json received = json::parse(response.body);
  EXPECT_EQ(received["method"], "POST");
  EXPECT_EQ(received["body"], body);
  EXPECT_EQ(received["headers"]["content-type"], "application/json");
  EXPECT_EQ(received["headers"]["content-length"], std::to_string(body.size()));
  EXPECT_FALSE(received["headers"].contains("expect"));
}

TEST_F(HttpClient, BodyWithoutContentTypeIsNotLabelledAForm) {
  http::Request request;
  request.method = "PUT";
  request.url = server().url("/raw");
  request.body = "plain";
  const json received = json::parse(http::perform(request).body);
  EXPECT_EQ(received["method"], "PUT");
  EXPECT_EQ(received["body"], "plain");
  EXPECT_FALSE(received["headers"].contains("content-type")) << received.dump();
}

TEST_F(HttpClient, PostWithoutBodySendsContentLengthZero) {
  http::Request request;
  request.method = "POST";
  request.url = server().url("/containers/abc/start");
  const json received = json::parse(http::perform(request).body);
  EXPECT_EQ(received["method"], "POST");
  EXPECT_EQ(received["headers"]["content-length"], "0");
}

TEST_F(HttpClient, UnixSocketWithCustomMethod) {
  http::Request request;
  request.method = "DELETE";
  request.url = "http://localhost/v1.43/containers/abc?force=true";
  request.unix_socket = server().unix_socket();
  const http::Response response = http::perform(request);
  ASSERT_EQ(response.error, "");
  EXPECT_EQ(response.status, 200);
  const json received = json::parse(response.body);
  EXPECT_EQ(received["method"], "DELETE");
  EXPECT_EQ(received["path"], "/v1.43/containers/abc?force=true");
  EXPECT_EQ(received["headers"]["host"], "localhost");
}

TEST_F(HttpClient, HeadHasHeadersAndNoBody) {
  http::Request request;
  request.method = "HEAD";
  request.url = server().url("/head");
  const http::Response response = http::perform(request);
  ASSERT_EQ(response.error, "");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.headers.at("x-test-server"), "echo");
  EXPECT_EQ(response.body, "");
}

TEST_F(HttpClient, ErrorStatusIsAResponseNotATransportError) {
  http::Request request;
  request.url = server().url("/status/404");
  const http::Response response = http::perform(request);
  EXPECT_EQ(response.error, "");
  EXPECT_EQ(response.status, 404);
  EXPECT_EQ(json::parse(response.body)["error"]["message"], "the test server answers 404");
}

TEST_F(HttpClient, OnBodyReceivesTheWholeBodyInsteadOfResponseBody) {
  http::Request request;
  request.url = server().url("/streamed");
  std::string streamed;
  request.on_body = [&](std::string_view chunk) {
    streamed.append(chunk);
    return true;
  };
  const http::Response response = http::perform(request);
  ASSERT_EQ(response.error, "");
  EXPECT_FALSE(response.aborted);
  EXPECT_EQ(response.body, "");
  EXPECT_EQ(json::parse(streamed)["path"], "/streamed");
}

TEST_F(HttpClient, OnBodyReturningFalseAbortsAnEndlessBody) {
  http::Request request;
  request.url = server().url("/stream");
  request.timeout = milliseconds(20'000);  // a failure to abort fails the test instead of hanging
  std::size_t received = 0;
  int chunks = 0;
  request.on_body = [&](std::string_view chunk) {
    received += chunk.size();
    return ++chunks < 3;
  };
  const auto start = steady_clock::now();
  const http::Response response = http::perform(request);
  EXPECT_LT(steady_clock::now() - start, milliseconds(5'000));
  EXPECT_TRUE(response.aborted);
  EXPECT_EQ(response.error, "");  // the caller's choice, not a transport failure
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(chunks, 3);
  EXPECT_GT(received, 0u);
}

TEST_F(HttpClient, ExceptionFromOnBodyReachesTheCaller) {
  http::Request request;
  request.url = server().url("/stream");
  request.timeout = milliseconds(20'000);
  request.on_body = [](std::string_view) -> bool { throw std::runtime_error("consumer failed"); };
  EXPECT_THROW(http::perform(request), std::runtime_error);
}

TEST_F(HttpClient, TimeoutIsATransportError) {
  http::Request request;
  request.url = server().url("/slow/5");
  request.timeout = milliseconds(300);
  const auto start = steady_clock::now();
  const http::Response response = http::perform(request);
  EXPECT_LT(steady_clock::now() - start, milliseconds(3'000));
  EXPECT_EQ(response.status, 0);
  EXPECT_NE(response.error.find("timed out"), std::string::npos) << response.error;
}

TEST_F(HttpClient, ConnectionRefusedIsATransportError) {
  // A bound socket that does not listen refuses connections, and holds the port meanwhile.
  const int bound = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(bound, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(bind(bound, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(getsockname(bound, reinterpret_cast<sockaddr*>(&address), &length), 0);

  http::Request request;
  request.url = "http://127.0.0.1:" + std::to_string(ntohs(address.sin_port)) + "/";
  const http::Response response = http::perform(request);
  close(bound);
  EXPECT_EQ(response.status, 0);
  EXPECT_NE(response.error, "");
}

TEST_F(HttpClient, MissingUnixSocketIsATransportError) {
  http::Request request;
  request.url = "http://localhost/_ping";
  request.unix_socket = server().unix_socket() + ".missing";
  const http::Response response = http::perform(request);
  EXPECT_EQ(response.status, 0);
  EXPECT_NE(response.error, "");
}

TEST_F(HttpClient, OnlyHttpSchemesAreSpoken) {
  http::Request request;
  request.url = "file:///etc/passwd";
  const http::Response response = http::perform(request);
  EXPECT_EQ(response.status, 0);
  EXPECT_EQ(response.body, "");
  EXPECT_NE(response.error, "");
}

TEST_F(HttpClient, ConcurrentRequestsFromManyThreads) {
  std::atomic<int> succeeded = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        http::Request request;
        request.method = "POST";
        request.url = server().url("/t" + std::to_string(t));
        request.unix_socket = i % 2 ? server().unix_socket() : "";
        request.body = std::to_string(i);
        const http::Response response = http::perform(request);
        if (response.status == 200 && json::parse(response.body)["body"] == std::to_string(i))
          ++succeeded;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(succeeded, 80);
}

}  // namespace
}  // namespace rlm::test
