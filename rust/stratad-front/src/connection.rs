//! One client connection: its TLS handshake or HTTP/2 preface, its HTTP/2
//! settings, and when it is closed (idle, shutdown).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::activity::Activity;
use crate::answers::ConnectionAnswers;
use crate::call::Peer;
use crate::rpc;
use crate::shared::OpenConnection;

/// HTTP/2 flow-control windows: a client may send this much on one call, and
/// on all its calls together, before the daemon has read it.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 8 << 20;
/// A client has this long from connecting to finishing its TLS handshake,
/// or to sending the HTTP/2 connection preface on plaintext.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// What every HTTP/2 client sends first.
pub(crate) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// How long an idle connection told GOAWAY has to acknowledge it (h2 waits
/// for a PING round trip) before it is cut: a client that never reads must
/// not keep its descriptor.
const GOAWAY_GRACE: Duration = Duration::from_secs(10);
/// The header list h2 itself accepts: above `max_header_bytes` and up to
/// this, a call gets RESOURCE_EXHAUSTED from rpc.rs (a gRPC status clients
/// understand); above this h2 answers HTTP 431 before a call exists.
pub(crate) const HEADER_LIST_HARD_LIMIT: u32 = 256 << 10;

/// Serve a connection just accepted: after its TLS handshake if TLS is on,
/// else once its HTTP/2 preface arrived (either failing or taking longer
/// than HANDSHAKE_TIMEOUT closes it).
pub(crate) async fn serve_accepted(
    io: TcpStream,
    address: String,
    open: OpenConnection,
    stopped: watch::Receiver<bool>,
) {
    let Some(certificates) = &open.0.tls else {
        if preface_arrives(&io).await {
            let peer = Arc::new(Peer {
                address,
                certificate: None,
            });
            serve_connection(io, peer, open, stopped).await;
        }
        return;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(certificates.current());
    let Ok(Ok(io)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await else {
        return;
    };
    let certificate = io
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|cert| bytes::Bytes::copy_from_slice(cert.as_ref()));
    let peer = Arc::new(Peer {
        address,
        certificate,
    });
    serve_connection(io, peer, open, stopped).await;
}

/// Wait (up to HANDSHAKE_TIMEOUT) for a plaintext client's HTTP/2 preface.
/// A client that sends something else is told so with a GOAWAY (after the
/// empty SETTINGS that is the server's own preface) and closed after its
/// bytes are read, so it gets the message rather than a TCP reset.
async fn preface_arrives(io: &TcpStream) -> bool {
    let mut seen = [0u8; 24];
    let peeked = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        loop {
            let n = io.peek(&mut seen).await?;
            if n == 0 || n >= PREFACE.len() || seen[..n] != PREFACE[..n] {
                return std::io::Result::Ok(n);
            }
            // Part of the preface: peek returns at once while bytes wait.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    match peeked {
        Ok(Ok(n)) if n >= PREFACE.len() && seen == *PREFACE => true,
        Ok(Ok(n)) if n > 0 => {
            refuse(io).await;
            false
        }
        _ => false,
    }
}

/// An empty SETTINGS (the server's preface), then a GOAWAY saying why.
pub(crate) fn goaway_not_http2() -> Vec<u8> {
    const DEBUG: &[u8] = b"not an HTTP/2 connection preface: this port serves gRPC";
    let mut frames = vec![0, 0, 0, 4, 0, 0, 0, 0, 0]; // SETTINGS, empty
    let length = (8 + DEBUG.len()) as u32;
    frames.extend_from_slice(&length.to_be_bytes()[1..]);
    frames.extend_from_slice(&[7, 0, 0, 0, 0, 0]); // GOAWAY, stream 0
    frames.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1]); // last stream 0, PROTOCOL_ERROR
    frames.extend_from_slice(DEBUG);
    frames
}

async fn refuse(io: &TcpStream) {
    let frames = goaway_not_http2();
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut written = 0;
        while written < frames.len() {
            io.writable().await?;
            match io.try_write(&frames[written..]) {
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        let mut sink = [0u8; 4096];
        loop {
            io.readable().await?;
            match io.try_read(&mut sink) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await;
}

pub(crate) async fn serve_connection<IO>(
    io: IO,
    peer: Arc<Peer>,
    open: OpenConnection,
    mut stopped: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let shared = open.0.clone();
    let limits = shared.limits.clone();
    let activity = Arc::new(Activity::default());
    let calls = activity.clone();
    let answers = ConnectionAnswers::new(shared.answers.clone());
    let service = service_fn(move |request| {
        let (shared, peer, answers) = (shared.clone(), peer.clone(), answers.clone());
        let busy = calls.begin();
        async move {
            let response = rpc::handle(request, shared, peer, answers, busy).await;
            Ok::<_, Infallible>(response)
        }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    // Fixed windows, not BDP probing: probing pings every connection while it
    // ramps up, which costs both sides CPU on the first thousands of calls.
    builder
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(limits.max_streams_per_connection)
        .max_header_list_size(HEADER_LIST_HARD_LIMIT);
    // Streams a client may reset before they are taken up stay at h2's
    // default (20, then GOAWAY): raised to 1,024, a rapid-reset
    // flood (HEADERS + RST_STREAM, 200k pairs) went on uncut and its calls
    // piled up in the event queue (RSS ~1 GB; tests/hostile/test_floods.py),
    // while 400 calls with a 1 ms deadline never reached 20 (test_legit_load.py).
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = stopped.changed() => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
        _ = activity.idle_for(limits.idle_timeout) => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(GOAWAY_GRACE, connection).await;
        }
    }
    drop(open);
}
