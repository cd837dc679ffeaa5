// `rlm-sandbox serve`: pools of warm sandboxes behind a unix socket (docs/pools-and-server.md).
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <iostream>
#include <mutex>
#include <string_view>

#include "cli.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/server.hpp"
#include "rlm_sandbox/units.hpp"

namespace po = boost::program_options;

namespace rlm::cli {
namespace {

constexpr const char* kUsage =
    R"(usage: rlm-sandbox serve --socket PATH [--pool POLICY=N]... [OPTIONS]

Keeps sandboxes built ahead of time (namespaces, root filesystem, cgroup, seccomp filter in place)
for each offered policy, and serves them over a unix socket to `rlm-sandbox run --server PATH`,
`rlm-sandbox repl --server PATH`, the C++ client (rlm_sandbox/client.hpp) and the Python client.
Each sandbox is used once and destroyed; the pool refills in the background.

The server is a privilege boundary. A connecting process is identified by the kernel (its uid and
groups, SO_PEERCRED) and served only when it runs as the server's own uid or is allowed by
--allow-uid / --allow-gid. A client may use only the policies offered here, may only tighten them
(lower limits, fewer mounts, read-only binds, more seccomp denials), and may bind only host
directories --permit-bind grants its uid. Every refusal is an error frame the client prints
(`run --server` exits 125 and never runs elsewhere).

Clients share the server and are bounded against each other: one uid holds at most
--max-clients-per-uid connections; a connection sends its run or session within 10 s of
connecting, after at most 16 hello/policy frames; frames being received share
--max-bytes-in-flight and each uid's --max-bytes-in-flight-per-uid, and one that does not fit is
refused at once. An fd a client passes (stdio, a context) must be a pipe, socket or regular file
(or, for stdio, a character device), never a procfs/sysfs-like file or an anonymous inode.

The server needs what the namespace backend needs for its policies: as root, cgroups for every
limit; otherwise, a delegated cgroup v2 subtree (see `rlm-sandbox health`).

As a node of a fleet (docs/fleet.md) it answers health, ready and capacity
(`rlm-sandbox server capacity`), holds at most --max-sandboxes runs and sessions (past them a
request is refused resource_exhausted at once, so a client places it elsewhere) and names itself
--node-id in results and session ids. SIGTERM (or `rlm-sandbox server drain`) drains: ready turns
false, new work is refused, running runs and sessions get --drain-grace, then end with
node_drained, and the server exits 0; a second SIGTERM stops at once. SIGINT stops at once: every
run and session it holds is stopped and the socket file removed. Killed with
SIGKILL, it leaves no sandbox behind (they die with it), and a restart replaces the stale socket.
Under systemd, socket activation (LISTEN_FDS) replaces --socket: packaging/systemd/.

Remote clients (another host, a fleet across machines) come in through --listen HOST:PORT: TLS 1.3
only, a client certificate issued by --client-ca (and not revoked by --client-crl) required. The
certificate's identity (its common name or a subject alternative name) stands for the uid
--tls-identity NAME=UID gives it, with exactly that uid's permits and shares; an identity not
given is refused. Over TLS the payload's
stdio is streamed, with the same output cap; everything else is as on the socket.

It says what it does on stderr, one JSON object per line: {"event":"request"} for each run,
session, status and kill (its id, op, policy and the client's uid, gid and pid), "refusal" for
each request refused (kind and message), and "end" for each run (status, exit code, wall and CPU
time) and session (cells, why it ended). `rlm-sandbox server status` lists what runs now, with
owner and age; `rlm-sandbox server kill ID` ends one (a client only its own; root any).
)";

constexpr const char* kExamples = R"(
examples:
  rlm-sandbox serve --socket /run/rlm-sandbox.sock --pool default=4 --allow-uid 1000
  rlm-sandbox serve --socket /tmp/s.sock --pool default=8 --session-pool python-repl=2 \
      --allow-gid 100 --permit-bind 1000:/srv/data --permit-bind 1000:/home/ci/out:rw
  rlm-sandbox serve --config /etc/rlm-sandbox/server.json
  rlm-sandbox serve --socket /run/rlm-sandbox.sock --pool default=2 --session-pool python-repl=1 \
      --allow-uid 1000 --listen 127.0.0.1:7443 --tls-cert node.pem --tls-key node.key \
      --client-ca ca.pem --tls-identity ci=1000
then:
  rlm-sandbox run --server /run/rlm-sandbox.sock --policy default -- /bin/true
  RLM_SANDBOX_SERVER=/run/rlm-sandbox.sock rlm-sandbox repl --policy python-repl --lm echo
  rlm-sandbox run --server tls://127.0.0.1:7443 --tls-cert ci.pem --tls-key ci.key \
      --tls-ca ca.pem -- /bin/true
)";

// `text` as a whole number in `base`, at most `max`; throws Error naming `flag` otherwise.
unsigned long whole_number(const std::string& flag, const std::string& text, unsigned long max,
                           int base = 10) {
  std::size_t used = 0;
  unsigned long value = 0;
  try {
    value = std::stoul(text, &used, base);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || value > max)
    throw Error(flag + ": expected a whole number" + (base == 8 ? " in octal" : "") +
                " from 0 to " + std::to_string(max) + ", not '" + text + "'");
  return value;
}

// POLICY=N (the last '=' splits, so a policy path may hold one).
std::pair<std::string, std::size_t> pool_flag(const std::string& flag, const std::string& value) {
  const auto equals = value.rfind('=');
  if (equals == std::string::npos || equals == 0)
    throw Error(flag + " " + value + ": expected POLICY=N, e.g. default=4");
  return {value.substr(0, equals),
          whole_number(flag + " " + value, value.substr(equals + 1), 1024)};
}

std::uint32_t id_flag(const std::string& flag, const std::string& text) {
  return static_cast<std::uint32_t>(whole_number(flag + " " + text, text, 0xFFFFFFFEul));
}

// UID:DIR[:rw]
std::pair<uid_t, PermittedBind> permit_bind_flag(const std::string& value) {
  const std::string flag = "--permit-bind " + value;
  const auto colon = value.find(':');
  if (colon == std::string::npos) throw Error(flag + ": expected UID:DIR[:rw]");
  PermittedBind bind;
  bind.beneath = value.substr(colon + 1);
  if (bind.beneath.size() > 3 && bind.beneath.compare(bind.beneath.size() - 3, 3, ":rw") == 0) {
    bind.writable = true;
    bind.beneath.resize(bind.beneath.size() - 3);
  } else if (bind.beneath.size() > 3 &&
             bind.beneath.compare(bind.beneath.size() - 3, 3, ":ro") == 0) {
    bind.beneath.resize(bind.beneath.size() - 3);
  }
  if (bind.beneath.empty() || bind.beneath.front() != '/')
    throw Error(flag + ": the directory must be an absolute host path");
  return {id_flag("--permit-bind", value.substr(0, colon)), bind};
}

OfferedPolicy& offer(ServerConfig& config, const std::string& name) {
  for (auto& offered : config.policies)
    if (offered.name == name) return offered;
  config.policies.push_back(OfferedPolicy{name, "", 0, 0});
  return config.policies.back();
}

// A warm sandbox holds about 15 fds in this process (twice as many sandboxes while used ones wait
// for their teardown), a client a few. The soft open-files limit goes up to the hard one (a
// sandbox gets its policy's own limit from init; the hard limit, which any process may raise its
// soft one to, is unchanged), and a limit still short of what the pools may hold is said once:
// past it, warm sandboxes fail to build and runs go cold.
void raise_open_files_limit(const ServerConfig& config) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) getrlimit(RLIMIT_NOFILE, &limit);
  }
  std::uint64_t warm = 0;
  for (const auto& offered : config.policies) warm += offered.sandboxes + offered.sessions;
  const std::uint64_t needed = 64 + 2 * 16 * warm + 8 * config.max_clients;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < needed)
    config.log(nlohmann::json{
        {"event", "note"},
        {"message", "the open-files limit (" + std::to_string(limit.rlim_cur) +
                        ") is below the about " + std::to_string(needed) +
                        " fds these pools and clients may hold; raise it (ulimit -n, or "
                        "LimitNOFILE= in the systemd unit), or warm sandboxes will fail to build "
                        "and runs go cold"}}
                   .dump());
}

}  // namespace

int serve_command(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()             //
      ("help,h", "show this help")  //
      ("socket,s", po::value<std::string>(),
       "PATH of the unix socket to listen on (a stale socket nobody listens on is replaced)")  //
      ("socket-mode", po::value<std::string>(),
       "permissions of the socket file, octal (default 0660); peers are checked anyway")  //
      ("pool", po::value<std::vector<std::string>>()->composing(),
       "POLICY=N[,recycle=M]: offer POLICY (shipped name or server-side file) with N warm "
       "sandboxes; with recycle, each serves up to M runs of one client uid, made fresh between "
       "them (docs/pools-and-server.md#recycled-sandboxes)")  //
      ("session-pool", po::value<std::vector<std::string>>()->composing(),
       "POLICY=N: offer POLICY with N warm REPL sessions")  //
      ("allow-uid", po::value<std::vector<std::string>>()->composing(),
       "U: let processes of uid U connect (repeatable; the server's own uid always may); "
       "the socket file is granted to U too")  //
      ("allow-gid", po::value<std::vector<std::string>>()->composing(),
       "G: let processes in group G (primary or supplementary) connect (repeatable); the "
       "socket file is granted to G too")  //
      ("permit-bind", po::value<std::vector<std::string>>()->composing(),
       "UID:DIR[:rw]: uid UID may bind host paths beneath DIR, read-only unless :rw")       //
      ("config", po::value<std::string>(), "a JSON configuration file (flags add to it)")   //
      ("max-clients", po::value<std::string>(), "connections served at once (default 64)")  //
      ("max-clients-per-uid", po::value<std::string>(),
       "N: connections one uid may hold at once (default a quarter of --max-clients; the "
       "server's own uid is not capped, and others leave it 1/16 of them)")              //
      ("max-context", po::value<std::string>(), "largest session context (default 1G)")  //
      ("max-bytes-in-flight", po::value<std::string>(),
       "SIZE: bytes of frames being received from all clients at once (default 256M); a frame "
       "beyond it is refused")  //
      ("max-bytes-in-flight-per-uid", po::value<std::string>(),
       "SIZE: the same for one uid's connections together (default 64M)")  //
      ("node-id", po::value<std::string>(),
       "ID: this node's name in a fleet (default the host name): capacity, results and session "
       "ids carry it")  //
      ("max-sandboxes", po::value<std::string>(),
       "N: runs and sessions held at once; past it a request is refused resource_exhausted at "
       "once, never queued (default: no cap of its own)")  //
      ("register", po::value<std::string>(),
       "DIR: once listening, write DIR/NODE_ID.endpoint for a fleet's clients (--fleet DIR); "
       "removed when the server exits")  //
      ("max-sandboxes-per-uid", po::value<std::string>(),
       "N: of those, the most one client uid may hold at once (the server's own uid excepted); "
       "set it on a node tenants share, so one cannot take every slot (default: no share)")  //
      ("drain-grace", po::value<std::string>(),
       "DURATION: how long a drain (SIGTERM, `rlm-sandbox server drain`) lets running runs and "
       "sessions go on before it ends them with node_drained (default 30s)")  //
      ("listen", po::value<std::string>(),
       "HOST:PORT: also serve TLS clients on this TCP address (TLS 1.3, a client certificate "
       "required; plain TCP refused). Needs --tls-cert, --tls-key, --client-ca and identities "
       "(docs/fleet.md#remote-access)")                                                       //
      ("tls-cert", po::value<std::string>(), "FILE: the listener's certificate chain (PEM)")  //
      ("tls-key", po::value<std::string>(), "FILE: its private key (PEM)")                    //
      ("client-ca", po::value<std::string>(),
       "FILE: the CA (PEM) client certificates must be issued by")  //
      ("client-crl", po::value<std::string>(),
       "FILE: revocation lists (PEM) of the client CA: a revoked certificate is refused, and so "
       "is every new handshake while the list has expired; read again when the file changes "
       "(replace it by rename), each new list logged")  //
      ("tls-identity", po::value<std::vector<std::string>>()->composing(),
       "NAME=UID: a client certificate whose common name or subject alternative name is NAME "
       "acts as uid UID, with that uid's permits (--allow-uid, --permit-bind, shares); "
       "repeatable. A certificate no identity names is refused")  //
      ("tls-identity-file", po::value<std::string>(),
       "FILE: identities as JSON, {\"identities\": {NAME: UID}} (e.g. a mounted Secret)");

  auto values = parse_options(args, options, "serve");
  if (values.count("help")) {
    std::cout << kUsage << "\n" << options << kExamples;
    return 0;
  }
  ServerConfig config;
  if (values.count("config")) config = load_server_config(values["config"].as<std::string>());
  if (values.count("socket")) config.socket_path = values["socket"].as<std::string>();
  if (values.count("socket-mode"))
    config.socket_mode = static_cast<mode_t>(
        whole_number("--socket-mode", values["socket-mode"].as<std::string>(), 0777, /*base=*/8));
  const auto each = [&](const char* name, auto&& apply) {
    if (values.count(name))
      for (const auto& value : values[name].as<std::vector<std::string>>()) apply(value);
  };
  each("pool", [&](const std::string& v) {
    // POLICY=N[,recycle=M]: the option last, so a policy path may hold a ',' or '='.
    constexpr std::string_view kRecycle = ",recycle=";
    const auto option = v.rfind(kRecycle);
    auto [name, count] = pool_flag("--pool", v.substr(0, option));
    offer(config, name).sandboxes = count;
    if (option != std::string::npos)
      offer(config, name).recycle =
          whole_number("--pool " + v, v.substr(option + kRecycle.size()), kMaxRecycledRuns);
  });
  each("session-pool", [&](const std::string& v) {
    auto [name, count] = pool_flag("--session-pool", v);
    offer(config, name).sessions = count;
  });
  each("allow-uid",
       [&](const std::string& v) { config.allow_uids.push_back(id_flag("--allow-uid", v)); });
  each("allow-gid",
       [&](const std::string& v) { config.allow_gids.push_back(id_flag("--allow-gid", v)); });
  each("permit-bind", [&](const std::string& v) {
    auto [uid, bind] = permit_bind_flag(v);
    config.permitted_binds[uid].push_back(bind);
  });
  if (values.count("max-clients"))
    config.max_clients = count_flag("--max-clients", values["max-clients"].as<std::string>());
  if (values.count("max-clients-per-uid"))
    config.max_clients_per_uid =
        count_flag("--max-clients-per-uid", values["max-clients-per-uid"].as<std::string>());
  if (values.count("max-context"))
    config.max_context_bytes = size_flag("--max-context", values["max-context"].as<std::string>());
  if (values.count("max-bytes-in-flight"))
    config.max_bytes_in_flight =
        size_flag("--max-bytes-in-flight", values["max-bytes-in-flight"].as<std::string>());
  if (values.count("max-bytes-in-flight-per-uid"))
    config.max_bytes_in_flight_per_uid = size_flag(
        "--max-bytes-in-flight-per-uid", values["max-bytes-in-flight-per-uid"].as<std::string>());
  if (values.count("node-id")) {
    config.node_id = values["node-id"].as<std::string>();
    if (const auto why = node_id_problem(config.node_id))
      throw UsageError("--node-id: " + *why, "serve");
  }
  if (values.count("max-sandboxes"))
    config.max_sandboxes = count_flag("--max-sandboxes", values["max-sandboxes"].as<std::string>());
  if (values.count("max-sandboxes-per-uid"))
    config.max_sandboxes_per_uid =
        count_flag("--max-sandboxes-per-uid", values["max-sandboxes-per-uid"].as<std::string>());
  if (values.count("register")) config.register_dir = values["register"].as<std::string>();
  if (values.count("drain-grace"))
    config.drain_grace = duration_flag("--drain-grace", values["drain-grace"].as<std::string>());
  if (values.count("listen")) config.tls_listen = values["listen"].as<std::string>();
  if (values.count("tls-cert")) config.tls_cert = values["tls-cert"].as<std::string>();
  if (values.count("tls-key")) config.tls_key = values["tls-key"].as<std::string>();
  if (values.count("client-ca")) config.tls_client_ca = values["client-ca"].as<std::string>();
  if (values.count("client-crl")) config.tls_client_crl = values["client-crl"].as<std::string>();
  if (values.count("tls-identity-file"))
    for (const auto& [name, uid] :
         load_tls_identities(values["tls-identity-file"].as<std::string>()))
      config.tls_identities[name] = uid;
  each("tls-identity", [&](const std::string& v) {
    const auto equals = v.rfind('=');
    if (equals == std::string::npos || equals == 0)
      throw UsageError("--tls-identity " + v + ": expected NAME=UID", "serve");
    config.tls_identities[v.substr(0, equals)] = id_flag("--tls-identity", v.substr(equals + 1));
  });
  if (!config.tls_listen.empty() &&
      (config.tls_cert.empty() || config.tls_key.empty() || config.tls_client_ca.empty()))
    throw UsageError(
        "--listen needs --tls-cert, --tls-key and --client-ca (a TLS listener "
        "only; plain TCP is not offered)",
        "serve");
  config.listen_fd = systemd_listen_fd();
  if (config.listen_fd < 0 && config.socket_path.empty())
    throw UsageError("no socket: give --socket PATH (or start it by systemd socket activation)",
                     "serve");

  // SIGTERM drains (what every engine sends first: Kubernetes, Slurm, Swarm, systemd) and a second
  // one stops at once; SIGINT and SIGHUP stop at once. Each through a signalfd, blocked before any
  // thread starts, so every thread (the pools' included) leaves them to it.
  sigset_t stop_signals, drain_signals, both;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  sigemptyset(&drain_signals);
  sigaddset(&drain_signals, SIGTERM);
  sigemptyset(&both);
  sigaddset(&both, SIGINT);
  sigaddset(&both, SIGHUP);
  sigaddset(&both, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &both, nullptr);
  const int stop_fd = signalfd(-1, &stop_signals, SFD_CLOEXEC | SFD_NONBLOCK);
  const int drain_fd = signalfd(-1, &drain_signals, SFD_CLOEXEC | SFD_NONBLOCK);
  if (stop_fd < 0 || drain_fd < 0) throw Error("signalfd failed");

  // The server's account: one JSON line per request, refusal and end, one write each.
  config.log = [](std::string_view line) {
    static std::mutex mutex;
    const std::lock_guard lock(mutex);
    write_all(STDERR_FILENO, std::string(line) + "\n");
  };
  raise_open_files_limit(config);
  Server server(std::move(config));
  server.serve(stop_fd, drain_fd);  // its first line says where it listens and what it offers
  close(stop_fd);
  close(drain_fd);
  return 0;
}

}  // namespace rlm::cli
