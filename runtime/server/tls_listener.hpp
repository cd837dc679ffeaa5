// The server's TCP listener for TLS clients (docs/fleet.md, "Remote access"): the socket, the
// check that a connection speaks TLS at all, and which uid a client certificate is.
#pragma once

#include <sys/types.h>
#include <time.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "host/unique_fd.hpp"
#include "server/peer.hpp"
#include "server/tls.hpp"

namespace rlm::server {

// The server's TLS context. With a client CRL file, it is made anew when that file changes
// (looked at when a client connects and by each open connection, at most once a second; its
// inode, size and ctime, which no copy tool sets back): a revocation takes effect without a
// restart, a list about to expire can be replaced, no session cached under the old list is
// resumed (the session cache goes with its context), and each open connection checks its
// certificate against the new context (the server cuts those it revokes). A changed file that
// cannot be loaded leaves the context in force until the file changes again. Each outcome is told
// to `report` (the server's event log).
class ServerTlsContext {
 public:
  using Report = std::function<void(bool loaded, const std::string& why)>;
  // Throws Error as TlsContext::for_server does.
  ServerTlsContext(std::string cert, std::string key, std::string client_ca, std::string client_crl,
                   Report report = {});
  std::shared_ptr<TlsContext> current();

 private:
  struct FileVersion {
    dev_t device = 0;
    ino_t inode = 0;
    off_t size = 0;
    timespec changed{};
    bool operator==(const FileVersion& other) const;
  };
  static FileVersion version_of(const std::string& path);

  const std::string cert_, key_, client_ca_, client_crl_;
  const Report report_;
  std::mutex mutex_;
  std::shared_ptr<TlsContext> context_;
  FileVersion crl_version_;
  Clock::time_point next_look_;
};

struct TlsListener {
  host::UniqueFd fd;
  std::unique_ptr<ServerTlsContext> context;
  std::string address;  // as bound: "127.0.0.1:7443" (the port chosen when 0 was asked for)
};

// Binds and listens on `host_port` ("HOST:PORT", "[V6]:PORT"; port 0 picks one) with the
// server's certificate, key, client CA and client CRL ("": none) loaded. Throws Error saying
// what is wrong.
TlsListener listen_tls(const std::string& host_port, const std::string& cert,
                       const std::string& key, const std::string& client_ca,
                       const std::string& client_crl, int backlog,
                       ServerTlsContext::Report report = {});

// Whether the connection's first byte is a TLS handshake record (0x16), waiting until `deadline`
// for it; false for anything else (a plain-protocol client), EOF or silence.
bool speaks_tls(int socket, Clock::time_point deadline);

// The peer a client certificate's identities (`names`: its CN, then its SANs) stand for: the
// first one `identities` lists gives the uid (and that uid's primary group, when the host knows
// it). A string saying why not when none is listed, or two name different uids.
std::variant<Peer, std::string> peer_of_identities(const std::vector<std::string>& names,
                                                   const std::map<std::string, uid_t>& identities);

// "HOST:PORT" of a connected socket's far end, for the log.
std::string remote_address(int socket);

}  // namespace rlm::server
