// Shared by the HDF5 fuzz targets: the input bytes as an HDF5 file held in memory (core driver, no backing
// store), so an input costs no disk I/O and leaves nothing behind.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace ddplab::fuzz {

// libhdf5 1.10.8 (Debian 12) loops forever parsing a global heap collection ("GCOL", where variable-length
// strings live) whose free-space object (index 0) has size 0: H5HG__cache_heap_deserialize advances by that
// size. Our readers cannot guard against it (it happens inside H5Aread/H5Dread), so such inputs are set aside
// (docs/FUZZING.md, tests/fuzz/known_hdf5_crashes/) rather than stopping every fuzzing run at the same hang.
// This walks every collection the way libhdf5 does and reports one where the walk would not move forward.
inline bool hangs_libhdf5(const uint8_t* data, size_t size) {
  auto u64 = [&](size_t at) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = v << 8 | data[at + i];
    return v;
  };
  for (size_t at = 0; at + 16 <= size; ++at) {
    if (data[at] != 'G' || data[at + 1] != 'C' || data[at + 2] != 'O' || data[at + 3] != 'L') continue;
    const uint64_t end = at + u64(at + 8);  // the collection's size, header included
    for (uint64_t p = at + 16; p < end && p + 16 <= end && p + 16 <= size;) {
      const unsigned index = data[p] | data[p + 1] << 8;
      const uint64_t object = u64(p + 8);
      const uint64_t next = p + (index > 0 ? 16 + ((object + 7) & ~uint64_t{7}) : object);
      if (next <= p) return true;
      p = next;
    }
  }
  return false;
}

// Returns a file id, or a negative id when HDF5 refuses the bytes (then there is nothing to read).
inline hid_t open_image(const uint8_t* data, size_t size) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  if (size == 0) return -1;  // without an image the core driver would read the named file from disk
  if (hangs_libhdf5(data, size)) return -1;
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_core(fapl, 1 << 16, /*backing_store=*/0);
  H5Pset_file_image(fapl, const_cast<uint8_t*>(data), size);  // HDF5 copies the buffer
  const hid_t file = H5Fopen("fuzz-input.h5", H5F_ACC_RDONLY, fapl);
  H5Pclose(fapl);
  return file;
}

// Closes the file and checks that the reader closed every object it opened: a leaked id keeps the whole file
// (here, its in-memory copy) open, once per input.
inline void close_image(hid_t file) {
  H5Fclose(file);
  const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (open != 0) {
    std::fprintf(stderr, "fuzz: %zd HDF5 objects left open by the reader\n", open);
    std::abort();
  }
}

}  // namespace ddplab::fuzz
