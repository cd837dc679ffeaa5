# The namespace backend's orchestration: clone into the namespaces, id maps, the child's pipeline,
# the payload's seccomp filter, health, and the Result (docs/namespace-backend.md).
target_sources(rlm_sandbox PRIVATE
  namespace_backend.cpp  # run(): prepare, clone, finish, supervise
  child.cpp              # the child between clone and exec
  clone.cpp              # clone3 with fallback to clone
  userns.cpp             # uid/gid maps, the namespace's owner, the user namespace probe
  sandbox_uid.cpp        # a host uid of its own per live sandbox (root runtime)
  payload_filter.cpp     # seccomp programs in sealed memfds for init
  limits.cpp             # init's rlimits, the cgroup's account of the run, rlimits in its place
  health.cpp)
