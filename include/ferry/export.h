// FERRY_EXPORT marks ferry's public API. libferry is built with hidden visibility
// (-fvisibility=hidden -fvisibility-inlines-hidden), so only classes and functions that carry
// it appear in libferry.so's dynamic symbol table; everything in src/ stays internal and can
// change without breaking a program linked against the library.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define FERRY_EXPORT [[gnu::visibility("default")]]
#else
#define FERRY_EXPORT
#endif
