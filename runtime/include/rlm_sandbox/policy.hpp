// The policy model: one JSON document selects backend, limits, namespaces, mounts, network,
// seccomp rules, capabilities and environment. docs/policy.md documents every field.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/error.hpp"

namespace rlm {

struct BackendPreference {
  // Tried in order by "auto" selection. Names: "namespace", "docker", "landlock" (opt-in: never
  // in a shipped default), "local".
  std::vector<std::string> prefer{"namespace", "docker"};
  // The only switch that lets the unisolated local backend run this policy.
  bool allow_unisolated = false;
};

struct Limits {
  std::chrono::milliseconds wall_time{10'000};
  std::chrono::milliseconds cpu_time{10'000};
  std::uint64_t memory_bytes = 256ull << 20;
  std::uint32_t pids = 64;
  std::uint64_t output_bytes = 1ull << 20;  // per stream: stdout and stderr each
  std::uint64_t file_size_bytes = 16ull << 20;
  std::uint32_t open_files = 256;
  std::uint64_t tmpfs_bytes = 64ull << 20;
  // A session's host-side bytes in flight (frames read and not yet handled, prompts at the LM
  // handler, answers and replies not yet written): beyond it the host stops reading from the
  // sandbox. docs/control-channel.md.
  std::uint64_t session_buffer_bytes = 24ull << 20;
  // After the wall timeout (or an output overflow) the payload gets SIGTERM, then SIGKILL once
  // this grace has passed.
  std::chrono::milliseconds kill_grace{200};
  // CPU bandwidth of the whole sandbox, in CPUs: 0.5 is half of one CPU's time, 2 two CPUs'
  // worth, however many processes and threads share it (cgroup cpu.max / CFS quota, Docker's
  // NanoCpus). From kMinCpus to kMaxCpus; nullopt: no bandwidth limit.
  std::optional<double> cpus;
};
inline constexpr double kMinCpus = 0.01;  // cpu.max's smallest quota, 1 ms per 100 ms period
inline constexpr double kMaxCpus = 1024;

struct Namespaces {
  bool user = true, pid = true, net = true, mount = true, ipc = true, uts = true, cgroup = true;
};

struct Mount {
  enum class Type { bind, tmpfs };
  std::string source;  // bind only
  std::string target;  // absolute path inside the sandbox
  Type type = Type::bind;
  bool readonly = true;                     // binds default read-only; tmpfs defaults writable
  std::optional<std::uint64_t> size_bytes;  // tmpfs only; default limits.tmpfs_bytes
  bool optional = false;  // bind only: skipped when the source does not exist on the host
};

struct Filesystem {
  std::vector<Mount> mounts;  // the shipped "default" policy lists the usual read-only system binds
  // Absolute path inside the sandbox; "" means the caller's current directory (local backend) or
  // the sandbox root (isolating backends).
  std::string workdir = "/tmp";
  // Binds whose source is a kernel interface (/proc, /sys, /dev, a procfs or sysfs mounted
  // elsewhere, or a directory holding one) are refused unless this is true.
  bool allow_kernel_interface_binds = false;
};

// "none": loopback only; "host": the host's network; "allowlist": egress by name and port
// (Egress below), enforced on the host by the namespace and docker backends; the others refuse
// such a policy before anything runs, never running it with more network than it asks for.
enum class Network { none, host, allowlist };

// One entry of an allowlist's "allow" or "deny" (docs/policy.md, "network"):
//   "pypi.org:443", "*.githubusercontent.com:443", "host:8000-8100"   a name (or names below one)
//   "https://pypi.org", "http://deb.debian.org"                        the TLS (443) or HTTP (80)
//                                                                      protocol checked too
//   "10.0.0.0/8:5432", "[2001:db8::/32]:443"                           addresses, by CIDR
// A deny entry may leave the port out (every port).
struct NetworkRule {
  enum class Kind { name, wildcard, cidr };
  enum class Scheme { tcp, https, http };
  Kind kind = Kind::name;
  Scheme scheme = Scheme::tcp;
  std::string name;                        // lowercase; a wildcard's is the part after "*."
  std::array<std::uint8_t, 16> address{};  // a CIDR's network, IPv4 in the first 4 bytes
  bool ipv6 = false;
  unsigned prefix = 0;
  std::uint16_t first_port = 0, last_port = 0;  // 0-0: every port (deny entries only)
  std::string text;                             // as written (canonical)
};

// Credentials the host side adds to requests for one host, never given to the sandbox: it ends
// the sandbox's TLS to that host with a certificate of the sandbox's own CA, whose certificate
// (after the host's CA bundle) the sandbox finds at kInjectionTrustBundle; SSL_CERT_FILE,
// CURL_CA_BUNDLE, REQUESTS_CA_BUNDLE, PIP_CERT, GIT_SSL_CAINFO and NODE_EXTRA_CA_CERTS point
// there.
inline constexpr const char* kInjectionTrustBundle = "/etc/rlm-sandbox/ca-certificates.crt";
struct NetworkInjection {
  std::string host;  // "api.example.com:443", covered by an allow entry
  std::string header;
  std::string value_from_env;   // the runtime's environment variable holding the value, or
  std::string value_from_file;  // an absolute host path holding it
};

struct EgressLimits {
  std::uint32_t connections = 64;          // open at once, per sandbox
  std::uint32_t names = 4096;              // names the sandbox's DNS has answered
  std::chrono::milliseconds idle{60'000};  // per connection: nothing moved this long ends it
  // per connection, both ways together: past it the connection ends (a `limit` denial)
  std::uint64_t connection_bytes = 4ull << 30;
  std::uint32_t client_hello_bytes = 16384;
  std::chrono::milliseconds client_hello_wait{5000};
};

struct Egress {
  std::vector<NetworkRule> allow, deny;  // deny wins
  bool allow_private = false;  // "private": names may resolve to loopback, RFC 1918, link-local,
                               // CGNAT and ULA addresses (explicit CIDR entries always may)
  std::vector<NetworkInjection> inject;
  EgressLimits limits;
};

// Docker/OCI seccomp profile format, so one profile serves libseccomp and Docker alike.
struct SeccompArg {
  unsigned index = 0;
  std::uint64_t value = 0;
  std::uint64_t value_two = 0;
  std::string op;  // SCMP_CMP_EQ, SCMP_CMP_NE, SCMP_CMP_LT, SCMP_CMP_LE, SCMP_CMP_GT, SCMP_CMP_GE,
                   // SCMP_CMP_MASKED_EQ
};
struct SeccompRule {
  std::vector<std::string> names;
  std::string action;  // SCMP_ACT_ALLOW, SCMP_ACT_ERRNO, SCMP_ACT_KILL, SCMP_ACT_KILL_PROCESS,
                       // SCMP_ACT_KILL_THREAD, SCMP_ACT_TRAP, SCMP_ACT_LOG
  std::optional<int> errno_ret;  // SCMP_ACT_ERRNO only; default EPERM
  std::vector<SeccompArg> args;
};
struct Seccomp {
  std::string default_action = "SCMP_ACT_ALLOW";
  std::vector<SeccompRule> syscalls;
};

struct Environment {
  bool clear = true;                       // start from an empty environment
  std::map<std::string, std::string> set;  // then set these
  std::vector<std::string> pass;           // then copy these from the host where present (wins)
};

struct User {
  std::uint32_t uid = 1000;
  std::uint32_t gid = 1000;
};

struct DockerSettings {
  std::string image = "python:3.12-slim";
};

// A Python environment exposed read-only to the sandbox, at the same path as on the host: a venv
// (its whole directory; its lib/pythonX.Y/site-packages goes on sys.path) and/or site-packages
// directories such as the system's dist-packages. The site directories reach the payload, in
// order, in RLM_SANDBOX_SITE_DIRS (colon-separated); the session's worker adds each with
// site.addsitedir. docs/policy.md, "python".
struct PythonEnvironment {
  std::optional<std::string> venv;         // absolute host path of a venv (holds pyvenv.cfg)
  std::vector<std::string> site_packages;  // absolute host paths of site directories
};

struct Policy {
  std::string name;         // shipped name or file path it was loaded from; "" when built in code
  std::string description;  // one human sentence, shown by `policy show`

  BackendPreference backend;
  Limits limits;
  Namespaces namespaces;
  Filesystem filesystem;
  Network network = Network::none;
  Egress egress;  // network == allowlist only
  Seccomp seccomp;
  std::vector<std::string> capabilities;  // canonical "CAP_NET_BIND_SERVICE" form
  Environment env;
  User user;
  std::string hostname = "sandbox";
  DockerSettings docker;
  PythonEnvironment python;

  // The effective policy, every field explicit (what `policy show` prints). Round-trips through
  // policy_from_json.
  nlohmann::json to_json() const;
};

// ---- Loading -----------------------------------------------------------------------------------
// Every loader resolves "extends" (a shipped name or a file path relative to the including file;
// objects merge key by key, every other value -- arrays included -- replaces), then validates the
// merged document and reports every problem at once as a PolicyError.

// A shipped policy name ("default", "strict", ...) or a path to a JSON file. A name is looked up
// in $RLM_SANDBOX_POLICY_PATH (colon-separated directories) first, then among the shipped ones.
Policy load_policy(std::string_view name_or_path);

// A document already in memory. `origin` names it in messages; `base_dir` resolves a relative
// "extends" path.
Policy load_policy_text(std::string_view json_text, std::string origin, std::string base_dir = ".");

// Validates and converts an already merged document (no "extends" left). Throws PolicyError.
Policy policy_from_json(const nlohmann::json& document, std::string origin);

// Every problem in a document after "extends" resolution; empty when valid. Used by
// `rlm-sandbox policy check` (which must list them all, never stop at the first).
std::vector<Diagnostic> check_policy(std::string_view name_or_path);

// Why binding the host path `source` would hand a sandbox a kernel interface (it is in /proc,
// /sys or /dev, as written or resolved; it is on, or holds below it, a procfs, sysfs, devtmpfs,
// cgroupfs, nsfs, ...; it is "/"), or nullopt. Such binds need
// filesystem.allow_kernel_interface_binds; the CLI's --bind uses this to say which flag is refused.
std::optional<std::string> kernel_interface_in(std::string_view source);

// Names of the policies shipped in policies/ (embedded in the library at build time), sorted.
std::vector<std::string> shipped_policy_names();

// Every backend name a policy may mention, in documentation order: namespace, docker, landlock,
// local.
std::vector<std::string> known_backend_names();

std::string_view to_string(Network network);
std::string_view to_string(Mount::Type type);

}  // namespace rlm
