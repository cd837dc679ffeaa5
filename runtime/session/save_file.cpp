#include "session/save_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <array>
#include <cerrno>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/session.hpp"
#include "rlm_sys/sys.hpp"
#include "session/worker_source.hpp"

namespace rlm::session {
namespace {

using host::UniqueFd;
using nlohmann::json;

constexpr std::string_view kFormat = "rlm-sandbox-saved-state";
constexpr int kVersion = 1;
constexpr std::size_t kChunk = 1u << 20;

class Sha256 {
 public:
  Sha256() : context_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    if (!context_ || EVP_DigestInit_ex(context_.get(), EVP_sha256(), nullptr) != 1)
      throw Error("cannot start a SHA-256");
  }
  void add(const void* data, std::size_t size) {
    if (EVP_DigestUpdate(context_.get(), data, size) != 1) throw Error("SHA-256 failed");
  }
  std::string hex() {
    std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
    unsigned size = 0;
    if (EVP_DigestFinal_ex(context_.get(), digest.data(), &size) != 1)
      throw Error("SHA-256 failed");
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string text;
    for (unsigned i = 0; i < size; ++i) {
      text += kDigits[digest[i] >> 4];
      text += kDigits[digest[i] & 15];
    }
    return text;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> context_;
};

std::string sha256_of(std::string_view data) {
  Sha256 hash;
  hash.add(data.data(), data.size());
  return hash.hex();
}

void write_all(int fd, const char* data, std::size_t size, const char* what) {
  while (size > 0) {
    const ssize_t count = write(fd, data, size);
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) throw Error(std::string("writing ") + what + ": " + sys::errno_text(errno));
    data += count;
    size -= static_cast<std::size_t>(count);
  }
}

// Exactly `size` bytes at `offset`, or fewer at the file's end.
std::size_t read_at(int fd, char* data, std::size_t size, std::uint64_t offset, const char* what) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t count = pread(fd, data + done, size - done, static_cast<off_t>(offset + done));
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) throw Error(std::string("reading ") + what + ": " + sys::errno_text(errno));
    if (count == 0) break;
    done += static_cast<std::size_t>(count);
  }
  return done;
}

const std::string& worker_digest() {
  static const std::string digest = sha256_of(worker_source());
  return digest;
}

std::string text_field(const json& header, const char* name) {
  const auto found = header.find(name);
  if (found == header.end() || !found->is_string())
    throw Error(std::string("the save file's header has no \"") + name + "\"");
  return found->get<std::string>();
}

}  // namespace

SaveIdentity save_identity(const Policy& policy) {
  return {worker_digest(), sha256_of(policy.to_json().dump()), policy.name};
}

std::uint64_t seal_state(int memfd) {
  // Not F_SEAL_SHRINK: the host empties the memfd once the op is done (release_state), so that
  // an fd of it the sandbox kept holds no memory. A sandbox that shrinks it meanwhile makes
  // only a short read, which fails the save or its own load.
  constexpr int kSeals = F_SEAL_SEAL | F_SEAL_GROW | F_SEAL_WRITE;
  if (fcntl(memfd, F_ADD_SEALS, kSeals) != 0)
    throw Error(errno == EBUSY ? "the sandbox still maps the saved state for writing"
                               : "cannot seal the saved state: " + sys::errno_text(errno));
  struct stat info {};
  if (fstat(memfd, &info) != 0) throw Error("fstat: " + sys::errno_text(errno));
  const auto size = static_cast<std::uint64_t>(info.st_size);
  if (size > kMaxSavedStateBytes)
    throw Error("the saved state is " + std::to_string(size) + " bytes, above the " +
                std::to_string(kMaxSavedStateBytes) + " a save file holds");
  return size;
}

std::uint64_t write_save_file(int out, int state, std::uint64_t size,
                              const SaveIdentity& identity) {
  // Read with pread, never through a mapping: a hole the sandbox left reads as zeros without a
  // page of the host's being made for it.
  Sha256 hash;
  std::vector<char> chunk(kChunk);
  const auto pass = [&](const std::function<void(std::size_t)>& use) {
    for (std::uint64_t offset = 0; offset < size;) {
      const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, size - offset));
      if (read_at(state, chunk.data(), want, offset, "the saved state") != want)
        throw Error("the saved state is shorter than it was when sealed");
      use(want);
      offset += want;
    }
  };
  pass([&](std::size_t got) { hash.add(chunk.data(), got); });
  const json header = {{"format", kFormat},
                       {"version", kVersion},
                       {"worker", identity.worker},
                       {"policy", identity.policy},
                       {"policy_name", identity.policy_name},
                       {"bytes", size},
                       {"sha256", hash.hex()}};
  const std::string line = header.dump() + "\n";
  if (line.size() > kMaxSaveHeaderBytes) throw Error("the save file's header is too long");
  write_all(out, line.data(), line.size(), "the save file");
  pass([&](std::size_t got) { write_all(out, chunk.data(), got, "the save file"); });
  return line.size() + size;
}

host::UniqueFd reopen_readonly(int fd) {
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  UniqueFd copy(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!copy) throw Error("cannot reopen the saved state: " + sys::errno_text(errno));
  return copy;
}

void release_state(int memfd) {
  // A failure leaves the pages until the memfd's last fd closes: nothing more to do here.
  if (memfd >= 0 && ftruncate(memfd, 0) != 0) return;
}

bool fully_sealed(int fd) {
  constexpr int kSeals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
  const int seals = fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & kSeals) == kSeals;
}

std::uint64_t trusted_header_length(int in) {
  std::string head(kMaxSaveHeaderBytes, '\0');
  head.resize(read_at(in, head.data(), head.size(), 0, "the save file"));
  const auto end = head.find('\n');
  if (end == std::string::npos) throw Error("not a save file: no header line");
  return end + 1;
}

SavedState read_save_file(int in, const SaveIdentity& identity, std::uint64_t room) {
  struct stat info {};
  if (fstat(in, &info) != 0) throw Error("fstat: " + sys::errno_text(errno));
  if (!S_ISREG(info.st_mode)) throw Error("a save file must be a regular file");
  const auto file_size = static_cast<std::uint64_t>(info.st_size);

  std::string head(kMaxSaveHeaderBytes, '\0');
  head.resize(read_at(in, head.data(), head.size(), 0, "the save file"));
  const auto end = head.find('\n');
  if (end == std::string::npos) throw Error("not a save file: no header line");
  const json header = json::parse(head.substr(0, end), nullptr, false);
  if (!header.is_object() || header.value("format", json()) != kFormat)
    throw Error("not a save file of rlm-sandbox");
  if (header.value("version", json()) != kVersion)
    throw Error("a save file of another version of rlm-sandbox");
  if (text_field(header, "worker") != identity.worker)
    throw Error("the save file was made by another build of rlm-sandbox (its worker differs)");
  if (text_field(header, "policy") != identity.policy)
    throw Error("the save file was made under another policy than this session's ('" +
                identity.policy_name +
                "' as given here: another policy, or the same one with other limits)");
  const auto bytes = header.find("bytes");
  if (bytes == header.end() || !bytes->is_number_unsigned())
    throw Error("the save file's header gives no size");
  if (bytes->get<std::uint64_t>() > std::min(room, kMaxSavedStateBytes))
    throw Error("the save file holds " + std::to_string(bytes->get<std::uint64_t>()) +
                " bytes of state, more than this session may hold (" +
                std::to_string(std::min(room, kMaxSavedStateBytes)) + " bytes)");
  const std::uint64_t size = bytes->get<std::uint64_t>();
  const std::uint64_t start = end + 1;
  if (file_size < start + size)
    throw Error("the save file is cut short: " + std::to_string(file_size - start) + " of " +
                std::to_string(size) + " bytes");
  if (file_size > start + size) throw Error("the save file has bytes past its end");
  const std::string expected = text_field(header, "sha256");

  std::vector<char> chunk(kChunk);
  if (fully_sealed(in)) {  // nothing can change it after the check: no copy
    Sha256 hash;
    for (std::uint64_t offset = 0; offset < size;) {
      const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, size - offset));
      if (read_at(in, chunk.data(), want, start + offset, "the save file") != want)
        throw Error("the save file was cut short while it was read");
      hash.add(chunk.data(), want);
      offset += want;
    }
    if (hash.hex() != expected)
      throw Error("the save file was changed or damaged: its SHA-256 does not match");
    return {reopen_readonly(in), start};
  }
  UniqueFd state(memfd_create("rlm-sandbox-saved-state", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!state) throw Error("memfd_create: " + sys::errno_text(errno));
  Sha256 hash;
  for (std::uint64_t offset = 0; offset < size;) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, size - offset));
    if (read_at(in, chunk.data(), want, start + offset, "the save file") != want)
      throw Error("the save file was cut short while it was read");
    hash.add(chunk.data(), want);
    write_all(state.get(), chunk.data(), want, "the state");
    offset += want;
  }
  if (hash.hex() != expected)
    throw Error("the save file was changed or damaged: its SHA-256 does not match");
  if (lseek(state.get(), 0, SEEK_SET) != 0) throw Error("lseek: " + sys::errno_text(errno));
  seal_state(state.get());
  return {std::move(state), 0};
}

}  // namespace rlm::session

namespace rlm {

CellResult Session::save(const std::string& path) {
  // Beside `path` (a rename within one filesystem), under a short name of its own.
  const auto slash = path.rfind('/');
  const std::string directory = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  std::string partial =
      (slash == std::string::npos ? std::string() : directory) + ".rlm-save-XXXXXX";
  host::UniqueFd fd(mkostemp(partial.data(), O_CLOEXEC));
  if (!fd) throw Error("cannot create '" + partial + "': " + sys::errno_text(errno));
  try {
    CellResult result = save_to_fd(fd.get());
    if (result.status == CellStatus::ok) {
      if (fsync(fd.get()) != 0) throw Error("fsync '" + partial + "': " + sys::errno_text(errno));
      if (rename(partial.c_str(), path.c_str()) != 0)
        throw Error("cannot rename to '" + path + "': " + sys::errno_text(errno));
      // The rename itself survives a crash once the directory is on disk.
      const host::UniqueFd parent(open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (parent) fsync(parent.get());
    } else {
      unlink(partial.c_str());
    }
    return result;
  } catch (...) {
    unlink(partial.c_str());
    throw;
  }
}

CellResult Session::load(const std::string& path) {
  // Non-blocking: a FIFO at `path` is refused (not a regular file) instead of waiting for a
  // writer.
  const host::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (!fd) throw Error("cannot open the save file '" + path + "': " + sys::errno_text(errno));
  return load_from_fd(fd.get());
}

}  // namespace rlm
