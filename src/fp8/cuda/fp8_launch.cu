// The range split used by every FP8 launcher and the two-stage workspace check (fp8_launch.cuh).
#include <algorithm>
#include <string>

#include "fp8/cuda/fp8_launch.cuh"

namespace embscale {
namespace cuda {

Status check_amax_slots(const void* ws, const char* op) {
  if (ws == nullptr || reinterpret_cast<uintptr_t>(ws) % 4 != 0) {
    return invalid_argument(std::string(op) + ": workspace must be non-null and 4-byte aligned for two_stage");
  }
  return Status::Ok();
}

RangeSplit make_split(const void* in, size_t in_size, int64_t n, const void* out, size_t out_size) {
  RangeSplit s;
  s.n = n;
  const auto in_addr = reinterpret_cast<uintptr_t>(in);
  const auto out_addr = reinterpret_cast<uintptr_t>(out);
  s.in_aligned = in_addr % in_size == 0;
  s.out_aligned = out == nullptr || out_addr % out_size == 0;
  s.head = n;
  s.nvec = 0;
  s.tail_begin = n;
  if (!s.in_aligned || !s.out_aligned) return s;
  const int64_t per_vec = static_cast<int64_t>(Arch::kVectorBytes / in_size);
  const int64_t head =
      std::min<int64_t>(n, static_cast<int64_t>((Arch::kVectorBytes - in_addr % Arch::kVectorBytes) %
                                                Arch::kVectorBytes / in_size));
  const int64_t nvec = (n - head) / per_vec;
  if (nvec <= 0) return s;
  if (out != nullptr) {
    const size_t align = std::min<size_t>(Arch::kVectorBytes, static_cast<size_t>(per_vec) * out_size);
    if ((out_addr + static_cast<uintptr_t>(head) * out_size) % align != 0) return s;
  }
  s.head = head;
  s.nvec = nvec;
  s.tail_begin = head + nvec * per_vec;
  return s;
}

}  // namespace cuda
}  // namespace embscale
