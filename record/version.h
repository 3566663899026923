// The version of ddplab, stamped into every run file and checkpoint (with the git commit the build came from).
#pragma once

namespace ddplab {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace ddplab
