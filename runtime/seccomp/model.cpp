#include "seccomp/model.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <utility>

namespace rlm::seccomp::detail {
namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

struct Interval {
  std::uint64_t lo, hi;  // inclusive
};

bool is_bound(scmp_compare op) {
  return op == SCMP_CMP_LT || op == SCMP_CMP_LE || op == SCMP_CMP_GT || op == SCMP_CMP_GE;
}

// The values a bound (or EQ) comparison accepts; nullopt when it accepts none (LT 0, GT max).
std::optional<Interval> interval(const Comparison& c) {
  switch (c.op) {
    case SCMP_CMP_EQ:
      return Interval{c.a, c.a};
    case SCMP_CMP_LT:
      if (c.a == 0) return std::nullopt;
      return Interval{0, c.a - 1};
    case SCMP_CMP_LE:
      return Interval{0, c.a};
    case SCMP_CMP_GT:
      if (c.a == kMax) return std::nullopt;
      return Interval{c.a + 1, kMax};
    case SCMP_CMP_GE:
      return Interval{c.a, kMax};
    default:
      return Interval{0, kMax};
  }
}

struct Fused {
  enum Kind { never, one, inexpressible } kind;
  Comparison cmp{};
};

Fused one(const Comparison& c) {
  return {Fused::one, c};
}

// x AND y for two comparisons of the same argument, as one comparison when that is possible.
Fused fuse(const Comparison& x, const Comparison& y) {
  if (x == y) return one(x);
  if (x.op == SCMP_CMP_EQ) return x.holds(x.a) && y.holds(x.a) ? one(x) : Fused{Fused::never};
  if (y.op == SCMP_CMP_EQ) return x.holds(y.a) && y.holds(y.a) ? one(y) : Fused{Fused::never};
  if (x.op == SCMP_CMP_MASKED_EQ && y.op == SCMP_CMP_MASKED_EQ) {
    const std::uint64_t common = x.a & y.a;
    if (((x.b ^ y.b) & common) != 0) return {Fused::never};
    return one({x.arg, SCMP_CMP_MASKED_EQ, x.a | y.a, (x.b & x.a) | (y.b & y.a)});
  }
  // NE v AND y is just y when y already excludes v.
  if (x.op == SCMP_CMP_NE) return y.holds(x.a) ? Fused{Fused::inexpressible} : one(y);
  if (y.op == SCMP_CMP_NE) return x.holds(y.a) ? Fused{Fused::inexpressible} : one(x);

  // Bounds, or a bound and a mask: compare the value ranges (for a mask, the range between its
  // smallest and largest member bounds it).
  auto range = [](const Comparison& c) -> std::optional<Interval> {
    if (c.op != SCMP_CMP_MASKED_EQ) return interval(c);
    const std::uint64_t lo = c.b & c.a;
    return Interval{lo, lo | ~c.a};
  };
  const auto rx = range(x), ry = range(y);
  if (!rx || !ry) return {Fused::never};
  const std::uint64_t lo = std::max(rx->lo, ry->lo), hi = std::min(rx->hi, ry->hi);
  if (lo > hi) return {Fused::never};
  if (x.op == SCMP_CMP_MASKED_EQ || y.op == SCMP_CMP_MASKED_EQ) {
    // Only "the bound contains every member of the mask" collapses to the mask.
    const auto& mask = x.op == SCMP_CMP_MASKED_EQ ? x : y;
    const auto& bound = x.op == SCMP_CMP_MASKED_EQ ? y : x;
    const auto rm = range(mask), rb = range(bound);
    if (rb->lo <= rm->lo && rm->hi <= rb->hi) return one(mask);
    return {Fused::inexpressible};
  }
  if (is_bound(x.op) && is_bound(y.op)) {
    if (lo == rx->lo && hi == rx->hi) return one(x);
    if (lo == ry->lo && hi == ry->hi) return one(y);
  }
  return {Fused::inexpressible};
}

void complement_walk(unsigned arg, std::uint32_t mask, std::uint32_t bits, int bit,
                     const std::vector<std::uint32_t>& values, std::vector<Conditions>& out) {
  if (bit < 0) return;  // a leaf is one of the values
  const std::uint32_t here = std::uint32_t{1} << bit;
  for (const std::uint32_t side : {std::uint32_t{0}, here}) {
    std::vector<std::uint32_t> below;
    for (const auto v : values)
      if ((v & here) == side) below.push_back(v);
    if (below.empty())
      out.push_back({Comparison{arg, SCMP_CMP_MASKED_EQ, mask | here, bits | side}});
    else
      complement_walk(arg, mask | here, bits | side, bit - 1, below, out);
  }
}

}  // namespace

std::uint32_t to_libseccomp(Action action) {
  switch (action.verdict) {
    case Verdict::allow:
      return SCMP_ACT_ALLOW;
    case Verdict::log:
      return SCMP_ACT_LOG;
    case Verdict::errno_:
      return SCMP_ACT_ERRNO(action.errno_value);
    case Verdict::trap:
      return SCMP_ACT_TRAP;
    case Verdict::kill_process:
      return SCMP_ACT_KILL_PROCESS;
  }
  return SCMP_ACT_KILL_PROCESS;
}

std::string_view profile_name(Action action) {
  switch (action.verdict) {
    case Verdict::allow:
      return "SCMP_ACT_ALLOW";
    case Verdict::log:
      return "SCMP_ACT_LOG";
    case Verdict::errno_:
      return "SCMP_ACT_ERRNO";
    case Verdict::trap:
      return "SCMP_ACT_TRAP";
    case Verdict::kill_process:
      return "SCMP_ACT_KILL_PROCESS";
  }
  return "SCMP_ACT_KILL_PROCESS";
}

std::string describe(Action action) {
  std::string text(profile_name(action));
  if (action.verdict == Verdict::errno_) text += "(" + std::to_string(action.errno_value) + ")";
  return text;
}

std::optional<Verdict> parse_verdict(std::string_view name) {
  if (name == "SCMP_ACT_ALLOW") return Verdict::allow;
  if (name == "SCMP_ACT_LOG") return Verdict::log;
  if (name == "SCMP_ACT_ERRNO") return Verdict::errno_;
  if (name == "SCMP_ACT_TRAP") return Verdict::trap;
  if (name == "SCMP_ACT_KILL" || name == "SCMP_ACT_KILL_THREAD" || name == "SCMP_ACT_KILL_PROCESS")
    return Verdict::kill_process;
  return std::nullopt;
}

bool Comparison::holds(std::uint64_t value) const {
  switch (op) {
    case SCMP_CMP_NE:
      return value != a;
    case SCMP_CMP_LT:
      return value < a;
    case SCMP_CMP_LE:
      return value <= a;
    case SCMP_CMP_EQ:
      return value == a;
    case SCMP_CMP_GE:
      return value >= a;
    case SCMP_CMP_GT:
      return value > a;
    case SCMP_CMP_MASKED_EQ:
      return (value & a) == (b & a);
    default:
      return false;
  }
}

namespace {
constexpr std::pair<std::string_view, scmp_compare> kOps[] = {
    {"SCMP_CMP_NE", SCMP_CMP_NE},
    {"SCMP_CMP_LT", SCMP_CMP_LT},
    {"SCMP_CMP_LE", SCMP_CMP_LE},
    {"SCMP_CMP_EQ", SCMP_CMP_EQ},
    {"SCMP_CMP_GE", SCMP_CMP_GE},
    {"SCMP_CMP_GT", SCMP_CMP_GT},
    {"SCMP_CMP_MASKED_EQ", SCMP_CMP_MASKED_EQ},
};
}  // namespace

std::optional<scmp_compare> parse_op(std::string_view name) {
  for (const auto& [n, op] : kOps)
    if (n == name) return op;
  return std::nullopt;
}

std::string_view op_name(scmp_compare op) {
  for (const auto& [n, o] : kOps)
    if (o == op) return n;
  return "SCMP_CMP_?";
}

Conjunction conjoin(const Conditions& x, const Conditions& y) {
  Conjunction out{Conjunction::conditions, {}};
  bool inexpressible = false;
  auto i = x.begin(), j = y.begin();
  while (i != x.end() || j != y.end()) {
    if (j == y.end() || (i != x.end() && i->arg < j->arg)) {
      out.result.push_back(*i++);
    } else if (i == x.end() || j->arg < i->arg) {
      out.result.push_back(*j++);
    } else {
      const Fused f = fuse(*i++, *j++);
      if (f.kind == Fused::never) return {Conjunction::never, {}};
      if (f.kind == Fused::inexpressible) inexpressible = true;
      out.result.push_back(f.cmp);
    }
  }
  // An argument proven unsatisfiable anywhere wins over one that is merely inexpressible.
  if (inexpressible) return {Conjunction::inexpressible, {}};
  return out;
}

bool disjoint(const Conditions& x, const Conditions& y) {
  return conjoin(x, y).kind == Conjunction::never;
}

std::vector<Conditions> complement_low32(unsigned arg, std::span<const std::uint32_t> values) {
  std::vector<std::uint32_t> unique(values.begin(), values.end());
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  std::vector<Conditions> out;
  if (unique.empty()) return {Conditions{}};
  complement_walk(arg, 0, 0, 31, unique, out);
  return out;
}

namespace {

// Syscalls an older libseccomp may not know the name of. Since Linux 5.1 a new syscall gets the
// same number on every architecture, so one table serves x86_64 and aarch64.
struct NewSyscall {
  std::string_view name;
  int number;
};
constexpr NewSyscall kNewSyscalls[] = {
    {"cachestat", 451},         {"fchmodat2", 452},        {"map_shadow_stack", 453},
    {"futex_wake", 454},        {"futex_wait", 455},       {"futex_requeue", 456},
    {"statmount", 457},         {"listmount", 458},        {"lsm_get_self_attr", 459},
    {"lsm_set_self_attr", 460}, {"lsm_list_modules", 461}, {"mseal", 462},
    {"setxattrat", 463},        {"getxattrat", 464},       {"listxattrat", 465},
    {"removexattrat", 466},     {"open_tree_attr", 467},   {"file_getattr", 468},
    {"file_setattr", 469},
};

}  // namespace

std::optional<int> resolve_syscall(std::string_view name) {
  const std::string n(name);
  const int nr = seccomp_syscall_resolve_name_arch(SCMP_ARCH_NATIVE, n.c_str());
  if (nr != __NR_SCMP_ERROR) return nr;
  for (const auto& s : kNewSyscalls)
    if (s.name == name) return s.number;
  return std::nullopt;
}

std::optional<std::string> syscall_name_of(int number) {
  if (number < 0) return std::nullopt;
  if (char* name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, number)) {
    std::string out(name);
    std::free(name);
    return out;
  }
  for (const auto& s : kNewSyscalls)
    if (s.number == number) return std::string(s.name);
  return std::nullopt;
}

}  // namespace rlm::seccomp::detail
