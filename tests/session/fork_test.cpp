// fork_session (docs/sessions.md, "Fork"): branches of a live session, each in a sandbox of its
// own, attacked from inside: they see the parent's state, and nothing one of them does (files,
// variables, signals, memory) reaches a sibling or the parent.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "namespace_session_fixture.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

std::string dump(const CellResult& cell) {
  return cell.to_json().dump();
}

class ForkTest : public NamespaceSessionTest {
 protected:
  Forked fork(Session& parent, std::size_t count) {
    return fork_session(parent, count, [this](std::size_t) { return open(); });
  }

  // The value a cell printed as its last line of JSON.
  static json printed(const CellResult& cell) {
    EXPECT_EQ(cell.status, CellStatus::ok) << dump(cell);
    const auto end = cell.stdout_data.find_last_of('\n', cell.stdout_data.size() - 2);
    return json::parse(cell.stdout_data.substr(end == std::string::npos ? 0 : end + 1));
  }
};

// Where a process is: its namespaces and cgroups, and its marker process's pid.
constexpr const char* kWhereAmI = R"(
import json, os, subprocess, sys
WAIT_FOR_STOP = 'import os, time\nwhile not os.path.exists("/tmp/stop"): time.sleep(0.02)'
def where_am_i(name):
    global marker
    # Lives until /tmp/stop exists (the guard keeps a later cell from signalling it).
    marker = subprocess.Popen([sys.executable, '-c', WAIT_FOR_STOP, 'MARKER-' + name])
    spaces = {ns: os.readlink('/proc/self/ns/' + ns)
              for ns in ('pid', 'mnt', 'ipc', 'net', 'user', 'cgroup')}
    return {'spaces': spaces, 'pids': [os.getpid(), marker.pid]}
def alive(process):  # running, not a zombie (its parent is a frozen checkpoint)
    try:
        return open('/proc/%d/stat' % process.pid).read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False
)";

TEST_F(ForkTest, EightBranchesOfALargeSessionEachGetTheStateAndNothingOfEachOther) {
  SessionOptions options;
  options.context = "the prompt";
  auto parent = open(options);
  ASSERT_EQ(parent
                ->execute(std::string(kWhereAmI) + R"(
import random
big = b'x' * (100 << 20)
order = {'z': 1, 'a': 2}
def twice(v):
    return 2 * v
os.makedirs('/tmp/files', exist_ok=True)
for i in range(10):
    open('/tmp/files/%d.txt' % i, 'w').write('file %d' % i)
open('/tmp/shared.txt', 'w').write('parent')
value = 'parent'
random.seed(1)
)")
                .status,
            CellStatus::ok);

  auto forked = fork(*parent, 8);
  ASSERT_EQ(forked.branches.size(), 8u);
  EXPECT_EQ(forked.saved.saved->at("skipped").size(), 0u) << forked.saved.saved->dump();
  const json parent_place = printed(parent->execute("print(json.dumps(where_am_i('parent')))"));

  std::vector<json> places;
  std::set<std::string> draws{printed(parent->execute("print(random.random())")).dump()};
  for (std::size_t i = 0; i < 8; ++i) {
    auto& branch = *forked.branches[i];
    const auto seen = branch.execute(R"(
import os
assert context == 'the prompt' and len(big) == 100 << 20 and big[12345:12347] == b'xx'
assert list(order) == ['z', 'a'] and twice(21) == 42 and value == 'parent'
assert sorted(os.listdir('/tmp/files')) == ['%d.txt' % i for i in range(10)]
assert open('/tmp/files/7.txt').read() == 'file 7'
assert open('/tmp/shared.txt').read() == 'parent'
print('seen')
)");
    ASSERT_EQ(seen.stdout_data, "seen\n") << dump(seen);
    // Each branch writes its own, and records where it is.
    ASSERT_EQ(branch
                  .execute("value = 'branch " + std::to_string(i) +
                           "'\nopen('/tmp/shared.txt', 'w').write(value)\n"
                           "big = None\ntwice = None")
                  .status,
              CellStatus::ok);
    places.push_back(printed(
        branch.execute("print(json.dumps(where_am_i('branch-" + std::to_string(i) + "')))")));
    draws.insert(printed(branch.execute("import random\nprint(random.random())")).dump());
  }
  EXPECT_EQ(draws.size(), 9u) << "the branches' random generators are seeded anew";

  // Nothing is shared: namespaces and cgroups differ from the parent's and from each other's.
  for (const char* space : {"pid", "mnt", "ipc", "net", "user", "cgroup"}) {
    std::set<std::string> seen{parent_place["spaces"][space].get<std::string>()};
    for (const auto& place : places) seen.insert(place["spaces"][space].get<std::string>());
    EXPECT_EQ(seen.size(), 9u) << space << ": " << parent_place.dump();
  }

  // Each branch kills every pid the others have (in its own view, those are its own processes
  // or none), and looks for their markers among the processes it sees.
  json others = json::array();
  for (const auto& place : places) others.push_back(place["pids"]);
  others.push_back(parent_place["pids"]);
  for (std::size_t i = 0; i < 8; ++i) {
    const auto attacked = forked.branches[i]->execute(R"(
import os, signal
others = )" + others.dump() + R"(
names = []
for entry in os.listdir('/proc'):
    if entry.isdigit():
        try:
            names.append(open('/proc/%s/cmdline' % entry, 'rb').read())
        except OSError:
            pass
foreign = [n for n in names if b'MARKER-' in n]
assert foreign and all(n.endswith(b'MARKER-branch-)" + std::to_string(i) +
                                                      R"(\0') for n in foreign), foreign
for pids in others:
    for pid in pids:
        if os.path.exists('/proc/%d' % pid):
            continue  # one of this branch's own: the others' are not in its view
        try:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError('killed %d' % pid)
        except ProcessLookupError:
            pass
print('attacked')
)");
    EXPECT_EQ(attacked.stdout_data, "attacked\n") << dump(attacked);
  }
  // Every marker survived, every branch kept its own write, the parent kept everything.
  for (std::size_t i = 0; i < 8; ++i) {
    const auto after =
        forked.branches[i]->execute("print(alive(marker), open('/tmp/shared.txt').read(), value)");
    EXPECT_EQ(after.stdout_data,
              "True branch " + std::to_string(i) + " branch " + std::to_string(i) + "\n")
        << dump(after);
  }
  const auto kept = parent->execute(
      "print(alive(marker), open('/tmp/shared.txt').read(), value, len(big), "
      "twice(2))");
  EXPECT_EQ(kept.stdout_data, "True parent parent 104857600 4\n") << dump(kept);
  // The markers go before the sessions close (a process left running holds a close up).
  for (auto& branch : forked.branches) branch->execute("open('/tmp/stop', 'w').close()");
  parent->execute("open('/tmp/stop', 'w').close()");
}

TEST_F(ForkTest, ABranchAtItsMemoryLimitLeavesItsSiblingAndTheParentAlone) {
  policy_.limits.memory_bytes = 256ull << 20;
  auto parent = open();
  ASSERT_EQ(parent->execute("kept = list(range(1000))").status, CellStatus::ok);
  auto forked = fork(*parent, 2);
  const auto hog = forked.branches[0]->execute("hog = bytearray(1 << 30)");
  EXPECT_EQ(hog.status, CellStatus::memory_limit) << dump(hog);
  EXPECT_TRUE(hog.rolled_back);
  for (Session* session : {forked.branches[0].get(), forked.branches[1].get(), parent.get()}) {
    const auto check = session->execute("print(sum(kept))");
    EXPECT_EQ(check.stdout_data, "499500\n") << dump(check);
  }
}

TEST_F(ForkTest, ABranchLivesOnWithoutItsParentAndTheParentWithoutItsBranch) {
  auto parent = open();
  ASSERT_EQ(parent->execute("n = 1").status, CellStatus::ok);
  auto first = fork(*parent, 1);
  auto second = fork(*parent, 1);
  first.branches[0]->close();
  EXPECT_EQ(parent->execute("n += 1\nprint(n)").stdout_data, "2\n");
  parent->close();
  EXPECT_EQ(second.branches[0]->execute("n += 10\nprint(n)").stdout_data, "11\n");
  // A branch forks in turn.
  auto grandchild = fork(*second.branches[0], 1);
  EXPECT_EQ(grandchild.branches[0]->execute("print(n)").stdout_data, "11\n");
}

TEST_F(ForkTest, RandomGoesOnAcrossCellsAndIsSeededAnewInEachBranch) {
  auto parent = open();
  ASSERT_EQ(parent->execute("import random\nrandom.seed(7)").status, CellStatus::ok);
  // As in one process (LocalREPL): the cells' forks do not reseed the generator.
  const auto draws =
      parent->execute("first = random.random()\nprint(first == random.Random(7).random())");
  EXPECT_EQ(draws.stdout_data, "True\n") << dump(draws);
  const auto crash = parent->execute("random.random()\nimport os\nos._exit(1)");
  EXPECT_TRUE(crash.rolled_back);
  const auto after = parent->execute(
      "expected = random.Random(7)\nexpected.random()\n"
      "print(random.random() == expected.random())");
  EXPECT_EQ(after.stdout_data, "True\n") << "a rollback takes the generator back too";
  auto forked = fork(*parent, 2);
  std::set<std::string> seen;
  for (auto& branch : forked.branches)
    seen.insert(branch->execute("print(random.random())").stdout_data);
  seen.insert(parent->execute("print(random.random())").stdout_data);
  EXPECT_EQ(seen.size(), 3u);
}

TEST_F(ForkTest, AForkOfNoneOrTooManyBranchesIsRefused) {
  auto parent = open();
  EXPECT_THROW(fork(*parent, 0), Error);
  EXPECT_THROW(fork(*parent, kMaxForkBranches + 1), Error);
  // A branch that cannot be opened fails the fork, and every branch opened is closed.
  EXPECT_THROW(fork_session(*parent, 3,
                            [&](std::size_t index) -> std::unique_ptr<Session> {
                              if (index == 1) throw Error("no room for this branch");
                              auto session = open();
                              return session;
                            }),
               Error);
  EXPECT_EQ(parent->execute("print('still here')").stdout_data, "still here\n");
}

}  // namespace
}  // namespace rlm::test
