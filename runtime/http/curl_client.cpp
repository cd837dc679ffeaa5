// rlm::http over libcurl: one easy handle per request, so concurrent calls share nothing.
#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "http/http_client.hpp"

namespace rlm::http {
namespace {

void initialize_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
      throw std::runtime_error("curl_global_init failed");
  });
}

struct EasyDeleter {
  void operator()(CURL* easy) const { curl_easy_cleanup(easy); }
};
struct SlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

// What the callbacks write into; they run on the calling thread, inside curl_easy_perform.
struct Transfer {
  const Request& request;
  Response& response;
  std::exception_ptr callback_exception;  // rethrown once curl has unwound
};

size_t on_write(char* data, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const std::string_view chunk(data, size * count);
  if (!transfer.request.on_body) {
    transfer.response.body.append(chunk);
    return chunk.size();
  }
  try {
    if (transfer.request.on_body(chunk)) return chunk.size();
    transfer.response.aborted = true;
  } catch (...) {
    // An exception must not cross libcurl's C frames.
    transfer.callback_exception = std::current_exception();
  }
  return CURL_WRITEFUNC_ERROR;
}

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto& headers = static_cast<Transfer*>(user)->response.headers;
  const std::string_view line(data, size * count);
  // Each response (an interim 100 Continue, a proxy's CONNECT answer) starts with a status line;
  // only the last response's headers are kept.
  if (line.starts_with("HTTP/")) {
    headers.clear();
    return line.size();
  }
  const auto colon = line.find(':');
  if (colon == std::string_view::npos) return line.size();  // the blank line ending the block
  std::string name(trim(line.substr(0, colon)));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::string_view value = trim(line.substr(colon + 1));
  auto [slot, inserted] = headers.try_emplace(std::move(name), value);
  if (!inserted)
    slot->second.append(", ").append(value);  // repeated headers, as RFC 9110 joins them
  return line.size();
}

bool has_header(const std::vector<std::string>& headers, std::string_view name) {
  return std::any_of(headers.begin(), headers.end(), [&](const std::string& header) {
    return header.size() > name.size() && header[name.size()] == ':' &&
           std::equal(name.begin(), name.end(), header.begin(), [](char a, char b) {
             return std::tolower(static_cast<unsigned char>(a)) ==
                    std::tolower(static_cast<unsigned char>(b));
           });
  });
}

}  // namespace

bool available() {
  return true;
}

Response perform(const Request& request) {
  initialize_curl_once();
  Response response;
  std::unique_ptr<CURL, EasyDeleter> easy(curl_easy_init());
  if (!easy) {
    response.error = "curl_easy_init failed";
    return response;
  }
  CURL* handle = easy.get();
  Transfer transfer{request, response, nullptr};
  char error_text[CURL_ERROR_SIZE] = "";

  // Signals would be unsafe in a multithreaded host (libcurl's resolver timeout uses SIGALRM).
  curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(handle, CURLOPT_URL, request.url.c_str());
  // No file://, ftp:// or redirects into them: this client speaks HTTP and nothing else.
  curl_easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "http,https");
  if (!request.unix_socket.empty())
    curl_easy_setopt(handle, CURLOPT_UNIX_SOCKET_PATH, request.unix_socket.c_str());
  curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, error_text);
  curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(request.connect_timeout.count()));
  curl_easy_setopt(handle, CURLOPT_TIMEOUT_MS, static_cast<long>(request.timeout.count()));

  // A POST, PUT or PATCH without a body still says "Content-Length: 0": some servers answer 411
  // Length Required otherwise.
  static const std::string kEmptyBody;
  const bool sends_body = request.body || request.method == "POST" || request.method == "PUT" ||
                          request.method == "PATCH";
  if (sends_body) {
    const std::string& body = request.body ? *request.body : kEmptyBody;
    curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(handle, CURLOPT_POSTFIELDS, body.data());
  }
  if (request.method == "HEAD") curl_easy_setopt(handle, CURLOPT_NOBODY, 1L);
  curl_easy_setopt(handle, CURLOPT_CUSTOMREQUEST, request.method.c_str());

  std::unique_ptr<curl_slist, SlistDeleter> headers;
  auto add_header = [&](const std::string& header) {
    curl_slist* extended = curl_slist_append(headers.get(), header.c_str());
    if (!extended) throw std::bad_alloc();
    static_cast<void>(headers.release());
    headers.reset(extended);
  };
  for (const auto& header : request.headers) add_header(header);
  if (sends_body) {
    // Left to itself libcurl would label every body a form (application/x-www-form-urlencoded),
    // and send "Expect: 100-continue" with large ones, then stall a second on servers that never
    // answer it. An empty value drops the header.
    if (!has_header(request.headers, "Content-Type")) add_header("Content-Type:");
    if (!has_header(request.headers, "Expect")) add_header("Expect:");
  }
  curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers.get());

  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(handle, CURLOPT_WRITEDATA, &transfer);
  curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(handle, CURLOPT_HEADERDATA, &transfer);

  const CURLcode result = curl_easy_perform(handle);
  if (transfer.callback_exception) std::rethrow_exception(transfer.callback_exception);
  curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &response.status);
  if (result != CURLE_OK && !(response.aborted && result == CURLE_WRITE_ERROR))
    response.error = error_text[0] ? error_text : curl_easy_strerror(result);
  return response;
}

}  // namespace rlm::http
