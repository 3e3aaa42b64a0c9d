//! Every call the front door does not serve itself goes, unchanged, to the
//! daemon's grpc.aio server on a private unix socket: one HTTP/2 connection,
//! opened on first use and again after it breaks.

use std::path::PathBuf;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;
use tokio::sync::Mutex;

use crate::server::BoxError;

/// Metadata the front door sets on forwarded calls (a client's own values
/// are dropped): the caller's address, and a per-start key proving the
/// call came through the front door, so the daemon may believe the address.
pub const PEER_HEADER: &str = "x-stratad-front-peer";
pub const KEY_HEADER: &str = "x-stratad-front-key";

pub struct Backend {
    path: PathBuf,
    key: HeaderValue,
    sender: Mutex<Option<SendRequest<Incoming>>>,
}

impl Backend {
    pub fn new(path: PathBuf, key: &str) -> Result<Self, String> {
        let key = HeaderValue::from_str(key).map_err(|_| "front key must be printable ASCII")?;
        Ok(Backend {
            path,
            key,
            sender: Mutex::new(None),
        })
    }

    async fn sender(&self) -> Result<SendRequest<Incoming>, BoxError> {
        let mut slot = self.sender.lock().await;
        if let Some(sender) = slot.as_ref() {
            if !sender.is_closed() {
                return Ok(sender.clone());
            }
        }
        let stream = UnixStream::connect(&self.path).await?;
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        tokio::spawn(connection);
        *slot = Some(sender.clone());
        Ok(sender)
    }

    /// Forward `request` and return the backend's answer as it streams in.
    pub async fn forward(
        &self,
        mut request: Request<Incoming>,
        peer: &str,
    ) -> Result<Response<BoxBody<Bytes, BoxError>>, BoxError> {
        let headers = request.headers_mut();
        headers.remove(PEER_HEADER);
        headers.remove(KEY_HEADER);
        headers.insert(PEER_HEADER, HeaderValue::from_str(peer)?);
        headers.insert(KEY_HEADER, self.key.clone());
        let mut sender = self.sender().await?;
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        Ok(response.map(|body| body.map_err(BoxError::from).boxed()))
    }
}
