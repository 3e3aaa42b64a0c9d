//! TLS for the front door's listeners (rustls): the certificate and key,
//! and for mTLS the client CA, read from PEM files and read again when they
//! change, so a rotated certificate (cert-manager, a Kubernetes secret
//! update) reaches every new connection without a restart.
//!
//! A change is noticed by each file's (mtime, size, inode), checked at each
//! accepted connection (three stat calls): Kubernetes swaps a secret's files
//! by replacing a symlink, which changes the inode. A half-done change (the
//! certificate replaced, its key not yet) does not load, and the previous
//! configuration stays in use until one does.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// The PEM files of a TLS listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// mTLS: clients must present a certificate this CA issued.
    pub client_ca: Option<PathBuf>,
}

type Signature = Vec<(i64, u64, u64)>;

/// Hands out the server configuration for each new connection.
pub(crate) struct Certificates {
    files: TlsFiles,
    loaded: Mutex<(Signature, Arc<ServerConfig>)>,
    /// How many times changed files were loaded.
    pub reloads: AtomicU64,
}

impl Certificates {
    /// Load the files now: a start-up with unusable files fails loudly.
    pub fn load(files: TlsFiles) -> Result<Certificates, String> {
        let signature = signature(&files).map_err(|e| e.to_string())?;
        let config = server_config(&files)?;
        Ok(Certificates {
            files,
            loaded: Mutex::new((signature, config)),
            reloads: AtomicU64::new(0),
        })
    }

    /// The configuration for a connection accepted now: the files' current
    /// one, or the last that loaded while they are changing or broken.
    pub fn current(&self) -> Arc<ServerConfig> {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if let Ok(now) = signature(&self.files) {
            if now != loaded.0 {
                if let Ok(config) = server_config(&self.files) {
                    *loaded = (now, config);
                    self.reloads.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        loaded.1.clone()
    }
}

fn signature(files: &TlsFiles) -> std::io::Result<Signature> {
    [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|path| {
        let m = fs::metadata(path)?;
        Ok((
            m.mtime_nsec() + m.mtime() * 1_000_000_000,
            m.size(),
            m.ino(),
        ))
    })
    .collect()
}

fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, String> {
    let shown = |path: &PathBuf| path.display().to_string();
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: no PEM certificate: {e}", shown(&files.cert)))?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("{}: no PEM private key: {e}", shown(&files.key)))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("{}: no PEM certificate: {e}", shown(path)))?
            {
                let cert = cert.map_err(|e| format!("{}: {e}", shown(path)))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: {e}", shown(path)))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{}: {e}", shown(path)))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("{} and {}: {e}", shown(&files.cert), shown(&files.key)))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
