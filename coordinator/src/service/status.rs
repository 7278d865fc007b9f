//! The one place errors become gRPC statuses.

use flower_store::StoreError;
use tonic::Status;

pub fn from_store(e: StoreError) -> Status {
    match e {
        StoreError::NotFound(what) => Status::not_found(format!("{what} not found")),
        StoreError::Ambiguous(what) => Status::invalid_argument(format!("`{what}` matches several jobs")),
        StoreError::Conflict(m) => Status::failed_precondition(m),
        StoreError::Fenced { .. } => Status::aborted(e.to_string()),
        StoreError::Backend(m) => Status::unavailable(format!("storage: {m}")),
        StoreError::Corrupt(m) => Status::internal(format!("stored data: {m}")),
    }
}

/// A required id field, parsed, or `InvalidArgument` naming the field.
pub fn parse_id<T: std::str::FromStr>(field: &str, value: &str) -> Result<T, Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field}: required")));
    }
    value.parse().map_err(|_| Status::invalid_argument(format!("{field}: `{value}` is not a valid id")))
}
