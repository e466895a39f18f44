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
        let cfg: Config = fig.extract().map_err(|e| from_figment(e, env))?;
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

fn from_figment(e: figment::Error, env: &[(String, String)]) -> ConfigError {
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
            return unknown_key(&full, field, expected, env);
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

/// An unknown key `full` (its last part `field`), with `expected` the valid keys beside it: the
/// environment variable that set it, when one did (a variable's name is what the user typed),
/// and the nearest valid key.
fn unknown_key(
    full: &str,
    field: &str,
    expected: &[&str],
    env: &[(String, String)],
) -> ConfigError {
    let variable = env_variable_for(full, env);
    let mut message = String::from("unknown key");
    if let Some(var) = &variable {
        message.push_str(&format!(", set by the environment variable {var}"));
    }
    if let Some(near) = nearest(field, expected) {
        let parent = full.strip_suffix(field).unwrap_or("");
        let suggested = format!("{parent}{near}");
        match &variable {
            Some(_) => message.push_str(&format!(
                "; did you mean {} ({suggested})?",
                env_name(&suggested)
            )),
            None => message.push_str(&format!("; did you mean {suggested}?")),
        }
    }
    message.push_str(&format!("; valid keys here are: {}", expected.join(", ")));
    if looks_like_service_link(full) {
        message.push_str(&format!(
            ". KVBUST_{} looks like a variable Kubernetes sets for a Service named \
             kvbust...: set enableServiceLinks: false in the pod spec",
            full.to_ascii_uppercase()
        ));
    }
    ConfigError::new(full, message)
}

/// `cache_bust.target` → `KVBUST_CACHE_BUST__TARGET`, as [`SnapshotEnv`] reads names.
fn env_name(key: &str) -> String {
    format!("KVBUST_{}", key.replace('.', "__").to_ascii_uppercase())
}

/// The `KVBUST_*` variable in `env` that names `key`, if any (as written, any case).
fn env_variable_for(key: &str, env: &[(String, String)]) -> Option<String> {
    env.iter()
        .map(|(k, _)| k)
        .find(|k| {
            k.strip_prefix("KVBUST_")
                .is_some_and(|rest| rest.to_ascii_lowercase().replace("__", ".") == key)
        })
        .cloned()
}

/// The valid key nearest to `typed`, when it is near enough to be a typo: at most a third of
/// its letters edited (at least 1, at most 3).
fn nearest<'a>(typed: &str, valid: &[&'a str]) -> Option<&'a str> {
    let most = (typed.len() / 3).clamp(1, 3);
    valid
        .iter()
        .map(|v| (edit_distance(typed, v), *v))
        .filter(|(d, _)| *d <= most)
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v)
}

/// Levenshtein distance between `a` and `b` in bytes (keys and header names are ASCII): how
/// close a typo is to a valid name, for the "did you mean" of unknown keys and headers.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.bytes().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != cb);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
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
