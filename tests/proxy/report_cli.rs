//! `kvbust report` as a user runs it: the real binary against a tiny HTTP server (port 0) that
//! answers `GET /report` with a report's JSON, in every format, and the figures on the HTML page
//! (table cells and chart points, found by their ids and data attributes) checked against that
//! JSON. Also: unreachable ports, answers that are not a report, and bad flags.
// The environment carries the test harness's own switches.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Output};
use std::thread::JoinHandle;

use kvbust::report::{
    Breaches, Bucket, ModelFacts, Pair, Quantiles, Report, Reuse, Row, Run, Timeline,
    UpstreamFacts, SCHEMA,
};

/// A server answering every request with one status and body, recording request lines, until a
/// request for `STOP` (the test's own, so it always ends).
struct Server {
    addr: SocketAddr,
    thread: Option<JoinHandle<Vec<String>>>,
}

impl Server {
    fn start(status: &'static str, content_type: &'static str, body: Vec<u8>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line.starts_with("STOP") {
                    break;
                }
                // The rest of the head.
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap() == 0 || h == "\r\n" {
                        break;
                    }
                }
                seen.push(line.trim_end().to_string());
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                stream.write_all(head.as_bytes()).unwrap();
                stream.write_all(&body).unwrap();
            }
            seen
        });
        Server {
            addr,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Ends the server; the request lines it saw.
    fn stop(mut self) -> Vec<String> {
        TcpStream::connect(self.addr)
            .unwrap()
            .write_all(b"STOP\r\n")
            .unwrap();
        self.thread.take().unwrap().join().unwrap()
    }
}

fn kvbust(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut p = Command::new(env!("CARGO_BIN_EXE_kvbust"));
    for (k, _) in std::env::vars() {
        if k.starts_with("KVBUST_") || k == "NO_COLOR" {
            p.env_remove(k);
        }
    }
    p.envs(env.iter().copied());
    p.args(args).output().expect("kvbust runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A run as one looks at the end of a benchmark: warmup then profiling on two targets, 60
/// buckets of 5 s, the upstream reporting, TTFT falling as the cache warms, and breaches in one
/// row.
pub fn realistic() -> Report {
    // A fixed generator: the figures vary like a real run's but the same on every run.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut noise = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % 1000) as f64 / 1000.0
    };
    let mut buckets = Vec::new();
    for index in 0..60u64 {
        let phase = if index < 12 { "warmup" } else { "profiling" };
        let requests = 6 + (noise() * 6.0) as u64;
        let prompt = requests * (2600 + (noise() * 800.0) as u64);
        let hit = if index < 12 {
            0.05 + 0.1 * noise()
        } else {
            (0.35 + 0.5 * ((index - 12) as f64 / 48.0).sqrt() + 0.06 * noise()).min(0.95)
        };
        let predicted = (prompt as f64 * hit) as u64;
        let reported = (predicted as f64 * (0.93 + 0.05 * noise())) as u64;
        buckets.push(Bucket {
            index,
            phase: phase.into(),
            requests,
            prompt_tokens: prompt,
            predicted_cached: predicted,
            reported_cached: Some(reported),
            reported_prompt_tokens: Some(prompt + requests * 3),
            ttft_ms_mean: Some(45.0 + 260.0 * (1.0 - hit) + 30.0 * noise()),
        });
    }
    let row = |phase: &str, target: &str, requests: u64, prompt: u64, hit: f64| Row {
        phase: phase.into(),
        target: target.into(),
        requests,
        accounted_requests: requests,
        prompt_tokens: Pair {
            reported: Some(prompt + requests * 3),
            predicted: prompt,
        },
        cached_tokens: Pair {
            reported: Some((prompt as f64 * hit * 0.95) as u64),
            predicted: (prompt as f64 * hit) as u64,
        },
        reuse: Reuse {
            same_session: (prompt as f64 * hit * 0.6) as u64,
            other_session: (prompt as f64 * hit * 0.3) as u64,
            warmup: (prompt as f64 * hit * 0.1) as u64,
        },
        breaches: Breaches::default(),
        divergent_requests: requests / 40,
        ttft_ms: Quantiles {
            count: requests,
            p50: Some(60.0 + 200.0 * (1.0 - hit)),
            p99: Some(410.25 + 300.0 * (1.0 - hit)),
        },
        salt_fallbacks: 0,
        hit_ratio: None,
        dialled_requests: 0,
        salt_ignored: 0,
    };
    let mut breached = row("profiling", "first_turn_prefix", 212, 566_311, 0.58);
    breached.breaches = Breaches {
        cross_session: 2,
        warmup_reuse: 0,
        session_collision: 5,
    };
    breached.accounted_requests = 209;
    Report {
        schema: SCHEMA,
        run: Run {
            benchmark_id: "aiperf-7f3a9c".into(),
            started_at: "2026-12-02T09:00:00.000Z".into(),
            generated_at: "2026-12-02T09:05:00.412Z".into(),
            elapsed_s: 300.412,
        },
        cache_model: ModelFacts {
            enabled: true,
            block_size: 16,
            tokenizer: "Qwen/Qwen3-0.6B".into(),
            chat_template: "auto".into(),
            capacity_blocks: 0,
            max_memory: 256 << 20,
            indexed_blocks: 74_210,
            evicted_blocks: 0,
            unaccounted: BTreeMap::from([("queue_full".to_string(), 3)]),
            topology: "sidecar".into(),
            note: None,
        },
        upstream: UpstreamFacts {
            reports_cached_tokens: Some(true),
            responses_with_usage: 521,
            hint: None,
        },
        rows: vec![
            row("warmup", "system_prefix", 37, 98_120, 0.09),
            row("warmup", "first_turn_prefix", 36, 95_004, 0.08),
            row("profiling", "system_prefix", 236, 630_117, 0.74),
            breached,
        ],
        timeline: Timeline {
            bucket_s: 5.0,
            buckets,
        },
    }
}

// ---------------------------------------------------------------------------------------------
// A small HTML/SVG reader: the page is written as well-formed XML (every tag closed, attributes
// quoted), so a stack of open elements suffices, and a broken nesting fails the test.

#[derive(Debug)]
struct Node {
    name: String,
    attrs: BTreeMap<String, String>,
    text: String,
    parent: Option<usize>,
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

fn parse_html(page: &str) -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let mut rest = page;
    while let Some(lt) = rest.find('<') {
        if let Some(&top) = open.last() {
            nodes[top].text.push_str(&unescape(&rest[..lt]));
        }
        rest = &rest[lt..];
        let gt = rest.find('>').expect("a tag ends");
        let tag = &rest[1..gt];
        rest = &rest[gt + 1..];
        if tag.starts_with('!') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            let top = open.pop().expect("a closing tag closes an open one");
            assert_eq!(
                nodes[top].name, name,
                "closing </{name}> over <{}>",
                nodes[top].name
            );
            continue;
        }
        let self_closing = tag.ends_with('/');
        let tag = tag.trim_end_matches('/');
        let name_end = tag.find(char::is_whitespace).unwrap_or(tag.len());
        let mut attrs = BTreeMap::new();
        let mut a = tag[name_end..].trim_start();
        while !a.is_empty() {
            let eq = a.find("=\"").expect("attributes are quoted");
            let close = a[eq + 2..].find('"').unwrap() + eq + 2;
            attrs.insert(a[..eq].to_string(), unescape(&a[eq + 2..close]));
            a = a[close + 1..].trim_start();
        }
        nodes.push(Node {
            name: tag[..name_end].to_string(),
            attrs,
            text: String::new(),
            parent: open.last().copied(),
        });
        if !self_closing {
            open.push(nodes.len() - 1);
        }
    }
    assert!(open.is_empty(), "unclosed elements: {open:?}");
    nodes
}

fn attr<'a>(n: &'a Node, k: &str) -> &'a str {
    n.attrs.get(k).map_or("", String::as_str)
}

fn within(nodes: &[Node], mut i: usize, ancestor: usize) -> bool {
    while let Some(p) = nodes[i].parent {
        if p == ancestor {
            return true;
        }
        i = p;
    }
    false
}

/// The elements named `name` under the element at `root` matching every `(attribute, value)`.
fn find<'a>(
    nodes: &'a [Node],
    root: usize,
    name: &str,
    want: &[(&str, &str)],
) -> Vec<(usize, &'a Node)> {
    nodes
        .iter()
        .enumerate()
        .filter(|(i, n)| {
            n.name == name && within(nodes, *i, root) && want.iter().all(|(k, v)| attr(n, k) == *v)
        })
        .collect()
}

fn by_id(nodes: &[Node], id: &str) -> usize {
    let hits: Vec<usize> = (0..nodes.len())
        .filter(|&i| attr(&nodes[i], "id") == id)
        .collect();
    assert_eq!(hits.len(), 1, "one #{id}");
    hits[0]
}

/// A displayed count back to its number: `1,234` -> 1234.
fn count(s: &str) -> u64 {
    s.replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("`{s}` is not a count"))
}

fn check_table(nodes: &[Node], r: &Report) {
    let table = by_id(nodes, "report-rows");
    assert_eq!(
        find(nodes, table, "tr", &[("class", "row")]).len(),
        r.rows.len()
    );
    for row in &r.rows {
        let tr = find(
            nodes,
            table,
            "tr",
            &[("data-phase", &row.phase), ("data-target", &row.target)],
        );
        assert_eq!(tr.len(), 1, "{} × {}", row.phase, row.target);
        let cell = |col: &str| {
            let td = find(nodes, tr[0].0, "td", &[("data-col", col)]);
            assert_eq!(td.len(), 1, "{col}");
            let value = td[0]
                .1
                .attrs
                .get("data-value")
                .map(|v| v.parse::<f64>().unwrap());
            (td[0].1.text.clone(), value)
        };
        let hit_pred = row.cached_tokens.predicted as f64 / row.prompt_tokens.predicted as f64;
        let hit_rep =
            row.cached_tokens.reported.unwrap() as f64 / row.prompt_tokens.reported.unwrap() as f64;
        assert_eq!(
            cell("hit_predicted"),
            (format!("{:.1}%", hit_pred * 100.0), Some(hit_pred))
        );
        assert_eq!(
            cell("hit_reported"),
            (format!("{:.1}%", hit_rep * 100.0), Some(hit_rep))
        );
        assert_eq!(
            count(&cell("prompt_counted").0),
            row.prompt_tokens.predicted
        );
        assert_eq!(
            count(&cell("prompt_reported").0),
            row.prompt_tokens.reported.unwrap()
        );
        assert_eq!(
            count(&cell("cached_predicted").0),
            row.cached_tokens.predicted
        );
        assert_eq!(
            count(&cell("cached_reported").0),
            row.cached_tokens.reported.unwrap()
        );
        assert_eq!(count(&cell("reuse_same_session").0), row.reuse.same_session);
        assert_eq!(
            count(&cell("reuse_other_session").0),
            row.reuse.other_session
        );
        assert_eq!(count(&cell("reuse_warmup").0), row.reuse.warmup);
        let breaches =
            row.breaches.cross_session + row.breaches.warmup_reuse + row.breaches.session_collision;
        assert_eq!(count(&cell("breaches").0), breaches);
        assert_eq!(count(&cell("divergent").0), row.divergent_requests);
        assert_eq!(
            cell("requests").0,
            format!("{}/{}", row.accounted_requests, row.requests)
        );
        assert_eq!(cell("ttft_p50_ms").1, row.ttft_ms.p50);
        assert_eq!(cell("ttft_p99_ms").1, row.ttft_ms.p99);
        assert_eq!(
            cell("ttft_p99_ms").0,
            format!("{:.0}", row.ttft_ms.p99.unwrap())
        );
    }
}

/// The points of one chart's series: (bucket index, value, cx, cy).
fn points(nodes: &[Node], chart: usize, phase: &str, series: &str) -> Vec<(u64, f64, f64, f64)> {
    let g = find(
        nodes,
        chart,
        "g",
        &[
            ("class", "series"),
            ("data-phase", phase),
            ("data-series", series),
        ],
    );
    assert_eq!(g.len(), 1, "{phase} {series}");
    let pts: Vec<_> = find(nodes, g[0].0, "circle", &[("class", "point")])
        .into_iter()
        .map(|(_, c)| {
            let f = |k| attr(c, k).parse::<f64>().unwrap();
            (
                attr(c, "data-index").parse().unwrap(),
                f("data-value"),
                f("cx"),
                f("cy"),
            )
        })
        .collect();
    assert_eq!(attr(g[0].1, "data-points"), pts.len().to_string());
    pts
}

/// Every point is a bucket of its phase with its figure, left to right by time, higher for a
/// larger figure.
fn check_series(pts: &[(u64, f64, f64, f64)], want: &[(u64, f64)]) {
    let got: Vec<(u64, f64)> = pts.iter().map(|p| (p.0, p.1)).collect();
    assert_eq!(got, want);
    for w in pts.windows(2) {
        assert!(w[1].2 > w[0].2, "x grows with time: {w:?}");
    }
    // Coordinates are drawn to 0.1 unit: a larger value sits no lower, and higher when it is
    // larger by more than a unit's worth.
    let (lo, hi) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), p| (l.min(p.1), h.max(p.1)));
    for a in pts {
        for b in pts {
            if a.1 > b.1 {
                assert!(a.3 <= b.3, "a larger value sits no lower: {a:?} {b:?}");
            }
            if a.1 - b.1 > (hi - lo) / 100.0 {
                assert!(a.3 < b.3, "a larger value sits higher: {a:?} {b:?}");
            }
        }
    }
}

fn check_charts(nodes: &[Node], r: &Report) {
    let hit = by_id(nodes, "chart-hit-rate");
    let ttft = by_id(nodes, "chart-ttft");
    for phase in ["warmup", "profiling"] {
        let of_phase: Vec<&Bucket> = r
            .timeline
            .buckets
            .iter()
            .filter(|b| b.phase == phase)
            .collect();
        let predicted: Vec<(u64, f64)> = of_phase
            .iter()
            .map(|b| (b.index, b.predicted_cached as f64 / b.prompt_tokens as f64))
            .collect();
        let reported: Vec<(u64, f64)> = of_phase
            .iter()
            .map(|b| {
                (
                    b.index,
                    b.reported_cached.unwrap() as f64 / b.reported_prompt_tokens.unwrap() as f64,
                )
            })
            .collect();
        let means: Vec<(u64, f64)> = of_phase
            .iter()
            .map(|b| (b.index, b.ttft_ms_mean.unwrap()))
            .collect();
        check_series(&points(nodes, hit, phase, "predicted"), &predicted);
        check_series(&points(nodes, hit, phase, "reported"), &reported);
        check_series(&points(nodes, ttft, phase, "ttft_mean"), &means);
        assert_eq!(
            find(
                nodes,
                hit,
                "g",
                &[("class", "legend-entry"), ("data-phase", phase)]
            )
            .len(),
            2
        );
    }
    assert_eq!(
        attr(&nodes[hit], "data-points"),
        (2 * r.timeline.buckets.len()).to_string()
    );
    assert_eq!(find(nodes, hit, "circle", &[]).len(), 120);
    assert_eq!(find(nodes, ttft, "circle", &[]).len(), 60);
    // Axes say what they measure, with ticks: 300 s of buckets read in minutes.
    let texts: Vec<&str> = find(nodes, hit, "text", &[])
        .iter()
        .map(|(_, n)| n.text.as_str())
        .collect();
    for t in [
        "time since the run started (min)",
        "hit rate (cached / prompt tokens)",
        "0%",
        "100%",
        "5",
        "warmup predicted",
        "profiling reported",
    ] {
        assert!(texts.contains(&t), "{t} in {texts:?}");
    }
    let texts: Vec<&str> = find(nodes, ttft, "text", &[])
        .iter()
        .map(|(_, n)| n.text.as_str())
        .collect();
    assert!(texts.contains(&"mean TTFT (ms)"), "{texts:?}");
}

#[test]
fn report_renders_every_format_from_the_admin_port() {
    let made = realistic();
    let body = serde_json::to_vec(&made).unwrap();
    // The figures as the served JSON says them, read as kvbust reads it (serde_json's float
    // parsing may land a last-place bit away from the value serialized).
    let r: Report = serde_json::from_slice(&body).unwrap();
    let server = Server::start("200 OK", "application/json", body.clone());
    let url = server.url();

    // JSON: the bytes as served, indented as serde_json indents.
    let json = kvbust(&["report", "--admin", &url, "--format", "json"], &[]);
    assert_eq!(json.status.code(), Some(0), "{}", text(&json.stderr));
    assert_eq!(
        text(&json.stdout),
        serde_json::to_string_pretty(&made).unwrap() + "\n"
    );
    assert_eq!(serde_json::from_slice::<Report>(&json.stdout).unwrap(), r);

    // Table (the default): no colour into a pipe, one line per row with its figures.
    let table = kvbust(&["report", "--admin", &url], &[]);
    assert_eq!(table.status.code(), Some(0), "{}", text(&table.stderr));
    let t = text(&table.stdout);
    assert!(!t.contains('\x1b'), "{t}");
    assert_eq!(
        t,
        kvbust::report::render::table(&r),
        "the binary prints the library's table"
    );
    for row in &r.rows {
        let line = t
            .lines()
            .find(|l| {
                l.split_whitespace()
                    .take(2)
                    .eq([row.phase.as_str(), row.target.as_str()])
            })
            .unwrap_or_else(|| panic!("{} × {} in {t}", row.phase, row.target));
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(count(fields[4]), row.prompt_tokens.predicted);
        assert_eq!(count(fields[6]), row.cached_tokens.predicted);
    }
    assert!(t.contains("! isolation breached in profiling × first_turn_prefix: 2 cross_session, 5 session_collision"), "{t}");
    assert!(
        t.contains("! 3 requests unaccounted by the cache model (3 queue_full)"),
        "{t}"
    );

    let md = kvbust(&["report", "--admin", &url, "--format", "markdown"], &[]);
    assert_eq!(md.status.code(), Some(0), "{}", text(&md.stderr));
    let md = text(&md.stdout);
    assert_eq!(
        md.lines().filter(|l| l.starts_with("| `")).count(),
        r.rows.len(),
        "{md}"
    );
    assert!(md.contains("| benchmark | `aiperf-7f3a9c` |"), "{md}");

    // HTML into a file (-o): parsed, and its figures checked against the JSON.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    // The JSON beside the page, for a person to serve and look at both.
    std::fs::write(dir.join("kvbust-report.json"), &body).unwrap();
    let path = dir.join("kvbust-report.html");
    let _ = std::fs::remove_file(&path);
    let html = kvbust(
        &[
            "report",
            "--admin",
            &url,
            "--format",
            "html",
            "-o",
            path.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(html.status.code(), Some(0), "{}", text(&html.stderr));
    assert!(html.stdout.is_empty(), "-o writes nothing to stdout");
    let page = std::fs::read_to_string(&path).unwrap();
    for banned in ["<script", "src=", "href=", "url("] {
        assert!(!page.contains(banned), "self-contained: {banned}");
    }
    let nodes = parse_html(&page);
    check_table(&nodes, &r);
    check_charts(&nodes, &r);
    let facts = by_id(&nodes, "facts");
    let benchmark = find(&nodes, facts, "dd", &[("data-fact", "benchmark_id")]);
    assert_eq!(benchmark[0].1.text, r.run.benchmark_id);
    let notes = by_id(&nodes, "notes");
    assert_eq!(
        find(&nodes, notes, "li", &[("data-note", "breaches")]).len(),
        1
    );

    let seen = server.stop();
    assert_eq!(seen.len(), 4);
    // Half of the default 10 s timeout for the open requests to be counted first.
    assert!(
        seen.iter().all(|l| l == "GET /report?wait=5000ms HTTP/1.1"),
        "{seen:?}"
    );
}

#[test]
fn report_finds_the_admin_port_from_the_configuration() {
    let body = serde_json::to_vec(&realistic()).unwrap();
    let r: Report = serde_json::from_slice(&body).unwrap();
    let server = Server::start("200 OK", "application/json", body);
    let addr = server.addr.to_string();
    let flag = kvbust(
        &["report", "--admin-listen", &addr, "--format", "json"],
        &[],
    );
    assert_eq!(flag.status.code(), Some(0), "{}", text(&flag.stderr));
    let env = kvbust(
        &["report", "--format", "json"],
        &[("KVBUST_ADMIN__ADDR", &addr)],
    );
    assert_eq!(env.status.code(), Some(0), "{}", text(&env.stderr));
    assert_eq!(serde_json::from_slice::<Report>(&env.stdout).unwrap(), r);
    assert_eq!(server.stop().len(), 2);
}

#[test]
fn report_fails_clearly_on_what_is_not_a_kvbust_report() {
    // Nothing listening: the port of a listener just closed.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{closed}");
    let out = kvbust(&["report", "--admin", &url], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{url}/report")) && err.contains("cannot connect"),
        "{err}"
    );

    let page = Server::start("200 OK", "text/html", b"<html>hello</html>".to_vec());
    let out = kvbust(&["report", "--admin", &page.url()], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{}/report", page.url())) && err.contains("not a kvbust report"),
        "{err}"
    );
    page.stop();

    let missing = Server::start("404 Not Found", "text/plain", b"no such page".to_vec());
    let out = kvbust(
        &["report", "--admin", &missing.url(), "--format", "html"],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("answered 404 Not Found") && err.contains("without GET /report"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    missing.stop();

    for args in [
        &["report", "--format", "pdf"][..],
        &["report", "--admin", "https://127.0.0.1:1"],
        &["report", "--admin", "127.0.0.1:1", "--timeout", "soon"],
    ] {
        let out = kvbust(args, &[]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}
