//! Validating the configuration, once at start: every check serde cannot express, each error
//! naming the key and how to fix it. Owns the rules only; never changes a value and never reads
//! anything but the files the configuration names (to say they are missing).

use std::path::Path;

use super::*;
use crate::cachebust::Target;

impl Config {
    /// Checks that serde cannot express. Runs once at start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let upstream_url = self.upstream_url()?;
        if self.listen.workers > 1024 {
            return Err(ConfigError::new(
                "listen.workers",
                format!(
                    "{} worker threads is far more than any machine has cores; use 0 for one per core",
                    self.listen.workers
                ),
            ));
        }
        validate_upstream_tls(&self.upstream.tls)?;
        validate_upstream(&self.upstream, upstream_url.as_ref())?;
        validate_listen_tls(self.listen.tls.as_ref())?;
        self.validate_timeouts()?;
        validate_limits(&self.limits)?;
        validate_placeholder_limits(&self.synth)?;
        validate_cache_bust(&self.cache_bust)?;
        validate_header_names(&self.headers)?;
        validate_synth_inputs(&self.synth)?;
        validate_synth_target(self.cache_bust.target, &self.synth)?;
        validate_admin(&self.admin)?;
        validate_cache_model(&self.cache_model)?;
        validate_capture(&self.capture, &self.cache_model)?;
        if self.cache_bust.ledger == LedgerMode::Stateless && self.cache_bust.benchmark_id.is_none()
        {
            return Err(ConfigError::new(
                "cache_bust.benchmark_id",
                "cache_bust.ledger = \"stateless\" needs a benchmark id shared by every replica \
                 (a random one per process would make replicas disagree): set \
                 cache_bust.benchmark_id (KVBUST_CACHE_BUST__BENCHMARK_ID), new for each run",
            ));
        }
        validate_http2(&self.listen)?;
        // The mock's messages start with the key they are about.
        self.mock.validate().map_err(|m| match m.split_once(' ') {
            Some((key, rest)) => ConfigError::new(key, rest),
            None => ConfigError::new("mock", m),
        })?;
        tracing_subscriber::EnvFilter::try_new(&self.log.level).map_err(|e| {
            ConfigError::new(
                "log.level",
                format!("`{}` is not a filter like \"info\" ({e})", self.log.level),
            )
        })?;
        Ok(())
    }

    /// Every timeout must be greater than zero.
    fn validate_timeouts(&self) -> Result<(), ConfigError> {
        for (key, d) in [
            ("upstream.connect_timeout", self.upstream.connect_timeout),
            (
                "upstream.first_byte_timeout",
                self.upstream.first_byte_timeout,
            ),
            ("upstream.idle_timeout", self.upstream.idle_timeout),
            (
                "listen.header_read_timeout",
                self.listen.header_read_timeout,
            ),
            ("listen.idle_timeout", self.listen.idle_timeout),
            ("listen.body_read_timeout", self.listen.body_read_timeout),
            ("listen.body_total_timeout", self.listen.body_total_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::new(
                    key,
                    "must be greater than zero (e.g. \"5s\")",
                ));
            }
        }
        Ok(())
    }
}

/// The upstream's TLS settings: consistent, with files that exist and a valid name.
fn validate_upstream_tls(t: &UpstreamTls) -> Result<(), ConfigError> {
    if t.insecure_skip_verify && t.ca_file.is_some() {
        return Err(ConfigError::new(
            "upstream.tls.insecure_skip_verify",
            "set either insecure_skip_verify or ca_file, not both",
        ));
    }
    match (&t.client_cert, &t.client_key) {
        (Some(_), None) | (None, Some(_)) => {
            return Err(ConfigError::new(
                "upstream.tls.client_cert",
                "set both upstream.tls.client_cert and upstream.tls.client_key, or neither",
            ))
        }
        _ => {}
    }
    for (key, p) in [
        ("upstream.tls.client_cert", &t.client_cert),
        ("upstream.tls.client_key", &t.client_key),
    ] {
        if let Some(p) = p {
            check_file(key, p)?;
        }
    }
    if let Some(name) = &t.server_name {
        if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() {
            return Err(ConfigError::new(
                "upstream.tls.server_name",
                format!("`{name}` is not a DNS name or IP address (e.g. model.internal)"),
            ));
        }
    }
    if let Some(ca) = &t.ca_file {
        check_file("upstream.tls.ca_file", ca)?;
    }
    Ok(())
}

/// `key`'s file `p` exists (as a file, not a folder).
fn check_file(key: &str, p: &Path) -> Result<(), ConfigError> {
    if p.is_file() {
        return Ok(());
    }
    Err(ConfigError::new(
        key,
        format!("{} is not a readable file", p.display()),
    ))
}

/// The data listener's certificate, key and client CA files exist.
fn validate_listen_tls(tls: Option<&TlsFiles>) -> Result<(), ConfigError> {
    if let Some(tls) = tls {
        let ca = tls.client_ca.as_ref().map(|p| ("listen.tls.client_ca", p));
        for (key, p) in [("listen.tls.cert", &tls.cert), ("listen.tls.key", &tls.key)]
            .into_iter()
            .chain(ca)
        {
            check_file(key, p)?;
        }
    }
    Ok(())
}

/// Body and header size limits.
fn validate_limits(l: &LimitsConfig) -> Result<(), ConfigError> {
    if l.max_body.0 == 0 {
        return Err(ConfigError::new(
            "limits.max_body",
            "must be greater than zero (e.g. \"64MiB\")",
        ));
    }
    if l.max_buffered_total.0 < l.max_body.0 {
        return Err(ConfigError::new(
            "limits.max_buffered_total",
            format!(
                "must be at least limits.max_body ({}), or no body of the largest allowed size could ever be buffered",
                l.max_body
            ),
        ));
    }
    if l.max_control_header.0 == 0 {
        return Err(ConfigError::new(
            "limits.max_control_header",
            "must be greater than zero (e.g. \"1KiB\")",
        ));
    }
    Ok(())
}

/// The placeholder caps are at least 1.
fn validate_placeholder_limits(s: &SynthConfig) -> Result<(), ConfigError> {
    at_least_one(
        &[
            ("synth.max_placeholders", s.max_placeholders),
            ("synth.max_placeholder_tokens", s.max_placeholder_tokens),
            ("synth.placeholder_queue", s.placeholder_queue),
            (
                "synth.placeholder_queue_per_client",
                s.placeholder_queue_per_client,
            ),
        ],
        "must be at least 1; set synth.placeholders = false to turn placeholders off",
    )?;
    if !(s.placeholder_build_share > 0.0 && s.placeholder_build_share <= 1.0) {
        return Err(ConfigError::new(
            "synth.placeholder_build_share",
            format!(
                "must be above 0 and at most 1 (got {}); e.g. 0.5 lets new placeholder lengths \
                 take half the queue and the cores",
                s.placeholder_build_share
            ),
        ));
    }
    if !(s.placeholder_build_cpu.is_finite() && s.placeholder_build_cpu > 0.0) {
        return Err(ConfigError::new(
            "synth.placeholder_build_cpu",
            format!(
                "must be a number of CPU-seconds per second above 0 (got {}); e.g. 0.5 is half \
                 a core",
                s.placeholder_build_cpu
            ),
        ));
    }
    if s.placeholder_build_window < std::time::Duration::from_millis(100) {
        return Err(ConfigError::new(
            "synth.placeholder_build_window",
            "must be at least 100ms (e.g. \"10s\"): it is the burst new lanes may spend at once",
        ));
    }
    Ok(())
}

/// The first of `keys` that is 0, named with `why`.
fn at_least_one(keys: &[(&'static str, usize)], why: &'static str) -> Result<(), ConfigError> {
    match keys.iter().find(|(_, n)| *n == 0) {
        Some((key, _)) => Err(ConfigError::new(*key, why)),
        None => Ok(()),
    }
}

/// The ledger's capacity, the session sources and the benchmark id.
fn validate_cache_bust(c: &CacheBustConfig) -> Result<(), ConfigError> {
    if c.ledger_capacity == 0 {
        return Err(ConfigError::new(
            "cache_bust.ledger_capacity",
            "must be at least 1",
        ));
    }
    if c.max_marked_prompts == 0 {
        return Err(ConfigError::new(
            "cache_bust.max_marked_prompts",
            "must be at least 1 (a single prompt string is always marked)",
        ));
    }
    if c.session_sources.is_empty() {
        return Err(ConfigError::new(
            "cache_bust.session_sources",
            "list at least one of x_correlation_id, x_session_id, body_user, first_user_turn",
        ));
    }
    if let Some(r) = c.hit_ratio {
        if !(0.0..=1.0).contains(&r) {
            return Err(ConfigError::new(
                "cache_bust.hit_ratio",
                format!("must be between 0 and 1 (the share of each prompt that may come from the cache), got {r}; omit it for no dial"),
            ));
        }
    }
    if let Some(b) = &c.benchmark_id {
        if b.is_empty() {
            return Err(ConfigError::new(
                "cache_bust.benchmark_id",
                "must not be empty; omit it for a random id",
            ));
        }
    }
    Ok(())
}

/// Configured header names are lowercase HTTP header names.
pub(super) fn validate_header_names(h: &HeaderNames) -> Result<(), ConfigError> {
    for (key, name) in h.all() {
        let ok = http::HeaderName::from_bytes(name.as_bytes()).is_ok()
            && name.bytes().all(|b| !b.is_ascii_uppercase());
        if !ok {
            return Err(ConfigError::new(
                format!("headers.{key}"),
                format!("`{name}` is not a lowercase HTTP header name"),
            ));
        }
    }
    Ok(())
}

/// The synthesis dataset, routes and tokenizer.
fn validate_synth_inputs(s: &SynthConfig) -> Result<(), ConfigError> {
    if let Some(d) = &s.dataset {
        d.validate()
            .map_err(|e| ConfigError::new("synth.dataset", e.to_string()))?;
    }
    for r in &s.routes {
        if !r.starts_with('/') {
            return Err(ConfigError::new(
                "synth.routes",
                format!("`{r}` must be a path like \"/v1/chat/completions\""),
            ));
        }
    }
    if let Some(t) = &s.tokenizer {
        if !t.exists() {
            return Err(ConfigError::new(
                "synth.tokenizer",
                format!("{} does not exist", t.display()),
            ));
        }
    }
    Ok(())
}

/// The shortest admin token accepted: 24 characters, as `openssl rand -hex 12` makes.
pub const MIN_ADMIN_TOKEN_LEN: usize = 24;

/// Placeholder tokens this repository has shipped in examples and manifests; a token equal to
/// one (or holding one of the `REPLACE-ME`/`CHANGE-ME` words) is anyone's token.
const PLACEHOLDER_TOKENS: &[&str] = &["REPLACE-ME-before-applying"];

const PLACEHOLDER_WORDS: &[&str] = &["replace-me", "replace_me", "change-me", "changeme"];

/// `warmup_isolation_system` marks the system prompt of the warmup requests; a synthetic dataset
/// without one would fail every synthesized request (AIPerf refuses the same combination).
fn validate_synth_target(target: Target, s: &SynthConfig) -> Result<(), ConfigError> {
    let Some(d) = &s.dataset else {
        return Ok(());
    };
    // A trace may carry its own system messages: only the synthesized ones are known here.
    let has_system = d.input_file.is_some()
        || d.system_prompt.as_deref().is_some_and(|p| !p.is_empty())
        || d.shared_system_prompt_length.is_some_and(|n| n > 0);
    if target == Target::WarmupIsolationSystem && !has_system {
        return Err(ConfigError::new(
            "synth.dataset",
            "has no system prompt, but cache_bust.target = \"warmup_isolation_system\" marks \
             the system prompt: set synth.dataset.shared_system_prompt_length (e.g. 100) or \
             synth.dataset.system_prompt, or use cache_bust.target = \
             \"warmup_isolation_first_turn\"",
        ));
    }
    Ok(())
}

/// An admin port reachable from other hosts needs a token (or an explicit opt-out); a token is
/// long enough and not a placeholder.
/// The most `admin.max_connections` may be: the admin port serves probes and scrapers.
const MAX_ADMIN_CONNECTIONS: usize = 4096;

fn validate_admin(a: &AdminConfig) -> Result<(), ConfigError> {
    if !(1..=MAX_ADMIN_CONNECTIONS).contains(&a.max_connections) {
        return Err(ConfigError::new(
            "admin.max_connections",
            format!(
                "is {}: set 1 to {MAX_ADMIN_CONNECTIONS} (default 64; probes and scrapers need a \
                 few, and each is a descriptor taken from the data port's share)",
                a.max_connections
            ),
        ));
    }
    if a.token.as_deref() == Some("") {
        return Err(ConfigError::new(
            "admin.token",
            "must not be empty; omit it to disable auth",
        ));
    }
    if let Some(t) = a.token.as_deref() {
        let lower = t.to_ascii_lowercase();
        if PLACEHOLDER_TOKENS.contains(&t) || PLACEHOLDER_WORDS.iter().any(|w| lower.contains(w)) {
            return Err(ConfigError::new(
                "admin.token",
                "is a placeholder from kvbust's examples, so anyone could use it: set a random \
                 token, e.g. KVBUST_ADMIN__TOKEN=$(openssl rand -hex 24) (in Kubernetes: the \
                 Secret kvbust-admin, see deploy/README.md)",
            ));
        }
        if t.chars().count() < MIN_ADMIN_TOKEN_LEN {
            return Err(ConfigError::new(
                "admin.token",
                format!(
                    "is {} characters, shorter than {MIN_ADMIN_TOKEN_LEN}: set a random token, \
                     e.g. KVBUST_ADMIN__TOKEN=$(openssl rand -hex 24)",
                    t.chars().count()
                ),
            ));
        }
    }
    if !a.addr.ip().is_loopback() && a.token.is_none() && !a.allow_unauthenticated {
        return Err(ConfigError::new(
            "admin.token",
            format!(
                "admin.addr {} is reachable from other hosts but no token is set, so anyone \
                 could change the phase of a running benchmark: set admin.token \
                 (KVBUST_ADMIN__TOKEN), listen on 127.0.0.1, or set \
                 admin.allow_unauthenticated = true on a trusted network",
                a.addr
            ),
        ));
    }
    Ok(())
}

/// HTTP/2 stream limits and flow-control windows.
fn validate_http2(l: &ListenConfig) -> Result<(), ConfigError> {
    if l.http2_max_concurrent_streams == 0 {
        return Err(ConfigError::new(
            "listen.http2_max_concurrent_streams",
            "must be at least 1",
        ));
    }
    for (key, v) in [
        ("listen.http2_stream_window", l.http2_stream_window.0),
        (
            "listen.http2_connection_window",
            l.http2_connection_window.0,
        ),
    ] {
        if !(65_535..=(i32::MAX as u64)).contains(&v) {
            return Err(ConfigError::new(key, "must be between 64KiB and 2GiB"));
        }
    }
    Ok(())
}

/// The `[upstream]` checks beyond the URL's syntax: the base path trap, the authority override
/// and the health probe.
fn validate_upstream(u: &UpstreamConfig, url: Option<&UpstreamUrl>) -> Result<(), ConfigError> {
    let (client, source) = (u.max_connections_per_client, u.max_connections_per_source);
    if source > 0 && client > source {
        return Err(ConfigError::new(
            "upstream.max_connections_per_source",
            format!(
                "is {source}, below upstream.max_connections_per_client ({client}): one client \
                 connection could never use its share; raise max_connections_per_source to at \
                 least {client} or lower max_connections_per_client"
            ),
        ));
    }
    if let Some(url) = url {
        url.check_base_path()?;
    }
    if let Some(a) = &u.authority {
        validate_authority(a, u)?;
    }
    if let Some(p) = &u.health_path {
        if !p.starts_with('/') || http::uri::PathAndQuery::try_from(p.as_str()).is_err() {
            return Err(ConfigError::new(
                "upstream.health_path",
                format!(
                    "`{p}` is not a path like \"/health\"; leave it unset for /health with the \
                     /v1/models fallback, or set upstream.health_probe = false for no probe"
                ),
            ));
        }
    }
    for (key, d) in [
        ("upstream.health_interval", u.health_interval),
        ("upstream.health_timeout", u.health_timeout),
    ] {
        if d.is_zero() {
            return Err(ConfigError::new(
                key,
                "must be greater than zero (e.g. \"5s\"); set upstream.health_probe = false to \
                 turn the probe off",
            ));
        }
    }
    at_least_one(
        &[
            (
                "upstream.health_fail_threshold",
                u.health_fail_threshold as usize,
            ),
            (
                "upstream.health_success_threshold",
                u.health_success_threshold as usize,
            ),
        ],
        "must be at least 1 (probes in a row)",
    )
}

/// `upstream.authority` (`a`): a bare host[:port], with `upstream.url` set and `keep_host` off.
fn validate_authority(a: &str, u: &UpstreamConfig) -> Result<(), ConfigError> {
    let fix = "write host or host:port, e.g. model.example.com or model.example.com:8000";
    let parsed = a.parse::<http::uri::Authority>().map_err(|e| {
        ConfigError::new(
            "upstream.authority",
            format!("`{a}` is not a valid authority ({e}); {fix}"),
        )
    })?;
    if parsed.as_str().contains('@') || parsed.host().is_empty() {
        return Err(ConfigError::new(
            "upstream.authority",
            format!("`{a}` must be a bare host[:port], without user-info; {fix}"),
        ));
    }
    // `Authority` accepts any text after the colon; a port must be a number.
    let port = &parsed.as_str()[parsed.host().len()..];
    let bad_port = !port.is_empty()
        && port
            .strip_prefix(':')
            .is_none_or(|p| p.parse::<u16>().is_err());
    if bad_port {
        return Err(ConfigError::new(
            "upstream.authority",
            format!("`{a}` has a port that is not a number from 0 to 65535; {fix}"),
        ));
    }
    if u.keep_host {
        return Err(ConfigError::new(
            "upstream.authority",
            "is set together with upstream.keep_host = true, which forwards the client's \
             Host instead: keep one of them",
        ));
    }
    if u.url.is_none() {
        return Err(ConfigError::new(
            "upstream.authority",
            "needs upstream.url (the built-in mock answers any Host): set upstream.url or \
             remove upstream.authority",
        ));
    }
    Ok(())
}

/// Parses a phase/target in the CLI layer with the same rules as config.
pub fn parse_target(s: &str) -> Result<Target, String> {
    s.parse::<Target>().map_err(|e| e.to_string())
}

/// `[capture]`: it rides on the cache model's worker, sizes that make sense, a key that exists,
/// and a folder that exists or can be made (it is made here, so `config check` makes it too).
fn validate_capture(c: &CaptureConfig, model: &CacheModelConfig) -> Result<(), ConfigError> {
    if !c.enabled {
        return Ok(());
    }
    if !model.enabled {
        return Err(ConfigError::new(
            "capture.enabled",
            "capture tokenizes with the cache model's worker: set cache_model.enabled = true \
             (or capture.enabled = false)",
        ));
    }
    if !(1..=1 << 20).contains(&c.block_size) {
        return Err(ConfigError::new(
            "capture.block_size",
            format!(
                "{} is not a block size: mooncake's is 512; use 1 to 1048576",
                c.block_size
            ),
        ));
    }
    if c.rotate_rows == 0 || c.rotate.is_zero() {
        return Err(ConfigError::new(
            if c.rotate_rows == 0 {
                "capture.rotate_rows"
            } else {
                "capture.rotate"
            },
            "must be above 0 (defaults: rotate = \"1h\", rotate_rows = 100000)",
        ));
    }
    if c.flush.is_zero() {
        return Err(ConfigError::new(
            "capture.flush",
            "must be above 0 (the default is \"1s\": a crash loses the rows of at most that long)",
        ));
    }
    if c.min_sessions_per_shared_block == 0 {
        return Err(ConfigError::new(
            "capture.min_sessions_per_shared_block",
            "must be at least 1 (1 keeps every shared block's id)",
        ));
    }
    if let Some(path) = &c.key_file {
        crate::capture::Key::load(path).map_err(|e| ConfigError::new("capture.key_file", e))?;
    }
    let unwritable = |e: std::io::Error| {
        ConfigError::new(
            "capture.dir",
            format!(
                "cannot create or write {}: {e}; point it at a writable folder (a volume in a \
                 container)",
                c.dir.display()
            ),
        )
    };
    std::fs::create_dir_all(&c.dir).map_err(unwritable)?;
    // A folder that exists but takes no file would drop every row: caught here, at start.
    let probe = c
        .dir
        .join(format!(".kvbust-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(unwritable)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// `[cache_model]`: sizes that make sense, a nice value and thread count in range, a tokenizer
/// that exists.
fn validate_cache_model(c: &CacheModelConfig) -> Result<(), ConfigError> {
    if !(1..=4096).contains(&c.block_size) {
        return Err(ConfigError::new(
            "cache_model.block_size",
            format!(
                "{} is not a block size: use the engine's (vLLM 16, SGLang 1 or its page size, \
                 llama.cpp 1), between 1 and 4096",
                c.block_size
            ),
        ));
    }
    if c.queue == 0 {
        return Err(ConfigError::new(
            "cache_model.queue",
            "must be at least 1 (the default is 1024); set cache_model.enabled = false to turn \
             the model off",
        ));
    }
    if !(0..=19).contains(&c.nice) {
        return Err(ConfigError::new(
            "cache_model.nice",
            format!(
                "{} is not a nice value kvbust sets: use 0 (the model's thread runs as the \
                 process) to 19 (it gets only the CPU forwarding leaves; the default)",
                c.nice
            ),
        ));
    }
    if !(1..=64).contains(&c.threads) {
        return Err(ConfigError::new(
            "cache_model.threads",
            format!(
                "{} is not a thread count kvbust starts: use 1 (one thread tokenizes and \
                 serves, the default) to 64; more than the cores left over from forwarding \
                 only adds memory",
                c.threads
            ),
        ));
    }
    if c.max_memory.as_u64() < (1 << 20) {
        return Err(ConfigError::new(
            "cache_model.max_memory",
            format!(
                "{} is too small to model anything; the default is 256MiB, the least 1MiB",
                c.max_memory
            ),
        ));
    }
    if c.max_prompt_bytes.as_u64() < 1024 {
        return Err(ConfigError::new(
            "cache_model.max_prompt_bytes",
            format!(
                "{} would leave every prompt unaccounted; the default is 2MiB, the least 1KiB",
                c.max_prompt_bytes
            ),
        ));
    }
    if let Some(t @ crate::mock::MockTokenizerSetting::Path(p)) = &c.tokenizer {
        if !t.exists() {
            return Err(ConfigError::new(
                "cache_model.tokenizer",
                format!(
                    "{} is neither a tokenizer.json file nor a folder holding one; use \"qwen3\", \
                     \"builtin\" or the engine's tokenizer path",
                    p.display()
                ),
            ));
        }
    }
    Ok(())
}
