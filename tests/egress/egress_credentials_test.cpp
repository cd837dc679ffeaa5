// Credentials injected at the edge (docs/network.md, "Credentials"), on each backend that
// enforces an allowlist: the host side adds the header to requests for the named host and nowhere
// else, and the secret is found nowhere the sandbox can reach -- its environment (even one copying
// the host's, even one that passes the variable by name), its files, its memory, its traffic.
// Attacked from inside a real sandbox.
#include <signal.h>

#include "egress_credentials.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

// The sandbox's requests to api.test reach it with the real Authorization in place of its own,
// over TLS verified on both sides; its other names pass untouched (pypi.test's TLS is the
// upstream's own); a client that does not trust the sandbox's CA is refused, not served; and the
// secret is nowhere inside.
constexpr const char* kInjectedRun = R"PY(
import os, re, urllib.request
request = urllib.request.Request("https://api.test/", headers={"Authorization": "Bearer the-sandboxs-own"})
print(urllib.request.urlopen(request, timeout=20).read().decode())
print(https_get("pypi.test"))
def pinned():
    context = ssl.create_default_context(cafile="/world/server.pem")
    with socket.create_connection(("api.test", 443), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="api.test") as tls:
            return "served"
print(outcome(pinned))
print(os.environ.get("SSL_CERT_FILE"), os.environ.get("RLM_TEST_INJECTED_TOKEN"))
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem, open("/out/memory", "wb") as out:
    for line in maps:
        fields = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+)", line)
        if fields[3][0] != "r" or "[vvar]" in line or "[vsyscall]" in line: continue
        try:
            mem.seek(int(fields[1], 16))
            out.write(mem.read(int(fields[2], 16) - int(fields[1], 16)))
        except (OSError, ValueError, OverflowError): pass
skipped = ("/proc", "/sys", "/dev", "/out", "/usr", "/lib", "/lib64", "/bin", "/sbin")
with open("/out/files", "wb") as out:
    for top, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in skipped]
        for name in files:
            try:
                with open(os.path.join(top, name), "rb") as file: out.write(file.read(1 << 24))
            except OSError: pass
with open("/proc/self/environ", "rb") as environ, open("/out/environ", "wb") as out:
    out.write(environ.read())
)PY";

TEST_P(EgressCredentials, TheUpstreamGetsTheCredentialAndTheSandboxNeverSeesIt) {
  const auto result = python(kInjectedRun, injecting({{"value_from_env", kSecretVariable}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(lines_of(result.stdout_data),
            (std::vector<std::string>{"tls ok sni=api.test", "tls ok sni=pypi.test",
                                      "error:SSLCertVerificationError",
                                      std::string(kInjectionTrustBundle) + " None"}))
      << describe(result);

  // Upstream: the real credential, once, in place of the sandbox's own.
  const std::string injected = "Authorization: sha256:" + sha256_hex(secret_);
  const std::string own = "Authorization: sha256:" + sha256_hex("Bearer the-sandboxs-own");
  int with_secret = 0;
  for (const auto& request : world_.requests()) {
    if (request.find("Host: api.test") == std::string::npos) {
      EXPECT_EQ(request.find("Authorization"), std::string::npos) << request;
      continue;
    }
    EXPECT_EQ(request.find(own), std::string::npos) << request;
    EXPECT_NE(request.find("Connection: close"), std::string::npos) << request;
    with_secret += request.find(injected) != std::string::npos;
  }
  EXPECT_EQ(with_secret, 1) << "requests the upstream got: " << world_.requests().size();

  // The account: api.test allowed with its bytes; the pinned client's refusal recorded.
  ASSERT_TRUE(result.network) << describe(result);
  bool api_logged = false;
  for (const auto& entry : result.network->allowed)
    api_logged |= entry.name == "api.test" && entry.bytes_out > 0 && entry.bytes_in > 0;
  EXPECT_TRUE(api_logged) << describe(result);
  EXPECT_TRUE(denial(result, "protocol", "api.test")) << describe(result);

  // Nowhere inside: its memory, its files, its environment, its output.
  const std::string memory = read_whole(out_.file("memory"));
  const std::string files = read_whole(out_.file("files"));
  const std::string environ = read_whole(out_.file("environ"));
  EXPECT_GT(memory.size(), 1u << 20) << "the memory dump is too small to mean anything";
  EXPECT_NE(files.find("BEGIN CERTIFICATE"), std::string::npos) << "the file walk read nothing";
  EXPECT_NE(environ.find("SSL_CERT_FILE="), std::string::npos);
  for (const auto* place : {&memory, &files, &environ, &result.stdout_data, &result.stderr_data})
    EXPECT_EQ(place->find(secret_), std::string::npos) << "the secret is inside the sandbox";
  // The memory dump does hold what the sandbox sent itself: a search that could find it.
  EXPECT_NE(memory.find("the-sandboxs-own"), std::string::npos);
}

TEST_P(EgressCredentials, AValueFromAFileIsInjectedWithoutItsLineEnd) {
  TempDir secrets;
  std::ofstream(secrets.file("token")) << secret_ << "\n";
  const auto result = python(R"PY(
import urllib.request
print(urllib.request.urlopen("https://api.test/", timeout=20).read().decode())
)PY",
                             injecting({{"value_from_file", secrets.file("token")}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, "tls ok sni=api.test\n");
  bool injected = false;
  for (const auto& request : world_.requests())
    injected |= request.find("Authorization: sha256:" + sha256_hex(secret_)) != std::string::npos;
  EXPECT_TRUE(injected);
}

// What cannot be injected is never run without it: the run fails before anything starts and
// names the field.
TEST_P(EgressCredentials, AValueThatCannotBeReadStopsTheRunAndSaysWhich) {
  const auto unset = python("print('ran')", injecting({{"value_from_env", "RLM_TEST_NOT_SET"}}));
  EXPECT_EQ(unset.status, Status::sandbox_error) << describe(unset);
  EXPECT_EQ(unset.stdout_data, "");
  EXPECT_NE(unset.detail.find("network.inject[0].value_from_env"), std::string::npos)
      << unset.detail;

  const auto missing = python("print('ran')", injecting({{"value_from_file", "/nonexistent/x"}}));
  EXPECT_EQ(missing.status, Status::sandbox_error) << describe(missing);
  EXPECT_NE(missing.detail.find("network.inject[0].value_from_file"), std::string::npos)
      << missing.detail;

  setenv(kSecretVariable, "two\r\nX-Smuggled: lines", 1);
  const auto split = python("print('ran')", injecting({{"value_from_env", kSecretVariable}}));
  EXPECT_EQ(split.status, Status::sandbox_error) << describe(split);
  EXPECT_NE(split.detail.find("line break"), std::string::npos) << split.detail;
}

// A second request on the injected connection never reaches the upstream (it would be sent
// under the sandbox's eyes with nothing checked), and a request for another Host is refused
// before the credential is added.
TEST_P(EgressCredentials, OneRequestAConnectionAndOnlyForItsHost) {
  const auto result = python(R"PY(
def two_requests(second_host):
    context = ssl.create_default_context()
    with socket.create_connection(("api.test", 443), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="api.test") as tls:
            tls.sendall(b"GET / HTTP/1.1\r\nHost: " + second_host + b"\r\nContent-Length: 0\r\n\r\n"
                        b"GET /again HTTP/1.1\r\nHost: api.test\r\n\r\n")
            data = b""
            while True:
                try: chunk = tls.recv(4096)
                except (OSError, ssl.SSLError): break
                if not chunk: break
                data += chunk
            return data.split(b"\r\n\r\n", 1)[-1]
print(outcome(two_requests, b"api.test"))
print(outcome(two_requests, b"evil.test"))
)PY",
                             injecting({{"value_from_env", kSecretVariable}}));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  const auto lines = lines_of(result.stdout_data);
  ASSERT_EQ(lines.size(), 2u) << describe(result);
  EXPECT_TRUE(nothing_came_back(lines[0])) << lines[0];
  EXPECT_TRUE(nothing_came_back(lines[1])) << lines[1];
  EXPECT_TRUE(denial(result, "protocol", "api.test")) << describe(result);
  EXPECT_TRUE(denial(result, "host_mismatch", "evil.test")) << describe(result);
  for (const auto& request : world_.requests()) {
    EXPECT_EQ(request.find("/again"), std::string::npos) << request;
    EXPECT_EQ(request.find("evil.test"), std::string::npos) << request;
  }
}

// What the sandbox does to its end of an injected connection reaches only that connection: a
// peer gone (closed, reset) before the response is written does not end the runtime (SIGPIPE:
// this very test process, on the namespace backend), a partial TLS record held back does not
// hold a thread past the head's wait or the idle limit, nor does a flood of TLS 1.3 KeyUpdates
// whose answers it never reads, and TRACE, which would echo the credential back, is refused.
constexpr const char* kHostileClients = R"PY(
import os
def tls_to_api():
    context = ssl.create_default_context()
    return context.wrap_socket(socket.create_connection(("api.test", 443), timeout=10),
                               server_hostname="api.test")
def gone_before_the_response(reset):
    tls = tls_to_api()
    tls.sendall(b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
    if reset: tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    tls.close()
def held_back(prefix):
    tls = tls_to_api()
    tls.sendall(prefix)
    os.write(tls.fileno(), b"\x17")  # one byte of a TLS record, the rest never sent
    start = time.monotonic()
    try:
        tls.settimeout(20)
        while tls.recv(4096): pass
    except (OSError, ssl.SSLError): pass
    return "ended" if time.monotonic() - start < 15 else "held"
for reset in (False, True, False, True):
    gone_before_the_response(reset)
time.sleep(1)
print(held_back(b""))
print(held_back(b"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 100\r\n\r\nsome"))
def key_update_flood():
    # TLS 1.3 KeyUpdates that each ask for one back, never reading them: the host side's writes
    # to us stall, and its read of our head must still end at its wait.
    import ctypes
    lib = ctypes.CDLL("libssl.so.3")
    for name in ("TLS_client_method", "SSL_CTX_new", "SSL_new"):
        getattr(lib, name).restype = ctypes.c_void_p
    lib.SSL_CTX_new.argtypes = [ctypes.c_void_p]
    lib.SSL_new.argtypes = [ctypes.c_void_p]
    for name in ("SSL_set_fd", "SSL_connect", "SSL_write", "SSL_key_update", "SSL_do_handshake"):
        getattr(lib, name).argtypes = [ctypes.c_void_p] + ([ctypes.c_int] if name in ("SSL_set_fd", "SSL_key_update") else [ctypes.c_char_p, ctypes.c_int] if name == "SSL_write" else [])
    lib.SSL_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_char_p]
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    raw.connect(("api.test", 443))
    tls = lib.SSL_new(lib.SSL_CTX_new(lib.TLS_client_method()))
    lib.SSL_set_fd(tls, raw.fileno())
    lib.SSL_ctrl(tls, 55, 0, b"api.test")  # SSL_set_tlsext_host_name
    if lib.SSL_connect(tls) != 1: return "no handshake"
    lib.SSL_write(tls, b"GET / HTTP/1.1\r\n", 16)
    start = time.monotonic()
    while time.monotonic() - start < 15:
        if lib.SSL_key_update(tls, 1) != 1 or lib.SSL_do_handshake(tls) != 1:
            return "ended"
    return "held"
print(key_update_flood())
def trace():
    with tls_to_api() as tls:
        tls.sendall(b"TRACE / HTTP/1.1\r\nHost: api.test\r\n\r\n")
        return tls.recv(4096)
print(outcome(trace))
)PY";

TEST_P(EgressCredentials, AHostileClientReachesOnlyItsOwnConnection) {
  // The runtime embedded in a host that leaves SIGPIPE as it comes (this test process ignores it
  // for its own pipes, which would hide the fault).
  struct DefaultSigpipe {
    sighandler_t before = signal(SIGPIPE, SIG_DFL);
    ~DefaultSigpipe() { signal(SIGPIPE, before); }
  } default_sigpipe;
  auto injected = injecting({{"value_from_env", kSecretVariable}});
  injected.egress.limits.client_hello_wait = std::chrono::seconds(2);
  injected.egress.limits.idle = std::chrono::seconds(2);
  const auto result = python(kHostileClients, injected);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  const auto lines = lines_of(result.stdout_data);
  ASSERT_EQ(lines.size(), 4u) << describe(result);
  EXPECT_EQ(lines[0], "ended") << "a partial record held the head's read past its wait";
  EXPECT_EQ(lines[1], "ended") << "a partial record held the body's relay past the idle limit";
  EXPECT_EQ(lines[2], "ended") << "a KeyUpdate flood held the head's read past its wait";
  EXPECT_TRUE(nothing_came_back(lines[3])) << lines[3];
  EXPECT_TRUE(denial(result, "limit", "api.test")) << describe(result);
  EXPECT_TRUE(denial(result, "protocol", "api.test")) << describe(result);
  for (const auto& request : world_.requests()) EXPECT_EQ(request.find("TRACE"), std::string::npos);
}

}  // namespace
}  // namespace rlm::test
