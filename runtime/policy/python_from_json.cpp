// The policy's "python" section: a venv and site-packages directories exposed read-only. Here only
// its shape (types, absolute paths, no duplicates); what the host holds at those paths is checked
// once the whole policy is read (python_environment.cpp), as the mounts matter too.
#include "policy/read_policy.hpp"

namespace rlm::policy {

using nlohmann::json;

void read_python(JsonReader& reader, const json& value, const std::string& path,
                 PythonEnvironment& python) {
  if (!reader.object(value, path, kPythonKeys)) return;
  const auto absolute = [&](const std::string& text,
                            const std::string& item_path) -> std::optional<std::string> {
    if (text.starts_with('/')) return text;
    reader.error(item_path, "must be an absolute host path, got " + as_json_string(text));
    return std::nullopt;
  };
  // null: no venv (a policy may drop the one it extends).
  if (const json* venv = member(value, "venv")) {
    const auto venv_path = key_path(path, "venv");
    if (venv->is_null())
      python.venv.reset();
    else if (auto text = reader.string(*venv, venv_path))
      python.venv = absolute(*text, venv_path);
  }
  read_member(
      value, path, "site_packages",
      [&](const json& list, const std::string& list_path) {
        return read_string_list(reader, list, list_path, absolute);
      },
      python.site_packages);
}

}  // namespace rlm::policy
