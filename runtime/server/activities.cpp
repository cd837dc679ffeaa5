#include "server/activities.hpp"

#include <cstdio>
#include <ctime>

namespace rlm::server {

struct Activities::Record {
  std::uint64_t id = 0;
  std::string op, policy;
  Peer owner;
  std::chrono::steady_clock::time_point started;
  std::chrono::system_clock::time_point started_at;
  Kill kill;
  std::optional<std::string> killed;  // under the registry's mutex
};

namespace {

std::string utc(std::chrono::system_clock::time_point when) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(when);
  std::tm parts{};
  gmtime_r(&seconds, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

}  // namespace

Activities::Entry::Entry(Activities& registry, std::shared_ptr<Record> record)
    : registry_(registry), record_(std::move(record)) {}

Activities::Entry::~Entry() {
  std::lock_guard lock(registry_.mutex_);
  registry_.records_.erase(record_->id);
}

std::uint64_t Activities::Entry::id() const {
  return record_->id;
}

std::optional<std::string> Activities::Entry::killed() const {
  std::lock_guard lock(registry_.mutex_);
  return record_->killed;
}

std::unique_ptr<Activities::Entry> Activities::add(std::string op, const Peer& owner,
                                                   std::string policy, Kill kill) {
  auto record = std::make_shared<Record>();
  record->op = std::move(op);
  record->policy = std::move(policy);
  record->owner = owner;
  record->started = std::chrono::steady_clock::now();
  record->started_at = std::chrono::system_clock::now();
  record->kill = std::move(kill);
  std::lock_guard lock(mutex_);
  record->id = next_id_++;
  records_.emplace(record->id, record);
  return std::make_unique<Entry>(*this, std::move(record));
}

nlohmann::json Activities::list(const Peer& asker, bool sees_all) const {
  const auto now = std::chrono::steady_clock::now();
  nlohmann::json list = nlohmann::json::array();
  std::lock_guard lock(mutex_);
  for (const auto& [id, record] : records_) {
    if (!sees_all && record->owner.uid != asker.uid) continue;
    list.push_back(
        {{"id", id},
         {"op", record->op},
         {"policy", record->policy},
         {"uid", record->owner.uid},
         {"gid", record->owner.gid},
         {"pid", record->owner.pid},
         {"age_ms",
          std::chrono::duration_cast<std::chrono::milliseconds>(now - record->started).count()},
         {"started", utc(record->started_at)},
         {"killed", record->killed ? nlohmann::json(*record->killed) : nlohmann::json()}});
  }
  return list;
}

bool Activities::kill(std::uint64_t id, const Peer& asker, bool may_kill_any) {
  std::lock_guard lock(mutex_);
  const auto found = records_.find(id);
  if (found == records_.end()) return false;
  Record& record = *found->second;
  if (!may_kill_any && record.owner.uid != asker.uid) return false;
  if (record.killed) return true;
  record.killed = "killed by uid " + std::to_string(asker.uid) + " with `rlm-sandbox server kill " +
                  std::to_string(id) + "`";
  if (record.kill) record.kill(*record.killed);
  return true;
}

std::size_t Activities::count() const {
  std::lock_guard lock(mutex_);
  return records_.size();
}

std::size_t Activities::kill_all(const std::string& why) {
  return kill_where([](const Record&) { return true; }, why);
}

std::size_t Activities::kill_connection(std::uint64_t connection, const std::string& why) {
  if (connection == 0) return 0;
  return kill_where(
      [connection](const Record& record) { return record.owner.connection == connection; }, why);
}

std::size_t Activities::kill_where(const std::function<bool(const Record&)>& which,
                                   const std::string& why) {
  std::lock_guard lock(mutex_);
  std::size_t killed = 0;
  for (auto& [id, record] : records_) {
    if (record->killed || !which(*record)) continue;
    record->killed = why;
    if (record->kill) record->kill(why);
    ++killed;
  }
  return killed;
}

}  // namespace rlm::server
