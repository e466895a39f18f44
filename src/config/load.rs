//! Loading the configuration: defaults < file < `KVBUST_*` env < CLI flags, layered by figment
//! (the environment passed in as pairs, so layering is a pure function), figment's errors turned
//! into ones naming the key, the start-time adjustments (`fit_memory_limit`), and the redacted
//! TOML `config show` and `GET /config` print. Owns no rule about values (that is `validate`);
//! never reads the process environment itself.

use std::path::Path;

use figment::providers::{Format, Serialized, Toml, Yaml};
use figment::Figment;

use super::*;

/// Environment variables with the `KVBUST_` prefix that are not configuration keys.
const NON_CONFIG_ENV: &[&str] = &[
    "config",
    "cache_dir",
    "real_upstream",
    "real_venv",
    "real_state_dir",
    "real_threads",
    "real_ctx",
    "real_cache_mib",
    "real_start_timeout",
    "proptest_cases",
];

impl Config {
    /// Layer defaults < file < env < CLI and validate. `env` is passed in (not read from the
    /// process) so the layering is a pure, testable function.
    pub fn load(
        file: Option<&Path>,
        env: &[(String, String)],
        cli: &CliOverrides,
    ) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::new(
                    "--config",
                    format!(
                        "file {} does not exist; pass an existing TOML or YAML file",
                        path.display()
                    ),
                ));
            }
            fig = match path.extension().and_then(|e| e.to_str()) {
                Some("toml") => fig.merge(Toml::file_exact(path)),
                Some("yaml" | "yml") => fig.merge(Yaml::file_exact(path)),
                _ => {
                    return Err(ConfigError::new(
                        "--config",
                        format!("{} must end in .toml, .yaml or .yml", path.display()),
                    ))
                }
            };
        }
        // figment's own Env provider reads the live process environment; a snapshot passed in
        // keeps layering a pure function that tests can drive without touching globals.
        fig = fig.merge(SnapshotEnv { vars: env.to_vec() });
        let cli_dict: std::collections::BTreeMap<String, String> = serde_json::to_value(cli)
            .ok()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        let mut flags = figment::value::Dict::new();
        for (k, v) in cli_dict {
            if let figment::value::Value::Dict(_, d) = figment::util::nest(&k, v.into()) {
                for (dk, dv) in d {
                    merge_value(&mut flags, dk, dv);
                }
            }
        }
        fig = fig.merge(Layer {
            name: "command-line flag(s)",
            dict: flags,
        });
        let cfg: Config = fig.extract().map_err(from_figment)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// `upstream.url` as a typed value (`None`: the built-in mock), checked as `validate` does.
    pub fn upstream_url(&self) -> Result<Option<UpstreamUrl>, ConfigError> {
        self.upstream
            .url
            .as_deref()
            .map(UpstreamUrl::parse)
            .transpose()
    }

    /// The configuration as TOML with secrets replaced, for `config show` and `GET /config`.
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        if c.admin.token.is_some() {
            c.admin.token = Some("<redacted>".into());
        }
        c.upstream.url = c.upstream.url.as_deref().map(redact_url);
        c
    }

    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        for a in &self.adjustments {
            out.push_str("# adjusted at start: ");
            out.push_str(a);
            out.push('\n');
        }
        out.push_str(&toml_string(self));
        out
    }

    /// Keeps what kvbust may hold within `memory_limit` (the cgroup's, see
    /// [`crate::cgroup::memory_limit`]): a container killed for memory mid-benchmark is worse
    /// than a 503 for a body over the budget, or a request the cache model leaves out. Lowers
    /// `limits.max_buffered_total` (and `limits.max_body`, which may not exceed it) to half of
    /// it, and `cache_model.max_memory` to a quarter, when above that; returns each warning,
    /// also kept in `adjustments`.
    pub fn fit_memory_limit(&mut self, memory_limit: Option<u64>) -> Vec<String> {
        let Some(limit) = memory_limit else {
            return Vec::new();
        };
        let notes: Vec<String> = [self.fit_buffers(limit), self.fit_cache_model(limit)]
            .into_iter()
            .flatten()
            .collect();
        self.adjustments.extend(notes.iter().cloned());
        notes
    }

    fn fit_buffers(&mut self, limit: u64) -> Option<String> {
        let half = limit / 2;
        let l = &mut self.limits;
        if l.max_buffered_total.0 <= half {
            return None;
        }
        let mut note = format!(
            "limits.max_buffered_total lowered from {} to {}, half the cgroup memory limit ({})",
            l.max_buffered_total,
            ByteSize(half),
            ByteSize(limit)
        );
        l.max_buffered_total = ByteSize(half);
        if l.max_body.0 > half {
            note.push_str(&format!(
                ", and limits.max_body from {} to the same",
                l.max_body
            ));
            l.max_body = ByteSize(half);
        }
        note.push_str(
            "; set limits.max_buffered_total to at most half the container's memory limit \
             (or raise the limit) to silence this",
        );
        Some(note)
    }

    fn fit_cache_model(&mut self, limit: u64) -> Option<String> {
        let quarter = (limit / 4).max(1 << 20);
        let m = &mut self.cache_model;
        if !m.enabled || m.max_memory.0 <= quarter {
            return None;
        }
        let note = format!(
            "cache_model.max_memory lowered from {} to {}, a quarter of the cgroup memory limit \
             ({}); set it to at most that (or raise the limit) to silence this",
            m.max_memory,
            ByteSize(quarter),
            ByteSize(limit)
        );
        m.max_memory = ByteSize(quarter);
        Some(note)
    }
}

/// `text` with [`redact_url`] applied to every URL-like word in it (split at whitespace and
/// quotes), for messages that quote configuration source, e.g. a TOML parse error's line. A
/// word with `user:password@` whose scheme a broken line cut off (`"http://us` … `her:pw@host`,
/// a fuzz finding) has its password hidden too.
pub fn redact_urls_in(text: &str) -> String {
    if !text.contains("://") && !text.contains('@') {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    for word in text.split_inclusive(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`')) {
        if word.contains("://") {
            out.push_str(&redact_url(word));
        } else {
            out.push_str(&redact_userinfo(word));
        }
    }
    out
}

/// `user:password@host…` → `user:<redacted>@host…`, for a word without a scheme; anything else
/// as it was.
fn redact_userinfo(word: &str) -> String {
    let Some(at) = word.rfind('@') else {
        return word.to_string();
    };
    match word[..at].split_once(':') {
        Some((user, _password)) if !user.contains('/') => {
            format!("{user}:<redacted>{}", &word[at..])
        }
        _ => word.to_string(),
    }
}

/// `url` with the password of its user-info replaced (`http://user:<redacted>@host/`), for
/// anything shown to people: `/config`, `config show`, logs and error messages. A URL without
/// a password (or not a URL at all) comes back as it was.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(auth_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_string();
    };
    let user = match userinfo.split_once(':') {
        Some((user, _password)) => user,
        None => return url.to_string(),
    };
    format!("{scheme}://{user}:<redacted>@{host}{tail}")
}

fn toml_string(c: &Config) -> String {
    // Every field is a TOML-representable type, so serialization cannot fail.
    toml::to_string_pretty(c).unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"))
}

fn from_figment(e: figment::Error) -> ConfigError {
    let key = if e.path.is_empty() {
        "(config)".to_string()
    } else {
        e.path.join(".")
    };
    let message = match &e.kind {
        figment::error::Kind::UnknownField(field, expected) => {
            // figment's path already ends with the unknown field; older versions did not.
            let full = match e.path.last() {
                Some(last) if last == field => key.clone(),
                Some(_) => format!("{key}.{field}"),
                None => field.clone(),
            };
            let mut message = format!(
                "unknown key; valid keys here are: {}",
                expected
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if looks_like_service_link(&full) {
                message.push_str(&format!(
                    ". KVBUST_{} looks like a variable Kubernetes sets for a Service named \
                     kvbust...: set enableServiceLinks: false in the pod spec",
                    full.to_ascii_uppercase()
                ));
            }
            return ConfigError::new(full, message);
        }
        other => {
            // Parse errors quote the source line, which may hold an upstream URL's password.
            let mut m = redact_urls_in(&other.to_string());
            if let Some(md) = &e.metadata {
                m.push_str(&format!(" (from {})", md.name));
            }
            m
        }
    };
    ConfigError::new(key, message)
}

/// Kubernetes gives every pod `<SERVICE>_SERVICE_HOST`, `<SERVICE>_PORT`, `<SERVICE>_PORT_<n>_TCP...`
/// variables for each Service in its namespace (unless `enableServiceLinks: false`); a Service
/// named `kvbust` or `kvbust-...` turns them into `KVBUST_*` variables, read here as top-level keys.
fn looks_like_service_link(key: &str) -> bool {
    !key.contains('.')
        && (key.ends_with("service_host")
            || key.contains("service_port")
            || key == "port"
            || key.ends_with("_port")
            || key.starts_with("port_")
            || key.contains("_port_"))
}

/// A layer of already-built values, named for error messages.
struct Layer {
    name: &'static str,
    dict: figment::value::Dict,
}

impl figment::Provider for Layer {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named(self.name)
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        Ok(figment::Profile::Default.collect(self.dict.clone()))
    }
}

/// An env provider over a captured snapshot instead of the live process environment.
struct SnapshotEnv {
    vars: Vec<(String, String)>,
}

impl figment::Provider for SnapshotEnv {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named("environment variable(s)")
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        use figment::value::{Dict, Value};
        let mut dict = Dict::new();
        for (k, v) in &self.vars {
            let Some(rest) = k.strip_prefix("KVBUST_") else {
                continue;
            };
            let lower = rest.to_ascii_lowercase();
            if NON_CONFIG_ENV.contains(&lower.as_str()) || lower.is_empty() {
                continue;
            }
            let path = lower.replace("__", ".");
            // Parsed like figment's Env provider does (its FromStr is infallible).
            let value: Value = match v.parse() {
                Ok(v) => v,
                Err(never) => match never {},
            };
            let nested = figment::util::nest(&path, value);
            if let Value::Dict(_, d) = nested {
                for (dk, dv) in d {
                    merge_value(&mut dict, dk, dv);
                }
            }
        }
        Ok(figment::Profile::Default.collect(dict))
    }
}

fn merge_value(dict: &mut figment::value::Dict, key: String, value: figment::value::Value) {
    use figment::value::Value;
    match (dict.get_mut(&key), value) {
        (Some(Value::Dict(_, existing)), Value::Dict(_, incoming)) => {
            for (k, v) in incoming {
                merge_value(existing, k, v);
            }
        }
        (_, v) => {
            dict.insert(key, v);
        }
    }
}
