//! The shipped monitoring (the Grafana dashboard `deploy/grafana/kvbust.json` and the alerts of
//! `deploy/k8s/overlays/monitoring/prometheusrule.yaml`) asks only for metrics, and labels,
//! that kvbust's `/metrics` really has, after traffic that touches every family; the engine
//! panels' `vllm:` metrics are checked against the mock's `/metrics` (vLLM's names).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::common::*;
use http::StatusCode;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Labels Prometheus adds at scrape time (target labels), which kvbust's exposition never has.
const TARGET_LABELS: &[&str] = &[
    "namespace",
    "pod",
    "instance",
    "job",
    "service",
    "container",
];

/// SGLang metrics the dashboard reads, which no server in these tests exports (the mock speaks
/// vLLM's names): taken from SGLang's documentation, checked by name only.
const SGLANG_UNCHECKED: &[&str] = &["sglang:cache_hit_rate"];

/// PromQL functions and aggregations the queries may use.
const FUNCTIONS: &[&str] = &[
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "rate",
    "increase",
    "irate",
    "histogram_quantile",
    "clamp_min",
    "label_values",
];
const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset"];

/// What one query uses: metric names, and the label names its `by (...)` / `on (...)` lists and
/// label matchers name.
#[derive(Debug, Default)]
struct Uses {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}
fn is_ident(c: char) -> bool {
    is_ident_start(c) || c.is_ascii_digit()
}

/// A small PromQL scanner: enough for the queries kvbust ships, and strict about anything else
/// (an unknown function is an error, so a typo cannot pass as a function call).
fn parse(q: &str) -> Uses {
    let mut uses = Uses::default();
    let chars: Vec<char> = q.chars().collect();
    let mut i = 0;
    let mut grouping = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '[' {
            // A range such as [5m] or [$__rate_interval].
            i += chars[i..]
                .iter()
                .position(|&c| c == ']')
                .expect("closed range")
                + 1;
        } else if c == '{' {
            // Label matchers: name op "value", ...
            let end = i + chars[i..]
                .iter()
                .position(|&c| c == '}')
                .expect("closed matcher");
            let inner: String = chars[i + 1..end].iter().collect();
            let mut rest = inner.as_str();
            while let Some(start) = rest.find(is_ident_start) {
                let name_len = rest[start..].find(|c| !is_ident(c)).unwrap_or(rest.len());
                uses.labels
                    .insert(rest[start..start + name_len].to_string());
                // Skip the operator and the quoted value.
                let after = &rest[start + name_len..];
                let open = after.find('"').expect("quoted matcher value");
                let close = after[open + 1..].find('"').expect("closed value") + open + 1;
                rest = &after[close + 1..];
            }
            i = end + 1;
        } else if c == '(' && grouping {
            let end = i + chars[i..]
                .iter()
                .position(|&c| c == ')')
                .expect("closed list");
            let inner: String = chars[i + 1..end].iter().collect();
            for l in inner.split(',').map(str::trim).filter(|l| !l.is_empty()) {
                uses.labels.insert(l.to_string());
            }
            grouping = false;
            i = end + 1;
        } else if is_ident_start(c) || c == '$' {
            let start = i;
            while i < chars.len() && (is_ident(chars[i]) || chars[i] == '$') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            // An aggregation may put its grouping first: `sum by (le) (...)`.
            let rest: String = chars[i..].iter().collect();
            let grouping_follows = ["by", "without"].iter().any(|k| {
                rest.trim_start()
                    .strip_prefix(k)
                    .is_some_and(|r| r.trim_start().starts_with('('))
            });
            if [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&word.as_str())
            {
                grouping = next == Some(&'(');
            } else if next == Some(&'(') || grouping_follows {
                assert!(
                    FUNCTIONS.contains(&word.as_str()),
                    "`{q}`: unknown function {word}"
                );
            } else if !KEYWORDS.contains(&word.as_str()) {
                assert!(!word.starts_with('$'), "`{q}`: stray variable {word}");
                uses.metrics.insert(word);
            }
        } else {
            i += 1;
        }
    }
    uses
}

/// Every `expr` of the dashboard's panels and every query variable, by where it is.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = repo().join("deploy/grafana/kvbust.json");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let title = p["title"].as_str().unwrap();
            out.push((format!("panel {title}"), t["expr"].as_str().unwrap().into()));
        }
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        if v["type"] == "query" {
            let q = v["query"].as_str().unwrap();
            // Grafana's `label_values(metric, label)`: as PromQL, `count by (label) (metric)`.
            let q = match q
                .strip_prefix("label_values(")
                .and_then(|r| r.strip_suffix(')'))
                .and_then(|r| r.split_once(','))
            {
                Some((metric, label)) => {
                    format!("count by ({}) ({})", label.trim(), metric.trim())
                }
                None => q.to_string(),
            };
            out.push((format!("variable {}", v["name"]), q));
        }
    }
    out
}

fn alert_queries() -> Vec<(String, String)> {
    let path = repo().join("deploy/k8s/overlays/monitoring/prometheusrule.yaml");
    let rule: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    for g in rule["spec"]["groups"].as_sequence().unwrap() {
        for r in g["rules"].as_sequence().unwrap() {
            out.push((
                format!("alert {}", r["alert"].as_str().unwrap()),
                r["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// Sample names (`kvbust_x_bucket`, ...) of an exposition, with the label names each carries.
fn exposition(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap();
        let labels = out.entry(line[..name_end].to_string()).or_default();
        if line[name_end..].starts_with('{') {
            let inner = &line[name_end + 1..line.rfind('}').unwrap()];
            for pair in inner.split("\",") {
                labels.insert(pair.split('=').next().unwrap().to_string());
            }
        }
    }
    out
}

#[test]
fn the_scanner_finds_metrics_and_labels_and_rejects_unknown_functions() {
    let u = parse(
        "histogram_quantile(0.99, sum by (le, phase) (rate(kvbust_x_bucket{namespace=~\"$ns\",status=~\"5..\"}[$__rate_interval]))) / on (pod) group_left (version) kvbust_build_info",
    );
    assert_eq!(
        u.metrics.into_iter().collect::<Vec<_>>(),
        ["kvbust_build_info", "kvbust_x_bucket"]
    );
    assert_eq!(
        u.labels.into_iter().collect::<Vec<_>>(),
        ["le", "namespace", "phase", "pod", "status", "version"]
    );
    assert!(std::panic::catch_unwind(|| parse("rat(kvbust_x[5m])")).is_err());
}

#[tokio::test]
async fn every_dashboard_and_alert_query_names_metrics_kvbust_exports() {
    let h = start(|_| {}).await;
    let c = h1();
    // Traffic that fills every family the queries read: a streamed chat twice (TTFT, inter-token
    // gaps, prompt and cached tokens, the ledger), and a client error.
    for _ in 0..2 {
        let resp = chat(&c, &h, chat_body("the same prompt twice", true, 4)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        body_bytes(resp).await;
    }
    let bad = send(
        &c,
        post(
            &h.url("/v1/chat/completions"),
            chat_body("hi", false, 1),
            &[("x-kvbust-phase", "later")],
        ),
    )
    .await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    body_bytes(bad).await;
    let exported = exposition(&metrics_text(&h).await);
    // The engine's own metrics, as the mock (vLLM's names) exports them after the same traffic.
    let resp = send(&c, get(&format!("http://{}/metrics", h.mock_addr))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let engine = exposition(std::str::from_utf8(&body_bytes(resp).await).unwrap());
    h.shutdown().await;
    assert!(engine.keys().all(|m| m.starts_with("vllm:")), "{engine:?}");
    let exported: BTreeMap<String, BTreeSet<String>> = exported.into_iter().chain(engine).collect();
    // SGLang's, which no server here exports: the names checked against SGLang's documentation
    // only, with the labels the queries may use (none beyond the scrape's own).
    let exported: BTreeMap<String, BTreeSet<String>> = exported
        .into_iter()
        .chain(
            SGLANG_UNCHECKED
                .iter()
                .map(|m| (m.to_string(), BTreeSet::new())),
        )
        .collect();

    let queries: Vec<(String, String)> = dashboard_queries()
        .into_iter()
        .chain(alert_queries())
        .collect();
    assert!(queries.len() >= 15, "{queries:?}");
    let mut used = BTreeSet::new();
    for (at, q) in &queries {
        let uses = parse(q);
        assert!(!uses.metrics.is_empty(), "{at}: `{q}` reads no metric");
        for m in &uses.metrics {
            assert!(
                exported.contains_key(m),
                "{at}: `{q}` reads {m}, which neither kvbust's /metrics nor the mock's (vllm:) has"
            );
            used.insert(m.clone());
        }
        // Each label is the scrape's own, or carried by a metric of the query.
        for l in &uses.labels {
            let carried = uses.metrics.iter().any(|m| exported[m].contains(l));
            assert!(
                carried || TARGET_LABELS.contains(&l.as_str()),
                "{at}: `{q}` uses label {l}, which none of {:?} has",
                uses.metrics
            );
        }
    }
    // What the issue asks the dashboard to show, and the three alerts.
    for m in [
        "kvbust_requests_total",
        "kvbust_errors_total",
        "kvbust_time_to_first_token_seconds_bucket",
        "kvbust_inter_token_seconds_bucket",
        "kvbust_upstream_cached_tokens_total",
        "kvbust_upstream_prompt_tokens_total",
        "kvbust_proxy_overhead_seconds_bucket",
        "kvbust_upstream_up",
        "kvbust_in_flight_requests",
        "kvbust_buffered_body_bytes",
        "kvbust_ledger_sessions",
        "process_resident_memory_bytes",
        // The engine's own prefix-cache counters, beside kvbust's.
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "sglang:cache_hit_rate",
    ] {
        assert!(used.contains(m), "the dashboard shows no {m}");
    }
    let alerts: Vec<String> = alert_queries().into_iter().map(|(a, _)| a).collect();
    assert_eq!(
        alerts,
        [
            "alert KvbustUpstreamDown",
            "alert KvbustHigh5xxRatio",
            "alert KvbustOverheadP99High"
        ]
    );
}
