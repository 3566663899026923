// A choice among named values: an enum that a flag takes and a run file stores by name. Each such enum declares
// its names once, beside itself, as a function found by argument-dependent lookup:
//   constexpr std::array<Named<Precision>, 3> choice_names(Precision) { return {{{Precision::kFp32, "fp32"}, ...}}; }
// and naming, parsing, the list of what a flag takes and the JSON form all come from that table.
#pragma once
#include <array>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace ddplab {

template <typename E>
struct Named {
  E value;
  const char* name;
};

template <typename E, typename = void>
struct IsChoice : std::false_type {};
template <typename E>
struct IsChoice<E, std::void_t<decltype(choice_names(E{}))>> : std::is_enum<E> {};
template <typename E>
inline constexpr bool kIsChoice = IsChoice<E>::value;

template <typename E, typename = std::enable_if_t<kIsChoice<E>>>
const char* to_string(E value) {
  for (const Named<E>& n : choice_names(E{}))
    if (n.value == value) return n.name;
  return "?";
}

template <typename E>
std::optional<E> find_choice(std::string_view name) {
  for (const Named<E>& n : choice_names(E{}))
    if (name == n.name) return n.value;
  return std::nullopt;
}

// "fp32, tf32 or bf16".
template <typename E>
std::string choice_list() {
  const auto names = choice_names(E{});
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + std::string(names[i].name);
  return text;
}

// The value named `name`; throws std::invalid_argument "<what> must be fp32, tf32 or bf16 (got 'fp8')".
template <typename E>
E parse_choice(const std::string& name, const std::string& what) {
  if (const std::optional<E> value = find_choice<E>(name)) return *value;
  throw std::invalid_argument(what + " must be " + choice_list<E>() + " (got '" + name + "')");
}

}  // namespace ddplab

// Choices travel in JSON by name, and a stored name that is not one of them is refused rather than read as another.
namespace nlohmann {
template <typename E>
struct adl_serializer<E, std::enable_if_t<ddplab::kIsChoice<E>>> {
  static void to_json(json& j, E value) { j = ddplab::to_string(value); }
  static void from_json(const json& j, E& value) { value = ddplab::parse_choice<E>(j.get<std::string>(), "a stored choice"); }
};
}  // namespace nlohmann
