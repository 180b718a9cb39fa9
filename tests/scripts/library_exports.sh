#!/usr/bin/env bash
# What the shared libraries export (they are built with hidden visibility, include/kvcomm/api.hpp):
#   - libkvcomm: the public API (a sample of it must be there), and of kvcomm::detail only the internal entry points
#     that src/common/internal_api.hpp lists; nothing from the static CUDA runtime;
#   - libkvcomm_mpi: kvcomm::MpiBootstrap only.
#   library_exports.sh LIBKVCOMM [LIBKVCOMM_MPI]
set -uo pipefail
lib=$1 mpi=${2:-}
status=0
command -v nm >/dev/null || { echo "SKIPPED: nm (binutils) is not installed"; exit 77; }
exported() { nm -DC --defined-only "$1" | sed 's/^[0-9a-f]* [A-Za-z] //' | sort -u; }
# The deliberate internal exports (keep in step with src/common/internal_api.hpp).
allowed='^kvcomm::detail::(RankScope::RankScope|RankScope::~RankScope|currentRank|formatMessage|throwError|throwSystem|logLine|cudaDriver|requireCudaDriver|cuResultText|throwCu|currentGpu|FdServer::instance|FdServer::offer|FdServer::retire|FdServer::liveTokens|fetchFds)[[(]'
all=$(exported "$lib")
detail=$(grep -E '^(typeinfo for |typeinfo name for |vtable for )?kvcomm::detail::' <<<"$all")
unexpected=$(grep -vE "$allowed" <<<"$detail" || true)
if [ -n "$unexpected" ]; then
  echo "FAIL: libkvcomm exports kvcomm::detail symbols that src/common/internal_api.hpp does not list:"
  sed 's/^/  /' <<<"$unexpected" | head -40
  status=1
else
  echo "ok   libkvcomm exports $(grep -c . <<<"$detail") kvcomm::detail symbols, all on the internal list"
fi
for sym in 'kvcomm::Communicator::create(' 'kvcomm::SymmetricBuffer::create(' 'kvcomm::Publisher::create(' \
           'kvcomm::TcpBootstrap::createUniqueId(' 'kvcomm::capabilities()' 'kvcomm::version()' \
           'typeinfo for kvcomm::Error' 'typeinfo for kvcomm::NetworkError' 'typeinfo for kvcomm::Bootstrap' \
           'kvcomm::Topology::toString' 'kvcomm::ParallelGroups::create('; do
  grep -qF -- "$sym" <<<"$all" || { echo "FAIL: libkvcomm does not export $sym"; status=1; }
done
[ "$status" = 0 ] && echo "ok   libkvcomm exports the public API ($(grep -c '^kvcomm::' <<<"$all") kvcomm:: symbols)"
cuda=$(grep -E '^(cuda|__cuda|cu[A-Z])' <<<"$all" | head -5)
[ -z "$cuda" ] || { echo "FAIL: libkvcomm exports CUDA runtime symbols: $cuda"; status=1; }
if [ -n "$mpi" ]; then
  other=$(exported "$mpi" | grep 'kvcomm' | grep -v 'kvcomm::MpiBootstrap')
  if [ -n "$other" ]; then echo "FAIL: libkvcomm_mpi exports more than MpiBootstrap:"; echo "$other"; status=1
  else echo "ok   libkvcomm_mpi exports kvcomm::MpiBootstrap only"; fi
fi
exit $status
