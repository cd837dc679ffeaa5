// The policy's "python" section: a venv and site-packages directories exposed read-only. What
// loads (a real venv made by python3 -m venv), every refusal at its JSON path (shape, the host's
// directories, kernel interfaces, symlinks, directories others can change, the policy's own
// writable mounts), the check repeated at prepare time, and rlm::loosenings calling a new
// directory a loosening unless the server permits it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "policy/python_environment.hpp"
#include "policy_test_helpers.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/tightening.hpp"
#include "support/python_venv.hpp"

namespace rlm::test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string json_text(const std::string& text) {
  return nlohmann::json(text).dump();
}

std::string with_python(const std::string& python, const std::string& more = "") {
  return R"({"extends": "python-repl", )" + more + R"("python": )" + python + "}";
}

std::string with_venv(const std::string& venv) {
  return with_python(R"({"venv": )" + json_text(venv) + "}");
}

std::string with_site(const std::string& dir) {
  return with_python(R"({"site_packages": [)" + json_text(dir) + "]}");
}

std::string listed(const std::vector<Diagnostic>& found) {
  std::string text;
  for (const auto& d : found) text += "\n  " + d.to_string();
  return text;
}

class PythonPolicy : public ::testing::Test {
 protected:
  PythonVenv venv_;
};

TEST_F(PythonPolicy, AVenvLoadsAndItsSitePackagesIsFound) {
  const Policy policy = load_policy_text(with_venv(venv_.path()), "venv.json");
  ASSERT_EQ(policy.python.venv, venv_.path());
  EXPECT_THAT(policy.python.site_packages, IsEmpty());
  const auto dirs = policy::python_dirs(policy);
  ASSERT_EQ(dirs.size(), 1u);
  EXPECT_EQ(dirs[0].where, "python.venv");
  EXPECT_EQ(dirs[0].path, venv_.path()) << "the whole venv is bound, its bin/ and pyvenv.cfg too";
  EXPECT_EQ(dirs[0].site, venv_.site());
  EXPECT_FALSE(dirs[0].bound_by_policy);
  EXPECT_EQ(policy::site_dirs_value(dirs), venv_.site());

  // `policy show` prints it, and what it prints loads back unchanged.
  const auto shown = policy.to_json();
  EXPECT_EQ(shown["python"]["venv"], venv_.path());
  EXPECT_EQ(policy_from_json(shown, "shown").to_json(), shown);
}

TEST_F(PythonPolicy, SiteDirectoriesFollowTheVenvInTheirOrder) {
  std::string system_site = "/usr/lib/python3/dist-packages";
  if (!std::filesystem::is_directory(system_site)) system_site = venv_.root();
  const Policy policy = load_policy_text(
      with_python(R"({"venv": )" + json_text(venv_.path()) + R"(, "site_packages": [)" +
                  json_text(venv_.plain_site()) + ", " + json_text(system_site) + "]}"),
      "sites.json");
  EXPECT_THAT(policy.python.site_packages, ElementsAre(venv_.plain_site(), system_site));
  EXPECT_EQ(policy::site_dirs_value(policy::python_dirs(policy)),
            venv_.site() + ":" + venv_.plain_site() + ":" + system_site);
}

TEST_F(PythonPolicy, ShippedPoliciesExposeNoPythonEnvironment) {
  for (const auto& name : shipped_policy_names()) {
    const Policy policy = load_policy(name);
    EXPECT_FALSE(policy.python.venv) << name;
    EXPECT_THAT(policy.python.site_packages, IsEmpty()) << name;
    EXPECT_EQ(policy.to_json()["python"],
              nlohmann::json({{"venv", nullptr}, {"site_packages", nlohmann::json::array()}}))
        << name;
  }
}

TEST_F(PythonPolicy, ShapeErrorsAreFoundAtTheirPaths) {
  EXPECT_EQ(only_problem_in(with_python(R"({"venv": 1})")).path, "python.venv");
  EXPECT_EQ(only_problem_in(with_python(R"({"site_packages": "/usr"})")).path,
            "python.site_packages");
  const auto relative = only_problem_in(with_venv("venv"));
  EXPECT_EQ(relative.path, "python.venv");
  EXPECT_THAT(relative.message, HasSubstr("must be an absolute host path"));
  EXPECT_EQ(only_problem_in(with_python(R"({"site_packages": ["/usr", "lib"]})")).path,
            "python.site_packages[1]");
  const auto duplicate =
      only_problem_in(with_python(R"({"site_packages": [)" + json_text(venv_.plain_site()) + ", " +
                                  json_text(venv_.plain_site()) + "]}"));
  EXPECT_EQ(duplicate.path, "python.site_packages[1]");
  EXPECT_THAT(duplicate.message, HasSubstr("duplicates python.site_packages[0]"));
  const auto typo = only_problem_in(with_python(R"({"venvv": "/opt/venv"})"));
  EXPECT_EQ(typo.path, "python.venvv");
  EXPECT_THAT(typo.message, HasSubstr("did you mean venv?"));
  // A key of the section written at the top level is pointed to its section ("venv" alone is
  // closer to "env").
  const auto misplaced = only_problem_in(R"({"site_packages": ["/usr"]})");
  EXPECT_THAT(misplaced.message, HasSubstr("did you mean python.site_packages?"));
  // The same directory as the venv and as a site directory.
  const auto twice =
      only_problem_in(with_python(R"({"venv": )" + json_text(venv_.path()) +
                                  R"(, "site_packages": [)" + json_text(venv_.path()) + "]}"));
  EXPECT_EQ(twice.path, "python.site_packages[0]");
  EXPECT_THAT(twice.message, HasSubstr("duplicates python.venv"));
}

TEST_F(PythonPolicy, PathsMustBeInNormalFormWithoutAColon) {
  for (const std::string& path : {venv_.root() + "//venv", venv_.root() + "/./venv",
                                  venv_.path() + "/", venv_.root() + "/site/../venv"}) {
    const auto problem = only_problem_in(with_venv(path));
    EXPECT_EQ(problem.path, "python.venv") << path;
    EXPECT_THAT(problem.message, HasSubstr("normal form")) << path;
  }
  EXPECT_THAT(only_problem_in(with_venv("/")).message, HasSubstr("must not be \"/\""));
  std::filesystem::create_directory(venv_.root() + "/a:b");
  EXPECT_THAT(only_problem_in(with_site(venv_.root() + "/a:b")).message,
              HasSubstr("holds a ':', which separates the directories in RLM_SANDBOX_SITE_DIRS"));
}

TEST_F(PythonPolicy, RefusesWhatTheHostDoesNotHold) {
  const auto missing = only_problem_in(with_venv(venv_.root() + "/nothing"));
  EXPECT_EQ(missing.path, "python.venv");
  EXPECT_EQ(missing.message, venv_.root() + "/nothing does not exist on the host");

  const auto file = only_problem_in(with_site(venv_.path() + "/pyvenv.cfg"));
  EXPECT_EQ(file.path, "python.site_packages[0]");
  EXPECT_THAT(file.message, HasSubstr("is not a directory"));

  // A directory that is not a venv: pointed at site_packages instead.
  const auto not_venv = only_problem_in(with_venv(venv_.plain_site()));
  EXPECT_THAT(not_venv.message, HasSubstr("is not a virtual environment (it has no pyvenv.cfg)"));
  EXPECT_THAT(not_venv.message, HasSubstr("python.site_packages"));

  // A venv made for another Python has no site-packages for the version it names.
  std::filesystem::create_directories(venv_.root() + "/other");
  std::ofstream(venv_.root() + "/other/pyvenv.cfg") << "home = /usr/bin\nversion = 3.99.1\n";
  const auto other = only_problem_in(with_venv(venv_.root() + "/other"));
  EXPECT_THAT(other.message, HasSubstr("has no directory " + venv_.root() +
                                       "/other/lib/python3.99/site-packages"));
}

TEST_F(PythonPolicy, KernelInterfacesAreNeverAPythonEnvironment) {
  for (const std::string dir : {"/proc/sys", "/sys/kernel", "/dev", "/proc"}) {
    // Not even where the policy allows kernel-interface binds.
    const auto problem =
        only_problem_in(with_python(R"({"site_packages": [)" + json_text(dir) + "]}",
                                    R"("filesystem": {"allow_kernel_interface_binds": true}, )"));
    EXPECT_EQ(problem.path, "python.site_packages[0]") << dir;
    EXPECT_THAT(problem.message, HasSubstr("a Python environment is never a kernel interface"))
        << dir;
  }
}

TEST_F(PythonPolicy, RefusesAPathThroughASymlinkNamingWhereItLeads) {
  const std::string link = venv_.root() + "/link";
  std::filesystem::create_directory_symlink(venv_.path(), link);
  const auto problem = only_problem_in(with_venv(link));
  EXPECT_EQ(problem.path, "python.venv");
  EXPECT_THAT(problem.message, HasSubstr(link + " leads through a symbolic link to " +
                                         venv_.path() + "; name the directory itself"));
  // A symlink above the directory counts as well.
  const auto above = only_problem_in(with_site(link + "/lib"));
  EXPECT_THAT(above.message,
              HasSubstr("leads through a symbolic link to " + venv_.path() + "/lib"));
}

TEST_F(PythonPolicy, RefusesADirectoryAnotherUserCouldChange) {
  const std::string site = venv_.plain_site();
  const auto refused = [&](const std::string& why) {
    const auto problem = only_problem_in(with_site(site));
    EXPECT_EQ(problem.path, "python.site_packages[0]");
    EXPECT_THAT(problem.message, HasSubstr(why));
    EXPECT_THAT(problem.message, HasSubstr("only root and the runtime's own user"));
  };
  ASSERT_EQ(::chmod(site.c_str(), 0777), 0);
  refused(site + " is writable by every user");
  ASSERT_EQ(::chmod(site.c_str(), 0775), 0);
  ASSERT_EQ(::chown(site.c_str(), 0, 12345), 0);
  refused(site + " is writable by group 12345");
  ASSERT_EQ(::chmod(site.c_str(), 0755), 0);
  ASSERT_EQ(::chown(site.c_str(), 12345, 0), 0);
  refused(site + " is owned by uid 12345");
  ASSERT_EQ(::chown(site.c_str(), 0, 0), 0);
  EXPECT_THAT(problems_in(with_site(site)), IsEmpty());
  // A parent anyone may write to could swap the directory for another; a sticky one (/tmp) not.
  ASSERT_EQ(::chmod(venv_.root().c_str(), 0777), 0);
  refused(site + "'s parent " + venv_.root() + " is writable by every user");
  ASSERT_EQ(::chmod(venv_.root().c_str(), 01777), 0);
  EXPECT_THAT(problems_in(with_site(site)), IsEmpty());
  ASSERT_EQ(::chmod(venv_.root().c_str(), 0755), 0);
}

TEST_F(PythonPolicy, RefusesWhatTheSandboxCouldWriteThroughAnotherMount) {
  // A read-write bind of the directory that holds the venv: the sandbox could change its code.
  const auto writable = only_problem_in(
      with_venv(venv_.path())
          .replace(0, 1,
                   R"({"filesystem": {"mounts": [{"source": )" + json_text(venv_.root()) +
                       R"(, "target": "/data", "readonly": false}]}, )"));
  EXPECT_EQ(writable.path, "python.venv");
  EXPECT_THAT(writable.message,
              HasSubstr("filesystem.mounts[0] binds " + venv_.root() +
                        " read-write, so the sandbox could write into " + venv_.path()));
  // A read-write bind of something inside it.
  const auto inside = only_problem_in(
      with_venv(venv_.path())
          .replace(0, 1,
                   R"({"filesystem": {"mounts": [{"source": )" + json_text(venv_.site()) +
                       R"(, "target": "/data", "readonly": false}]}, )"));
  EXPECT_THAT(inside.message, HasSubstr("read-write"));
  // A mount whose target lies inside the venv would be hidden by the venv's bind.
  const auto hidden =
      only_problem_in(with_venv(venv_.path())
                          .replace(0, 1,
                                   R"({"filesystem": {"mounts": [{"type": "tmpfs", "target": )" +
                                       json_text(venv_.path() + "/bin") + "}]}, "));
  EXPECT_THAT(hidden.message, HasSubstr("which its bind would hide"));
  // A tmpfs at the very place.
  const auto same =
      only_problem_in(with_venv(venv_.path())
                          .replace(0, 1,
                                   R"({"filesystem": {"mounts": [{"type": "tmpfs", "target": )" +
                                       json_text(venv_.path()) + "}]}, "));
  EXPECT_THAT(same.message, HasSubstr("is also the target of filesystem.mounts[0]"));
}

TEST_F(PythonPolicy, AReadOnlyBindOfTheDirectoryItselfIsNotMadeTwice) {
  const Policy policy = load_policy_text(
      with_venv(venv_.path())
          .replace(0, 1,
                   R"({"filesystem": {"mounts": [{"source": )" + json_text(venv_.path()) +
                       R"(, "target": )" + json_text(venv_.path()) + "}]}, "),
      "bound.json");
  const auto dirs = policy::python_dirs(policy);
  ASSERT_EQ(dirs.size(), 1u);
  EXPECT_TRUE(dirs[0].bound_by_policy);
}

TEST_F(PythonPolicy, AnExtendingPolicyMayDropTheVenvWithNull) {
  TempDir dir;
  dir.write("base.json", with_venv(venv_.path()));
  dir.write("top.json", R"({"extends": "base.json", "python": {"venv": null}})");
  EXPECT_EQ(load_policy(dir.file("base.json")).python.venv, venv_.path());
  EXPECT_FALSE(load_policy(dir.file("top.json")).python.venv);
}

TEST_F(PythonPolicy, TheHostIsCheckedAgainWhenASandboxIsPrepared) {
  const Policy policy = load_policy_text(with_venv(venv_.path()), "venv.json");
  ASSERT_EQ(::chmod(venv_.path().c_str(), 0777), 0);
  try {
    policy::python_dirs(policy);
    ADD_FAILURE() << "a venv made writable after loading was exposed";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(),
                HasSubstr("python.venv: " + venv_.path() + " is writable by every user"));
  }
  std::filesystem::remove_all(venv_.path());
  EXPECT_THROW(policy::python_dirs(policy), Error);
}

// ---- loosenings ---------------------------------------------------------------------------------

class PythonTightening : public PythonPolicy {
 protected:
  Policy base_ = load_policy("python-repl");
};

TEST_F(PythonTightening, ANewDirectoryIsALooseningUnlessTheServerPermitsIt) {
  Policy candidate = base_;
  candidate.python.venv = venv_.path();
  candidate.python.site_packages = {"/usr", venv_.plain_site()};
  const auto found = loosenings(base_, candidate, {{"/usr", false}});
  ASSERT_EQ(found.size(), 2u) << listed(found);
  EXPECT_EQ(found[0].path, "python.venv");
  EXPECT_THAT(found[0].message,
              HasSubstr(venv_.path() + " is not exposed by the offered policy nor beneath a "
                                       "directory the server permits; this client may bind "
                                       "beneath /usr"));
  EXPECT_EQ(found[1].path, "python.site_packages[1]");
  // Permitted read-only is enough: the directories are always bound read-only.
  EXPECT_THAT(loosenings(base_, candidate, {{"/usr", false}, {venv_.root(), false}}), IsEmpty());
}

TEST_F(PythonTightening, KeepingNarrowingOrDroppingTheOfferedDirectoriesPasses) {
  Policy offered = base_;
  offered.python.venv = venv_.path();
  offered.python.site_packages = {venv_.plain_site()};
  EXPECT_THAT(loosenings(offered, offered, {}), IsEmpty());
  Policy dropped = offered;
  dropped.python = {};
  EXPECT_THAT(loosenings(offered, dropped, {}), IsEmpty());
  Policy narrowed = offered;
  narrowed.python.venv.reset();
  narrowed.python.site_packages = {venv_.site()};  // inside the offered venv
  EXPECT_THAT(loosenings(offered, narrowed, {}), IsEmpty());
  // A "..": resolved before it is compared, so it cannot climb out of an offered directory.
  Policy climbing = offered;
  climbing.python.site_packages = {venv_.path() + "/../.."};
  EXPECT_THAT(loosenings(offered, climbing, {}),
              ElementsAre(::testing::Field(&Diagnostic::path, "python.site_packages[0]")));
}

}  // namespace
}  // namespace rlm::test
