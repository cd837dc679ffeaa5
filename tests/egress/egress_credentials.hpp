// The fixture of the injected-credential tests (egress_credentials_test.cpp on every backend
// that enforces an allowlist; egress_namespace_test.cpp through the server): a random secret in
// the runtime's environment, a policy that injects it for api.test, and a writable /out where the
// sandbox leaves what the test searches for it.
#pragma once

#include <openssl/evp.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "egress_suite.hpp"

namespace rlm::test {

using nlohmann::json;

inline constexpr const char* kSecretVariable = "RLM_TEST_INJECTED_TOKEN";

inline std::string sha256_hex(const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(text.data(), text.size(), digest, &length, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

inline std::string random_secret() {
  std::random_device device;
  std::string secret = "rlm-injected-";
  for (int i = 0; i < 4; ++i) secret += std::to_string(device());
  return secret;
}

inline std::string read_whole(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

class EgressCredentials : public EgressSuite {
 protected:
  void SetUp() override {
    EgressSuite::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    secret_ = random_secret();
    setenv(kSecretVariable, secret_.c_str(), 1);
    chmod(out_.path().c_str(), 0777);
  }
  void TearDown() override {
    unsetenv(kSecretVariable);
    // The docker backend's trust store (a host file per run, named by the run's id, which starts
    // with this pid) goes with its run.
    const std::string prefix = "rlm-sandbox-trust-" + std::to_string(getpid()) + "-";
    for (const auto& entry : std::filesystem::directory_iterator("/tmp"))
      EXPECT_FALSE(entry.path().filename().string().starts_with(prefix)) << entry.path();
  }

  // An allowlist of api.test (its Authorization injected from `from`) and pypi.test, with the
  // host's environment copied and the secret's variable passed by name besides (both withheld),
  // and /out writable.
  Policy injecting(const json& from) const {
    json injection = {{"host", "api.test:443"}, {"header", "Authorization"}};
    injection.update(from);
    Policy injected =
        policy({{"allow", {"api.test:443", "pypi.test:443"}}, {"inject", {injection}}});
    injected.limits.file_size_bytes = 512ull << 20;  // room for a memory dump
    injected.env.clear = false;
    injected.env.pass.push_back(kSecretVariable);
    Mount out;
    out.source = out_.path();
    out.target = "/out";
    out.readonly = false;
    injected.filesystem.mounts.push_back(out);
    return injected;
  }

  std::string secret_;
  TempDir out_;
};

}  // namespace rlm::test
