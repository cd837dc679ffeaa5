// A session's cells import from the Python environment the policy exposes (a venv made by
// python3 -m venv with a hand-written package, and a plain site directory): the worker adds each
// directory of RLM_SANDBOX_SITE_DIRS at start-up. Under the namespace backend a cell cannot write
// into them; the local backend reaches the same host directories.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/session.hpp"
#include "support/python_venv.hpp"

namespace rlm::test {
namespace {

using ::testing::HasSubstr;

class PythonEnvironmentSession : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { session_ = backend_->open_session(policy_, {}); }

  CellResult execute(const std::string& code) {
    auto cell = session_->execute(code);
    EXPECT_EQ(cell.status, CellStatus::ok) << cell.to_json().dump();
    return cell;
  }

  PythonVenv venv_;
  Policy policy_ = venv_.policy_for(GetParam());
  std::unique_ptr<Backend> backend_ = make_backend(GetParam());
  std::unique_ptr<Session> session_;
};

TEST_P(PythonEnvironmentSession, ACellImportsAModuleOnlyTheVenvHas) {
  EXPECT_EQ(execute("import rlm_venv_probe\nprint(rlm_venv_probe.VALUE)").stdout_data, "4242\n");
  EXPECT_EQ(execute("import rlm_site_probe\nprint(rlm_site_probe.WHERE)").stdout_data,
            "plain site\n");
  // The venv's site-packages comes first on sys.path, after the standard library.
  EXPECT_EQ(execute("import sys\nprint([p for p in sys.path if p in " +
                    nlohmann::json({venv_.site(), venv_.plain_site()}).dump() + "])")
                .stdout_data,
            "['" + venv_.site() + "', '" + venv_.plain_site() + "']\n");
}

TEST_P(PythonEnvironmentSession, WithoutThePolicyFieldTheModuleIsNotThere) {
  policy_.python = {};
  session_ = backend_->open_session(policy_, {});
  const auto cell = session_->execute("import rlm_venv_probe");
  EXPECT_EQ(cell.status, CellStatus::error) << cell.to_json().dump();
  EXPECT_THAT(cell.error, HasSubstr("No module named 'rlm_venv_probe'"));
}

INSTANTIATE_TEST_SUITE_P(Backends, PythonEnvironmentSession,
                         ::testing::Values("namespace", "local"));

class NamespacePythonEnvironmentSession : public PythonEnvironmentSession {};

TEST_P(NamespacePythonEnvironmentSession, ACellCannotWriteIntoTheVenv) {
  // Writable by everyone on the host: only the read-only bind stands in the way.
  const std::string module = venv_.site() + "/rlm_venv_probe/__init__.py";
  ASSERT_EQ(::chmod(module.c_str(), 0666), 0);
  const auto cell = execute(R"(
import os, rlm_venv_probe
site_dir = os.path.dirname(os.path.dirname(rlm_venv_probe.__file__))
for attempt in (lambda: open(rlm_venv_probe.__file__, "a").write("VALUE = 0\n"),
                lambda: open(os.path.join(site_dir, "planted.py"), "w"),
                lambda: os.mkdir(os.path.join(site_dir, "planted"))):
    try:
        attempt()
        print("wrote")
    except OSError as error:
        print(error.errno)
)");
  EXPECT_EQ(cell.stdout_data, "30\n30\n30\n");  // EROFS, each time
  EXPECT_EQ(std::filesystem::file_size(module), std::string("VALUE = 4242\n").size());
  EXPECT_FALSE(std::filesystem::exists(venv_.site() + "/planted.py"));
  // The next cell still imports the unchanged module.
  EXPECT_EQ(
      execute("import importlib, rlm_venv_probe\nprint(importlib.reload(rlm_venv_probe).VALUE)")
          .stdout_data,
      "4242\n");
}

INSTANTIATE_TEST_SUITE_P(Backends, NamespacePythonEnvironmentSession,
                         ::testing::Values("namespace"));

}  // namespace
}  // namespace rlm::test
