// The DDPLAB_* knobs (runtime/settings.h): the environment's value when set and valid, the default when unset or empty,
// a bad value refused with the variable named, and each knob read once, so a running job never sees it change.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "runtime/settings.h"

namespace ddplab::settings {
namespace {

TEST(Settings, DefaultWhenUnsetOrEmpty) {
  constexpr Knob unset{"DDPLAB_TEST_UNSET", "7", "a knob nobody sets", 0, 100};
  unsetenv(unset.name);
  EXPECT_EQ(integer(unset), 7);
  EXPECT_EQ(integer(unset, 42), 42) << "a default computed by the caller (per world size, say)";
  constexpr Knob empty{"DDPLAB_TEST_EMPTY", "shm", "a knob set to nothing", 0, -1, "shm|mpi"};
  setenv(empty.name, "", 1);
  EXPECT_EQ(choice(empty), "shm");
}

TEST(Settings, EnvironmentValueReadOnce) {
  constexpr Knob knob{"DDPLAB_TEST_ONCE", "1", "a knob read once", 0, 100};
  setenv(knob.name, "25", 1);
  EXPECT_EQ(integer(knob), 25);
  setenv(knob.name, "50", 1);
  EXPECT_EQ(integer(knob), 25) << "a knob must not change under a running job";
  EXPECT_EQ(integer(knob, 99), 25) << "a set knob wins over the caller's default";
}

TEST(Settings, BadValuesAreRefusedNamingTheVariable) {
  constexpr Knob not_a_number{"DDPLAB_TEST_BAD", "1", "a knob set to text", 0, 100};
  setenv(not_a_number.name, "12k", 1);
  try {
    integer(not_a_number);
    ADD_FAILURE() << "'12k' was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("DDPLAB_TEST_BAD"), std::string::npos) << e.what();
  }
  constexpr Knob out_of_range{"DDPLAB_TEST_RANGE", "1", "a knob set too high", 0, 100};
  setenv(out_of_range.name, "101", 1);
  EXPECT_THROW(integer(out_of_range), BadSetting);
  // The ring's slices are whole floats: 1 to 3 bytes read as "no slicing" before they were refused.
  setenv(kRingSliceBytes.name, "6", 1);
  try {
    integer(kRingSliceBytes);
    ADD_FAILURE() << "a slice of 6 bytes was accepted";
  } catch (const BadSetting& e) {
    EXPECT_NE(std::string(e.what()).find("DDPLAB_RING_SLICE_BYTES must be a multiple of 4, got '6'"), std::string::npos)
        << e.what();
  }
  unsetenv(kRingSliceBytes.name);
  constexpr Knob unknown{"DDPLAB_TEST_CHOICE", "shm", "a knob set to an unknown name", 0, -1, "shm|mpi"};
  setenv(unknown.name, "tcp", 1);
  try {
    choice(unknown);
    ADD_FAILURE() << "'tcp' was accepted";
  } catch (const BadSetting& e) {
    EXPECT_NE(std::string(e.what()).find("must be shm or mpi, got 'tcp'"), std::string::npos) << e.what();
  }
}

TEST(Settings, DescribeListsEveryKnobWithItsOrigin) {
  setenv(kCommTransport.name, "mpi", 1);
  unsetenv(kRingSliceBytes.name);
  const std::vector<std::string> lines = describe();
  ASSERT_EQ(lines.size(), std::size(kKnobs));
  const auto line_of = [&](const Knob& knob) {
    for (const std::string& line : lines)
      if (line.rfind(std::string(knob.name) + " ", 0) == 0) return line;
    return std::string("(no line for ") + knob.name + ")";
  };
  EXPECT_NE(line_of(kCommTransport).find("mpi (environment)"), std::string::npos) << line_of(kCommTransport);
  EXPECT_NE(line_of(kRingSliceBytes).find("262144 (default)"), std::string::npos) << line_of(kRingSliceBytes);
  // A value the other commands refuse is said to be refused, with their reason, where they send the user.
  setenv(kCommSpinUs.name, "abc", 1);
  const std::vector<std::string> with_bad = describe();
  unsetenv(kCommSpinUs.name);
  const auto bad = std::find_if(with_bad.begin(), with_bad.end(), [](const std::string& line) {
    return line.rfind(std::string(kCommSpinUs.name) + " ", 0) == 0;
  });
  ASSERT_NE(bad, with_bad.end());
  EXPECT_NE(bad->find("abc (environment)"), std::string::npos) << *bad;
  EXPECT_NE(bad->find("REFUSED: DDPLAB_COMM_SPIN_US must be an integer"), std::string::npos) << *bad;
  EXPECT_EQ(line_of(kCommTransport).find("REFUSED"), std::string::npos) << line_of(kCommTransport);
}

// The one knob whose default the caller computes (per world size): its text for `ddplab devices` names the values.
TEST(Settings, SmallAllreduceDefaultTextNamesTheDefaults) {
  const std::string text = kSmallAllreduceBytes.default_text;
  EXPECT_EQ(text, std::to_string(kSmallAllreduceBytesAtTwoRanks) + " at 2 ranks (" +
                      std::to_string(kSmallAllreduceBytesAtTwoRanksBesideDirect) + " beside the direct all-reduce), " +
                      std::to_string(kSmallAllreduceBytesBeyond) + " beyond");
}

}  // namespace
}  // namespace ddplab::settings
