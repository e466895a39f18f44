//! Running kvbust as users deploy it: two replicas and the ledger modes, the admin safety rule,
//! `kvbust healthcheck`, and the shipped Kubernetes manifests and Dockerfile checked against the
//! real binary (every port, probe path, env var and config key they name must exist in kvbust).
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Output};

use crate::common::*;
use clap::Parser;
use http::StatusCode;
use kvbust::cachebust::{digest, DigestInputs, Target};
use kvbust::cli::{Cli, Command};
use kvbust::config::{Config, LedgerMode};
use serde::Deserialize;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Ledger modes: one session's turns alternate between two replicas.

/// Turn `n` (1-based) of a chat session: the client resends its history, unmarked.
fn turn(n: usize) -> String {
    let mut messages = vec![json!({"role": "user", "content": "Plan a trip to Lisbon."})];
    for i in 1..n {
        messages.push(json!({"role": "assistant", "content": format!("answer {i}")}));
        messages.push(json!({"role": "user", "content": format!("follow-up {i}")}));
    }
    json!({"model": "kvbust-mock", "max_tokens": 1, "messages": messages}).to_string()
}

/// Sends turn `n` of session `key` through `h`; returns the RID the proxy reports and the first
/// user message the upstream received.
async fn send_turn(h: &Harness, key: &str, n: usize) -> (String, String) {
    let resp = send(
        &h1(),
        post(
            &h.url("/v1/chat/completions"),
            turn(n),
            &[("x-correlation-id", key)],
        ),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let rid = resp.headers()["x-kvbust-rid"].to_str().unwrap().to_string();
    body_bytes(resp).await;
    let got = h
        .mock
        .recorder()
        .requests()
        .pop()
        .expect("the upstream saw it");
    let body: Value = serde_json::from_slice(&got.body).unwrap();
    let first_user = body["messages"][0]["content"].as_str().unwrap().to_string();
    (rid, first_user)
}

/// Two replicas in front of one upstream, as behind a Service with no session affinity. Replica
/// A has already served another session, as replicas of a busy gateway have; then the turns of
/// session "s1" alternate A, B, A, B. Returns the RIDs and the marked first user messages.
async fn alternate(mode: LedgerMode) -> (Vec<String>, Vec<String>) {
    let a = start(|c| {
        c.cache_bust.target = Target::FirstTurnPrefix;
        c.cache_bust.ledger = mode;
    })
    .await;
    let upstream = format!("http://{}", a.mock_addr);
    let mut b = start_proxy(&upstream, |c| {
        c.cache_bust.target = Target::FirstTurnPrefix;
        c.cache_bust.ledger = mode;
    })
    .await;
    // Both replicas forward to A's mock, so the recorder sees every request in order.
    b.mock = a.mock.clone();
    send_turn(&a, "earlier-session", 1).await;
    let (mut rids, mut firsts) = (Vec::new(), Vec::new());
    for n in 1..=4 {
        let replica = if n % 2 == 1 { &a } else { &b };
        let (rid, first) = send_turn(replica, "s1", n).await;
        rids.push(rid);
        firsts.push(first);
    }
    b.shutdown().await;
    a.shutdown().await;
    (rids, firsts)
}

/// The RID of session "s1" with counter `c`, computed by the digest function, not the proxy.
fn rid_of_s1(c: i64) -> String {
    digest(&DigestInputs {
        benchmark_id: "0123456789ab".into(),
        recycle_pass: c,
        trajectory_index: c,
        trace_id: "s1".into(),
    })
}

#[tokio::test]
async fn local_ledger_replicas_disagree_on_a_session() {
    let (rids, firsts) = alternate(LedgerMode::Local).await;
    // A minted counter 1 for s1 (it had seen a session before), B minted 0.
    let (on_a, on_b) = (rid_of_s1(1), rid_of_s1(0));
    assert_ne!(on_a, on_b);
    assert_eq!(
        rids,
        [on_a.clone(), on_b.clone(), on_a.clone(), on_b.clone()]
    );
    assert_eq!(firsts[0], format!("[rid:{on_a}]\n\nPlan a trip to Lisbon."));
    assert_eq!(firsts[1], format!("[rid:{on_b}]\n\nPlan a trip to Lisbon."));
    assert_eq!(firsts[0], firsts[2]);
    assert_ne!(firsts[0], firsts[1]);
}

#[tokio::test]
async fn stateless_ledger_replicas_agree_on_a_session() {
    let (rids, firsts) = alternate(LedgerMode::Stateless).await;
    let want = rid_of_s1(0);
    assert_eq!(rids, vec![want.clone(); 4]);
    for first in &firsts {
        assert_eq!(first, &format!("[rid:{want}]\n\nPlan a trip to Lisbon."));
    }
}

#[tokio::test]
async fn stateless_ledger_keeps_no_sessions() {
    let h = start(|c| {
        c.cache_bust.target = Target::FirstTurnPrefix;
        c.cache_bust.ledger = LedgerMode::Stateless;
    })
    .await;
    let (rid_x, _) = send_turn(&h, "x", 1).await;
    let (rid_y, _) = send_turn(&h, "y", 1).await;
    assert_ne!(rid_x, rid_y, "different sessions keep different markers");
    let m = metrics_text(&h).await;
    assert!(m.contains("kvbust_ledger_sessions 0"), "{m}");
    h.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// The binary: admin safety rule and `kvbust healthcheck`.

/// The kvbust binary with no `KVBUST_*` variables inherited from the test's environment.
fn kvbust() -> Process {
    let mut p = Process::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") {
            p.env_remove(k);
        }
    }
    p
}

fn run(mut p: Process) -> Output {
    p.output().expect("kvbust runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_public_admin_port_without_a_token_refuses_to_start() {
    let out = run({
        let mut p = kvbust();
        p.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "0.0.0.0:0",
        ]);
        p
    });
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("admin.token"), "{err}");
    assert!(err.contains("allow_unauthenticated"), "{err}");

    // `config check` says the same before anything is deployed; a token or the explicit opt-out
    // makes the configuration valid.
    let check = |env: &[(&str, &str)]| {
        let mut p = kvbust();
        p.args(["config", "check", "--admin-listen", "0.0.0.0:9090"]);
        p.envs(env.iter().copied());
        run(p).status.code()
    };
    assert_eq!(check(&[]), Some(64));
    assert_eq!(check(&[("KVBUST_ADMIN__TOKEN", TOKEN)]), Some(0));
    assert_eq!(
        check(&[("KVBUST_ADMIN__ALLOW_UNAUTHENTICATED", "true")]),
        Some(0)
    );
}

/// An admin token kvbust accepts: 24 characters or more, no placeholder.
const TOKEN: &str = "test-token-0123456789abcdef";

/// The token the base kustomization once shipped, and any short one, are refused at start: a
/// first `kubectl apply -k` must not leave `PUT /phase` open to a token in the repository.
#[test]
fn a_placeholder_or_short_admin_token_refuses_to_start() {
    for token in ["REPLACE-ME-before-applying", "t0ken"] {
        let out = run({
            let mut p = kvbust();
            p.args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .env("KVBUST_ADMIN__TOKEN", token);
            p
        });
        assert_eq!(out.status.code(), Some(64), "{token}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("admin.token"), "{err}");
        assert!(err.contains("openssl rand"), "{err}");
    }
}

fn healthcheck(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut p = kvbust();
    p.arg("healthcheck").args(args).envs(env.iter().copied());
    run(p)
}

#[tokio::test]
async fn healthcheck_exits_0_when_ready_and_1_when_draining_or_down() {
    let h = start(|_| {}).await;
    let admin = h.admin_addr.to_string();
    let hc = |args: Vec<String>, env: Vec<(&'static str, &'static str)>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            healthcheck(&args, &env)
        })
    };
    let ok = hc(vec!["--admin-listen".into(), admin.clone()], vec![])
        .await
        .unwrap();
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("200"));

    // A wildcard admin address is probed on loopback (a container's own view of itself).
    let wildcard = format!("0.0.0.0:{}", h.admin_addr.port());
    let ok = hc(
        vec!["--admin-listen".into(), wildcard],
        vec![("KVBUST_ADMIN__TOKEN", TOKEN)],
    )
    .await
    .unwrap();
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));

    let missing = hc(
        vec![
            "--admin-listen".into(),
            admin.clone(),
            "--path".into(),
            "/nope".into(),
        ],
        vec![],
    )
    .await
    .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).contains("404"), "{}", stderr(&missing));

    // Draining: /readyz answers 503, so the probe fails, while /healthz (alive) still passes.
    h.runtime.start_draining();
    let draining = hc(vec!["--admin-listen".into(), admin.clone()], vec![])
        .await
        .unwrap();
    assert_eq!(draining.status.code(), Some(1));
    assert!(stderr(&draining).contains("503"), "{}", stderr(&draining));
    let alive = hc(
        vec![
            "--admin-listen".into(),
            admin.clone(),
            "--path".into(),
            "/healthz".into(),
        ],
        vec![],
    )
    .await
    .unwrap();
    assert_eq!(alive.status.code(), Some(0), "{}", stderr(&alive));
    h.shutdown().await;

    // Nothing listening any more.
    let down = hc(vec!["--admin-listen".into(), admin], vec![])
        .await
        .unwrap();
    assert_eq!(down.status.code(), Some(1));
    // The listening socket may still be closing when shutdown returns: the kernel can then
    // accept the probe from the backlog and reset it. Either way the probe fails, and says why.
    let said = stderr(&down);
    assert!(
        said.contains("cannot connect") || said.contains("Connection reset"),
        "{said}"
    );

    let usage = healthcheck(&["--path", "readyz"], &[]);
    assert_eq!(usage.status.code(), Some(2), "{}", stderr(&usage));
}

// ---------------------------------------------------------------------------------------------
// The shipped manifests and Dockerfile, checked against kvbust itself.

/// The placeholder image name the manifests ship (no image is published; README).
const IMAGE_REPO: &str = "image-not-published.invalid/kvbust";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn overlay_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo().join("deploy/k8s/overlays"))
        .expect("deploy/k8s/overlays exists")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The overlay rendered by kustomize: from `$K8S_RENDERED_DIR/<overlay>.yaml` (written by
/// .ci/run), else by `kubectl kustomize`. `None` when neither is available.
fn render(overlay: &str) -> Option<String> {
    if let Some(dir) = std::env::var_os("K8S_RENDERED_DIR") {
        let path = Path::new(&dir).join(format!("{overlay}.yaml"));
        return Some(
            std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e} (.ci/run renders it)", path.display())),
        );
    }
    let dir = repo().join("deploy/k8s/overlays").join(overlay);
    let out = Process::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        stderr(&out)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or("")
}

fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or("")
}

fn find<'a>(docs: &'a [Value], k: &str, n: &str) -> &'a Value {
    docs.iter()
        .find(|d| kind(d) == k && name(d) == n)
        .unwrap_or_else(|| panic!("no {k} named {n} in the rendered overlay"))
}

fn str_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// True when every `selector` label is on `labels` (an empty selector selects nothing here).
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// A workload's pod template.
struct Pod<'a> {
    workload: &'a Value,
    labels: BTreeMap<String, String>,
    spec: &'a Value,
}

impl Pod<'_> {
    fn containers(&self) -> impl Iterator<Item = (&Value, bool)> {
        list(&self.spec["containers"])
            .iter()
            .map(|c| (c, false))
            .chain(list(&self.spec["initContainers"]).iter().map(|c| (c, true)))
    }
}

fn pods(docs: &[Value]) -> Vec<Pod<'_>> {
    docs.iter()
        .filter(|d| matches!(kind(d), "Deployment" | "StatefulSet" | "DaemonSet" | "Job"))
        .map(|d| Pod {
            workload: d,
            labels: str_map(&d["spec"]["template"]["metadata"]["labels"]),
            spec: &d["spec"]["template"]["spec"],
        })
        .collect()
}

fn is_kvbust(container: &Value) -> bool {
    container["image"]
        .as_str()
        .is_some_and(|i| i.starts_with(&format!("{IMAGE_REPO}:")))
}

/// A named or numbered port of `container`: (name, number).
fn container_port(container: &Value, port: &Value) -> Option<(String, u64)> {
    list(&container["ports"]).iter().find_map(|p| {
        let n = p["containerPort"].as_u64()?;
        let pname = p["name"].as_str().unwrap_or("").to_string();
        let hit = match port {
            Value::String(s) => *s == pname,
            Value::Number(x) => x.as_u64() == Some(n),
            _ => false,
        };
        hit.then_some((pname, n))
    })
}

/// What the manifests ask of kvbust's admin port, answered by a real kvbust at the end.
#[derive(Default)]
struct Seen {
    admin_paths: BTreeSet<String>,
    kvbust_containers: usize,
    /// The model servers' ports a PodMonitor scrapes (their own /metrics).
    engine_ports: BTreeSet<String>,
    dashboards: usize,
    rules: usize,
}

/// Checks one kvbust container against the binary's command line and configuration.
fn check_kvbust_container(
    ctx: &str,
    docs: &[Value],
    pod: &Pod<'_>,
    c: &Value,
    init: bool,
    scaled: bool,
    seen: &mut Seen,
) {
    seen.kvbust_containers += 1;
    let image = c["image"].as_str().unwrap();
    assert_eq!(
        image,
        format!("{IMAGE_REPO}:{}", env!("CARGO_PKG_VERSION")),
        "{ctx}: the image tag follows the crate version"
    );
    if init {
        assert_eq!(
            c["restartPolicy"], "Always",
            "{ctx}: kvbust in initContainers must be a native sidecar (restartPolicy: Always)"
        );
    }

    // The command line parses as `kvbust serve`, with a config file mounted from a ConfigMap.
    let args: Vec<String> = list(&c["args"])
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert!(c["command"].is_null(), "{ctx}: keep the image's entrypoint");
    let cli = Cli::try_parse_from(std::iter::once("kvbust".to_string()).chain(args.clone()))
        .unwrap_or_else(|e| panic!("{ctx}: args {args:?} do not parse: {e}"));
    let Command::Serve(serve) = cli.command else {
        panic!("{ctx}: args {args:?} must run `kvbust serve`");
    };
    let config_path = serve
        .flags
        .config
        .clone()
        .unwrap_or_else(|| panic!("{ctx}: pass --config"));
    let dir = config_path.parent().unwrap().to_str().unwrap();
    let file = config_path.file_name().unwrap().to_str().unwrap();
    let mount = list(&c["volumeMounts"])
        .iter()
        .find(|m| m["mountPath"] == dir)
        .unwrap_or_else(|| panic!("{ctx}: nothing is mounted at {dir}"));
    let volume = list(&pod.spec["volumes"])
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("{ctx}: no volume {}", mount["name"]));
    let cm_name = volume["configMap"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{ctx}: {dir} must come from a ConfigMap"));
    let text = find(docs, "ConfigMap", cm_name)["data"][file]
        .as_str()
        .unwrap_or_else(|| panic!("{ctx}: ConfigMap {cm_name} has no key {file}"));
    assert_eq!(
        text,
        std::fs::read_to_string(repo().join("deploy/k8s/base/kvbust.toml")).unwrap(),
        "{ctx}: the ConfigMap is deploy/k8s/base/kvbust.toml, as in the image"
    );
    let scratch = test_dir().join(format!("deploy-{}", ctx.replace(['/', ' '], "_")));
    std::fs::create_dir_all(&scratch).unwrap();
    let local = scratch.join(file);
    std::fs::write(&local, text).unwrap();

    // Every env var is a kvbust variable; Secret and ConfigMap references resolve.
    let mut env = Vec::new();
    for e in list(&c["env"]) {
        let var = e["name"].as_str().unwrap().to_string();
        assert!(
            var.starts_with("KVBUST_"),
            "{ctx}: env {var} is not read by kvbust"
        );
        let value = if var == "KVBUST_CAPTURE__KEY_FILE" {
            // Mounted from the user's Secret (components/capture): a stand-in key here.
            let key = scratch.join("capture.key");
            std::fs::write(&key, "a-stand-in-capture-key-of-32-bytes").unwrap();
            key.to_string_lossy().into_owned()
        } else if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
            let (n, k) = (r["name"].as_str().unwrap(), r["key"].as_str().unwrap());
            // The admin token's Secret is the user's to create (the README's command), so no
            // token value is ever shipped: nothing renders it, and the README creates it.
            assert!(
                !docs.iter().any(|d| kind(d) == "Secret"),
                "{ctx}: the manifests must not ship a Secret (its value would be everyone's)"
            );
            assert_eq!(
                (n, k),
                ("kvbust-admin", "token"),
                "{ctx}: {var}: deploy/README.md creates Secret kvbust-admin, key token"
            );
            assert!(
                r.get("optional").is_none_or(|o| o == false),
                "{ctx}: {var}: without the Secret the pod must not start"
            );
            let readme = std::fs::read_to_string(repo().join("deploy/README.md")).unwrap();
            assert!(
                readme.contains("kubectl create secret generic kvbust-admin --from-literal=token="),
                "{ctx}: deploy/README.md shows how to create Secret {n}"
            );
            format!("from-secret-{n}-{k}-0123456789abcdef")
        } else if let Some(r) = e["valueFrom"]["configMapKeyRef"].as_object() {
            // A per-run value (the gateway's benchmark id) the user sets, as the README shows.
            let (n, k) = (r["name"].as_str().unwrap(), r["key"].as_str().unwrap());
            let readme = std::fs::read_to_string(repo().join("deploy/README.md")).unwrap();
            assert!(
                readme.contains(&format!("kubectl create configmap {n} --from-literal={k}=")),
                "{ctx}: {var}: deploy/README.md must show how to create ConfigMap {n} key {k}"
            );
            "0123456789ab".to_string()
        } else {
            panic!("{ctx}: {var}: use value, valueFrom.secretKeyRef or valueFrom.configMapKeyRef");
        };
        env.push((var, value));
    }
    let config = Config::load(Some(&local), &env, &serve.flags.overrides())
        .unwrap_or_else(|e| panic!("{ctx}: kvbust would refuse this configuration: {e}"));
    std::fs::remove_dir_all(&scratch).ok();

    // Buffered bodies fit in half the container's memory (kvbust would lower them at start
    // with a warning otherwise).
    let mem = c["resources"]["limits"]["memory"].as_str().unwrap_or("");
    let mem_bytes: u64 = match mem.strip_suffix("Mi") {
        Some(n) => n.parse::<u64>().unwrap() << 20,
        None => mem
            .strip_suffix("Gi")
            .map_or(u64::MAX, |n| n.parse::<u64>().unwrap() << 30),
    };
    assert!(
        config.limits.max_buffered_total.as_u64() <= mem_bytes / 2,
        "{ctx}: limits.max_buffered_total {} is more than half the memory limit {mem}",
        config.limits.max_buffered_total
    );

    // Writable paths: the root filesystem is read-only, so the cache dir must be a volume.
    if let Some((_, dir)) = env.iter().find(|(k, _)| k == "KVBUST_CACHE_DIR") {
        assert!(
            list(&c["volumeMounts"])
                .iter()
                .any(|m| m["mountPath"] == dir.as_str() && m["readOnly"] != true),
            "{ctx}: KVBUST_CACHE_DIR {dir} must be a writable volume"
        );
    }

    // Ports: exactly kvbust's two listeners, named as the Services and monitors expect.
    let data_port = u64::from(config.listen.addr.port());
    let admin_port = u64::from(config.admin.addr.port());
    let ports: BTreeMap<String, u64> = list(&c["ports"])
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or("").to_string(),
                p["containerPort"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        BTreeMap::from([("http".into(), data_port), ("metrics".into(), admin_port)]),
        "{ctx}: ports must be kvbust's listen.addr (http) and admin.addr (metrics)"
    );

    // Probes: HTTP GETs on the admin port, paths answered by the admin server (checked below).
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let p = &c[probe];
        assert!(p.is_object(), "{ctx}: {probe} is missing");
        let get = &p["httpGet"];
        let (_, n) = container_port(c, &get["port"])
            .unwrap_or_else(|| panic!("{ctx}: {probe} port {} is not a port", get["port"]));
        assert_eq!(n, admin_port, "{ctx}: {probe} must use the admin port");
        seen.admin_paths
            .insert(get["path"].as_str().unwrap().to_string());
    }
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{ctx}");
    // /readyz waits for the model server. A native sidecar's startup probe on it would never
    // pass (the model server starts only after it does), and a liveness probe on it would
    // restart kvbust whenever the model server is down: both must ask about kvbust itself.
    for probe in ["startupProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"]["path"], "/healthz", "{ctx}: {probe}");
    }

    // Hardening.
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true, "{ctx}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{ctx}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{ctx}");
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{ctx}");
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{ctx}");
    assert!(
        c["resources"]["requests"]["cpu"].is_string()
            && c["resources"]["limits"]["memory"].is_string(),
        "{ctx}: set a CPU request and a memory limit"
    );

    // The pod: no service-link variables (a Service named kvbust-* would inject KVBUST_*
    // variables kvbust rejects), and time for preStop plus the drain before SIGKILL.
    assert_eq!(
        pod.spec["enableServiceLinks"], false,
        "{ctx}: set enableServiceLinks: false"
    );
    let pre_stop = pod
        .containers()
        .filter_map(|(c, _)| c["lifecycle"]["preStop"]["sleep"]["seconds"].as_u64())
        .max()
        .unwrap_or(0);
    let grace_period = pod.spec["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or(30);
    assert!(
        grace_period > pre_stop + config.shutdown.grace.as_secs(),
        "{ctx}: terminationGracePeriodSeconds {grace_period} must exceed preStop {pre_stop} s + shutdown.grace {:?}",
        config.shutdown.grace
    );

    // Several replicas must compute the same markers without sticky routing.
    if scaled {
        assert_eq!(
            config.cache_bust.ledger,
            LedgerMode::Stateless,
            "{ctx}: a scaled-out kvbust needs cache_bust.ledger = \"stateless\""
        );
    }
}

fn check_overlay(overlay: &str, docs: &[Value], seen: &mut Seen) {
    let pods = pods(docs);
    let hpa_targets: BTreeSet<&str> = docs
        .iter()
        .filter(|d| kind(d) == "HorizontalPodAutoscaler")
        .map(|d| {
            let t = d["spec"]["scaleTargetRef"]["name"].as_str().unwrap();
            find(docs, "Deployment", t);
            t
        })
        .collect();
    for pod in &pods {
        let autoscaled = hpa_targets.contains(name(pod.workload));
        // A replica count beside an HPA is reset to it on every apply.
        assert!(
            !autoscaled || pod.workload["spec"]["replicas"].is_null(),
            "{overlay}: {} {} has an HPA: drop spec.replicas",
            kind(pod.workload),
            name(pod.workload)
        );
        let scaled = pod.workload["spec"]["replicas"].as_u64().unwrap_or(1) > 1 || autoscaled;
        for (c, init) in pod.containers() {
            if is_kvbust(c) {
                let ctx = format!(
                    "{overlay}: {} {}/{}",
                    kind(pod.workload),
                    name(pod.workload),
                    c["name"].as_str().unwrap_or("?")
                );
                check_kvbust_container(&ctx, docs, pod, c, init, scaled, seen);
            }
        }
    }
    for pod in &pods {
        for (c, _) in pod.containers() {
            // A benchmark must name what it measured: every image has a pinned tag.
            let image = c["image"].as_str().unwrap();
            let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
            assert!(
                !tag.is_empty() && tag != "latest" && !tag.contains('/'),
                "{overlay}: image {image} must have a pinned tag"
            );
            if is_kvbust(c) {
                continue;
            }
            // Model servers: weights on a PersistentVolumeClaim, not re-downloaded per pod.
            for m in list(&c["volumeMounts"]) {
                if m["mountPath"] == "/models" {
                    let v = list(&pod.spec["volumes"])
                        .iter()
                        .find(|v| v["name"] == m["name"])
                        .unwrap();
                    let claim = v["persistentVolumeClaim"]["claimName"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{overlay}: the model cache must be a PVC"));
                    find(docs, "PersistentVolumeClaim", claim);
                }
            }
            // The Hugging Face token is optional: the pod starts without its Secret.
            for e in list(&c["env"]) {
                if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
                    assert_eq!(r.get("optional"), Some(&json!(true)), "{overlay}: {e:?}");
                }
            }
        }
    }
    for d in docs {
        let ctx = format!("{overlay}: {} {}", kind(d), name(d));
        match kind(d) {
            "Service" => {
                let selector = str_map(&d["spec"]["selector"]);
                let pod = pods
                    .iter()
                    .find(|p| selects(&selector, &p.labels))
                    .unwrap_or_else(|| panic!("{ctx}: selects no pod"));
                let kvbust = pod
                    .containers()
                    .find(|(c, _)| is_kvbust(c))
                    .map(|(c, _)| c)
                    .unwrap_or_else(|| panic!("{ctx}: its pods run no kvbust"));
                // Every port goes to kvbust: nothing bypasses it to the model server.
                let mut names = BTreeSet::new();
                for p in list(&d["spec"]["ports"]) {
                    let (target, _) =
                        container_port(kvbust, &p["targetPort"]).unwrap_or_else(|| {
                            panic!("{ctx}: targetPort {} is not a kvbust port", p["targetPort"])
                        });
                    names.insert((p["name"].as_str().unwrap_or("").to_string(), target));
                }
                assert!(
                    names.contains(&("metrics".to_string(), "metrics".to_string())),
                    "{ctx}: expose kvbust's admin port as port \"metrics\" (ServiceMonitor)"
                );
                assert_eq!(
                    d["metadata"]["labels"]["app.kubernetes.io/part-of"], "kvbust",
                    "{ctx}: the ServiceMonitor selects app.kubernetes.io/part-of: kvbust"
                );
            }
            "PodDisruptionBudget" => {
                let selector = str_map(&d["spec"]["selector"]["matchLabels"]);
                assert!(
                    pods.iter().any(|p| selects(&selector, &p.labels)),
                    "{ctx}: selects no pod"
                );
            }
            _ => {}
        }
    }
}

/// ServiceMonitor / PodMonitor endpoints match the Services and pods of the other overlays.
fn check_monitors(docs: &[Value], others: &[Value], seen: &mut Seen) {
    for d in docs {
        let ctx = format!("monitoring: {} {}", kind(d), name(d));
        // kube-prometheus-stack's Prometheus selects monitors and rules by its release label.
        assert!(
            d["metadata"]["labels"]["release"]
                .as_str()
                .is_some_and(|r| !r.is_empty()),
            "{ctx}: label it release: <kube-prometheus-stack's release> (the overlay's patch point)"
        );
        match kind(d) {
            "ServiceMonitor" => {
                let selector = str_map(&d["spec"]["selector"]["matchLabels"]);
                let services: Vec<&Value> =
                    others.iter().filter(|s| kind(s) == "Service").collect();
                assert!(!services.is_empty());
                for s in services {
                    assert!(
                        selects(&selector, &str_map(&s["metadata"]["labels"])),
                        "{ctx}: does not select Service {}",
                        name(s)
                    );
                    for e in list(&d["spec"]["endpoints"]) {
                        assert!(
                            list(&s["spec"]["ports"])
                                .iter()
                                .any(|p| p["name"] == e["port"]),
                            "{ctx}: Service {} has no port {}",
                            name(s),
                            e["port"]
                        );
                        seen.admin_paths
                            .insert(e["path"].as_str().unwrap().to_string());
                    }
                }
            }
            "PodMonitor" => {
                let selector = str_map(&d["spec"]["selector"]["matchLabels"]);
                for e in list(&d["spec"]["podMetricsEndpoints"]) {
                    if e["port"] != "metrics" {
                        check_engine_endpoint(&ctx, &selector, e, others, seen);
                        continue;
                    }
                    assert!(
                        pods(others).iter().all(|p| p
                            .containers()
                            .filter(|(c, _)| is_kvbust(c))
                            .all(|(c, _)| container_port(c, &e["port"]).is_some())),
                        "{ctx}: kvbust containers have no port {}",
                        e["port"]
                    );
                    seen.admin_paths
                        .insert(e["path"].as_str().unwrap().to_string());
                }
            }
            // The Grafana dashboard, for kube-prometheus-stack's dashboard sidecar.
            "ConfigMap" => {
                assert_eq!(
                    d["metadata"]["labels"]["grafana_dashboard"], "1",
                    "{ctx}: the Grafana sidecar loads ConfigMaps labelled grafana_dashboard"
                );
                assert_eq!(
                    d["data"]["kvbust.json"].as_str(),
                    Some(
                        std::fs::read_to_string(repo().join("deploy/grafana/kvbust.json"))
                            .unwrap()
                            .as_str()
                    ),
                    "{ctx}: ships deploy/grafana/kvbust.json as it is"
                );
                seen.dashboards += 1;
            }
            // Its expressions are checked against /metrics by tests/proxy/monitoring.rs.
            "PrometheusRule" => seen.rules += 1,
            other => panic!("{ctx}: unexpected kind {other} in the monitoring overlay"),
        }
    }
}

/// A PodMonitor endpoint on a model server's own port: some pod it selects has a model-server
/// container (not kvbust) with that port, and the path is the engines' `/metrics`.
fn check_engine_endpoint(
    ctx: &str,
    selector: &BTreeMap<String, String>,
    e: &Value,
    others: &[Value],
    seen: &mut Seen,
) {
    let port = e["port"].as_str().unwrap_or("");
    let found = pods(others)
        .iter()
        .filter(|p| selects(selector, &p.labels))
        .flat_map(|p| p.containers().collect::<Vec<_>>())
        .any(|(c, _)| !is_kvbust(c) && container_port(c, &e["port"]).is_some());
    assert!(
        found,
        "{ctx}: no model server of the pods it selects has a port {port}"
    );
    assert_eq!(
        e["path"], "/metrics",
        "{ctx}: vLLM and SGLang serve /metrics"
    );
    seen.engine_ports.insert(port.to_string());
}

/// The model servers' own ports (vLLM's, SGLang's API port, which serves their /metrics) are
/// scraped by the monitoring overlay, and SGLang is told to serve its metrics.
fn check_engines_scraped(workloads: &[Value], seen: &Seen) {
    let mut engines = 0;
    for pod in pods(workloads) {
        for (c, _) in pod.containers().filter(|(c, _)| !is_kvbust(c)) {
            let ports: Vec<&str> = list(&c["ports"])
                .iter()
                .filter_map(|p| p["name"].as_str())
                .collect();
            if ports.is_empty() {
                continue; // a client (the benchmark Job's), not a server
            }
            engines += 1;
            let ctx = format!("{} {}", kind(pod.workload), name(pod.workload));
            assert!(
                ports.iter().any(|p| seen.engine_ports.contains(*p)),
                "{ctx}: no PodMonitor scrapes its model server's ports {ports:?}"
            );
            if c["image"]
                .as_str()
                .unwrap_or("")
                .starts_with("lmsysorg/sglang")
            {
                assert!(
                    list(&c["args"]).iter().any(|a| a == "--enable-metrics"),
                    "{ctx}: SGLang serves /metrics only with --enable-metrics"
                );
            }
        }
    }
    assert_eq!(engines, 3, "vLLM, SGLang, and vLLM with capture");
}

/// The ConfigMap `served-model` of an overlay's configMapGenerator, as kustomize renders it (its
/// name gains a hash): its rendered name and the model it names.
fn served_model(docs: &[Value]) -> Option<(String, String)> {
    docs.iter()
        .find(|d| kind(d) == "ConfigMap" && name(d).starts_with("served-model-"))
        .map(|d| {
            let model = d["data"]["model"].as_str().expect("key model");
            (name(d).to_string(), model.to_string())
        })
}

/// The model is one patch point per overlay: every non-kvbust container reads it as `MODEL` from
/// the ConfigMap `served-model` and uses it only through that variable; the value appears
/// nowhere else in the rendered manifests.
fn check_model_patch_point(overlay: &str, docs: &[Value]) {
    let (cm, model) =
        served_model(docs).unwrap_or_else(|| panic!("{overlay}: no ConfigMap served-model"));
    let mut users = 0;
    for pod in pods(docs) {
        for (c, _) in pod.containers().filter(|(c, _)| !is_kvbust(c)) {
            let ctx = format!("{overlay}: {}/{}", name(pod.workload), c["name"]);
            let var = list(&c["env"])
                .iter()
                .find(|e| e["name"] == "MODEL")
                .unwrap_or_else(|| panic!("{ctx}: no MODEL variable"));
            assert_eq!(
                var["valueFrom"]["configMapKeyRef"]["name"],
                cm.as_str(),
                "{ctx}"
            );
            assert_eq!(var["valueFrom"]["configMapKeyRef"]["key"], "model", "{ctx}");
            let words = list(&c["command"]).iter().chain(list(&c["args"]));
            let text: Vec<&str> = words.filter_map(Value::as_str).collect();
            assert!(
                text.iter()
                    .any(|w| w.contains("$(MODEL)") || w.contains("\"$MODEL\"")),
                "{ctx}: the command line does not use $(MODEL): {text:?}"
            );
            users += 1;
        }
    }
    assert!(users > 0, "{overlay}: nothing reads the model");
    let rendered = serde_json::to_string(docs).unwrap();
    assert_eq!(
        rendered.matches(model.as_str()).count(),
        1,
        "{overlay}: the model {model} is hard-coded beside its ConfigMap"
    );
}

/// The capture component: capture on, its folder on the claim it ships, the key from a Secret,
/// and files kvbust's group can write.
fn check_capture(docs: &[Value]) {
    let pod = pods(docs)
        .into_iter()
        .next()
        .expect("the capture overlay has a workload");
    let (kv, _) = pod
        .containers()
        .find(|(c, _)| is_kvbust(c))
        .expect("kvbust in the capture overlay");
    let env: BTreeMap<String, String> = list(&kv["env"])
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .collect();
    assert_eq!(env["KVBUST_CAPTURE__ENABLED"], "true");
    let mount = |path: &str| {
        list(&kv["volumeMounts"])
            .iter()
            .find(|m| m["mountPath"] == path)
            .and_then(|m| m["name"].as_str())
            .unwrap_or_else(|| panic!("nothing mounted at {path}"))
            .to_string()
    };
    let volume = |name: &str| {
        list(&pod.spec["volumes"])
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"))
            .clone()
    };
    let dir = volume(&mount(&env["KVBUST_CAPTURE__DIR"]));
    let claim = dir["persistentVolumeClaim"]["claimName"].as_str().unwrap();
    find(docs, "PersistentVolumeClaim", claim);
    let key_dir = Path::new(&env["KVBUST_CAPTURE__KEY_FILE"])
        .parent()
        .unwrap();
    let key = volume(&mount(key_dir.to_str().unwrap()));
    assert_eq!(key["secret"]["secretName"], "kvbust-capture-key");
    assert_eq!(pod.spec["securityContext"]["fsGroup"], 65532);
}

#[tokio::test]
async fn rendered_manifests_name_only_what_kvbust_has() {
    let mut rendered = BTreeMap::new();
    for o in overlay_names() {
        let Some(yaml) = render(&o) else {
            eprintln!(
                "NOTE: Kubernetes manifests were NOT checked: no kubectl, and K8S_RENDERED_DIR \
                 is not set (.ci/run sets it)"
            );
            return;
        };
        rendered.insert(o, documents(&yaml));
    }
    assert_eq!(
        rendered.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "benchmark-job",
            "gateway",
            "monitoring",
            "sidecar-sglang",
            "sidecar-vllm",
            "sidecar-vllm-capture"
        ]
    );
    let mut seen = Seen::default();
    let mut workloads = Vec::new();
    for (o, docs) in &rendered {
        if o == "monitoring" {
            continue;
        }
        check_overlay(o, docs, &mut seen);
        workloads.extend(docs.iter().cloned());
    }
    check_monitors(&rendered["monitoring"], &workloads, &mut seen);
    check_engines_scraped(&workloads, &seen);
    // The model: a patch point in each overlay that runs a model server or a client.
    let with_model: Vec<&str> = rendered
        .iter()
        .filter(|(_, docs)| served_model(docs).is_some())
        .map(|(o, _)| o.as_str())
        .collect();
    assert_eq!(
        with_model,
        [
            "benchmark-job",
            "sidecar-sglang",
            "sidecar-vllm",
            "sidecar-vllm-capture"
        ]
    );
    for o in with_model {
        check_model_patch_point(o, &rendered[o]);
    }
    assert_eq!(seen.kvbust_containers, 5, "one kvbust per workload overlay");
    check_capture(&rendered["sidecar-vllm-capture"]);
    // The benchmark Job's kvbust is a native sidecar (it ends with the Job's client), and
    // forwards to the documented upstream patch point, not to a container of its own pod.
    let job = rendered["benchmark-job"]
        .iter()
        .find(|d| kind(d) == "Job")
        .expect("benchmark-job renders a Job");
    let init = list(&job["spec"]["template"]["spec"]["initContainers"]);
    let sidecar = init
        .iter()
        .find(|c| is_kvbust(c))
        .expect("kvbust in the Job");
    assert_eq!(sidecar["restartPolicy"], "Always");
    let upstream = list(&sidecar["env"])
        .iter()
        .find(|e| e["name"] == "KVBUST_UPSTREAM__URL")
        .unwrap();
    assert_eq!(upstream["value"], "http://model-server:8000");
    assert_eq!(
        (seen.dashboards, seen.rules),
        (1, 1),
        "monitoring: a dashboard and the alerts"
    );

    // The gateway's shape: a shared Deployment of at least two replicas, with a PDB and an HPA.
    let gw = &rendered["gateway"];
    let kinds: BTreeSet<&str> = gw.iter().map(kind).collect();
    for k in [
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
    ] {
        assert!(kinds.contains(k), "gateway: no {k}");
    }
    let hpa = gw
        .iter()
        .find(|d| kind(d) == "HorizontalPodAutoscaler")
        .unwrap();
    assert!(hpa["spec"]["minReplicas"].as_u64().unwrap() >= 2);

    // Every admin path the manifests probe or scrape is served by kvbust.
    let h = start(|_| {}).await;
    assert!(seen.admin_paths.contains("/metrics") && seen.admin_paths.contains("/readyz"));
    for path in &seen.admin_paths {
        let resp = send(&h1(), get(&h.admin_url(path))).await;
        assert_eq!(
            resp.status(),
            StatusCode::OK,
            "GET {path} on the admin port"
        );
        body_bytes(resp).await;
    }
    h.shutdown().await;
}

/// The Dockerfile's instructions that name kvbust's paths, ports and commands.
#[test]
fn dockerfile_config_passes_config_check_and_names_its_ports() {
    let text = std::fs::read_to_string(repo().join("deploy/Dockerfile")).unwrap();
    let runtime_stage = text.rsplit("\nFROM ").next().unwrap();
    let lines: Vec<&str> = runtime_stage.lines().map(str::trim).collect();
    let arg = |instr: &str| -> Vec<String> {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(instr))
            .map(|rest| rest.trim().to_string())
            .collect()
    };
    let copy = arg("COPY ")
        .into_iter()
        .find(|c| c.ends_with(" /etc/kvbust/kvbust.toml"))
        .expect("the image gets a config file");
    let source = repo().join(copy.split_whitespace().next().unwrap());
    assert_eq!(arg("ENV "), ["KVBUST_CONFIG=/etc/kvbust/kvbust.toml"]);

    // `kvbust config check` on the image's config: valid with a token, refused without one
    // (its admin port is on all interfaces).
    let check = |token: bool| {
        let mut p = kvbust();
        p.args(["config", "check"]).env("KVBUST_CONFIG", &source);
        if token {
            p.env("KVBUST_ADMIN__TOKEN", TOKEN);
        }
        run(p)
    };
    let ok = check(true);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    assert_eq!(check(false).status.code(), Some(64));

    let config = Config::load(
        Some(&source),
        &[("KVBUST_ADMIN__TOKEN".into(), TOKEN.into())],
        &Default::default(),
    )
    .unwrap();
    assert_eq!(
        arg("EXPOSE "),
        [format!(
            "{} {}",
            config.listen.addr.port(),
            config.admin.addr.port()
        )]
    );
    assert!(
        config.admin.addr.ip().is_unspecified(),
        "reachable from outside the container"
    );

    // The runtime user is not root; CMD and HEALTHCHECK are kvbust commands.
    let user = arg("USER ");
    assert_eq!(user.len(), 1);
    assert!(!user[0].starts_with("0") && !user[0].starts_with("root"));
    let exec_form = |s: &str| -> Vec<String> {
        serde_json::from_str(&s[s.find('[').unwrap()..]).expect("exec form")
    };
    for cmd in [arg("CMD ")[0].clone(), arg("HEALTHCHECK ")[0].clone()] {
        let mut words = exec_form(&cmd);
        if words[0] == "/usr/local/bin/kvbust" {
            words.remove(0);
        }
        Cli::try_parse_from(std::iter::once("kvbust".to_string()).chain(words))
            .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    }
    assert_eq!(arg("ENTRYPOINT "), [r#"["/usr/local/bin/kvbust"]"#]);
}

/// The Docker build context leaves out build output, the fuzzing crate (its corpora and
/// artifacts grow large) and benchmark results, but keeps every file cargo needs to build.
#[test]
fn dockerignore_leaves_out_fuzz_and_bench_output_but_not_what_cargo_reads() {
    let text = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    let rules: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    // The patterns used here: `dir/` (all of it), `dir/*` (its entries) and `!dir/*.ext`.
    let ignored = |path: &str| {
        let mut out = false;
        for r in &rules {
            let (negate, pat) = match r.strip_prefix('!') {
                Some(p) => (true, p),
                None => (false, *r),
            };
            let hit = if let Some(dir) = pat.strip_suffix('/') {
                path.starts_with(&format!("{dir}/"))
            } else if let Some((dir, ext)) = pat.split_once("/*.") {
                path.starts_with(&format!("{dir}/")) && path.ends_with(&format!(".{ext}"))
            } else if let Some(dir) = pat.strip_suffix("/*") {
                path.starts_with(&format!("{dir}/"))
            } else {
                path == pat
            };
            if hit {
                out = !negate;
            }
        }
        out
    };
    for p in [
        "target/release/kvbust",
        "fuzz/corpus/x",
        "fuzz/artifacts/crash-1",
        "fuzz/target/debug/f",
        "benches/results.md",
        "benches/nginx/nginx.conf",
        ".git/HEAD",
    ] {
        assert!(ignored(p), "{p} must not reach the build context");
    }
    // Every target path Cargo.toml declares, and the build inputs.
    let manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(repo().join("Cargo.toml")).unwrap()).unwrap();
    let mut needed = vec![
        "Cargo.toml".to_string(),
        "Cargo.lock".into(),
        "build.rs".into(),
        "src/main.rs".into(),
        "deploy/k8s/base/kvbust.toml".into(),
    ];
    for section in ["bench", "example"] {
        for t in manifest[section].as_array().unwrap() {
            let path = t
                .get("path")
                .and_then(|p| p.as_str())
                .map(str::to_string)
                .unwrap_or_else(|| format!("benches/{}.rs", t["name"].as_str().unwrap()));
            needed.push(path);
        }
    }
    for p in needed {
        assert!(repo().join(&p).exists(), "{p}");
        assert!(
            !ignored(&p),
            "{p} is needed by cargo but left out of the build context"
        );
    }
}

/// The model-server overlays' commented patch points (tolerations, runtimeClassName) work as
/// written once uncommented: applied on top of the overlay, the Deployment carries them.
#[test]
fn the_model_overlays_patch_points_apply_when_uncommented() {
    if Process::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        eprintln!("NOTE: no kubectl: the overlays' patch points were NOT checked");
        return;
    }
    for overlay in ["sidecar-vllm", "sidecar-sglang"] {
        let dir = repo().join("deploy/k8s/overlays").join(overlay);
        let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
        // The commented block from `# patches:` on, uncommented.
        let block: Vec<String> = text
            .lines()
            .skip_while(|l| !l.starts_with("# patches:"))
            .take_while(|l| l.starts_with('#'))
            .map(|l| {
                l.strip_prefix("# ")
                    .unwrap_or(l.trim_start_matches('#'))
                    .to_string()
            })
            .collect();
        assert!(!block.is_empty(), "{overlay}: no commented patches block");
        let scratch = test_dir().join(format!("patch-points-{overlay}"));
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::write(
            scratch.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n{}\n",
                relative(&scratch, &dir).display(),
                block.join("\n")
            ),
        )
        .unwrap();
        let out = Process::new("kubectl")
            .arg("kustomize")
            .arg(&scratch)
            .output()
            .unwrap();
        assert!(out.status.success(), "{overlay}: {}", stderr(&out));
        let docs = documents(&String::from_utf8(out.stdout).unwrap());
        let name = overlay.trim_start_matches("sidecar-");
        let spec = &find(&docs, "Deployment", name)["spec"]["template"]["spec"];
        assert_eq!(spec["runtimeClassName"], "nvidia", "{overlay}");
        assert_eq!(spec["tolerations"][0]["key"], "nvidia.com/gpu", "{overlay}");
        std::fs::remove_dir_all(&scratch).ok();
    }
}

/// The model's patch point as deploy/README.md documents it for an overlay of your own: a
/// configMapGenerator `served-model` with `behavior: merge` on top of each overlay replaces the
/// model everywhere it is used, and the old name is gone from the rendered manifests.
#[test]
fn the_model_patch_point_applies_in_an_overlay_on_top() {
    if Process::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        eprintln!("NOTE: no kubectl: the model patch point was NOT checked");
        return;
    }
    let readme = std::fs::read_to_string(repo().join("deploy/README.md")).unwrap();
    assert!(
        readme.contains("behavior: merge") && readme.contains("name: served-model"),
        "deploy/README.md documents the model's patch point"
    );
    let other = "example-org/Other-Model-7B";
    for overlay in [
        "benchmark-job",
        "sidecar-sglang",
        "sidecar-vllm",
        "sidecar-vllm-capture",
    ] {
        let dir = repo().join("deploy/k8s/overlays").join(overlay);
        let scratch = test_dir().join(format!("model-patch-{overlay}"));
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::write(
            scratch.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n\
                 configMapGenerator:\n  - name: served-model\n    behavior: merge\n    literals:\n      - model={other}\n",
                relative(&scratch, &dir).display(),
            ),
        )
        .unwrap();
        let out = Process::new("kubectl")
            .arg("kustomize")
            .arg(&scratch)
            .output()
            .unwrap();
        assert!(out.status.success(), "{overlay}: {}", stderr(&out));
        let docs = documents(&String::from_utf8(out.stdout).unwrap());
        let (_, model) = served_model(&docs).expect("the ConfigMap");
        assert_eq!(model, other, "{overlay}");
        // Every reader points at the patched ConfigMap, and the default is nowhere.
        check_model_patch_point(overlay, &docs);
        let (_, default) = served_model(&documents(&render(overlay).unwrap())).unwrap();
        assert!(
            !serde_json::to_string(&docs).unwrap().contains(&default),
            "{overlay}: {default} is still in the patched manifests"
        );
        std::fs::remove_dir_all(&scratch).ok();
    }
}

/// `to` as a path relative to the folder `from` (kustomize refuses absolute resource paths).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let (from, to) = (from.canonicalize().unwrap(), to.canonicalize().unwrap());
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in from.components().skip(common) {
        out.push("..");
    }
    for c in to.components().skip(common) {
        out.push(c);
    }
    out
}
