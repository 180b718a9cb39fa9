# Library sources by layer (data flows down: common -> platform -> comm -> symm -> kvlayout, device -> kernels -> barrier -> the
# features publish, fetch, arena (side by side, never including each other) -> capi). docs/architecture.md draws it;
# tests/scripts/include_rules.py enforces it.
set(KVCOMM_SOURCES
    src/common/error.cpp
    src/common/env.cpp
    src/common/log.cpp
    src/common/socket.cpp
    src/common/listener.cpp
    src/common/wait_reporter.cpp
    src/platform/gpu_info.cpp
    src/platform/ibverbs.cpp
    src/platform/capabilities.cpp
    src/comm/agreement.cpp
    src/comm/health.cpp
    src/comm/wire.cpp
    src/comm/tcp_mesh.cpp
    src/comm/tcp_bootstrap.cpp
    src/comm/communicator.cpp
    src/comm/topology.cpp
    src/comm/parallel_groups.cpp
    src/symm/host_memory.cpp
    src/symm/fd_exchange.cpp
    src/symm/rendezvous.cpp
    src/symm/symmetric_buffer.cpp
    src/kvlayout/kv_layout.cpp
    src/kvlayout/kv_contents.cpp
    src/kvlayout/kv_conversion.cpp
    src/device/device_errors.cpp
    src/kernels/host_ops.cpp
    src/publish/host_transport.cpp
    src/barrier/barrier.cpp
    src/publish/publisher.cpp
    src/fetch/member_layouts.cpp
    src/fetch/planner.cpp
    src/fetch/transport/peer/peer_memory.cpp
    src/fetch/transport/peer/peer_transport.cpp
    src/fetch/transport/net/wire.cpp
    src/fetch/transport/negotiation.cpp
    src/fetch/transport/net/net_io.cpp
    src/fetch/transport/net/staged_io.cpp
    src/fetch/transport/tcp/tcp_server.cpp
    src/fetch/transport/tcp/tcp_transport.cpp
    src/fetch/transport/tcp/tcp_client.cpp
    src/fetch/transport/tcp/tcp_plugin.cpp
    src/fetch/transport/rdma/verbs_transport.cpp
    src/fetch/transport/rdma/rdma_connect.cpp
    src/fetch/transport/rdma/rdma_plugin.cpp
    src/fetch/transport/registry.cpp
    src/fetch/fetcher.cpp
    src/endpoint/metadata.cpp
    src/endpoint/memory_export.cpp
    src/endpoint/share_server.cpp
    src/endpoint/peer_mapping.cpp
    src/endpoint/peer_link.cpp
    src/endpoint/rdma_side.cpp
    src/endpoint/notify_wire.cpp
    src/endpoint/inbox.cpp
    src/endpoint/notifier.cpp
    src/endpoint/endpoint.cpp
    src/endpoint/convert_program.cpp
    src/endpoint/converted_read.cpp
    src/arena/protocol.cpp
    src/arena/capability_table.cpp
    src/arena/arena_memory.cpp
    src/arena/session.cpp
    src/arena/reactor.cpp
    src/arena/owned_arena.cpp
    src/arena/imported_arena.cpp
    src/arena/arena.cpp
    src/arena/arena_import.cpp
    src/arena/arena_server.cpp
    src/capi/error.cpp
    src/capi/kv_layout.cpp
    src/capi/polled_status.cpp
    src/capi/bootstrap.cpp
    src/capi/communicator.cpp
    src/capi/parallel_groups.cpp
    src/capi/buffer.cpp
    src/capi/publisher.cpp
    src/capi/barrier.cpp
    src/capi/fetch.cpp
    src/capi/arena.cpp
    src/capi/endpoint.cpp
    src/capi/conversion.cpp)

# Compiled only with the CUDA backend.
set(KVCOMM_CUDA_SOURCES
    src/platform/cuda_driver.cpp
    src/symm/cuda_memory.cpp
    src/kernels/publish.cu
    src/kernels/barrier.cu
    src/kernels/fetch.cu
    src/kernels/pieces.cu
    src/kernels/dependent_launch.cu
    src/fetch/device_copy.cpp
    src/fetch/checked_launch.cpp
    src/fetch/transport/rdma/gpu_direct.cpp
    src/device/device_memory.cpp
    src/device/launch_limits.cpp
    src/arena/cuda_support.cpp)

# CUDA builds with nccl.h: the fallback's NCCL transport.
set(KVCOMM_NCCL_SOURCES
    src/platform/nccl.cpp
    src/publish/nccl_transport.cpp)

# Stand-ins for the CUDA entry points in a build without CUDA.
set(KVCOMM_NO_CUDA_SOURCES
    src/symm/no_cuda.cpp
    src/kernels/no_cuda.cpp
    src/fetch/no_cuda.cpp
    src/device/no_cuda.cpp
    src/arena/no_cuda.cpp)

# Stand-in for the NCCL transport where NCCL is not part of the build (CUDA or not).
set(KVCOMM_NO_NCCL_SOURCES
    src/publish/no_nccl.cpp)
