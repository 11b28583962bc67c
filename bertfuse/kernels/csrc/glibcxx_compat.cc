// Keeps the library within manylinux_2_28's libstdc++ (symbol versions up to GLIBCXX_3.4.24,
// GCC 8's), whichever g++ nvcc calls: the platform wheel's build checks it
// (bertfuse/kernels/prebuild.py), linking the system's libstdc++ dynamically.
//
// GCC 11 and newer headers make std::allocator and new[] call
// std::__throw_bad_array_new_length(), a libstdc++ function of GLIBCXX_3.4.29; this hidden
// copy, defined as libstdc++ defines it, is the one the library binds to. (Likewise
// std::ostringstream's default constructor is GLIBCXX_3.4.26: common.h constructs it with
// an explicit ios_base::out, a constructor every C++11-ABI libstdc++ has.) Linking libstdc++
// statically instead would pull in glibc symbols of 2.32 to 2.36 from its archive.
//
// Weak: a toolchain whose g++ links libstdc++.a (a host's own cache build did, with GCC 13)
// brings its own strong copy from the archive, which then wins instead of clashing ("multiple
// definition of std::__throw_bad_array_new_length()" stopped that link).
#include <new>

namespace std {
[[noreturn]] __attribute__((weak, visibility("hidden"))) void __throw_bad_array_new_length() {
    throw bad_array_new_length();
}
}  // namespace std
