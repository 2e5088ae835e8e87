// The one way an op carves the caller's workspace (the buffer its *_workspace_size query sized):
// a WorkspaceLayout of slices, each starting at a multiple of kAlign bytes from the layout's base.
// An op builds its layout with one function of its arguments, once per call; the size query returns
// that layout's size() and the call carves the same layout, so the two cannot disagree. Plain C++17
// (.cu files include it too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "embscale/context.h"
#include "embscale/status.h"

namespace embscale {

// Where a slice lies: `offset` bytes after the layout's base, `bytes` long.
struct WorkspaceSlice {
  size_t offset = 0;
  size_t bytes = 0;
};

class WorkspaceLayout {
 public:
  static constexpr size_t kAlign = 256;

  // Where the layout's base is in the caller's buffer: kAsGiven, at its first byte; kAligned, at its
  // first kAlign-aligned byte, so the buffer may start anywhere (size() adds kAlign bytes of slack).
  enum class Base { kAsGiven, kAligned };

  explicit WorkspaceLayout(Base base) : base_(base) {}

  // Appends a slice of `bytes` bytes (0 is allowed: an empty slice at the current end).
  WorkspaceSlice add(size_t bytes) {
    const WorkspaceSlice s{end_, bytes};
    end_ = align_up(end_ + bytes);
    return s;
  }

  // Bytes the caller must provide: 0 when every slice is empty, else the slices (each rounded up to
  // kAlign) and, with Base::kAligned, kAlign bytes of slack.
  size_t size() const { return end_ == 0 ? 0 : end_ + (base_ == Base::kAligned ? kAlign : 0); }

  // The size check of a call (check_workspace below) against this layout's size().
  Status check(const Context& ctx, const void* ws, size_t ws_bytes, const char* size_query,
               detail::KnownPointers* known = nullptr) const;

  // Slice s of the caller's buffer ws (which check() accepted), as T*.
  template <typename T>
  T* at(void* ws, WorkspaceSlice s) const {
    char* base = static_cast<char*>(ws);
    if (base_ == Base::kAligned) base = reinterpret_cast<char*>(align_up(reinterpret_cast<uintptr_t>(ws)));
    return reinterpret_cast<T*>(base + s.offset);
  }

  static constexpr size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

 private:
  Base base_;
  size_t end_ = 0;
};

// The size check of a call that needs `need` bytes: kWorkspaceTooSmall below it (naming `size_query`, the
// function that gives the size), a null buffer when need > 0, or memory the context's backend cannot
// use (a handle's `known` pointers as in check::memory). Every op's workspace check (layouts' and the FP8
// ops', whose backends size their own) is this one.
inline Status check_workspace(const Context& ctx, const void* ws, size_t ws_bytes, size_t need, const char* size_query,
                              detail::KnownPointers* known = nullptr) {
  if (ws_bytes < need)
    return workspace_too_small("workspace_bytes: " + std::to_string(ws_bytes) + " bytes; " + size_query +
                               " asks for " + std::to_string(need));
  if (need == 0) return Status::Ok();
  if (ws == nullptr) return invalid_argument("workspace: null, but " + std::to_string(need) + " bytes are needed");
  return check::memory(ctx, "workspace", ws, known);
}

inline Status WorkspaceLayout::check(const Context& ctx, const void* ws, size_t ws_bytes, const char* size_query,
                                     detail::KnownPointers* known) const {
  return check_workspace(ctx, ws, ws_bytes, size(), size_query, known);
}

}  // namespace embscale
