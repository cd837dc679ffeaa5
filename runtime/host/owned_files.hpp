// What a sandbox that ran as a host uid of its own (sandbox_uid.hpp) left behind on the host,
// given to whoever owns the place it wrote to, so that its uid owns nothing once the sandbox ended:
// the next holder of that uid may be another client's sandbox. The namespace backend idmaps its
// read-write binds instead (namespace/idmap.hpp); the landlock backend, which runs its payload in
// place as that uid, walks its read-write binds after the run.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "host/tree_walk.hpp"
#include "rlm_sandbox/request.hpp"

namespace rlm::host {

// Every entry beneath `root` (itself included) whose owner is `uid` or whose group is `gid` gets
// `owner`'s uid or gid in its place (root's chown also clears set-id bits). Walks the tree as the
// sandbox left it, hostile: no symlink is followed (each directory is opened beneath its parent
// with O_NOFOLLOW, each entry is changed through an O_PATH descriptor of exactly the inode that
// was checked), bounded by `limits`. True when the whole tree was walked and every such entry
// changed; false otherwise (the caller must then not hand `uid` out again).
bool give_to_owner(const std::string& root, uid_t uid, gid_t gid, const HostIds& owner,
                   const TreeLimits& limits = {});

}  // namespace rlm::host
