#include "runtime/agreement.h"

#include <cstdint>

namespace ddplab {

std::string disagreement(const std::vector<std::pair<std::string, std::string>>& fields, MPI_Comm comm) {
  // The values, each ended by '\0' (names are the same on every rank), hashed (FNV-1a): MAX of {h, ~h} on every
  // rank equals its own exactly when all agree.
  std::string text;
  for (const auto& field : fields) text += field.second + '\0';
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  const uint64_t mine[2] = {h, ~h};
  uint64_t most[2];
  MPI_Allreduce(mine, most, 2, MPI_UINT64_T, MPI_MAX, comm);
  int differs = most[0] != mine[0] || most[1] != mine[1];
  MPI_Allreduce(MPI_IN_PLACE, &differs, 1, MPI_INT, MPI_MAX, comm);
  if (!differs) return "";
  int size = 1;
  MPI_Comm_size(comm, &size);
  const int length = static_cast<int>(text.size());
  std::vector<int> lengths(size), displs(size);
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm);
  for (int r = 1; r < size; ++r) displs[r] = displs[r - 1] + lengths[r - 1];
  std::string all(static_cast<size_t>(displs[size - 1] + lengths[size - 1]), '\0');
  MPI_Allgatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR, comm);
  const auto value = [&](int rank, size_t field) {  // the field-th '\0'-ended value in rank's text
    size_t at = static_cast<size_t>(displs[rank]);
    for (size_t f = 0; f < field; ++f) at = all.find('\0', at) + 1;
    return std::string(all.c_str() + at);
  };
  std::string differing;
  for (size_t f = 0; f < fields.size(); ++f) {
    for (int r = 1; r < size; ++r) {
      if (value(r, f) == value(0, f)) continue;
      differing += (differing.empty() ? "" : ", ") + fields[f].first + " (rank 0: " + value(0, f) + ", rank " +
                   std::to_string(r) + ": " + value(r, f) + ")";
      break;
    }
  }
  return differing;
}

std::vector<std::string> gather_strings(const std::string& mine, MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  constexpr int kLen = MPI_MAX_PROCESSOR_NAME;
  std::vector<char> padded(kLen, '\0'), all(static_cast<size_t>(size) * kLen);
  mine.copy(padded.data(), kLen - 1);
  MPI_Allgather(padded.data(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm);
  std::vector<std::string> strings;
  for (int r = 0; r < size; ++r) strings.emplace_back(all.data() + static_cast<size_t>(r) * kLen);
  return strings;
}

}  // namespace ddplab
