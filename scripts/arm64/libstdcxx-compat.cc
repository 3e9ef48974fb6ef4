// std::ios_base_library_init() (GLIBCXX_3.4.32, GCC 13): since GCC 13,
// <iostream> no longer puts a static std::ios_base::Init object in every
// file that includes it; it references this symbol instead, which pulls the
// library's own initializer in. Bookworm's libstdc++ (GCC 12, GLIBCXX_3.4.30)
// has no such symbol, so define it here together with what GCC 12's
// <iostream> did: one static Init object, which sets up cout/cerr/cin.
// Referenced by lib_FoundationICU.a(ustream.cpp.o) only.
#include <ios>

namespace std {
void ios_base_library_init() {}
}

static std::ios_base::Init blecontrol_ios_init;
