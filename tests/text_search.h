// What a command printed, searched: whether a text holds a piece, and how often. Shared by the
// tests that judge a run by its output (test_ckpt_failures, test_mpi_faults, ...).
#pragma once
#include <string>

inline bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

// How many times `needle` occurs in `s`, overlapping occurrences included.
inline int count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}
