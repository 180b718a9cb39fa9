// Minimal leveled logging to stderr (destructors log instead of throwing).
#pragma once

#include "common/check.hpp"
#include "common/internal_api.hpp"

namespace kvcomm::detail {
KVCOMM_INTERNAL_API void logLine(int level, const std::string& text);
}  // namespace kvcomm::detail

#define KVCOMM_WARN(...) ::kvcomm::detail::logLine(1, ::kvcomm::detail::cat(__VA_ARGS__))
#define KVCOMM_INFO(...) ::kvcomm::detail::logLine(2, ::kvcomm::detail::cat(__VA_ARGS__))
#define KVCOMM_DEBUG(...) ::kvcomm::detail::logLine(3, ::kvcomm::detail::cat(__VA_ARGS__))
