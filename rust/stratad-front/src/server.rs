//! The HTTP/2 server: binds the listeners, accepts connections and serves
//! every call on them through the event queue (rpc.rs).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};

use crate::answers::AnswerBudget;
use crate::call::EventQueue;
use crate::connection::serve_accepted;
use crate::shared::{EdgeLimits, OpenConnection, Shared};
use crate::tls::{Certificates, TlsFiles};
use crate::unix::serve_unix;

pub struct FrontConfig {
    /// Where to listen: `host:port` (port 0: any free port) or `unix:PATH`
    /// (the path must not exist; always plaintext: who may connect is a
    /// matter of the socket file's permissions; unix.rs).
    pub listen: Vec<String>,
    /// Serve TLS (mTLS with a client CA) on every TCP listener; None: plaintext.
    pub tls: Option<TlsFiles>,
    /// Every method served, `/package.Service/Method`, with whether its
    /// requests are a stream (client or bidi streaming). Others are
    /// UNIMPLEMENTED.
    pub methods: Vec<(String, bool)>,
    /// Largest request message accepted (compressed and decompressed).
    pub max_message_bytes: usize,
    /// Most calls in progress at once (0: no limit).
    pub max_concurrent_calls: usize,
    pub limits: EdgeLimits,
    pub worker_threads: usize,
}

/// A running front door. Dropping it stops it (without draining).
pub struct Front {
    runtime: Option<tokio::runtime::Runtime>,
    stop: watch::Sender<bool>,
    ports: Vec<u16>,
    queue: Arc<EventQueue>,
    shared: Arc<Shared>,
}

impl Front {
    /// Bind every `config.listen` address and start serving on background threads.
    pub fn start(config: FrontConfig) -> std::io::Result<Front> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.worker_threads.max(1))
            .thread_name("stratad-front")
            .enable_all()
            .build()?;
        let listeners = {
            let _guard = runtime.enter();
            config
                .listen
                .iter()
                .map(|address| bind(address))
                .collect::<std::io::Result<Vec<_>>>()?
        };
        let ports = listeners
            .iter()
            .map(Listener::port)
            .collect::<std::io::Result<Vec<_>>>()?;
        let tls = config
            .tls
            .map(Certificates::load)
            .transpose()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let queue = Arc::new(EventQueue::new()?);
        let shared = Arc::new(Shared {
            answers: AnswerBudget::new(config.limits.max_answer_bytes),
            tls,
            methods: config.methods.into_iter().collect(),
            queue: queue.clone(),
            max_message_bytes: config.max_message_bytes,
            slots: (config.max_concurrent_calls > 0)
                .then(|| Arc::new(Semaphore::new(config.max_concurrent_calls))),
            limits: config.limits,
            connections: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        });
        let (stop, stopped) = watch::channel(false);
        for listener in listeners {
            runtime.spawn(accept_loop(listener, shared.clone(), stopped.clone()));
        }
        Ok(Front {
            runtime: Some(runtime),
            stop,
            ports,
            queue,
            shared,
        })
    }

    /// Answer bytes handed over by the daemon and not yet written to sockets.
    pub fn answer_bytes(&self) -> usize {
        self.shared.answers.in_use()
    }

    /// How many times changed TLS files were loaded (0 without TLS).
    pub fn tls_reloads(&self) -> u64 {
        self.shared
            .tls
            .as_ref()
            .map_or(0, |tls| tls.reloads.load(Ordering::Relaxed))
    }

    /// The port of each listener, in the order given (0 for a unix socket).
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    pub fn queue(&self) -> &Arc<EventQueue> {
        &self.queue
    }

    /// Stop accepting, let open connections finish their calls (HTTP/2
    /// GOAWAY) for up to `grace`, then close everything.
    pub fn shutdown(&mut self, grace: Duration) {
        let _ = self.stop.send(true);
        let deadline = Instant::now() + grace;
        while self.shared.connections.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(deadline.saturating_duration_since(Instant::now()));
        }
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

enum Listener {
    Tcp(TcpListener),
    /// With its path, which is each of its clients' peer (`unix:PATH`).
    Unix(UnixListener, String),
}

impl Listener {
    fn port(&self) -> std::io::Result<u16> {
        match self {
            Listener::Tcp(listener) => listener.local_addr().map(|a| a.port()),
            Listener::Unix(..) => Ok(0),
        }
    }
}

/// Listen on `address`; an error names it (of several listeners, which one failed).
fn bind(address: &str) -> std::io::Result<Listener> {
    bind_listener(address)
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {address}: {e}")))
}

fn bind_listener(address: &str) -> std::io::Result<Listener> {
    if let Some(path) = address.strip_prefix("unix:") {
        // unix:///abs/path and unix:/abs/path name the same file, as in gRPC.
        let path = path.strip_prefix("//").unwrap_or(path);
        return Ok(Listener::Unix(
            UnixListener::bind(path)?,
            format!("unix:{path}"),
        ));
    }
    let listener = std::net::TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    Ok(Listener::Tcp(TcpListener::from_std(listener)?))
}

async fn accept_loop(listener: Listener, shared: Arc<Shared>, mut stopped: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            accepted = accept(&listener) => accepted,
            _ = stopped.changed() => return,
        };
        let Ok(connection) = accepted else {
            // EMFILE and friends: wait a little rather than spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let max = shared.limits.max_connections;
        if max > 0 && shared.connections.load(Ordering::Acquire) >= max {
            // Closed at once: the descriptors and memory of the connections
            // already open stay theirs.
            continue;
        }
        let open = OpenConnection::count(&shared);
        let stopped = stopped.clone();
        match connection {
            Accepted::Tcp(io, peer) => {
                let _ = io.set_nodelay(true);
                tokio::spawn(serve_accepted(io, tcp_peer(peer), open, stopped));
            }
            Accepted::Unix(io, peer) => {
                tokio::spawn(serve_unix(io, peer, open, stopped));
            }
        }
    }
}

enum Accepted {
    Tcp(TcpStream, SocketAddr),
    Unix(UnixStream, String),
}

async fn accept(listener: &Listener) -> std::io::Result<Accepted> {
    match listener {
        Listener::Tcp(listener) => {
            let (io, peer) = listener.accept().await?;
            Ok(Accepted::Tcp(io, peer))
        }
        Listener::Unix(listener, path) => {
            let (io, _) = listener.accept().await?;
            Ok(Accepted::Unix(io, path.clone()))
        }
    }
}

/// How grpc writes a TCP peer: `ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000`.
fn tcp_peer(peer: SocketAddr) -> String {
    match peer {
        SocketAddr::V4(a) => format!("ipv4:{a}"),
        SocketAddr::V6(a) => format!("ipv6:{a}"),
    }
}
