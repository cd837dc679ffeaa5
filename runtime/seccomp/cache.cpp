#include "seccomp/cache.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <seccomp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "host/unique_fd.hpp"

namespace rlm::seccomp::cache {
namespace {

using host::UniqueFd;

constexpr char kMagic[8] = {'R', 'L', 'M', 'B', 'P', 'F', '0', '1'};
// A file holds its key (a policy's rules: bounded by what a policy file may hold) and two programs
// of at most BPF_MAXINSNS instructions each.
constexpr std::size_t kMaxFileBytes = 4 << 20;

void append_field(std::string& out, std::string_view text) {
  out += std::to_string(text.size());
  out += ':';
  out += text;
  out += ';';
}

void append_number(std::string& out, std::uint64_t value) {
  append_field(out, std::to_string(value));
}

struct Memory {
  std::mutex mutex;
  std::map<std::string, Programs> entries;
  std::deque<std::string> order;  // oldest first
  std::string directory;
  bool directory_set = false;
};

Memory& memory() {
  static Memory m;
  return m;
}

std::atomic<std::uint64_t> g_memory_hits{0}, g_disk_hits{0}, g_misses{0}, g_disk_rejected{0};

std::string default_directory() {
  if (::geteuid() != 0) return "";
  const char* setting = std::getenv("RLM_SANDBOX_SECCOMP_CACHE");
  if (setting && std::string_view(setting) == "off") return "";
  return kDiskDirectory;
}

std::string disk_directory() {
  auto& m = memory();
  std::lock_guard lock(m.mutex);
  if (!m.directory_set) {
    m.directory = default_directory();
    m.directory_set = true;
  }
  return m.directory;
}

// What else a program depends on besides the rules: the code that layers and compiles them (this
// executable, identified by its file) and libseccomp. In memory these never change.
const std::string& build_identity() {
  static const std::string identity = [] {
    std::string text = "exe:";
    struct stat st {};
    if (::stat("/proc/self/exe", &st) != 0) return std::string();  // unknown: no disk layer
    for (std::uint64_t v :
         {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
          static_cast<std::uint64_t>(st.st_size), static_cast<std::uint64_t>(st.st_mtim.tv_sec),
          static_cast<std::uint64_t>(st.st_mtim.tv_nsec),
          static_cast<std::uint64_t>(st.st_ctim.tv_sec),
          static_cast<std::uint64_t>(st.st_ctim.tv_nsec)})
      append_number(text, v);
    const scmp_version* version = seccomp_version();
    text += "libseccomp:";
    if (version) {
      append_number(text, version->major);
      append_number(text, version->minor);
      append_number(text, version->micro);
    }
    text += "arch:";
    append_number(text, seccomp_arch_native());
    return text;
  }();
  return identity;
}

std::string disk_key(const std::string& key) {
  return build_identity() + "rules:" + key;
}

// The directory, opened without following a symlink, if it is ours and nobody else may write or
// even read it.
UniqueFd open_directory(const std::string& path, bool create) {
  if (path.empty() || build_identity().empty()) return {};
  if (create && ::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return {};
  UniqueFd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) return {};
  struct stat st {};
  if (::fstat(dir.get(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 077) != 0)
    return {};
  return dir;
}

bool valid_program(std::size_t bytes) {
  return bytes % sizeof(sock_filter) == 0 && bytes / sizeof(sock_filter) <= BPF_MAXINSNS;
}

void append_u32(std::string& out, std::uint32_t value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

void append_program(std::string& out, const std::vector<sock_filter>& program) {
  const auto bytes = program.size() * sizeof(sock_filter);
  append_u32(out, static_cast<std::uint32_t>(bytes));
  out.append(reinterpret_cast<const char*>(program.data()), bytes);
}

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool u32(std::uint32_t& value) {
    if (data_.size() < sizeof value) return false;
    std::memcpy(&value, data_.data(), sizeof value);
    data_.remove_prefix(sizeof value);
    return true;
  }
  bool bytes(std::size_t n, std::string_view& out) {
    if (data_.size() < n) return false;
    out = data_.substr(0, n);
    data_.remove_prefix(n);
    return true;
  }
  bool program(std::vector<sock_filter>& out) {
    std::uint32_t n = 0;
    std::string_view raw;
    if (!u32(n) || !valid_program(n) || !bytes(n, raw)) return false;
    out.resize(n / sizeof(sock_filter));
    if (n != 0) std::memcpy(out.data(), raw.data(), n);  // an empty program has no data() to copy
    return true;
  }
  bool done() const { return data_.empty(); }

 private:
  std::string_view data_;
};

std::optional<std::string> read_trusted_file(int dir, const std::string& name) {
  UniqueFd fd(::openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd) return std::nullopt;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 022) != 0 || static_cast<std::size_t>(st.st_size) > kMaxFileBytes) {
    ++g_disk_rejected;
    return std::nullopt;
  }
  std::string data(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        ::pread(fd.get(), data.data() + done, data.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    done += static_cast<std::size_t>(n);
  }
  return data;
}

std::optional<Programs> read_from_disk(const std::string& key) {
  const UniqueFd dir = open_directory(disk_directory(), false);
  if (!dir) return std::nullopt;
  const auto data = read_trusted_file(dir.get(), disk_file_name(key));
  if (!data) return std::nullopt;
  Reader reader(*data);
  std::string_view magic, stored_key;
  std::uint32_t key_size = 0;
  Programs programs;
  const std::string expected = disk_key(key);
  if (!reader.bytes(sizeof kMagic, magic) || magic != std::string_view(kMagic, sizeof kMagic) ||
      !reader.u32(key_size) || !reader.bytes(key_size, stored_key) || stored_key != expected ||
      !reader.program(programs.kill) || programs.kill.empty() || !reader.program(programs.notify) ||
      !reader.done()) {
    ++g_disk_rejected;
    return std::nullopt;
  }
  return programs;
}

// Makes room for one more file: a full directory loses its oldest files (by mtime), so a cache
// filled by programs of older builds (every rebuild is a new key) keeps serving the current one
// instead of going dead. Temporary files older than a minute (a writer that died) go too.
void make_room(int dir) {
  const int copy = ::fcntl(dir, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return;
  DIR* d = ::fdopendir(copy);
  if (!d) {
    ::close(copy);
    return;
  }
  std::vector<std::pair<timespec, std::string>> files;
  const std::time_t stale_before = std::time(nullptr) - 60;
  while (const dirent* entry = ::readdir(d)) {
    const std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (::fstatat(dir, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
      continue;
    if (name.front() == '.') {
      if (st.st_mtim.tv_sec < stale_before) ::unlinkat(dir, entry->d_name, 0);
      continue;
    }
    if (files.size() < 4 * kDiskEntries) files.emplace_back(st.st_mtim, entry->d_name);
  }
  ::closedir(d);
  if (files.size() < kDiskEntries) return;
  const auto excess = files.size() - kDiskEntries + 1;
  std::partial_sort(files.begin(), files.begin() + static_cast<std::ptrdiff_t>(excess), files.end(),
                    [](const auto& a, const auto& b) {
                      return a.first.tv_sec != b.first.tv_sec ? a.first.tv_sec < b.first.tv_sec
                                                              : a.first.tv_nsec < b.first.tv_nsec;
                    });
  for (std::size_t i = 0; i < excess; ++i) ::unlinkat(dir, files[i].second.c_str(), 0);
}

void write_to_disk(const std::string& key, const Programs& programs) {
  const UniqueFd dir = open_directory(disk_directory(), true);
  if (!dir) return;
  make_room(dir.get());
  std::string data(kMagic, sizeof kMagic);
  const std::string stored_key = disk_key(key);
  append_u32(data, static_cast<std::uint32_t>(stored_key.size()));
  data += stored_key;
  append_program(data, programs.kill);
  append_program(data, programs.notify);
  if (data.size() > kMaxFileBytes) return;

  static std::atomic<unsigned> counter{0};
  const std::string name = disk_file_name(key);
  const std::string temporary =
      "." + name + "." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  UniqueFd fd(::openat(dir.get(), temporary.c_str(),
                       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) return;
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  fd.reset();
  // A complete file appears under its name at once, or not at all.
  if (done != data.size() || ::renameat(dir.get(), temporary.c_str(), dir.get(), name.c_str()) != 0)
    ::unlinkat(dir.get(), temporary.c_str(), 0);
}

void remember(const std::string& key, const Programs& programs) {
  auto& m = memory();
  std::lock_guard lock(m.mutex);
  if (m.entries.count(key)) return;
  while (m.entries.size() >= kMemoryEntries && !m.order.empty()) {
    m.entries.erase(m.order.front());
    m.order.pop_front();
  }
  m.entries.emplace(key, programs);
  m.order.push_back(key);
}

}  // namespace

std::string program_key(const Seccomp& rules) {
  std::string key = "seccomp-rules-v1;";
  append_field(key, rules.default_action);
  append_number(key, rules.syscalls.size());
  for (const auto& rule : rules.syscalls) {
    append_number(key, rule.names.size());
    for (const auto& name : rule.names) append_field(key, name);
    append_field(key, rule.action);
    append_field(key, rule.errno_ret ? "errno " + std::to_string(*rule.errno_ret) : "no errno");
    append_number(key, rule.args.size());
    for (const auto& arg : rule.args) {
      append_number(key, arg.index);
      append_number(key, arg.value);
      append_number(key, arg.value_two);
      append_field(key, arg.op);
    }
  }
  return key;
}

std::optional<Programs> find(const std::string& key) {
  {
    auto& m = memory();
    std::lock_guard lock(m.mutex);
    if (auto it = m.entries.find(key); it != m.entries.end()) {
      ++g_memory_hits;
      return it->second;
    }
  }
  if (auto programs = read_from_disk(key)) {
    ++g_disk_hits;
    remember(key, *programs);
    return programs;
  }
  ++g_misses;
  return std::nullopt;
}

void store(const std::string& key, const Programs& programs) {
  if (programs.kill.empty() || !valid_program(programs.kill.size() * sizeof(sock_filter)) ||
      !valid_program(programs.notify.size() * sizeof(sock_filter)))
    return;
  remember(key, programs);
  write_to_disk(key, programs);
}

Stats stats() {
  return {g_memory_hits.load(), g_disk_hits.load(), g_misses.load(), g_disk_rejected.load()};
}

void clear_memory() {
  auto& m = memory();
  std::lock_guard lock(m.mutex);
  m.entries.clear();
  m.order.clear();
}

void set_disk_directory(std::string directory) {
  auto& m = memory();
  std::lock_guard lock(m.mutex);
  m.directory = std::move(directory);
  m.directory_set = true;
}

std::string disk_file_name(const std::string& key) {
  // FNV-1a, 64 bits: only spreads keys over file names; the file's content names its key in full.
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : disk_key(key)) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string name(16, '0');
  for (int i = 15; i >= 0; --i, hash >>= 4) name[static_cast<std::size_t>(i)] = kHex[hash & 15];
  return name + ".bpf";
}

}  // namespace rlm::seccomp::cache
