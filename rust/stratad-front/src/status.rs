//! The gRPC vocabulary the rest of the crate shares: status codes, a call's
//! final status with its trailers, and metadata values. It depends on no
//! other module here, so that calls (`call.rs`), the wire format
//! (`grpc.rs`), the answer budget (`answers.rs`) and the client all use it
//! without depending on each other.

/// gRPC status codes (the ones this crate answers with itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

/// A metadata value as gRPC defines it: text, or bytes for `-bin` keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataValue {
    Text(String),
    Binary(Vec<u8>),
}

/// A final status with its trailing metadata.
#[derive(Debug, Clone)]
pub(crate) struct Status {
    pub code: u32,
    pub message: String,
    pub trailers: Vec<(String, MetadataValue)>,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Status {
            code: code as u32,
            message: message.into(),
            trailers: Vec::new(),
        }
    }
}
