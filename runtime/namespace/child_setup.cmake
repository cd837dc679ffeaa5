# The child's setup steps between clone and exec (child_setup.hpp): root filesystem, loopback,
# privileges. libnl-route-3 and libcap are linked to rlm_sandbox already.
target_sources(rlm_sandbox PRIVATE mounts.cpp net.cpp caps.cpp)
