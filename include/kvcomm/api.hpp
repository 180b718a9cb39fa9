// kvcomm: which symbols the shared libraries export.
//
// libkvcomm and libkvcomm_mpi are compiled with -fvisibility=hidden (and hidden inline functions): a symbol is part
// of their binary interface only when its declaration says so with KVCOMM_API. Everything else stays inside the
// library, so internals can change without breaking engines, and cannot clash with an engine's own symbols.
//
// How to use it (STYLE, for every public header, including the ones added later):
//   - Mark with KVCOMM_API every class or struct declared in include/kvcomm/ that has a member defined in the
//     library (a .cpp/.cu: constructors, destructors, static or virtual members, out-of-line methods):
//         class KVCOMM_API Communicator { ... };
//         struct KVCOMM_API Topology { ... bool allPeerAccess() const; ... };
//   - Mark every function declared there and defined in the library:
//         KVCOMM_API const Capabilities& capabilities();
//   - Mark every exception class and every class with virtual functions, even when all its members are inline:
//     their type information must be one object across the library boundary, or `catch (const kvcomm::Error&)`
//     in an engine and dynamic_cast between libraries stop working.
//   - Do not mark: functions and templates defined inline in the header, structs and enums without out-of-line
//     members, constexpr values, and the device API (include/kvcomm/device/, header-only, also compiled by nvcc).
//   - Nothing under src/ uses KVCOMM_API. The few internal entry points that kvcomm's own libraries and tests share
//     are marked KVCOMM_INTERNAL_API (src/common/internal_api.hpp lists them); they are not API.
//   - Checks: library.exports fails when libkvcomm exports a kvcomm::detail symbol that is not on that list, or
//     lacks a sample of the public API; package.consumer builds a program against the installed package that uses
//     the API from outside (and catches a kvcomm::Error thrown inside the library); every program in this
//     repository except the unit tests links the shared libraries, so a public symbol left unmarked fails to link.
#pragma once

#if defined(_WIN32)
#define KVCOMM_API
#else
#define KVCOMM_API __attribute__((visibility("default")))
#endif
