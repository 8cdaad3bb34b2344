// The host-side choices of the GPU path, on any machine: the averaging choice, the stream plan
// of a co2 boundary (checked against its ordering rules), chunking, the report ring.
#include "runtime/backends/device/selection.hpp"

#include <gtest/gtest.h>

namespace co2::device {
namespace {

TEST(Selection, AveragingFollowsPlacementAndTransport) {
  std::string why;
  EXPECT_EQ(choose_averaging(Placement::Host, false, false, &why), Averaging::HostRing);
  EXPECT_TRUE(why.empty());
  EXPECT_EQ(choose_averaging(Placement::Device, true, false, &why), Averaging::Collective);
  // GPU over UCX (or local): staged through pinned host memory, chosen without being asked.
  EXPECT_EQ(choose_averaging(Placement::Device, false, false, &why), Averaging::StagedHost);
  // A compressed wire is encoded on the host: staged over NCCL too.
  EXPECT_EQ(choose_averaging(Placement::Device, true, true, &why), Averaging::StagedHost);
  EXPECT_TRUE(why.empty());
  // NCCL with host tensors is refused with a reason.
  choose_averaging(Placement::Host, true, false, &why);
  EXPECT_NE(why.find("NCCL"), std::string::npos);
}

// Under torchrun the default transport is UCX; a CUDA tensor handed to its raw all-reduce would
// be read through device addresses on the CPU (a segfault before this check).
TEST(Selection, RawCollectivesRefuseDeviceMemoryOnHostTransports) {
  EXPECT_EQ(raw_collective_refusal(false, false), "");
  EXPECT_EQ(raw_collective_refusal(false, true), "");
  EXPECT_EQ(raw_collective_refusal(true, true), "");
  const std::string why = raw_collective_refusal(true, false);
  EXPECT_NE(why.find("CUDA device memory"), std::string::npos) << why;
  EXPECT_NE(why.find("CO2_TRANSPORT_NCCL"), std::string::npos) << why;
}

TEST(Selection, NoDriverMeansNoDevice) {
  EXPECT_EQ(usable_device_count(35, 4), 0);  // cudaErrorInsufficientDriver
  EXPECT_EQ(usable_device_count(100, 0), 0);
  EXPECT_EQ(usable_device_count(0, 0), 0);
  EXPECT_EQ(usable_device_count(0, 2), 2);
}

size_t count_kind(const std::vector<Op>& plan, OpKind kind) {
  size_t n = 0;
  for (const Op& op : plan) n += op.kind == kind;
  return n;
}

// Boundaries back to back: the first has no average yet, later ones have.
std::vector<std::vector<Op>> rounds(Averaging a, int n) {
  std::vector<std::vector<Op>> plans;
  for (int i = 0; i < n; ++i) plans.push_back(co2_boundary_plan(a, i > 0));
  return plans;
}

// The collective path blocks the host only on the previous round's collective and the flag
// behind it (τ steps old): before an average is applied its collective has succeeded — an
// aborted NCCL collective releases the stream with a half-reduced buffer — and its finiteness is
// known, so NONFINITE comes from the boundary that skipped the update, not 1–4 boundaries later.
TEST(StreamPlan, CollectivePathWaitsOnlyForThePreviousRoundsCollective) {
  const auto first = co2_boundary_plan(Averaging::Collective, false);
  EXPECT_EQ(count_kind(first, OpKind::HostWaitEvent), 0u);
  EXPECT_EQ(count_kind(first, OpKind::HostWaitAverage), 0u);
  const auto later = co2_boundary_plan(Averaging::Collective, true);
  EXPECT_EQ(count_kind(later, OpKind::HostWaitAverage), 1u);
  EXPECT_EQ(count_kind(later, OpKind::HostWaitEvent), 1u);
  EXPECT_EQ(later[1], (Op{OpKind::HostWaitEvent, Stream::Comm, Event::AverageReady}));
  EXPECT_EQ(count_kind(later, OpKind::HostReadFinite), 1u);
  for (const auto& plan : {first, later}) {
    EXPECT_EQ(count_kind(plan, OpKind::Pass), 1u);
    EXPECT_EQ(count_kind(plan, OpKind::DeviceAllReduce), 1u);
    EXPECT_EQ(count_kind(plan, OpKind::CopyFlagOut), 1u);
    EXPECT_EQ(count_kind(plan, OpKind::SubmitHostAverage), 0u);
  }
  EXPECT_EQ(check_plan_sequence(rounds(Averaging::Collective, 5)), "");
}

TEST(StreamPlan, StagedPathBlocksOnceAfterTheCopyOut) {
  const auto plan = co2_boundary_plan(Averaging::StagedHost, true);
  EXPECT_EQ(count_kind(plan, OpKind::HostWaitEvent), 1u);
  EXPECT_EQ(count_kind(plan, OpKind::HostWaitAverage), 1u);
  EXPECT_EQ(count_kind(plan, OpKind::DeviceAllReduce), 0u);
  EXPECT_EQ(count_kind(plan, OpKind::CopyAverageIn), 1u);
  EXPECT_EQ(count_kind(plan, OpKind::CopyDeltaOut), 1u);
  // The host blocks on the copy out, and only then submits.
  size_t wait = 0, submit = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i].kind == OpKind::HostWaitEvent) wait = i;
    if (plan[i].kind == OpKind::SubmitHostAverage) submit = i;
  }
  EXPECT_LT(wait, submit);
  EXPECT_EQ(check_plan_sequence(rounds(Averaging::StagedHost, 5)), "");
}

TEST(StreamPlan, FrameworkMemoryOnlyOnTheCallersStream) {
  for (Averaging a : {Averaging::Collective, Averaging::StagedHost})
    for (const Op& op : co2_boundary_plan(a, true)) {
      if (op.kind == OpKind::Pass || op.kind == OpKind::Coefficients || op.kind == OpKind::Report) {
        EXPECT_EQ(op.stream, Stream::Caller);
      }
      if (op.kind == OpKind::DeviceAllReduce || op.kind == OpKind::CopyAverageIn || op.kind == OpKind::CopyDeltaOut) {
        EXPECT_EQ(op.stream, Stream::Comm);
      }
    }
}

// The checker must catch broken plans, or the tests above prove nothing.
TEST(StreamPlan, CheckerCatchesAWaitOnAnUnrecordedEvent) {
  // A first boundary that pretends an average is there: AverageReady was never recorded.
  const std::string error = check_plan_sequence({co2_boundary_plan(Averaging::Collective, true)});
  EXPECT_NE(error.find("never recorded"), std::string::npos) << error;
}

TEST(StreamPlan, CheckerCatchesAMissingStreamWait) {
  auto plans = rounds(Averaging::StagedHost, 3);
  auto& second = plans[1];
  for (size_t i = 0; i < second.size(); ++i)
    if (second[i].kind == OpKind::StreamWaitEvent && second[i].stream == Stream::Caller) {
      second.erase(second.begin() + long(i));
      break;
    }
  const std::string error = check_plan_sequence(plans);
  EXPECT_NE(error.find("races"), std::string::npos) << error;
}

TEST(StreamPlan, CheckerCatchesASubmitBeforeTheCopyCompleted) {
  auto plans = rounds(Averaging::StagedHost, 2);
  for (auto& plan : plans)
    for (size_t i = 0; i < plan.size(); ++i)
      if (plan[i].kind == OpKind::HostWaitEvent) {
        plan.erase(plan.begin() + long(i));
        break;
      }
  const std::string error = check_plan_sequence(plans);
  EXPECT_NE(error.find("before the copy out completed"), std::string::npos) << error;
}

// The plan of 1.0: the pass waited for the collective's event on the device only.
TEST(StreamPlan, CheckerCatchesAnAverageAppliedBeforeItsCollectiveSucceeded) {
  auto plans = rounds(Averaging::Collective, 2);
  auto& second = plans[1];
  second.erase(second.begin(), second.begin() + 3);  // HostWaitAverage, HostWaitEvent, HostReadFinite
  ASSERT_EQ(second[0], (Op{OpKind::StreamWaitEvent, Stream::Caller, Event::AverageReady}));
  const std::string error = check_plan_sequence(plans);
  EXPECT_NE(error.find("has not seen succeed"), std::string::npos) << error;
}

TEST(StreamPlan, CheckerCatchesTheFlagReadBeforeItsCopyCompleted) {
  auto plans = rounds(Averaging::Collective, 2);
  auto& second = plans[1];
  second.erase(second.begin() + 1);  // the host wait on AverageReady
  const std::string error = check_plan_sequence(plans);
  EXPECT_NE(error.find("before its copy out completed"), std::string::npos) << error;
}

TEST(StreamPlan, CheckerCatchesAPassBeforeTheFinitenessIsKnown) {
  auto plans = rounds(Averaging::StagedHost, 2);
  auto& second = plans[1];
  for (size_t i = 0; i < second.size(); ++i)
    if (second[i].kind == OpKind::HostReadFinite) {
      second.erase(second.begin() + long(i));
      break;
    }
  const std::string error = check_plan_sequence(plans);
  EXPECT_NE(error.find("finiteness"), std::string::npos) << error;
}

TEST(StreamPlan, CheckerCatchesAPassOnTheCommStream) {
  auto plans = rounds(Averaging::Collective, 2);
  for (Op& op : plans[1])
    if (op.kind == OpKind::Pass) op.stream = Stream::Comm;
  EXPECT_NE(check_plan_sequence(plans).find("caller's stream"), std::string::npos);
}

TEST(Chunks, NeverSpanSegmentsAndCoverEverything) {
  const std::vector<size_t> counts = {1, 4096, 4097, 10000, 3};
  const auto chunks = make_chunks(counts, 4096);
  std::vector<size_t> covered(counts.size(), 0);
  for (const Chunk& c : chunks) {
    ASSERT_LT(c.segment, counts.size());
    ASSERT_GE(c.count, 1u);
    ASSERT_LE(c.count, 4096u);
    EXPECT_EQ(c.begin, covered[c.segment]);  // in order, no gaps
    covered[c.segment] += c.count;
  }
  EXPECT_EQ(covered, counts);
  EXPECT_EQ(chunks.size(), 1u + 1 + 2 + 3 + 1);
  const auto first = first_chunk_of_segments(chunks, counts.size());
  EXPECT_EQ(first, (std::vector<uint32_t>{0, 1, 2, 4, 7, 8}));
  // The split depends only on the sizes: the deterministic order of the device norms.
  EXPECT_EQ(make_chunks(counts, 4096).size(), chunks.size());
}

TEST(ReportRing, FoldsInOrderAndSaysWhenFull) {
  ReportRing ring(3);
  EXPECT_TRUE(ring.empty());
  EXPECT_EQ(ring.push(), 0u);
  EXPECT_EQ(ring.push(), 1u);
  EXPECT_EQ(ring.push(), 2u);
  EXPECT_TRUE(ring.full());
  EXPECT_EQ(ring.oldest(), 0u);
  ring.pop();
  EXPECT_FALSE(ring.full());
  EXPECT_EQ(ring.push(), 0u);  // wraps into the freed slot
  EXPECT_EQ(ring.oldest(), 1u);
  EXPECT_EQ(ring.in_flight(), 3u);
}

}  // namespace
}  // namespace co2::device
