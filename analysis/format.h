// printf into a std::string, for the analysis' lines of text.
#pragma once
#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ddplab {

inline std::string fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));
inline std::string fmt(const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  // Measured first: a line may hold a path of any length (a blame hint names the run file).
  std::string text(static_cast<size_t>(std::max(0, std::vsnprintf(nullptr, 0, format, args))), '\0');
  va_end(args);
  std::vsnprintf(text.data(), text.size() + 1, format, again);
  va_end(again);
  return text;
}

// The unit of bucket caps (--bucket-mb) and of every size the analysis prints in "MiB".
inline constexpr double kMiB = 1024.0 * 1024.0;

// A size in the largest binary unit it reaches, as --bucket-mb counts: "147.3 MiB", "6.8 KiB", "400 B".
inline std::string size_text(int64_t bytes) {
  if (bytes >= 1024 * 1024) return fmt("%.1f MiB", bytes / kMiB);
  if (bytes >= 1024) return fmt("%.1f KiB", bytes / 1024.0);
  return fmt("%lld B", static_cast<long long>(bytes));
}

// A time in ms, or `none` for a counter the kernel does not keep (-1; runtime/cpu_taken.h): "1.25", "-".
inline std::string counted_ms(double ms, const char* none) { return ms >= 0 ? fmt("%.2f", ms) : std::string(none); }

// "1 step", "5 steps".
inline std::string counted(int n, const char* noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

}  // namespace ddplab
