// What a client may ask for: an offered policy, only tightened (docs/pools-and-server.md).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <cstdint>

#include "rlm_sandbox/tightening.hpp"
#include "server/connection.hpp"

namespace rlm::server {

using nlohmann::json;

Admitted admit(const Connection& connection, const json& frame) {
  const auto name = frame.find("policy");
  if (name == frame.end() || !name->is_string())
    throw Refusal("invalid", "the request names no \"policy\"");
  const std::string policy_name = name->get<std::string>();
  const auto offer = connection.offers.find(policy_name);
  if (offer == connection.offers.end()) {
    std::string offered;
    for (const auto& [key, value] : connection.offers)
      offered += (offered.empty() ? "" : ", ") + key;
    // The name is the client's: quoted only when short and printable.
    const bool printable = policy_name.size() <= 128 && policy_name.find_first_of(std::string(
                                                            "\0\n\r\t", 4)) == std::string::npos;
    throw Refusal("refused",
                  "policy " + (printable ? "'" + policy_name + "'" : std::string("(unprintable)")) +
                      " is not offered by this server (it offers: " + offered + ")");
  }
  Admitted admitted;
  admitted.offer = &offer->second;
  const auto overrides = frame.find("overrides");
  if (overrides == frame.end() || overrides->is_null()) return admitted;
  const Policy& base = offer->second.pool->policy();
  Policy candidate;
  try {
    candidate = policy_from_json(*overrides, "the client's overrides of " + policy_name);
  } catch (const PolicyError& error) {
    throw Refusal("invalid", error.what(), error.diagnostics());
  }
  candidate.name = base.name;
  if (candidate.to_json() == base.to_json()) return admitted;
  static const std::vector<PermittedBind> kNone;
  const auto permitted = connection.config.permitted_binds.find(connection.peer.uid);
  auto loosened =
      loosenings(base, candidate,
                 permitted == connection.config.permitted_binds.end() ? kNone : permitted->second);
  if (!loosened.empty()) {
    std::string message = "the request loosens policy '" + policy_name + "' (" +
                          std::to_string(loosened.size()) +
                          (loosened.size() == 1 ? " problem" : " problems") +
                          "); a client may only tighten what the server offers";
    for (const auto& d : loosened) message += "\n  " + d.to_string();
    throw Refusal("refused", message, std::move(loosened));
  }
  admitted.candidate = std::make_shared<const Policy>(std::move(candidate));
  return admitted;
}

namespace {

struct RefusedFilesystem {
  std::uint32_t magic;  // statfs's f_type (linux/magic.h)
  const char* name;
};

// Filesystems whose files are checked against the credentials of whoever reads or writes them,
// at that moment, not of whoever opened them: the server reading a client's fd of one (a
// context) or a sandbox's payload using it (stdio) would do so with rights the client may lack
// (procfs shows a root process's stat to root). Plus fusectl, whose files control others' mounts.
constexpr RefusedFilesystem kCredentialCheckedFilesystems[] = {
    {0x9fa0, "procfs"},        {0x62656572, "sysfs"},       {0x64626720, "debugfs"},
    {0x74726163, "tracefs"},   {0x73636673, "securityfs"},  {0x0027e0eb, "cgroupfs"},
    {0x63677270, "cgroup2fs"}, {0xcafe4a11, "bpffs"},       {0x62656570, "configfs"},
    {0xde5e81e4, "efivarfs"},  {0x6165676c, "pstore"},      {0xf97cff8c, "selinuxfs"},
    {0x43415d53, "smackfs"},   {0x42494e4d, "binfmt_misc"}, {0x65735543, "fusectl"},
};

// Filesystems of fds that are no stream of data: epoll, eventfd, signalfd, timerfd, inotify,
// fanotify, userfaultfd, io_uring (anon_inodefs), a pidfd (pidfs), a namespace (nsfs).
constexpr RefusedFilesystem kAnonymousFilesystems[] = {
    {0x09041934,
     "an anonymous inode (an epoll, eventfd, signalfd, timerfd, inotify or similar fd)"},
    {0x50494446, "a pidfd"},
    {0x6e736673, "a namespace fd"},
};

// Filesystems whose reads and writes wait on someone else's will (a FUSE daemon, a network
// server): the server reading or writing a client's file on one (a context, a save file) could
// be held for ever.
constexpr RefusedFilesystem kBlockingFilesystems[] = {
    {0x65735546, "FUSE"}, {0x6969, "NFS"},      {0xff534d42, "CIFS"}, {0xfe534d42, "SMB2"},
    {0x01021997, "9P"},   {0x00c36400, "Ceph"}, {0x6b414653, "AFS"},
};

}  // namespace

void check_client_fd(int fd, std::string_view which, FdUse use) {
  const auto refuse = [&](const std::string& why) {
    throw Refusal("invalid", "the " + std::string(which) + " fd is refused: " + why);
  };
  const int flags = fcntl(fd, F_GETFL);
  struct stat status {};
  struct statfs filesystem {};
  if (flags < 0 || fstat(fd, &status) != 0 || fstatfs(fd, &filesystem) != 0)
    refuse("it is not an open file");
  if (flags & O_PATH) refuse("it is an O_PATH handle, not an open stream");
  const auto magic = static_cast<std::uint32_t>(filesystem.f_type);
  for (const auto& anonymous : kAnonymousFilesystems)
    if (anonymous.magic == magic) refuse(std::string("it is ") + anonymous.name + ", not a stream");
  for (const auto& pseudo : kCredentialCheckedFilesystems)
    if (pseudo.magic == magic)
      refuse(std::string("it is a file on ") + pseudo.name +
             ", which checks each read and write against the credentials of whoever does it "
             "(the server, or the sandbox's payload), not the client that opened it");
  const bool data = S_ISFIFO(status.st_mode) || S_ISSOCK(status.st_mode) || S_ISREG(status.st_mode);
  if (use == FdUse::stdio && !data && !S_ISCHR(status.st_mode))
    refuse("a payload's stdio must be a pipe, socket, character device or regular file");
  if (use == FdUse::data && !data) refuse("it must be a pipe, socket, memfd or regular file");
  if (use == FdUse::data)
    for (const auto& remote : kBlockingFilesystems)
      if (remote.magic == magic)
        refuse(std::string("it is a file on ") + remote.name +
               ", whose reads and writes wait on another process or host: the server reads "
               "and writes only files that cannot hold it");
}

}  // namespace rlm::server
