// The policy's "python" section in real runs: the namespace backend binds the venv and each site
// directory read-only at their host paths (a payload imports from them and cannot write into
// them, and the venv's own interpreter works inside), the local backend binds nothing and names
// the same host directories, and every backend hands the payload RLM_SANDBOX_SITE_DIRS. A
// directory that changed on the host after the policy was loaded is refused when the sandbox is
// prepared.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "support/python_venv.hpp"

namespace rlm::test {
namespace {

using ::testing::HasSubstr;

// Adds each site directory as the session's worker does, imports both probes, then tries to plant
// a module in the venv's site-packages and to change it.
constexpr const char* kProbe = R"(
import os, site
dirs = os.environ.get("RLM_SANDBOX_SITE_DIRS", "")
print("dirs", dirs)
for d in dirs.split(":"):
    if d:
        site.addsitedir(d)
import rlm_venv_probe, rlm_site_probe
print("imported", rlm_venv_probe.VALUE, rlm_site_probe.WHERE)
if os.environ.get("TRY_WRITE"):
    for path in (dirs.split(":")[0] + "/planted.py", dirs.split(":")[1] + "/planted.py"):
        try:
            open(path, "w").write("x = 1")
            print("wrote", path)
        except OSError as error:
            print("refused", error.errno)
    venv = os.environ["VENV"]
    for change in (lambda: open(rlm_venv_probe.__file__, "a").write("x"),
                   lambda: os.mkdir(venv + "/new"),
                   lambda: os.rename(venv + "/bin", venv + "/gone")):
        try:
            change()
            print("changed")
        except OSError as error:
            print("refused", error.errno)
)";

class PythonEnvironmentRun : public ::testing::TestWithParam<std::string> {
 protected:
  Result run(std::vector<std::string> argv, std::map<std::string, std::string> env = {}) {
    Request request;
    request.argv = std::move(argv);
    request.env = std::move(env);
    return backend_->run(request, policy_);
  }

  PythonVenv venv_;
  Policy policy_ = venv_.policy_for(GetParam());
  std::unique_ptr<Backend> backend_ = make_backend(GetParam());
};

TEST_P(PythonEnvironmentRun, APayloadImportsFromTheSiteDirectoriesInOrder) {
  const auto result = run({"/usr/bin/python3", "-I", "-S", "-c", kProbe});
  ASSERT_EQ(result.status, Status::ok) << result.to_json().dump();
  EXPECT_THAT(result.stdout_data,
              HasSubstr("dirs " + venv_.site() + ":" + venv_.plain_site() + "\n"));
  EXPECT_THAT(result.stdout_data, HasSubstr("imported 4242 plain site\n"));
}

TEST_P(PythonEnvironmentRun, TheRequestMaySetTheVariableItself) {
  const auto result = run({"/bin/sh", "-c", "echo \"$RLM_SANDBOX_SITE_DIRS\""},
                          {{"RLM_SANDBOX_SITE_DIRS", "/elsewhere"}});
  ASSERT_EQ(result.status, Status::ok) << result.to_json().dump();
  EXPECT_EQ(result.stdout_data, "/elsewhere\n");
}

TEST_P(PythonEnvironmentRun, APolicyWithoutOneSetsNoVariable) {
  policy_.python = {};
  const auto result = run({"/bin/sh", "-c", "echo \"[${RLM_SANDBOX_SITE_DIRS-unset}]\""});
  ASSERT_EQ(result.status, Status::ok) << result.to_json().dump();
  EXPECT_EQ(result.stdout_data, "[unset]\n");
}

TEST_P(PythonEnvironmentRun, ADirectoryChangedAfterLoadingIsRefusedAtPrepare) {
  ASSERT_EQ(::chmod(venv_.path().c_str(), 0777), 0);
  std::string failure;
  try {
    const auto result = run({"/bin/true"});
    if (result.status == Status::sandbox_error) failure = result.detail;
  } catch (const Error& error) {
    failure = error.what();
  }
  EXPECT_THAT(failure, HasSubstr("python.venv: " + venv_.path() + " is writable by every user"));
}

INSTANTIATE_TEST_SUITE_P(Backends, PythonEnvironmentRun, ::testing::Values("namespace", "local"));

// The namespace backend's binds: read-only, whatever the payload tries, and the venv's own
// interpreter (a symlink to the host's /usr/bin/python3) runs inside with its packages.
class NamespacePythonEnvironment : public PythonEnvironmentRun {};

TEST_P(NamespacePythonEnvironment, ThePayloadCannotWriteIntoTheExposedDirectories) {
  // Writable by everyone on the host: only the read-only bind stands in the way.
  const std::string module = venv_.site() + "/rlm_venv_probe/__init__.py";
  ASSERT_EQ(::chmod(module.c_str(), 0666), 0);
  const auto result = run({"/usr/bin/python3", "-I", "-S", "-c", kProbe},
                          {{"TRY_WRITE", "1"}, {"VENV", venv_.path()}});
  ASSERT_EQ(result.status, Status::ok) << result.to_json().dump();
  EXPECT_THAT(result.stdout_data, HasSubstr("imported 4242 plain site\n"));
  EXPECT_THAT(result.stdout_data, ::testing::Not(HasSubstr("wrote"))) << result.stdout_data;
  EXPECT_THAT(result.stdout_data, ::testing::Not(HasSubstr("changed"))) << result.stdout_data;
  // EROFS for each of the five attempts: the binds are read-only, not merely unwritable to the
  // sandbox's user.
  std::size_t refusals = 0;
  for (auto at = result.stdout_data.find("refused 30\n"); at != std::string::npos;
       at = result.stdout_data.find("refused 30\n", at + 1))
    ++refusals;
  EXPECT_EQ(refusals, 5u) << result.stdout_data;
  EXPECT_FALSE(std::filesystem::exists(venv_.site() + "/planted.py"));
  EXPECT_FALSE(std::filesystem::exists(venv_.plain_site() + "/planted.py"));
  EXPECT_TRUE(std::filesystem::exists(venv_.path() + "/bin"));
  EXPECT_EQ(std::filesystem::file_size(module), std::string("VALUE = 4242\n").size());
}

TEST_P(NamespacePythonEnvironment, TheVenvsOwnInterpreterFindsItsPackages) {
  const auto result = run({venv_.path() + "/bin/python", "-c",
                           "import sys, rlm_venv_probe; print(sys.prefix, rlm_venv_probe.VALUE)"});
  ASSERT_EQ(result.status, Status::ok) << result.to_json().dump();
  EXPECT_EQ(result.stdout_data, venv_.path() + " 4242\n");
}

INSTANTIATE_TEST_SUITE_P(Backends, NamespacePythonEnvironment, ::testing::Values("namespace"));

}  // namespace
}  // namespace rlm::test
