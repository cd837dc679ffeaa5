// Policy -> JSON: the effective policy with every field explicit, in canonical units (integer
// bytes and milliseconds), so `policy show` hides nothing and the output loads back unchanged.
#include "rlm_sandbox/policy.hpp"

namespace rlm {
namespace {

using nlohmann::json;

json mount_to_json(const Mount& mount, std::uint64_t default_tmpfs_bytes) {
  json result = {{"target", mount.target},
                 {"type", std::string(to_string(mount.type))},
                 {"readonly", mount.readonly}};
  if (mount.type == Mount::Type::bind) {
    result["source"] = mount.source;
    result["optional"] = mount.optional;
  } else {
    result["size"] = mount.size_bytes.value_or(default_tmpfs_bytes);
  }
  return result;
}

json seccomp_to_json(const Seccomp& seccomp) {
  json rules = json::array();
  for (const auto& rule : seccomp.syscalls) {
    json args = json::array();
    for (const auto& arg : rule.args)
      args.push_back({{"index", arg.index},
                      {"value", arg.value},
                      {"valueTwo", arg.value_two},
                      {"op", arg.op}});
    json entry = {{"names", rule.names}, {"action", rule.action}, {"args", std::move(args)}};
    if (rule.action == "SCMP_ACT_ERRNO") entry["errnoRet"] = rule.errno_ret.value_or(1);
    rules.push_back(std::move(entry));
  }
  return {{"defaultAction", seccomp.default_action}, {"syscalls", std::move(rules)}};
}

}  // namespace

namespace {

json egress_to_json(const Egress& egress) {
  json allow = json::array(), deny = json::array(), inject = json::array();
  for (const auto& rule : egress.allow) allow.push_back(rule.text);
  for (const auto& rule : egress.deny) deny.push_back(rule.text);
  for (const auto& injection : egress.inject) {
    json item{{"host", injection.host}, {"header", injection.header}};
    if (!injection.value_from_env.empty()) item["value_from_env"] = injection.value_from_env;
    if (!injection.value_from_file.empty()) item["value_from_file"] = injection.value_from_file;
    inject.push_back(std::move(item));
  }
  const auto& limits = egress.limits;
  return {{"allow", std::move(allow)},
          {"deny", std::move(deny)},
          {"private", egress.allow_private},
          {"inject", std::move(inject)},
          {"limits",
           {{"connections", limits.connections},
            {"names", limits.names},
            {"idle_ms", limits.idle.count()},
            {"connection_bytes", limits.connection_bytes},
            {"client_hello_bytes", limits.client_hello_bytes},
            {"client_hello_wait_ms", limits.client_hello_wait.count()}}}};
}

}  // namespace

json Policy::to_json() const {
  json mounts = json::array();
  for (const auto& mount : filesystem.mounts)
    mounts.push_back(mount_to_json(mount, limits.tmpfs_bytes));
  return {
      {"description", description},
      {"backend", {{"prefer", backend.prefer}, {"allow_unisolated", backend.allow_unisolated}}},
      {"limits",
       {{"wall_time_ms", limits.wall_time.count()},
        {"cpu_time_ms", limits.cpu_time.count()},
        {"kill_grace_ms", limits.kill_grace.count()},
        {"memory_bytes", limits.memory_bytes},
        {"output_bytes", limits.output_bytes},
        {"file_size_bytes", limits.file_size_bytes},
        {"tmpfs_bytes", limits.tmpfs_bytes},
        {"session_buffer_bytes", limits.session_buffer_bytes},
        {"pids", limits.pids},
        {"open_files", limits.open_files},
        {"cpus", limits.cpus ? json(*limits.cpus) : json(nullptr)}}},
      {"namespaces",
       {{"user", namespaces.user},
        {"pid", namespaces.pid},
        {"net", namespaces.net},
        {"mount", namespaces.mount},
        {"ipc", namespaces.ipc},
        {"uts", namespaces.uts},
        {"cgroup", namespaces.cgroup}}},
      {"filesystem",
       {{"mounts", std::move(mounts)},
        {"workdir", filesystem.workdir},
        {"allow_kernel_interface_binds", filesystem.allow_kernel_interface_binds}}},
      {"network", network == Network::allowlist ? egress_to_json(egress)
                                                : json(std::string(to_string(network)))},
      {"seccomp", seccomp_to_json(seccomp)},
      {"capabilities", capabilities},
      {"env", {{"clear", env.clear}, {"set", env.set}, {"pass", env.pass}}},
      {"user", {{"uid", user.uid}, {"gid", user.gid}}},
      {"hostname", hostname},
      {"docker", {{"image", docker.image}}},
      {"python",
       {{"venv", python.venv ? json(*python.venv) : json(nullptr)},
        {"site_packages", python.site_packages}}},
  };
}

}  // namespace rlm
