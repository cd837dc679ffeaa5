// Stand-in until the real comparison lands: refuses every candidate (fails closed).
#include "rlm_sandbox/tightening.hpp"

namespace rlm {

std::vector<Diagnostic> loosenings(const Policy&, const Policy&,
                                   const std::vector<PermittedBind>&) {
  return {Diagnostic{"", "the tightening check is not implemented yet"}};
}

}  // namespace rlm
