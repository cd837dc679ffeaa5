// The comparison algebra the layering relies on.
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "seccomp/model.hpp"

namespace rlm::seccomp::detail {
namespace {

Comparison cmp(unsigned arg, scmp_compare op, std::uint64_t a, std::uint64_t b = 0) {
  return {arg, op, a, b};
}

bool matches(const Conditions& conditions, std::uint64_t value) {
  for (const auto& c : conditions)
    if (!c.holds(value)) return false;
  return true;
}

// Values worth probing: each member and its neighbours, single bits, all ones, random values
// with and without upper bits.
std::vector<std::uint64_t> probes(std::span<const std::uint32_t> values) {
  std::vector<std::uint64_t> out = {0, 1, 0xffffffff, 0xfffffffe, 0x7fffffff, ~0ull};
  for (const auto v : values)
    for (const std::uint64_t p : {std::uint64_t{v}, std::uint64_t{v} + 1, std::uint64_t{v} - 1,
                                  std::uint64_t{v} | (std::uint64_t{1} << 40)})
      out.push_back(p);
  for (int bit = 0; bit < 64; ++bit) out.push_back(1ull << bit);
  std::mt19937_64 random(42);
  for (int i = 0; i < 20000; ++i) out.push_back(i % 2 ? random() : random() & 0xffffffff);
  return out;
}

TEST(SeccompModel, ComplementCoversExactlyTheOtherValuesOnce) {
  const std::vector<std::vector<std::uint32_t>> sets = {
      {0x0, 0x8, 0x20000, 0x20008, 0xffffffff}, {0x5412, 0x541c}, {0}, {0xffffffff}, {7, 7}};
  for (const auto& set : sets) {
    const auto patterns = complement_low32(1, set);
    for (const auto value : probes(set)) {
      int hits = 0;
      for (const auto& p : patterns) hits += matches(p, value) ? 1 : 0;
      const bool member =
          std::find(set.begin(), set.end(), static_cast<std::uint32_t>(value)) != set.end();
      EXPECT_EQ(hits, member ? 0 : 1) << std::hex << "value 0x" << value;
    }
    for (const auto& p : patterns) {
      ASSERT_EQ(p.size(), 1u);
      EXPECT_EQ(p[0].arg, 1u);
      EXPECT_EQ(p[0].op, SCMP_CMP_MASKED_EQ);
      EXPECT_EQ(p[0].a >> 32, 0u) << "only the low half is compared";
    }
  }
}

TEST(SeccompModel, ConjoinFusesWhatOneComparisonExpresses) {
  // Two masks on one argument become one.
  auto both =
      conjoin({cmp(0, SCMP_CMP_MASKED_EQ, 0xf0, 0x10)}, {cmp(0, SCMP_CMP_MASKED_EQ, 0x0f, 0x2)});
  ASSERT_EQ(both.kind, Conjunction::conditions);
  EXPECT_EQ(both.result, (Conditions{cmp(0, SCMP_CMP_MASKED_EQ, 0xff, 0x12)}));
  // Different arguments simply combine, sorted.
  both = conjoin({cmp(2, SCMP_CMP_EQ, 1)}, {cmp(0, SCMP_CMP_GT, 5)});
  ASSERT_EQ(both.kind, Conjunction::conditions);
  EXPECT_EQ(both.result, (Conditions{cmp(0, SCMP_CMP_GT, 5), cmp(2, SCMP_CMP_EQ, 1)}));
  // EQ absorbs whatever it satisfies.
  both = conjoin({cmp(0, SCMP_CMP_EQ, 0x12)}, {cmp(0, SCMP_CMP_MASKED_EQ, 0xf0, 0x10)});
  EXPECT_EQ(both.result, (Conditions{cmp(0, SCMP_CMP_EQ, 0x12)}));
  // The tighter of two bounds in one direction.
  both = conjoin({cmp(0, SCMP_CMP_LT, 10)}, {cmp(0, SCMP_CMP_LE, 3)});
  EXPECT_EQ(both.result, (Conditions{cmp(0, SCMP_CMP_LE, 3)}));
  // A range needs two comparisons of one argument: not expressible.
  EXPECT_EQ(conjoin({cmp(0, SCMP_CMP_GT, 1)}, {cmp(0, SCMP_CMP_LT, 9)}).kind,
            Conjunction::inexpressible);
  EXPECT_EQ(conjoin({cmp(0, SCMP_CMP_NE, 1)}, {cmp(0, SCMP_CMP_NE, 2)}).kind,
            Conjunction::inexpressible);
}

TEST(SeccompModel, DisjointOnlyWhenProvable) {
  EXPECT_TRUE(disjoint({cmp(0, SCMP_CMP_EQ, 1)}, {cmp(0, SCMP_CMP_EQ, 2)}));
  EXPECT_TRUE(disjoint({cmp(0, SCMP_CMP_EQ, 2)}, {cmp(0, SCMP_CMP_NE, 2)}));
  EXPECT_TRUE(disjoint({cmp(0, SCMP_CMP_LT, 5)}, {cmp(0, SCMP_CMP_GE, 5)}));
  EXPECT_TRUE(
      disjoint({cmp(1, SCMP_CMP_MASKED_EQ, 0x8, 0x8)}, {cmp(1, SCMP_CMP_MASKED_EQ, 0xc, 0x4)}));
  EXPECT_TRUE(disjoint({cmp(0, SCMP_CMP_MASKED_EQ, 0xff00, 0x100)}, {cmp(0, SCMP_CMP_LT, 0x100)}));
  // Disjoint on one argument is enough, whatever the others say.
  EXPECT_TRUE(disjoint({cmp(0, SCMP_CMP_GT, 1), cmp(3, SCMP_CMP_EQ, 1)},
                       {cmp(0, SCMP_CMP_LT, 9), cmp(3, SCMP_CMP_EQ, 2)}));

  EXPECT_FALSE(disjoint({}, {cmp(0, SCMP_CMP_EQ, 1)}));
  EXPECT_FALSE(disjoint({cmp(0, SCMP_CMP_EQ, 1)}, {cmp(1, SCMP_CMP_EQ, 2)}));
  EXPECT_FALSE(disjoint({cmp(0, SCMP_CMP_GT, 1)}, {cmp(0, SCMP_CMP_LT, 9)}));
  EXPECT_FALSE(
      disjoint({cmp(0, SCMP_CMP_MASKED_EQ, 0x1, 0x1)}, {cmp(0, SCMP_CMP_MASKED_EQ, 0x2, 0x0)}));
}

TEST(SeccompModel, MaskedEqualityIgnoresDatumBitsOutsideTheMask) {
  // As libseccomp compiles it: (arg & mask) == (datum & mask).
  EXPECT_TRUE(cmp(0, SCMP_CMP_MASKED_EQ, 0xff, 0x1ff).holds(0xff));
  EXPECT_FALSE(cmp(0, SCMP_CMP_MASKED_EQ, 0xff, 0x1ff).holds(0x1fe));
}

TEST(SeccompModel, ActionsParseAndFoldKillsIntoKillProcess) {
  EXPECT_EQ(parse_verdict("SCMP_ACT_KILL"), Verdict::kill_process);
  EXPECT_EQ(parse_verdict("SCMP_ACT_KILL_THREAD"), Verdict::kill_process);
  EXPECT_EQ(parse_verdict("SCMP_ACT_ERRNO"), Verdict::errno_);
  EXPECT_FALSE(parse_verdict("SCMP_ACT_TRACE"));
  EXPECT_FALSE(parse_verdict("SCMP_ACT_NOTIFY"));
  EXPECT_EQ(to_libseccomp({Verdict::errno_, 38}), SCMP_ACT_ERRNO(38));
  EXPECT_EQ(describe({Verdict::errno_, 1}), "SCMP_ACT_ERRNO(1)");
  EXPECT_LT(Verdict::errno_, Verdict::trap);
  EXPECT_LT(Verdict::trap, Verdict::kill_process);
}

}  // namespace
}  // namespace rlm::seccomp::detail
