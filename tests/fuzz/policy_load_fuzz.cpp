// libFuzzer harness: the policy loader, fed as a policy file from a repository would be. Every
// input either loads or is refused with a PolicyError that names its problems; anything else -- a
// crash, a leak, undefined behaviour, another exception type, a message that is not UTF-8 or that
// quotes the bytes of another file -- is a finding.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"

namespace {

// What "extends" may reach: a directory of its own with one valid base and one file that is not
// JSON and holds a marker no message may ever contain.
constexpr std::string_view kMarker = "fuzz-marker-3c1e7a";

std::string g_directory;

void set_up_directory() {
  // Under $TMPDIR: tools/fuzz points it into its scratch directory, which it removes even when a
  // finding ends the run before the atexit handler below.
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/rlm-policy-fuzz.XXXXXX";
  if (!::mkdtemp(path.data())) std::abort();
  g_directory = path;
  const auto write = [](const std::string& name, std::string_view text) {
    FILE* file = std::fopen((g_directory + "/" + name).c_str(), "w");
    if (!file) std::abort();
    std::fwrite(text.data(), 1, text.size(), file);
    std::fclose(file);
  };
  write("base.json", R"({"extends": "default", "limits": {"pids": 7}, "hostname": "base"})");
  write("secret.json", std::string("root:") + std::string(kMarker) + ":19000:0:99999:7:::\n");
  std::atexit([] {
    for (const char* name : {"base.json", "secret.json"})
      ::unlink((g_directory + "/" + name).c_str());
    ::rmdir(g_directory.c_str());
  });
}

// Messages go to terminals, JSON results and logs: they must be valid UTF-8 and never carry a
// file's bytes.
void check_message(const std::string& message, bool input_has_marker) {
  try {
    (void)nlohmann::json(message).dump();
  } catch (const nlohmann::json::type_error&) {
    std::fprintf(stderr, "a policy message is not valid UTF-8\n");
    std::abort();
  }
  // The fuzzer can learn the marker from this very comparison and write it into a document of
  // its own, whose text messages may show; only a marker the input does not hold is a leak.
  if (!input_has_marker && message.find(kMarker) != std::string::npos) {
    std::fprintf(stderr, "a policy message quotes the bytes of secret.json:\n%s\n",
                 message.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Names resolve among the shipped policies only, never in a directory of the host's.
  ::unsetenv("RLM_SANDBOX_POLICY_PATH");
  set_up_directory();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const rlm::Policy policy = rlm::load_policy_text(text, "fuzz.json", g_directory);
    // What loads is what `policy show` prints, and it must load back to the same thing.
    const nlohmann::json shown = policy.to_json();
    const rlm::Policy again = rlm::policy_from_json(shown, "again");
    if (again.to_json() != shown) {
      std::fprintf(stderr, "policy show does not round-trip:\n%s\n", shown.dump(2).c_str());
      std::abort();
    }
  } catch (const rlm::PolicyError& error) {
    const bool input_has_marker = text.find(kMarker) != std::string_view::npos;
    check_message(error.what(), input_has_marker);
    if (error.diagnostics().empty()) std::abort();  // a refusal always says why
    for (const auto& diagnostic : error.diagnostics())
      check_message(diagnostic.to_string(), input_has_marker);
  }
  // Any other exception escapes, and libFuzzer reports it as a crash.
  return 0;
}
