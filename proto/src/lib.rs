//! The wire contract: the `Flower` gRPC service and the task/notice messages the
//! bus carries between coordinators and workers.
//!
//! Generated types and their conversions from and to the domain's
//! ([`convert`]); no I/O and no behaviour. Anything that interprets these
//! messages lives with its caller.
//!
//! Version: `flower.v1` grows compatibly. Typed fields were added beside the
//! strings older clients read (`Job.job_state` beside `Job.state`,
//! `Session.session_role` beside `role`, `JobEvent.detail` beside
//! `payload_json`, `TaskEnded.task_state` and `usage` beside `state` and
//! `usage_json`): senders fill both, readers prefer the typed field and fall
//! back to the string from an older sender.
// Tests may be long; the code they test may not (clippy.toml).
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod codec;
pub mod convert;

/// `flower.v1`: generated from `proto/flower/v1/flower.proto`.
#[allow(clippy::all, clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]
pub mod v1 {
    tonic::include_proto!("flower.v1");
}

/// The encoded descriptor set of `flower.v1` (for gRPC reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("flower_descriptor");
