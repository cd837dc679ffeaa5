#include "server/listener.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"
#include "server/socket_access.hpp"

namespace rlm::server {
namespace {

using host::UniqueFd;

sockaddr_un address_of(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof address.sun_path)
    throw Error("socket path '" + path + "' must be 1 to " +
                std::to_string(sizeof address.sun_path - 1) + " bytes");
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return address;
}

// Whether a server answers at the socket file `path`.
bool someone_listens(const std::string& path) {
  UniqueFd probe(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!probe) throw Error("socket(): " + sys::errno_text(errno));
  const sockaddr_un address = address_of(path);
  if (connect(probe.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0)
    return true;
  // EAGAIN: a listener whose backlog is full is still a listener.
  return errno != ECONNREFUSED && errno != ENOENT;
}

// Throws unless nothing is at `path` or it is a stale socket.
void check_replaceable(const std::string& path) {
  struct stat status {};
  if (lstat(path.c_str(), &status) != 0) {
    if (errno == ENOENT) return;
    throw Error("socket path " + path + ": " + sys::errno_text(errno));
  }
  if (!S_ISSOCK(status.st_mode))
    throw Error("socket path " + path +
                " exists and is not a socket; remove it or choose another --socket");
  if (someone_listens(path)) throw Error("another server already listens on " + path);
}

}  // namespace

UniqueFd open_own_socket_file(const std::string& path) {
  UniqueFd file(open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  struct stat status {};
  if (!file || fstat(file.get(), &status) != 0 || !S_ISSOCK(status.st_mode) ||
      status.st_uid != geteuid() || status.st_nlink != 1)
    return UniqueFd();
  return file;
}

Listener listen_at(const std::string& path, mode_t mode, int backlog,
                   const std::vector<uid_t>& allow_uids, const std::vector<gid_t>& allow_gids) {
  if (path.empty() || path.front() != '/')
    throw Error("socket path '" + path + "' must be absolute");
  const std::string temporary = path + ".new" + std::to_string(getpid());
  const sockaddr_un address = address_of(temporary);
  Listener listener;
  listener.fd = UniqueFd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener.fd) throw Error("socket(): " + sys::errno_text(errno));
  unlink(temporary.c_str());  // a leftover of this pid's own earlier attempt
  // The file is made with no permissions, opened up only by the chmod below: bind() gives it the
  // socket inode's mode less the umask, so the inode's mode goes to 0 first. Not umask(): it is
  // the whole process's, and a pool's thread building a sandbox meanwhile would hand the mask to
  // the sandbox. Were fchmod refused, nothing connects before listen() below all the same.
  (void)fchmod(listener.fd.get(), 0);
  if (bind(listener.fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0)
    throw Error("bind(" + temporary + "): " + sys::errno_text(errno));
  const auto fail = [&](const std::string& message) {
    unlink(temporary.c_str());
    throw Error(message);
  };
  // The name was bound a moment ago in a directory others may write: what is there now may be
  // another file, or a symlink to one. chmod(2) or setxattr(2) on the name would follow a symlink
  // swapped in meanwhile and open some other file to the allowed uids (found by attacking it:
  // root's 0600 file became theirs). So the mode and the ACL go through an O_PATH fd of the very
  // inode, once it is known to be the socket file this process made: a socket, ours, one link.
  const UniqueFd made = open_own_socket_file(temporary);
  if (!made)
    fail("the socket file " + temporary +
         " was replaced before its mode was set; use a directory only this user can write "
         "(/run, or one of your own)");
  const std::string by_fd = "/proc/self/fd/" + std::to_string(made.get());
  if (chmod(by_fd.c_str(), mode) != 0) fail("chmod(" + temporary + "): " + sys::errno_text(errno));
  try {
    grant_socket_access(by_fd, mode, allow_uids, allow_gids);
  } catch (const Error& error) {
    fail(error.what());
  }
  if (listen(listener.fd.get(), backlog) != 0) fail("listen(): " + sys::errno_text(errno));
  try {
    check_replaceable(path);
  } catch (const Error& error) {
    fail(error.what());
  }
  if (rename(temporary.c_str(), path.c_str()) != 0)
    fail("rename(" + temporary + ", " + path + "): " + sys::errno_text(errno));
  struct stat status {};
  if (lstat(path.c_str(), &status) == 0) {
    listener.inode = status.st_ino;
    listener.device = status.st_dev;
  }
  listener.path = path;
  return listener;
}

void remove_socket_file(const Listener& listener) {
  if (listener.path.empty()) return;
  struct stat status {};
  if (lstat(listener.path.c_str(), &status) == 0 && S_ISSOCK(status.st_mode) &&
      status.st_ino == listener.inode && status.st_dev == listener.device)
    unlink(listener.path.c_str());
}

}  // namespace rlm::server
