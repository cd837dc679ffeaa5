// The server's configuration file (server.hpp), and systemd's socket activation.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/server.hpp"
#include "rlm_sandbox/units.hpp"

namespace rlm {
namespace {

using nlohmann::json;

class Reader {
 public:
  explicit Reader(std::string_view origin) : origin_(origin) {}

  [[noreturn]] void fail(const std::string& path, const std::string& message) const {
    throw Error("server configuration " + origin_ + ": " + path + ": " + message);
  }
  void only_keys(const json& object, const std::string& path,
                 std::initializer_list<std::string_view> keys) const {
    if (!object.is_object()) fail(path.empty() ? "(document)" : path, "must be an object");
    for (const auto& [key, value] : object.items()) {
      bool known = false;
      for (auto k : keys) known = known || key == k;
      if (!known) fail(path.empty() ? key : path + "." + key, "unknown key");
    }
  }
  std::uint64_t count(const json& value, const std::string& path, std::uint64_t max) const {
    if (!value.is_number_unsigned() || value.get<std::uint64_t>() > max)
      fail(path, "must be an integer from 0 to " + std::to_string(max));
    return value.get<std::uint64_t>();
  }
  std::uint64_t size(const json& value, const std::string& path) const {
    if (value.is_number_unsigned()) return value.get<std::uint64_t>();
    if (value.is_string())
      if (auto parsed = parse_size(value.get<std::string>())) return *parsed;
    fail(path, "must be a size (an integer, or a string such as \"512M\")");
  }
  std::string text(const json& value, const std::string& path) const {
    if (!value.is_string() || value.get<std::string>().empty()) fail(path, "must be a string");
    return value.get<std::string>();
  }

 private:
  std::string origin_;
};

std::uint32_t parse_id(const Reader& reader, const std::string& text, const std::string& path) {
  char* end = nullptr;
  errno = 0;
  const unsigned long value = std::strtoul(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value >= std::numeric_limits<uid_t>::max())
    reader.fail(path, "'" + text + "' is not a numeric id");
  return static_cast<std::uint32_t>(value);
}

// {IDENTITY: UID}: a certificate's name, 1 to 255 bytes, to a numeric uid.
std::map<std::string, uid_t> identities_from_json(const Reader& reader, const json& object,
                                                  const std::string& path) {
  if (!object.is_object()) reader.fail(path, "must be an object of identity to uid");
  std::map<std::string, uid_t> identities;
  for (const auto& [name, uid] : object.items()) {
    if (name.empty() || name.size() > 255) reader.fail(path, "an identity has 1 to 255 bytes");
    identities[name] = static_cast<uid_t>(
        reader.count(uid, path + "." + name, std::numeric_limits<uid_t>::max() - 1));
  }
  return identities;
}

}  // namespace

ServerConfig server_config_from_json(const json& document, std::string_view origin) {
  const Reader reader(origin);
  reader.only_keys(document, "",
                   {"socket", "socket_mode", "pools", "allow", "permit_binds", "max_clients",
                    "max_clients_per_uid", "max_context_bytes", "max_bytes_in_flight",
                    "max_bytes_in_flight_per_uid", "node_id", "max_sandboxes",
                    "max_sandboxes_per_uid", "drain_grace", "register", "tls"});
  ServerConfig config;
  if (document.contains("socket")) config.socket_path = reader.text(document["socket"], "socket");
  if (document.contains("socket_mode")) {
    const std::string mode = reader.text(document["socket_mode"], "socket_mode");
    char* end = nullptr;
    const unsigned long value = std::strtoul(mode.c_str(), &end, 8);
    if (*end != '\0' || value > 0777) reader.fail("socket_mode", "must be octal, e.g. \"0660\"");
    config.socket_mode = static_cast<mode_t>(value);
  }
  if (document.contains("pools")) {
    const json& pools = document["pools"];
    if (!pools.is_object()) reader.fail("pools", "must be an object of policy name to pool");
    for (const auto& [name, entry] : pools.items()) {
      const std::string path = "pools." + name;
      reader.only_keys(entry, path, {"policy", "sandboxes", "sessions", "recycle"});
      OfferedPolicy offered;
      offered.name = name;
      if (entry.contains("policy")) offered.source = reader.text(entry["policy"], path + ".policy");
      if (entry.contains("sandboxes"))
        offered.sandboxes = reader.count(entry["sandboxes"], path + ".sandboxes", 1024);
      if (entry.contains("sessions"))
        offered.sessions = reader.count(entry["sessions"], path + ".sessions", 1024);
      if (entry.contains("recycle"))
        offered.recycle = reader.count(entry["recycle"], path + ".recycle", kMaxRecycledRuns);
      config.policies.push_back(std::move(offered));
    }
  }
  if (document.contains("allow")) {
    const json& allow = document["allow"];
    reader.only_keys(allow, "allow", {"uids", "gids"});
    const auto ids = [&](const char* key, auto& out) {
      if (!allow.contains(key)) return;
      const std::string path = std::string("allow.") + key;
      if (!allow[key].is_array()) reader.fail(path, "must be an array of numeric ids");
      for (const auto& id : allow[key])
        out.push_back(static_cast<std::uint32_t>(
            reader.count(id, path, std::numeric_limits<uid_t>::max() - 1)));
    };
    ids("uids", config.allow_uids);
    ids("gids", config.allow_gids);
  }
  if (document.contains("permit_binds")) {
    const json& binds = document["permit_binds"];
    if (!binds.is_object()) reader.fail("permit_binds", "must be an object of uid to a list");
    for (const auto& [uid_text, list] : binds.items()) {
      const std::string path = "permit_binds." + uid_text;
      const uid_t uid = parse_id(reader, uid_text, path);
      if (!list.is_array()) reader.fail(path, "must be an array");
      for (std::size_t i = 0; i < list.size(); ++i) {
        const std::string item = path + "[" + std::to_string(i) + "]";
        reader.only_keys(list[i], item, {"beneath", "writable"});
        PermittedBind bind;
        bind.beneath = reader.text(list[i].value("beneath", json()), item + ".beneath");
        if (bind.beneath.front() != '/') reader.fail(item + ".beneath", "must be absolute");
        if (list[i].contains("writable")) {
          if (!list[i]["writable"].is_boolean())
            reader.fail(item + ".writable", "must be a boolean");
          bind.writable = list[i]["writable"].get<bool>();
        }
        config.permitted_binds[uid].push_back(std::move(bind));
      }
    }
  }
  if (document.contains("max_clients"))
    config.max_clients = reader.count(document["max_clients"], "max_clients", 65536);
  if (document.contains("max_clients_per_uid"))
    config.max_clients_per_uid =
        reader.count(document["max_clients_per_uid"], "max_clients_per_uid", 65536);
  if (document.contains("max_bytes_in_flight"))
    config.max_bytes_in_flight =
        reader.size(document["max_bytes_in_flight"], "max_bytes_in_flight");
  if (document.contains("max_bytes_in_flight_per_uid"))
    config.max_bytes_in_flight_per_uid =
        reader.size(document["max_bytes_in_flight_per_uid"], "max_bytes_in_flight_per_uid");
  if (document.contains("max_context_bytes"))
    config.max_context_bytes = reader.size(document["max_context_bytes"], "max_context_bytes");
  if (document.contains("node_id")) {
    config.node_id = reader.text(document["node_id"], "node_id");
    if (const auto why = node_id_problem(config.node_id)) reader.fail("node_id", *why);
  }
  if (document.contains("register"))
    config.register_dir = reader.text(document["register"], "register");
  if (document.contains("max_sandboxes_per_uid"))
    config.max_sandboxes_per_uid =
        reader.count(document["max_sandboxes_per_uid"], "max_sandboxes_per_uid", 1'000'000);
  if (document.contains("max_sandboxes"))
    config.max_sandboxes = reader.count(document["max_sandboxes"], "max_sandboxes", 1'000'000);
  if (document.contains("tls")) {
    const json& tls = document["tls"];
    reader.only_keys(tls, "tls",
                     {"listen", "cert", "key", "client_ca", "client_crl", "identities"});
    if (tls.contains("listen")) config.tls_listen = reader.text(tls["listen"], "tls.listen");
    if (tls.contains("cert")) config.tls_cert = reader.text(tls["cert"], "tls.cert");
    if (tls.contains("key")) config.tls_key = reader.text(tls["key"], "tls.key");
    if (tls.contains("client_ca"))
      config.tls_client_ca = reader.text(tls["client_ca"], "tls.client_ca");
    if (tls.contains("client_crl"))
      config.tls_client_crl = reader.text(tls["client_crl"], "tls.client_crl");
    if (tls.contains("identities"))
      config.tls_identities = identities_from_json(reader, tls["identities"], "tls.identities");
  }
  if (document.contains("drain_grace")) {
    const auto grace = document["drain_grace"].is_string()
                           ? parse_duration(document["drain_grace"].get<std::string>())
                           : std::nullopt;
    if (!grace) reader.fail("drain_grace", "must be a duration string, e.g. \"30s\"");
    config.drain_grace = *grace;
  }
  return config;
}

std::optional<std::string> node_id_problem(std::string_view id) {
  if (id.empty() || id.size() > 64) return "a node id has 1 to 64 characters";
  for (const char c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_')
      return "a node id has only letters, digits, '.', '-' and '_' (it goes into session ids and "
             "endpoint file names); '" +
             std::string(id) + "' does not";
  return std::nullopt;
}

ServerConfig load_server_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("server configuration " + path + ": cannot read it");
  std::stringstream text;
  text << in.rdbuf();
  json document = json::parse(text.str(), nullptr, false);
  if (document.is_discarded()) throw Error("server configuration " + path + ": not valid JSON");
  return server_config_from_json(document, path);
}

std::map<std::string, uid_t> load_tls_identities(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("TLS identities " + path + ": cannot read it");
  std::stringstream text;
  text << in.rdbuf();
  const json document = json::parse(text.str(), nullptr, false);
  if (document.is_discarded()) throw Error("TLS identities " + path + ": not valid JSON");
  const Reader reader(path);
  reader.only_keys(document, "", {"identities"});
  return identities_from_json(reader, document.value("identities", json::object()), "identities");
}

int systemd_listen_fd() {
  const char* pid = std::getenv("LISTEN_PID");
  const char* fds = std::getenv("LISTEN_FDS");
  if (!pid || !fds) return -1;
  if (std::strtol(pid, nullptr, 10) != getpid()) return -1;
  if (std::strtol(fds, nullptr, 10) != 1)
    throw Error("systemd passed " + std::string(fds) + " sockets; the server takes exactly one");
  constexpr int kFirst = 3;  // SD_LISTEN_FDS_START
  struct stat status {};
  int type = 0;
  socklen_t size = sizeof type;
  if (fstat(kFirst, &status) != 0 || !S_ISSOCK(status.st_mode) ||
      getsockopt(kFirst, SOL_SOCKET, SO_TYPE, &type, &size) != 0 || type != SOCK_STREAM)
    throw Error("the socket systemd passed (fd 3) is not a stream socket");
  fcntl(kFirst, F_SETFD, FD_CLOEXEC);
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  return kFirst;
}

}  // namespace rlm
