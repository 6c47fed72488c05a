// Runs a shell command for the CLI-level tests and returns its exit code and combined
// stdout+stderr (shared by test_cli and test_resume).
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <string>

struct CommandResult {
  int code = -1;
  std::string out;
};

inline CommandResult run_command(const std::string& shell_cmd) {
  CommandResult r;
  FILE* p = popen((shell_cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}
