#include "config/knob_flags.h"

#include <optional>
#include <stdexcept>

namespace ddplab {

CLI::Validator auto_or_number_of(const std::string& flag) {
  std::optional<CLI::Validator> validator;
  const TrainConfig c;
  visit_knobs(c, [&](const Knob& knob, const auto& field) {
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
      if (knob.flag && knob.flag == flag && knob.auto_text) validator = knob_flags_detail::auto_or_number<T>(knob);
  });
  if (!validator) throw std::logic_error("auto_or_number_of: no numeric knob " + flag + " that takes auto");
  return *validator;
}

void check_knob_ranges(const TrainConfig& c) {
  visit_knobs(c, [](const Knob& knob, const auto& value) { knob_flags_detail::check_range(knob, value); });
}

void check_knob_value(const std::string& flag, double value) {
  TrainConfig c;
  bool found = false;
  visit_knobs(c, [&](const Knob& knob, auto& field) {
    if constexpr (std::is_arithmetic_v<std::decay_t<decltype(field)>>) {
      if (knob.flag && knob.flag == flag) found = true, knob_flags_detail::check_range(knob, value);
    }
  });
  if (!found) throw std::logic_error("check_knob_value: no numeric knob " + flag);
}

void add_knob_flags(CLI::App* app, TrainConfig& c, std::initializer_list<std::string_view> flags) {
  for (const std::string_view flag : flags) {
    bool found = false;
    visit_knobs(c, [&](const Knob& knob, auto& value) {
      if (knob.flag && knob.flag == flag) found = true, add_knob_flag(app, knob, value);
    });
    if (!found) throw std::logic_error("add_knob_flags: no knob " + std::string(flag));
  }
}

}  // namespace ddplab
