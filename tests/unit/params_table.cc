// Prints the README's table of OPTIREDUCE_* variables, generated from transport/params.cc.
#include <cstdio>

#include "transport/params.h"

int main() {
  std::fputs(optireduce::params_markdown_table().c_str(), stdout);
  return 0;
}
