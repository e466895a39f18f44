//! The distribution config of `kvbust synth agentic-code`: AIPerf 0.13.0's
//! `SessionDistributionConfig` (defaults, derived lognormal `mu`/`sigma`, its validation rules and
//! its `model_dump()` shape for `manifest.json`). Owns parsing and checking a config JSON; unlike
//! AIPerf, an unknown key is refused rather than carried along. Never draws or writes files.

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// A lognormal distribution given by its real-space mean and median (`mu`, `sigma` derived
/// unless both are given), optionally bounded by rejection sampling.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lognormal {
    pub mu: f64,
    pub sigma: f64,
    pub mean: f64,
    pub median: f64,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

impl Lognormal {
    /// From mean and median (AIPerf's `compute_mu_sigma`).
    pub fn from_mean_median(mean: f64, median: f64) -> Self {
        let ratio = mean / median;
        Lognormal {
            mu: median.ln(),
            sigma: if ratio > 1.0 {
                (2.0 * ratio.ln()).sqrt()
            } else {
                0.0
            },
            mean,
            median,
            min: None,
            max: None,
        }
    }
}

/// New tokens per turn: a lognormal with a truncation-bias multiplier.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NewTokens {
    #[serde(flatten)]
    pub dist: Lognormal,
    pub bias: f64,
}

/// The two-component inter-turn delay mixture (ms).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MixtureDelay {
    pub agentic_fraction: f64,
    pub agentic_delay: Lognormal,
    pub human_delay: Lognormal,
    pub max: Option<f64>,
}

/// Context-dependent reset probability.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reset {
    pub base_probability: f64,
    pub context_scaling: f64,
}

/// Explicit turns-per-session mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Turns {
    pub mean: i64,
    pub median: i64,
    pub min: i64,
    pub max: i64,
    pub allow_truncation: bool,
    pub max_session_attempts: Option<i64>,
}

/// L1.5 group assignment (Zipf).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Groups {
    pub num_groups: i64,
    pub zipf_alpha: f64,
}

/// The KV-cache prefix layers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cache {
    pub layer1_tokens: i64,
    pub layer1_5_tokens: i64,
    pub layer2: Lognormal,
    pub layer1_5_groups: Groups,
}

/// `SessionDistributionConfig`, field for field in its order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DistributionConfig {
    pub new_tokens_per_turn: NewTokens,
    pub generation_length: Lognormal,
    pub inter_turn_delay: MixtureDelay,
    pub reset: Option<Reset>,
    pub turns: Option<Turns>,
    pub max_prompt_tokens: i64,
    pub block_size: i64,
    pub cache: Cache,
    pub restart_initial_probability: f64,
    pub restart_turn_range: [i64; 2],
}

impl Default for DistributionConfig {
    /// AIPerf's model defaults (what its CLI uses without `--config`; not `configs/default.json`).
    fn default() -> Self {
        DistributionConfig {
            new_tokens_per_turn: NewTokens {
                dist: Lognormal::from_mean_median(3500.0, 1800.0),
                bias: 1.0,
            },
            generation_length: Lognormal::from_mean_median(500.0, 300.0),
            inter_turn_delay: MixtureDelay {
                agentic_fraction: 0.7,
                agentic_delay: Lognormal::from_mean_median(2500.0, 1800.0),
                human_delay: Lognormal::from_mean_median(40000.0, 25000.0),
                max: None,
            },
            reset: Some(Reset {
                base_probability: 0.02,
                context_scaling: 2.0,
            }),
            turns: None,
            max_prompt_tokens: 200_000,
            block_size: 512,
            cache: Cache {
                layer1_tokens: 32000,
                layer1_5_tokens: 20000,
                layer2: Lognormal::from_mean_median(10000.0, 5000.0),
                layer1_5_groups: Groups {
                    num_groups: 50,
                    zipf_alpha: 1.2,
                },
            },
            restart_initial_probability: 0.0,
            restart_turn_range: [5, 15],
        }
    }
}

/// A config object being read: its JSON path, for messages, and the keys not yet taken (as raw
/// JSON text: numbers are parsed from it, correctly rounded as Python parses them).
struct Obj {
    path: String,
    map: std::collections::BTreeMap<String, Box<RawValue>>,
}

type Res<T> = Result<T, String>;

impl Obj {
    fn new(path: &str, raw: &RawValue) -> Res<Self> {
        let shown = || {
            let mut t = raw.get().to_owned();
            t.truncate(60);
            t
        };
        let what = if path.is_empty() { "the config" } else { path };
        match serde_json::from_str(raw.get()) {
            Ok(map) => Ok(Obj {
                path: path.to_owned(),
                map,
            }),
            Err(_) => Err(format!("{what} must be a JSON object, got {}", shown())),
        }
    }

    fn at(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Takes `key` (or its camelCase alias at the top level); JSON null counts as absent.
    fn take(&mut self, key: &str) -> Option<Box<RawValue>> {
        let camel = camel_case(key);
        let v = self.map.remove(key).or_else(|| {
            self.path
                .is_empty()
                .then(|| self.map.remove(&camel))
                .flatten()
        });
        v.filter(|v| v.get().trim() != "null")
    }

    fn float(&mut self, key: &str) -> Res<Option<f64>> {
        let Some(raw) = self.take(key) else {
            return Ok(None);
        };
        let text = raw.get().trim();
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Number(_)) => text
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .map(Some)
                .ok_or_else(|| format!("{} must be a finite number", self.at(key))),
            _ => Err(format!("{} must be a number, got {text}", self.at(key))),
        }
    }

    fn int(&mut self, key: &str) -> Res<Option<i64>> {
        let Some(raw) = self.take(key) else {
            return Ok(None);
        };
        let text = raw.get().trim();
        let whole = text.parse::<i64>().ok().or_else(|| {
            text.parse::<f64>()
                .ok()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                .map(|f| f as i64)
        });
        whole
            .map(Some)
            .ok_or_else(|| format!("{} must be a whole number, got {text}", self.at(key)))
    }

    fn child(&mut self, key: &str) -> Res<Option<Obj>> {
        let path = self.at(key);
        self.take(key).map(|v| Obj::new(&path, &v)).transpose()
    }

    /// Refuses any key left over.
    fn finish(self) -> Res<()> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(k) => Err(format!(
                "unknown key {} in the agentic-code config; check its spelling against \
                 AIPerf's SessionDistributionConfig",
                if self.path.is_empty() {
                    k.clone()
                } else {
                    format!("{}.{k}", self.path)
                }
            )),
        }
    }
}

fn camel_case(key: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in key.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn check(ok: bool, msg: impl FnOnce() -> String) -> Res<()> {
    if ok {
        Ok(())
    } else {
        Err(msg())
    }
}

/// A lognormal object over `default` (mean and median required when there is no default).
fn lognormal(mut o: Obj) -> Res<Lognormal> {
    let at = o.path.clone();
    let mu = o.float("mu")?;
    let sigma = o.float("sigma")?;
    let mean = o.float("mean")?;
    let median = o.float("median")?;
    let min = o.float("min")?;
    let max = o.float("max")?;
    o.finish()?;
    let (Some(mean), Some(median)) = (mean, median) else {
        return Err(format!("{at} needs both `mean` and `median`"));
    };
    check(mean > 0.0 && median > 0.0, || {
        format!("{at}.mean and {at}.median must be above 0")
    })?;
    check(mean >= median, || {
        format!("{at}: mean ({mean}) must be >= median ({median}) for a lognormal")
    })?;
    for (v, k) in [(min, "min"), (max, "max")] {
        check(v.is_none_or(|v| v > 0.0), || {
            format!("{at}.{k} must be above 0")
        })?;
    }
    if let (Some(lo), Some(hi)) = (min, max) {
        check(lo <= hi, || {
            format!("{at}: min ({lo}) must be <= max ({hi})")
        })?;
    }
    check(sigma.is_none_or(|s| s >= 0.0), || {
        format!("{at}.sigma must be 0 or more")
    })?;
    let mut d = Lognormal::from_mean_median(mean, median);
    match (mu, sigma) {
        (Some(mu), Some(sigma)) => {
            d.mu = mu;
            d.sigma = sigma;
        }
        (None, None) => {}
        _ => return Err(format!("{at}: mu and sigma must be given as a pair")),
    }
    d.min = min;
    d.max = max;
    Ok(d)
}

fn or_default<T>(o: Option<Obj>, default: T, read: impl FnOnce(Obj) -> Res<T>) -> Res<T> {
    o.map_or(Ok(default), read)
}

fn mixture(mut o: Obj) -> Res<MixtureDelay> {
    let d = DistributionConfig::default().inter_turn_delay;
    let at = o.path.clone();
    let fraction = o.float("agentic_fraction")?.unwrap_or(d.agentic_fraction);
    check((0.0..=1.0).contains(&fraction), || {
        format!("{at}.agentic_fraction must be within 0..=1")
    })?;
    let agentic_delay = or_default(o.child("agentic_delay")?, d.agentic_delay, lognormal)?;
    let human_delay = or_default(o.child("human_delay")?, d.human_delay, lognormal)?;
    let max = o.float("max")?;
    check(max.is_none_or(|m| m >= 0.0), || {
        format!("{at}.max must be 0 or more")
    })?;
    o.finish()?;
    Ok(MixtureDelay {
        agentic_fraction: fraction,
        agentic_delay,
        human_delay,
        max,
    })
}

fn reset(mut o: Obj) -> Res<Reset> {
    let at = o.path.clone();
    let base = o.float("base_probability")?.unwrap_or(0.02);
    let scaling = o.float("context_scaling")?.unwrap_or(2.0);
    o.finish()?;
    check((0.0..=1.0).contains(&base), || {
        format!("{at}.base_probability must be within 0..=1")
    })?;
    check(scaling >= 1.0, || {
        format!("{at}.context_scaling must be at least 1")
    })?;
    Ok(Reset {
        base_probability: base,
        context_scaling: scaling,
    })
}

fn turns(mut o: Obj) -> Res<Turns> {
    let at = o.path.clone();
    let mut need = |k: &str| -> Res<i64> {
        let v = o.int(k)?.ok_or_else(|| format!("{at} needs `{k}`"))?;
        check(v > 0, || format!("{at}.{k} must be above 0"))?;
        Ok(v)
    };
    let (mean, median, min, max) = (need("mean")?, need("median")?, need("min")?, need("max")?);
    let allow_truncation = match o
        .take("allow_truncation")
        .map(|r| r.get().trim().to_owned())
    {
        None => false,
        Some(t) if t == "true" => true,
        Some(t) if t == "false" => false,
        Some(t) => {
            return Err(format!(
                "{at}.allow_truncation must be true or false, got {t}"
            ))
        }
    };
    let attempts = o.int("max_session_attempts")?;
    o.finish()?;
    check(mean >= median, || {
        format!("{at}: mean ({mean}) must be >= median ({median})")
    })?;
    check(min <= median, || {
        format!("{at}: min ({min}) must be <= median ({median})")
    })?;
    check(mean <= max, || {
        format!("{at}: mean ({mean}) must be <= max ({max})")
    })?;
    check(attempts.is_none_or(|a| a >= 1), || {
        format!("{at}.max_session_attempts must be at least 1")
    })?;
    let max_session_attempts = match (allow_truncation, attempts) {
        (true, Some(_)) => {
            return Err(format!(
                "{at}.max_session_attempts cannot be set when allow_truncation is true"
            ))
        }
        (true, None) => None,
        (false, a) => Some(a.unwrap_or(100)),
    };
    Ok(Turns {
        mean,
        median,
        min,
        max,
        allow_truncation,
        max_session_attempts,
    })
}

fn cache(mut o: Obj) -> Res<Cache> {
    let d = DistributionConfig::default().cache;
    let at = o.path.clone();
    let layer1_tokens = o.int("layer1_tokens")?.unwrap_or(d.layer1_tokens);
    let layer1_5_tokens = o.int("layer1_5_tokens")?.unwrap_or(d.layer1_5_tokens);
    check(layer1_tokens >= 0 && layer1_5_tokens >= 0, || {
        format!("{at}.layer1_tokens and {at}.layer1_5_tokens must be 0 or more")
    })?;
    let layer2 = or_default(o.child("layer2")?, d.layer2, lognormal)?;
    let layer1_5_groups = match o.child("layer1_5_groups")? {
        None => d.layer1_5_groups,
        Some(mut g) => {
            let num_groups = g.int("num_groups")?.unwrap_or(50);
            let zipf_alpha = g.float("zipf_alpha")?.unwrap_or(1.2);
            let gat = g.path.clone();
            g.finish()?;
            check(num_groups >= 1, || {
                format!("{gat}.num_groups must be at least 1")
            })?;
            check(zipf_alpha >= 0.0, || {
                format!("{gat}.zipf_alpha must be 0 or more")
            })?;
            Groups {
                num_groups,
                zipf_alpha,
            }
        }
    };
    o.finish()?;
    Ok(Cache {
        layer1_tokens,
        layer1_5_tokens,
        layer2,
        layer1_5_groups,
    })
}

impl DistributionConfig {
    /// Reads a config JSON (or a previous run's `manifest.json`, through its
    /// `generation_params`), missing keys at AIPerf's defaults.
    pub fn from_json(text: &str) -> Res<Self> {
        let v: Box<RawValue> =
            serde_json::from_str(text).map_err(|e| format!("is not valid JSON: {e}"))?;
        let mut top = Obj::new("", &v)?;
        if let Some(params) = top.take("generation_params") {
            top = Obj::new("", &params)?;
        } else if top.map.contains_key("seed") && top.map.contains_key("num_sessions") {
            return Err("is a manifest without `generation_params`".into());
        }
        Self::from_obj(top)
    }

    fn from_obj(mut o: Obj) -> Res<Self> {
        let d = DistributionConfig::default();
        // Removed or renamed keys AIPerf still accepts.
        o.take("system_prompt_tokens");
        let restart_fraction = o.float("restart_fraction")?;
        let turns_cfg = o.child("turns")?.map(turns).transpose()?;
        let reset_given = o.map.contains_key("reset");
        let reset_cfg = match o.child("reset")? {
            Some(r) => Some(reset(r)?),
            None if turns_cfg.is_some() || reset_given => None,
            None => d.reset.clone(),
        };
        let new_tokens_per_turn = match o.child("new_tokens_per_turn")? {
            None => d.new_tokens_per_turn,
            Some(mut n) => {
                let bias = n.float("bias")?.unwrap_or(1.0);
                check(bias > 0.0, || {
                    "new_tokens_per_turn.bias must be above 0".into()
                })?;
                NewTokens {
                    dist: lognormal(n)?,
                    bias,
                }
            }
        };
        let generation_length = or_default(
            o.child("generation_length")?,
            d.generation_length,
            lognormal,
        )?;
        let inter_turn_delay =
            or_default(o.child("inter_turn_delay")?, d.inter_turn_delay, mixture)?;
        let max_prompt_tokens = o.int("max_prompt_tokens")?.unwrap_or(d.max_prompt_tokens);
        let block_size = o.int("block_size")?.unwrap_or(d.block_size);
        let cache = or_default(o.child("cache")?, d.cache, cache)?;
        let restart_initial_probability = o.float("restart_initial_probability")?;
        let restart_turn_range = match o.take("restart_turn_range") {
            None => d.restart_turn_range,
            Some(raw) => match serde_json::from_str::<Vec<i64>>(raw.get()) {
                Ok(v) if v.len() == 2 => [v[0], v[1]],
                _ => {
                    return Err(format!(
                        "restart_turn_range must be [min, max) (two whole numbers), got {}",
                        raw.get()
                    ))
                }
            },
        };
        o.finish()?;
        if let (Some(f), Some(p)) = (restart_fraction, restart_initial_probability) {
            check(f == p, || {
                "restart_fraction cannot differ from restart_initial_probability".into()
            })?;
        }
        let restart = restart_initial_probability
            .or(restart_fraction)
            .unwrap_or(0.0);
        let cfg = DistributionConfig {
            new_tokens_per_turn,
            generation_length,
            inter_turn_delay,
            reset: reset_cfg,
            turns: turns_cfg,
            max_prompt_tokens,
            block_size,
            cache,
            restart_initial_probability: restart,
            restart_turn_range,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The model-level rules (`validate_turn_mode` and the field bounds).
    pub fn validate(&self) -> Res<()> {
        check(self.max_prompt_tokens >= 1, || {
            "max_prompt_tokens must be at least 1".into()
        })?;
        check(self.block_size >= 1, || {
            "block_size must be at least 1".into()
        })?;
        check(
            (0.0..=1.0).contains(&self.restart_initial_probability),
            || "restart_initial_probability must be within 0..=1".into(),
        )?;
        let [lo, hi] = self.restart_turn_range;
        check(lo >= 1, || "restart_turn_range minimum must be >= 1".into())?;
        check(hi > lo, || {
            "restart_turn_range must be ordered as [min, max)".into()
        })?;
        let Some(t) = &self.turns else {
            return Ok(());
        };
        check(self.reset.is_none(), || {
            "turns mode cannot be combined with reset".into()
        })?;
        check(self.restart_initial_probability == 0.0, || {
            "turns mode cannot be combined with restart_initial_probability".into()
        })?;
        let min_l2 = self.cache.layer2.min.map_or(1, |m| m as i64);
        let min_new = self.new_tokens_per_turn.dist.min.map_or(1, |m| m as i64);
        let min_out = self
            .generation_length
            .max
            .map_or(30, |m| (m as i64).min(30));
        let mut input = self.cache.layer1_tokens + self.cache.layer1_5_tokens + min_l2;
        check(input < self.max_prompt_tokens, || {
            "turns mode is impossible: minimum initial context exceeds max_prompt_tokens".into()
        })?;
        if !t.allow_truncation {
            for _ in 1..t.min {
                input += min_out + min_new;
                check(input < self.max_prompt_tokens, || {
                    "turns mode is impossible: minimum turn count cannot fit under \
                     max_prompt_tokens"
                        .into()
                })?;
            }
        }
        Ok(())
    }

    /// `--max-isl` / `--max-osl`: the context limit and the output bound (AIPerf's
    /// `_apply_cli_overrides`, which re-validates).
    pub fn with_overrides(mut self, max_isl: Option<i64>, max_osl: Option<i64>) -> Res<Self> {
        if let Some(isl) = max_isl {
            self.max_prompt_tokens = isl;
        }
        if let Some(osl) = max_osl {
            let g = &self.generation_length;
            check(osl as f64 > 0.0, || "--max-osl must be at least 1".into())?;
            if let Some(lo) = g.min {
                check(lo <= osl as f64, || {
                    format!("--max-osl {osl} is below generation_length.min ({lo})")
                })?;
            }
            self.generation_length.max = Some(osl as f64);
        }
        self.validate()?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_derive_mu_and_sigma() {
        let d = DistributionConfig::default();
        assert_eq!(d.generation_length.mu, 300f64.ln());
        assert_eq!(
            d.generation_length.sigma,
            (2.0 * (500f64 / 300.0).ln()).sqrt()
        );
        assert_eq!(DistributionConfig::from_json("{}").unwrap(), d);
    }

    #[test]
    fn keys_are_checked_by_path() {
        let e = DistributionConfig::from_json(r#"{"cache": {"layer2": {"mean": 1, "median": 2}}}"#)
            .unwrap_err();
        assert!(
            e.contains("cache.layer2: mean (1) must be >= median (2)"),
            "{e}"
        );
        let e = DistributionConfig::from_json(r#"{"cache": {"layer3": 5}}"#).unwrap_err();
        assert!(e.contains("unknown key cache.layer3"), "{e}");
        let c = DistributionConfig::from_json(
            r#"{"maxPromptTokens": 1000, "turns": {"mean": 3, "median": 2, "min": 1, "max": 5}}"#,
        );
        let e = c.unwrap_err();
        assert!(e.contains("minimum initial context exceeds"), "{e}");
        let c =
            DistributionConfig::from_json(r#"{"generation_params": {"block_size": 64}}"#).unwrap();
        assert_eq!(c.block_size, 64);
    }
}
