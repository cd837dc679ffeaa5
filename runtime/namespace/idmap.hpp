// Read-write binds idmapped to their owner (privileged runtime): the sandbox runs as a host uid of
// its own (sandbox_uid.hpp) that a later sandbox, another client's, may be given. Whatever that uid
// owned after the sandbox ended -- a file written through a bind, set-uid or not -- would be a way
// into the next sandbox that holds it. So each read-write bind is mounted with an idmapping in
// which the sandbox's host uid and gid stand for the owner's (the caller, or a server's client):
// files the owner has appear as the sandbox user's inside, and what the sandbox writes is stored
// as the owner's. The sandbox's own uid owns nothing on disk.
//
// The kernel lets only a holder of CAP_SYS_ADMIN over the filesystem (host root, for a host
// filesystem) idmap a mount, and only a mount not yet attached: so the parent clones each bind's
// tree, idmaps it and hands it to the child, which attaches it in the new root (mounts_apply.cpp).
#pragma once

#include <sys/types.h>

#include <string>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/request.hpp"

namespace rlm::ns {

// Parent: a user namespace whose maps make `owner` the sandbox's host ids ("OWNER HOST 1" in
// uid_map and gid_map), as an fd for MOUNT_ATTR_IDMAP. Its one process is gone on return.
// Throws SetupError naming the step.
host::UniqueFd owner_idmap(const HostIds& owner, uid_t host_uid, gid_t host_gid);

// Parent: the mount tree at `source` (an fd of `host_path`) cloned (detached, recursive), idmapped
// with `userns`, nosuid and nodev. Throws Error at `where` with the fix when the kernel or the
// filesystem cannot idmap it.
host::UniqueFd idmapped_tree(int source, const std::string& host_path, int userns,
                             const std::string& where);

}  // namespace rlm::ns
