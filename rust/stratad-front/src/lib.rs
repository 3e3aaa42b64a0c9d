//! The native front door of stratad.
//!
//! Python's grpc.aio spends about as much CPU per call on HTTP/2 and gRPC
//! framing as stratad spends saving the state (docs/benchmarks.md). This
//! crate takes that part over for every call: it serves HTTP/2 (plaintext,
//! TLS or mTLS with rustls) on the daemon's TCP listeners, and on its unix
//! sockets (through the header relay of `unix.rs`), with hyper, and turns
//! each call
//! of a method listed in [`FrontConfig::methods`] into [`Event`]s on one
//! [`EventQueue`] that the daemon drains in batches (raw request messages
//! in, raw response messages and a status out). Every method of every shape
//! (unary, client, server and bidi streaming) is served that way: nothing is
//! forwarded, so no call shares a connection with another client's.
//!
//! [`UnaryClient`] is the other direction: the Python SDK's blocking client
//! sends its unary calls through it (see `client.rs`).
//!
//! Nothing here knows a message type: requests and responses stay encoded
//! protobuf, decoded by the daemon, so there is one definition of every
//! message and one place (the daemon) where requests are checked.

mod activity;
mod answers;
mod call;
mod client;
mod connection;
mod grpc;
mod rpc;
mod server;
mod shared;
mod status;
mod tls;
mod unix;

pub use call::{CallHandle, Event, EventKind, EventQueue, Peer};
pub use client::{Target, UnaryClient, UnaryReply};
pub use server::{Front, FrontConfig};
pub use shared::EdgeLimits;
pub use status::{Code, MetadataValue};
pub use tls::TlsFiles;
