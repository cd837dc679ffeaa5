// Session::save and load (docs/sessions.md, "Save and restore"): a session's state written to a
// file and read into a fresh session in another sandbox, and save files that were tampered with,
// cut short or made elsewhere refused before any sandbox reads them.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "namespace_session_fixture.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::test {
namespace {

std::string dump(const CellResult& cell) {
  return cell.to_json().dump();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_file(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

class SaveRestoreTest : public NamespaceSessionTest {
 protected:
  void SetUp() override {
    NamespaceSessionTest::SetUp();
    char pattern[] = "/tmp/rlm-test-save-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    path_ = dir_ + "/state.save";
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  // A session holding state of each kind a save keeps, saved to path_.
  CellResult save_a_session_with_state() {
    SessionOptions options;
    options.context = "the prompt";
    auto session = open(options);
    const auto defined = session->execute(R"(
import json, os
numbers = {'b': 2, 'a': 1, 'c': [1, (2, 3), {4}]}
alias = numbers
blob = bytes(range(256)) * 4096
def scale(x, factor=3):
    return x * factor * unit
unit = 2
def fact(n):
    return 1 if n <= 1 else n * fact(n - 1)
def counter():
    count = 0
    def step():
        nonlocal count
        count += 1
        return count
    return step
tick = counter(); tick(); tick()
square = lambda v: v * v
class Base:
    def hello(self):
        return 'base'
class Shape(Base):
    sides = 4
    def __init__(self, name):
        self.name = name
    def hello(self):
        return super().hello() + ' ' + self.name
box = Shape('box')
gen = (i for i in range(3))
os.makedirs('/tmp/work/sub', exist_ok=True)
with open('/tmp/work/sub/data.txt', 'w') as f:
    f.write('kept file')
os.symlink('sub/data.txt', '/tmp/work/link')
os.chdir('/tmp/work')
answer['content'] = 'partial'
)");
    EXPECT_EQ(defined.status, CellStatus::ok) << dump(defined);
    auto saved = session->save(path_);
    // The session goes on as it was.
    const auto after = session->execute("print(scale(5), os.getcwd())");
    EXPECT_EQ(after.stdout_data, "30 /tmp/work\n") << dump(after);
    session->close();
    return saved;
  }

  std::string dir_, path_;
};

TEST_F(SaveRestoreTest, AFreshSessionGetsTheSavedStateBack) {
  const auto saved = save_a_session_with_state();
  ASSERT_EQ(saved.status, CellStatus::ok) << dump(saved);
  ASSERT_TRUE(saved.saved);
  EXPECT_EQ((*saved.saved)["bytes"].get<std::uint64_t>(), read_file(path_).size());
  // What cannot be saved is named, not lost silently.
  const auto& skipped = (*saved.saved)["skipped"];
  ASSERT_EQ(skipped.size(), 2u) << saved.saved->dump();
  EXPECT_EQ(skipped[0]["name"], "gen");
  EXPECT_EQ(skipped[0]["type"], "generator");
  EXPECT_EQ(skipped[1]["name"], "f");  // the (closed) file the cell wrote with
  EXPECT_EQ(skipped[1]["type"], "TextIOWrapper");
  struct stat info {};
  ASSERT_EQ(stat(path_.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);

  auto restored = open();
  const auto loaded = restored->load(path_);
  ASSERT_EQ(loaded.status, CellStatus::ok) << dump(loaded);
  const auto check = restored->execute(R"(
import os
assert context == 'the prompt' and context_0 == 'the prompt'
assert list(numbers) == ['b', 'a', 'c'] and numbers['c'][1] == (2, 3) and numbers['c'][2] == {4}
assert alias is numbers
assert blob == bytes(range(256)) * 4096
assert scale(5) == 30 and fact(10) == 3628800
unit = 10
assert scale(1) == 30, 'a function reads the restored globals'
assert tick() == 3 and square(7) == 49
assert box.hello() == 'base box' and isinstance(box, Shape) and Shape.sides == 4
assert 'gen' not in globals() and 'f' not in globals()
assert os.getcwd() == '/tmp/work'
assert open('/tmp/work/sub/data.txt').read() == 'kept file'
assert os.readlink('/tmp/work/link') == 'sub/data.txt'
assert answer['content'] == 'partial' and not answer['ready']
assert json.dumps([1]) == '[1]'
print('all kept')
)");
  EXPECT_EQ(check.status, CellStatus::ok) << dump(check);
  EXPECT_EQ(check.stdout_data, "all kept\n");
  // The restored session is a session like any: its cells roll back as usual.
  const auto crash = restored->execute("numbers['d'] = 4\nimport os\nos._exit(3)");
  EXPECT_TRUE(crash.rolled_back) << dump(crash);
  EXPECT_EQ(restored->execute("print(sorted(numbers))").stdout_data, "['a', 'b', 'c']\n");
}

TEST_F(SaveRestoreTest, LoadReplacesWhatTheSessionHeld) {
  ASSERT_EQ(save_a_session_with_state().status, CellStatus::ok);
  auto session = open();
  ASSERT_EQ(session
                ->execute("mine = 1\nimport os\nopen('/tmp/mine.txt', 'w').write('x')\n"
                          "os.makedirs('/tmp/work', exist_ok=True)\n"
                          "open('/tmp/work/extra', 'w').write('y')")
                .status,
            CellStatus::ok);
  ASSERT_EQ(session->load(path_).status, CellStatus::ok);
  const auto check = session->execute(
      "import os\nprint('mine' in globals(), sorted(os.listdir('/tmp')), "
      "sorted(os.listdir('/tmp/work')))");
  EXPECT_EQ(check.stdout_data, "False ['work'] ['link', 'sub']\n") << dump(check);
}

TEST_F(SaveRestoreTest, ATamperedOrCutShortSaveFileIsRefusedBeforeAnySandboxReadsIt) {
  ASSERT_EQ(save_a_session_with_state().status, CellStatus::ok);
  const std::string good = read_file(path_);
  auto session = open();
  ASSERT_EQ(session->execute("kept = 1").status, CellStatus::ok);
  const auto refused = [&](const std::string& bytes, const std::string& says) {
    const std::string bad = dir_ + "/bad.save";
    write_file(bad, bytes);
    try {
      session->load(bad);
      ADD_FAILURE() << "loaded a save file that should be refused for: " << says;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(says), std::string::npos) << error.what();
    }
  };
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x01;
  refused(flipped, "SHA-256 does not match");
  refused(good.substr(0, good.size() - 100), "cut short");
  refused(good + "more", "past its end");
  refused("{\"format\": \"something else\"}\n" + good, "not a save file");
  refused(std::string(8192, 'x'), "no header line");
  refused("", "no header line");
  std::string bigger = good;
  const auto at = bigger.find("\"bytes\":");
  ASSERT_NE(at, std::string::npos);
  bigger.replace(at, 8, "\"bytes\":1");
  refused(bigger, "cut short");
  // The session is untouched by every refusal.
  EXPECT_EQ(session->execute("print(kept)").stdout_data, "1\n");
}

TEST_F(SaveRestoreTest, ASaveFileOfAnotherPolicyIsRefused) {
  ASSERT_EQ(save_a_session_with_state().status, CellStatus::ok);
  policy_.limits.memory_bytes = policy_.limits.memory_bytes / 2;
  auto session = open();
  try {
    session->load(path_);
    FAIL() << "loaded a save file made under another policy";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("another policy"), std::string::npos) << error.what();
  }
}

TEST_F(SaveRestoreTest, AWellFramedStateTheSandboxCannotReadEndsAsAnErrorCell) {
  ASSERT_EQ(save_a_session_with_state().status, CellStatus::ok);
  auto session = open();
  // Re-frame garbage with a correct size and digest, as an attacker who knows the format would:
  // the host's checks pass, and the worker refuses it inside the sandbox.
  const std::string good = read_file(path_);
  const auto newline = good.find('\n');
  std::string header = good.substr(0, newline);
  const std::string body = "\x08\x00\x00\x00\x00\x00\x00\x00garbage!";
  const std::string hashed = dir_ + "/body";
  write_file(hashed, body);
  const auto digest_line = [&] {
    const std::string command = "sha256sum " + hashed + " > " + hashed + ".sum";
    EXPECT_EQ(std::system(command.c_str()), 0);
    return read_file(hashed + ".sum").substr(0, 64);
  }();
  const auto replace_field = [&](const std::string& name, const std::string& value) {
    const auto start = header.find("\"" + name + "\":");
    ASSERT_NE(start, std::string::npos);
    auto end = header.find_first_of(",}", start);
    header.replace(start, end - start, "\"" + name + "\":" + value);
  };
  replace_field("bytes", std::to_string(body.size()));
  replace_field("sha256", "\"" + digest_line + "\"");
  write_file(dir_ + "/forged.save", header + "\n" + body);
  const auto loaded = session->load(dir_ + "/forged.save");
  EXPECT_EQ(loaded.status, CellStatus::error) << dump(loaded);
  EXPECT_EQ(session->execute("print(1 + 1)").stdout_data, "2\n");
}

}  // namespace
}  // namespace rlm::test
