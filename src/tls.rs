//! TLS material: reads PEM certificates and keys, builds the data listener's rustls
//! configuration (optionally verifying client certificates against a CA: mTLS) and swaps in a
//! fresh one when the files change or on SIGHUP, so certificate rotations (cert-manager) need no
//! restart. Never accepts connections or looks at requests.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use sha2::{Digest, Sha256};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsFiles;
use crate::metrics::Metrics;

/// A TLS file problem, naming the configuration key and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{key}: cannot read {path}: {source}")]
    Read {
        key: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{key}: {path} is not valid PEM: {detail}")]
    Pem {
        key: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("{key}: {path} holds no PEM {what}")]
    Empty {
        key: &'static str,
        path: PathBuf,
        what: &'static str,
    },
    #[error("{key}: {detail}")]
    Rustls { key: &'static str, detail: String },
}

/// The one crypto provider kvbust uses (ring), for listener and upstream alike.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key,
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate in a PEM file (a chain, or a CA bundle); at least one.
pub fn load_certs(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            key,
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            key,
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_key(key: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(key, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::Empty {
            key,
            path: path.to_path_buf(),
            what: "private key",
        },
        e => TlsError::Pem {
            key,
            path: path.to_path_buf(),
            detail: e.to_string(),
        },
    })
}

/// A root store holding every certificate of a PEM CA bundle.
pub fn load_roots(key: &'static str, path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(key, path)? {
        roots.add(cert).map_err(|e| TlsError::Rustls {
            key,
            detail: format!("{}: {e}", path.display()),
        })?;
    }
    Ok(roots)
}

/// The data listener's configuration from the files as they are now: ALPN h2 and http/1.1,
/// and with `client_ca` a client certificate signed by that CA is required.
pub fn server_config(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let certs = load_certs("listen.tls.cert", &files.cert)?;
    let key = load_key("listen.tls.key", &files.key)?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls {
            key: "listen.tls",
            detail: e.to_string(),
        })?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = load_roots("listen.tls.client_ca", ca)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Rustls {
                    key: "listen.tls.client_ca",
                    detail: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Rustls {
            key: "listen.tls.key",
            detail: format!("does not match listen.tls.cert: {e}"),
        })?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The listener's TLS configuration, replaced whole on reload. A connection keeps the
/// configuration it was accepted with, so a reload never disturbs open streams.
pub struct ReloadingTls {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
    /// Hash of the files' bytes when `current` was built.
    loaded: Mutex<[u8; 32]>,
}

impl ReloadingTls {
    pub fn new(files: &TlsFiles) -> Result<Self, TlsError> {
        let loaded = fingerprint(files);
        let cfg = server_config(files)?;
        Ok(Self {
            files: files.clone(),
            current: RwLock::new(Arc::new(cfg)),
            loaded: Mutex::new(loaded),
        })
    }

    /// An acceptor for the next connection, with the newest configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        // A poisoned lock still holds a complete configuration: keep serving with it.
        let cfg = crate::sync::read(&self.current);
        TlsAcceptor::from(cfg.clone())
    }

    /// True when the files' bytes differ from those of the configuration in use.
    pub fn files_changed(&self) -> bool {
        *crate::sync::lock(&self.loaded) != fingerprint(&self.files)
    }

    /// Rebuilds the configuration from the files. On an error (a rotation half written, a key
    /// that does not match) the previous configuration stays in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let stamp = fingerprint(&self.files);
        let cfg = Arc::new(server_config(&self.files)?);
        *crate::sync::write(&self.current) = cfg;
        *crate::sync::lock(&self.loaded) = stamp;
        Ok(())
    }

    /// Reloads on SIGHUP, and when the files change (checked every `listen.tls.watch_interval`;
    /// zero: SIGHUP only). Each attempt is logged and counted in `kvbust_tls_reloads_total`.
    /// Runs until the task is dropped.
    pub async fn watch(self: Arc<Self>, metrics: Metrics) {
        let interval = self.files.watch_interval;
        let mut hup = sighup();
        let mut tick = (!interval.is_zero()).then(|| {
            let mut t = tokio::time::interval(interval);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        loop {
            let forced = tokio::select! {
                _ = next_hup(&mut hup) => true,
                _ = next_tick(&mut tick) => false,
            };
            if forced || self.files_changed() {
                match self.reload() {
                    Ok(()) => {
                        tracing::info!(cert = %self.files.cert.display(), "listener TLS reloaded");
                        metrics.tls_reloads.with_label_values(&["ok"]).inc();
                    }
                    Err(e) => {
                        tracing::warn!(
                            "listener TLS not reloaded, the previous certificate stays in use: {e}"
                        );
                        metrics.tls_reloads.with_label_values(&["error"]).inc();
                    }
                }
            }
        }
    }
}

fn fingerprint(files: &TlsFiles) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        // An unreadable file hashes as empty: the reload that follows reports the error.
        h.update(std::fs::read(p).unwrap_or_default());
        h.update([0]);
    }
    h.finalize().into()
}

#[cfg(unix)]
type Hup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hup = Option<()>;

fn sighup() -> Hup {
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("cannot listen for SIGHUP ({e}); TLS files reload on change only");
                None
            }
        }
    }
    #[cfg(not(unix))]
    None
}

async fn next_hup(hup: &mut Hup) {
    #[cfg(unix)]
    if let Some(s) = hup {
        s.recv().await;
        return;
    }
    let _ = hup;
    std::future::pending::<()>().await
}

async fn next_tick(tick: &mut Option<tokio::time::Interval>) {
    match tick {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending::<()>().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A self-signed certificate and its key, as PEM.
    fn pair(name: &str) -> (String, String) {
        let ck = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        (ck.cert.pem(), ck.key_pair.serialize_pem())
    }

    fn files(tag: &str, (cert, key): &(String, String)) -> TlsFiles {
        let dir = crate::test_support::test_dir().join(tag);
        std::fs::create_dir_all(&dir).unwrap();
        let f = TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            client_ca: None,
            watch_interval: Duration::from_secs(10),
        };
        std::fs::write(&f.cert, cert).unwrap();
        std::fs::write(&f.key, key).unwrap();
        f
    }

    fn cleanup(f: &TlsFiles) {
        std::fs::remove_dir_all(f.cert.parent().unwrap()).ok();
    }

    #[test]
    fn errors_name_the_key_and_the_problem() {
        let (a, b) = (pair("a.test"), pair("b.test"));
        let f = files("errors", &(a.0.clone(), "not a key".into()));
        let err = server_config(&f).unwrap_err().to_string();
        assert!(err.starts_with("listen.tls.key: "), "{err}");
        assert!(err.contains("no PEM private key"), "{err}");
        std::fs::write(&f.key, &b.1).unwrap();
        let err = server_config(&f).unwrap_err().to_string();
        assert!(err.contains("does not match listen.tls.cert"), "{err}");
        let missing = TlsFiles {
            client_ca: Some(f.cert.with_file_name("absent.pem")),
            ..files("errors", &a)
        };
        let err = server_config(&missing).unwrap_err().to_string();
        assert!(
            err.starts_with("listen.tls.client_ca: cannot read"),
            "{err}"
        );
        cleanup(&f);
    }

    #[test]
    fn reload_follows_the_files_and_keeps_the_old_config_on_errors() {
        let f = files("reload", &pair("a.test"));
        let tls = ReloadingTls::new(&f).unwrap();
        assert!(!tls.files_changed());
        let first = tls.acceptor();

        let b = pair("b.test");
        std::fs::write(&f.cert, &b.0).unwrap();
        std::fs::write(&f.key, &b.1).unwrap();
        assert!(tls.files_changed());
        tls.reload().unwrap();
        assert!(!tls.files_changed());
        let second = tls.acceptor();
        assert!(!Arc::ptr_eq(first.config(), second.config()));

        // A rotation half written: the new key does not match the certificate yet. The working
        // configuration stays, and the change is seen again at the next check.
        std::fs::write(&f.key, pair("c.test").1).unwrap();
        assert!(tls.reload().is_err());
        assert!(Arc::ptr_eq(second.config(), tls.acceptor().config()));
        assert!(tls.files_changed());
        cleanup(&f);
    }
}
