//! The wire contract: the `Flower` gRPC service and the task/notice messages the
//! bus carries between coordinators and workers.
//!
//! Leaf crate: generated types only, no I/O and no behaviour. Anything that
//! interprets these messages lives with its caller.

pub mod codec;

/// `flower.v1`: generated from `proto/flower/v1/flower.proto`.
#[allow(clippy::all, clippy::unwrap_used, clippy::expect_used)]
pub mod v1 {
    tonic::include_proto!("flower.v1");
}

/// The encoded descriptor set of `flower.v1` (for gRPC reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("flower_descriptor");
