// Name parsers written as tables: a name a parser accepts and the value it stands for. Each parser's table
// is what it accepts and, in the same order, what its *_spellings() lists, so help texts and messages can
// never disagree with it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace embscale {

template <typename E>
struct Spelling {
  const char* name;
  E value;
};

template <typename E, size_t N>
bool parse_spelling(const Spelling<E> (&table)[N], const std::string& name, E* out) {
  for (const Spelling<E>& s : table) {
    if (name == s.name) {
      if (out) *out = s.value;
      return true;
    }
  }
  return false;
}

template <typename E, size_t N>
std::vector<std::string> spellings(const Spelling<E> (&table)[N]) {
  std::vector<std::string> names;
  for (const Spelling<E>& s : table) names.push_back(s.name);
  return names;
}

}  // namespace embscale
