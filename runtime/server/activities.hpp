// What the server is running for whom: each run and session from its start to its end, with its
// owner (the client's credentials) and age, for `status` and `kill`. A client sees and kills only
// its own; root and the server's own uid see and kill any. An id is never handed out twice while
// the server lives.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/peer.hpp"

namespace rlm::server {

class Activities {
 public:
  // Ends an activity now, saying why (the kill's words); called with the registry's lock held,
  // so it must only signal (shut a socket down, fire a timer), never wait.
  using Kill = std::function<void(const std::string& why)>;

  struct Record;

  // An activity's place in the registry, from add() until it is destroyed (then it is gone from
  // status, and no kill reaches what it stood for any more).
  class Entry {
   public:
    Entry(Activities& registry, std::shared_ptr<Record> record);
    ~Entry();
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    std::uint64_t id() const;
    // Why it was killed ("killed by uid 0 with `rlm-sandbox server kill 4`"), once it was.
    std::optional<std::string> killed() const;

   private:
    Activities& registry_;
    std::shared_ptr<Record> record_;
  };

  // `op` "run" or "session"; `policy` the offered name.
  std::unique_ptr<Entry> add(std::string op, const Peer& owner, std::string policy, Kill kill);

  // What `asker` may see: [{"id", "op", "policy", "uid", "gid", "pid", "age_ms", "started"}],
  // oldest first; every activity when `sees_all`, else the asker's uid's own.
  nlohmann::json list(const Peer& asker, bool sees_all) const;

  // Kills activity `id` if `asker` may (its owner's uid, or `may_kill_any`). False when there is
  // none it may kill (one of another uid is not told apart from none).
  bool kill(std::uint64_t id, const Peer& asker, bool may_kill_any);

  // How many there are now.
  std::size_t count() const;

  // Kills every activity not killed yet, each saying `why` (a drain's grace ran out). Returns how
  // many it killed.
  std::size_t kill_all(const std::string& why);
  // Kills every activity that TLS connection `connection` (Peer::connection, not 0) started.
  std::size_t kill_connection(std::uint64_t connection, const std::string& why);

 private:
  std::size_t kill_where(const std::function<bool(const Record&)>& which, const std::string& why);
  mutable std::mutex mutex_;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, std::shared_ptr<Record>> records_;
};

}  // namespace rlm::server
