// Test helper for pickle_python_test.py: reads one pickle from stdin with ckptfs's reader and
// writes the tree back to stdout with ckptfs's writer, so that Python can check that what comes
// out unpickles to an object equal to what went in.
//
//   pickle_roundtrip_tool PROTOCOL      exit 0: written; 1: the reader refused (message on stderr)
//   pickle_roundtrip_tool --debug       prints pickle::Debug of the tree instead
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>

#include "formats/pickle.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PROTOCOL|--debug < in.pkl > out.pkl\n", argv[0]);
    return 2;
  }
  std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  size_t consumed = 0;
  auto tree = ckptfs::pickle::Read(in, &consumed);
  if (!tree.ok()) {
    std::fprintf(stderr, "%s\n", tree.status().ToString().c_str());
    return 1;
  }
  if (std::strcmp(argv[1], "--debug") == 0) {
    std::cout << ckptfs::pickle::Debug(*tree, 1 << 20) << "\n";
    return 0;
  }
  auto out = ckptfs::pickle::Write(*tree, std::atoi(argv[1]));
  if (!out.ok()) {
    std::fprintf(stderr, "%s\n", out.status().ToString().c_str());
    return 1;
  }
  std::cout.write(out->data(), static_cast<std::streamsize>(out->size()));
  return std::cout.good() ? 0 : 1;
}
