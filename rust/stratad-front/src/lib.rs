//! The native front door of stratad.
//!
//! Python's grpc.aio spends about as much CPU per call on HTTP/2 and gRPC
//! framing as stratad spends saving the state (docs/benchmarks.md). This
//! crate takes that part over for the hot RPCs: it serves HTTP/2 on the
//! daemon's public port with hyper, turns each call of a method listed in
//! [`FrontConfig::native_methods`] into [`Event`]s on one [`EventQueue`] that
//! the daemon drains in batches (raw request messages in, raw response
//! messages and a status out), and forwards every other request (health
//! checks, reflection, server streams, compressed calls) unchanged to the
//! daemon's grpc.aio server on a private unix socket ([`proxy`]).
//!
//! [`UnaryClient`] is the other direction: the Python SDK's blocking client
//! sends its unary calls through it (see `client.rs`).
//!
//! Nothing here knows a message type: requests and responses stay encoded
//! protobuf, decoded by the daemon, so there is one definition of every
//! message and one place (the daemon) where requests are checked.

mod call;
mod client;
mod grpc;
mod proxy;
mod server;

pub use call::{CallHandle, Event, EventKind, EventQueue, MetadataValue};
pub use client::{Target, UnaryClient, UnaryReply};
pub use grpc::Code;
pub use server::{Front, FrontConfig};
