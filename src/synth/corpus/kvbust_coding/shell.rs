//! Shell sessions and logs for the coding corpus: prompts with command output, training logs
//! (step/loss/lr), CI job logs and `pip install` output. Owns these templates; must never emit
//! text that was not composed here from the vocabularies.

use super::draw::Draw;
use super::vocab;

/// One shell-session or log block.
pub fn block(d: &mut Draw) -> String {
    match d.weighted(&[40, 22, 20, 18]) {
        0 => session(d),
        1 => training_log(d),
        2 => ci_log(d),
        _ => pip_install(d),
    }
}

fn size(d: &mut Draw) -> String {
    match d.n(0, 3) {
        0 => format!("{}", d.int(0, 4096)),
        1 => format!("{:.1}K", d.float(1.0, 999.0)),
        2 => format!("{:.1}M", d.float(1.0, 999.0)),
        _ => format!("{:.1}G", d.float(1.0, 80.0)),
    }
}

fn month(d: &mut Draw) -> &'static str {
    d.s(&[
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ])
}

fn session(d: &mut Draw) -> String {
    let mut out = String::new();
    let user = d.user();
    let host = d.host();
    let proj = d.project();
    let cmds = d.n(1, 3);
    for _ in 0..cmds {
        let cwd = format!("~/{}{}", proj, d.s(&["", "", "/src", "/tests", "/scripts"]));
        let prompt = match d.n(0, 2) {
            0 => format!("{user}@{host}:{cwd}$ "),
            1 => format!(
                "({}) {user}@{host}:{cwd}$ ",
                d.s(&[".venv", "base", "py311", "train"])
            ),
            _ => "$ ".to_string(),
        };
        let sh = Shell {
            prompt: &prompt,
            user: &user,
        };
        COMMANDS[d.n(0, COMMANDS.len() - 1)](d, &mut out, &sh);
    }
    out
}

/// The prompt a command is typed at, and the user it runs as.
struct Shell<'a> {
    prompt: &'a str,
    user: &'a str,
}

/// A command with its output, after the prompt.
type Command = fn(&mut Draw, &mut String, &Shell<'_>);

/// The commands of a session, drawn uniformly (the order is part of the corpus).
const COMMANDS: [Command; 12] = [
    ls,
    git_status,
    nvidia_smi,
    docker_ps,
    kubectl_pods,
    grep,
    df,
    du,
    curl,
    ps_aux,
    build,
    tail_log,
];

/// `ls -la` with a listing.
fn ls(d: &mut Draw, out: &mut String, sh: &Shell<'_>) {
    let Shell { prompt, user } = sh;
    w!(out, "{prompt}ls -la");
    w!(out, "total {}", d.int(8, 400));
    for _ in 0..d.n(3, 7) {
        let dir = d.chance(0.3);
        let name = if dir {
            d.s(&vocab::SUB_DIRS).to_string()
        } else {
            format!(
                "{}.{}",
                d.s(&vocab::FILE_STEMS),
                d.s(&["py", "rs", "go", "ts", "toml", "yaml", "md", "json", "lock"])
            )
        };
        w!(
            out,
            "{}  {} {user} {user} {:>6} {} {:>2} {:02}:{:02} {name}",
            if dir { "drwxr-xr-x" } else { "-rw-r--r--" },
            d.int(1, 9),
            d.int(96, 65_536),
            month(d),
            d.int(1, 28),
            d.int(0, 23),
            d.int(0, 59)
        );
    }
}

/// `git status` with changes.
fn git_status(d: &mut Draw, out: &mut String, sh: &Shell<'_>) {
    let Shell { prompt, .. } = sh;
    w!(out, "{prompt}git status");
    w!(
        out,
        "On branch {}",
        d.s(&[
            "main",
            "fix/flaky-test",
            "feat/streaming",
            "dev",
            "refactor-cache"
        ])
    );
    w!(
        out,
        "Your branch is {}.",
        d.s(&[
            "up to date with 'origin/main'",
            "ahead of 'origin/main' by 2 commits",
            "behind 'origin/main' by 1 commit, and can be fast-forwarded"
        ])
    );
    w!(out);
    w!(out, "Changes not staged for commit:");
    w!(
        out,
        "  (use \"git add <file>...\" to update what will be committed)"
    );
    for _ in 0..d.n(1, 4) {
        w!(
            out,
            "\tmodified:   {}",
            d.path_of(&["py", "go", "rs", "ts"])
        );
    }
    if d.chance(0.5) {
        w!(out);
        w!(out, "Untracked files:");
        w!(out, "\t{}", d.path_of(&["py", "go", "rs", "ts"]));
    }
}

/// `nvidia-smi` GPU memory and utilisation.
fn nvidia_smi(d: &mut Draw, out: &mut String, sh: &Shell<'_>) {
    let Shell { prompt, .. } = sh;
    w!(out, "{prompt}nvidia-smi --query-gpu=index,name,memory.used,memory.total,utilization.gpu --format=csv");
    w!(
        out,
        "index, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]"
    );
    let (gpu, mem) = *d.pick(&vocab::GPUS);
    for i in 0..*d.pick(&[1u64, 2, 4, 8]) {
        let total = mem * 1024 - d.int(300, 700);
        w!(
            out,
            "{i}, {gpu}, {} MiB, {total} MiB, {} %",
            d.int(1, total),
            d.int(0, 100)
        );
    }
}

/// `docker ps` containers.
fn docker_ps(d: &mut Draw, out: &mut String, sh: &Shell<'_>) {
    let Shell { prompt, .. } = sh;
    w!(out, "{prompt}docker ps --format 'table {{{{.ID}}}}\\t{{{{.Image}}}}\\t{{{{.Status}}}}\\t{{{{.Ports}}}}'");
    w!(
        out,
        "CONTAINER ID   IMAGE                              STATUS          PORTS"
    );
    for _ in 0..d.n(1, 4) {
        w!(
            out,
            "{}   {:<34} Up {} {:<6} 0.0.0.0:{}->{}/tcp",
            d.hex(12),
            format!("{}:{}", d.project(), d.version()),
            d.int(2, 59),
            d.s(&["minutes", "hours", "days"]),
            d.int(3000, 9999),
            d.s(&["80", "8000", "8080", "5432", "6379"])
        );
    }
}

/// `kubectl get pods` in a namespace.
fn kubectl_pods(d: &mut Draw, out: &mut String, sh: &Shell<'_>) {
    let Shell { prompt, .. } = sh;
    let ns = d.s(&["default", "inference", "training", "staging", "ml-platform"]);
    w!(out, "{prompt}kubectl get pods -n {ns}");
    w!(
        out,
        "NAME                                   READY   STATUS             RESTARTS      AGE"
    );
    for _ in 0..d.n(2, 5) {
        let status = d.s(&[
            "Running",
            "Running",
            "Running",
            "CrashLoopBackOff",
            "Pending",
            "OOMKilled",
            "Completed",
        ]);
        w!(
            out,
            "{:<38} {}/1     {:<18} {:<13} {}{}",
            format!("{}-{}-{}", d.project(), d.hex(9), d.alnum(5)),
            if status == "Running" { 1 } else { 0 },
            status,
            d.int(0, 14),
            d.int(1, 59),
            d.s(&["m", "h", "d"])
        );
    }
}

/// `grep -rn` for a function name.
fn grep(d: &mut Draw, out: &mut String, sh: &Shell<'_>) {
    let Shell { prompt, .. } = sh;
    let pat = d.fn_snake();
    w!(
        out,
        "{prompt}grep -rn \"{pat}\" {}",
        d.s(&["src/", ".", "tests/", "pkg/"])
    );
    for _ in 0..d.n(2, 6) {
        w!(
            out,
            "{}:{}:    {}",
            d.path_of(&["py", "go", "rs", "ts"]),
            d.int(1, 900),
            match d.n(0, 2) {
                0 => format!("def {pat}(self, {}):", d.noun_snake()),
                1 => format!("result = {pat}({})", d.noun_snake()),
                _ => format!("return {pat}({}, {})", d.noun_snake(), d.int(0, 9)),
            }
        );
    }
}

/// `df -h` disk usage.
fn df(d: &mut Draw, out: &mut String, sh: &Shell<'_>) {
    let Shell { prompt, .. } = sh;
    w!(
        out,
        "{prompt}df -h | grep -E '{}'",
        d.s(&["nvme|sda", "/data|/home", "overlay"])
    );
    for _ in 0..d.n(1, 3) {
        let used = d.int(5, 99);
        w!(
            out,
            "/dev/{}  {}  {}  {}  {used}% {}",
            d.s(&["nvme0n1p1", "nvme1n1", "sda1", "md0"]),
            size(d),
            size(d),
            size(d),
            d.s(&["/", "/data", "/home", "/scratch", "/mnt/models"])
        );
    }
}

/// `du -sh` of the largest folders.
fn du(d: &mut Draw, out: &mut String, sh: &Shell<'_>) {
    let Shell { prompt, .. } = sh;
    w!(
        out,
        "{prompt}du -sh {}/* | sort -h | tail -{}",
        d.s(&[
            "checkpoints",
            "data",
            "~/.cache/huggingface/hub",
            "logs",
            "target"
        ]),
        d.n(3, 5)
    );
    for _ in 0..d.n(3, 5) {
        w!(
            out,
            "{}\t{}",
            size(d),
            d.s(&[
                "models--Qwen--Qwen3-8B",
                "ckpt-2000",
                "ckpt-4000",
                "train.jsonl",
                "debug",
                "release",
                "wandb",
                "shards"
            ])
        );
    }
}

/// `curl` of a local endpoint.
fn curl(d: &mut Draw, out: &mut String, sh: &Shell<'_>) {
    let Shell { prompt, .. } = sh;
    let url = format!(
        "http://localhost:{}{}",
        d.s(&["8000", "8080", "3000", "9000"]),
        d.s(&vocab::HTTP_PATHS)
    );
    w!(
        out,
        "{prompt}curl -sS -X {} -w '\\n%{{http_code}} %{{time_total}}s\\n' {url}",
        d.s(&vocab::HTTP_METHODS)
    );
    w!(
        out,
        "{{\"status\":\"{}\",\"{}\":{}}}",
        d.s(&["ok", "degraded", "error"]),
        d.noun_snake(),
        d.int(0, 9999)
    );
    w!(
        out,
        "{} {:.6}s",
        d.s(&["200", "200", "503", "404", "500"]),
        d.float(0.001, 3.0)
    );
}

/// `ps aux` by memory.
fn ps_aux(d: &mut Draw, out: &mut String, sh: &Shell<'_>) {
    let Shell { prompt, user } = sh;
    w!(out, "{prompt}ps aux --sort=-%mem | head -{}", d.n(3, 5));
    w!(
        out,
        "USER         PID %CPU %MEM    VSZ   RSS TTY      STAT START   TIME COMMAND"
    );
    for _ in 0..d.n(2, 4) {
        w!(
            out,
            "{:<12} {:>5} {:>4.1} {:>4.1} {:>7} {:>6} ?        Sl   {:02}:{:02}  {:>3}:{:02} {}",
            user,
            d.int(100, 99_999),
            d.float(0.0, 400.0),
            d.float(0.0, 60.0),
            d.int(100_000, 90_000_000),
            d.int(10_000, 40_000_000),
            d.int(0, 23),
            d.int(0, 59),
            d.int(0, 900),
            d.int(0, 59),
            d.s(&[
                "python train.py --config configs/sft.yaml",
                "python -m vllm.entrypoints.openai.api_server",
                "node dist/server.js",
                "./target/release/server",
                "postgres: writer",
                "redis-server *:6379"
            ])
        );
    }
}

/// A build command with compiler output.
fn build(d: &mut Draw, out: &mut String, sh: &Shell<'_>) {
    let Shell { prompt, .. } = sh;
    w!(
        out,
        "{prompt}{}",
        d.s(&[
            "cargo build --release",
            "go build ./...",
            "npm run build",
            "make -j8"
        ])
    );
    for _ in 0..d.n(2, 5) {
        w!(
            out,
            "   Compiling {} v{}",
            d.s(&vocab::RUST_CRATES),
            d.version()
        );
    }
    if d.chance(0.5) {
        w!(out, "warning: unused variable: `{}`", d.noun_snake());
        w!(
            out,
            "  --> {}:{}:{}",
            d.path("rs"),
            d.int(1, 600),
            d.int(5, 30)
        );
    }
    w!(
        out,
        "    Finished `release` profile [optimized] target(s) in {:.2}s",
        d.float(1.0, 240.0)
    );
}

/// `tail` of a log file.
fn tail_log(d: &mut Draw, out: &mut String, sh: &Shell<'_>) {
    let Shell { prompt, .. } = sh;
    w!(
        out,
        "{prompt}tail -n {} logs/{}.log",
        d.n(3, 6),
        d.s(&["server", "worker", "api", "train"])
    );
    for _ in 0..d.n(3, 6) {
        let (h, m, s) = d.clock();
        w!(
            out,
            "{} {h:02}:{m:02}:{s:02},{:03} {} [{}] {}",
            d.date(),
            d.int(0, 999),
            d.s(&["INFO", "INFO", "WARNING", "ERROR", "DEBUG"]),
            d.s(&vocab::SUB_DIRS),
            d.sentence().to_lowercase()
        );
    }
}

fn training_log(d: &mut Draw) -> String {
    let mut out = String::new();
    let total = *d.pick(&[1000u64, 2000, 5000, 10_000, 20_000, 50_000]);
    let every = *d.pick(&[10u64, 20, 50, 100]);
    let start = d.int(0, total / every / 2) * every;
    let mut loss = d.float(0.8, 4.5);
    let peak = d.float(1.0, 9.0) * 10f64.powi(-(d.int(4, 5) as i32));
    let tps = d.float(2_000.0, 60_000.0);
    let style = d.n(0, 2);
    let date = d.date();
    let mut secs = d.int(0, 80_000);
    let per_step = d.float(0.2, 6.0);
    if d.chance(0.5) {
        w!(
            out,
            "[rank0]: {} | world_size={} | micro_bsz={} | grad_accum={} | seq_len={}",
            d.s(&vocab::MODELS),
            *d.pick(&[8u64, 16, 32, 64]),
            d.int(1, 8),
            d.int(1, 16),
            *d.pick(&[2048u64, 4096, 8192])
        );
    }
    for i in 0..d.n(5, 12) as u64 {
        let step = start + (i + 1) * every;
        loss = (loss * d.float(0.97, 1.005)).max(0.05);
        let lr = peak * (0.5 * (1.0 + (std::f64::consts::PI * step as f64 / total as f64).cos()));
        let gn = d.float(0.1, 2.5);
        match style {
            0 => w!(out, "step {step:>6}/{total} | loss {loss:.4} | lr {lr:.3e} | grad_norm {gn:.3} | tok/s {:.0} | mem {:.1}GiB", tps * d.float(0.95, 1.05), d.float(20.0, 78.0)),
            1 => {
                secs += (per_step * every as f64) as u64;
                let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
                w!(out, "{date} {h:02}:{m:02}:{s:02} INFO trainer: {{'loss': {loss:.4}, 'grad_norm': {gn:.4}, 'learning_rate': {lr:.4e}, 'epoch': {:.2}, 'step': {step}}}", step as f64 / total as f64 * 3.0)
            }
            _ => w!(out, "[{:>3}%] it {step} loss={loss:.5} lr={lr:.2e} gnorm={gn:.2} {:.2}s/it", step * 100 / total, d.float(0.2, 6.0)),
        }
        if step % (every * 10) == 0 && d.chance(0.7) {
            w!(
                out,
                "eval @ step {step}: val_loss={:.4} ppl={:.3} acc={:.3}",
                loss * d.float(1.0, 1.15),
                (loss * 1.05).exp(),
                d.float(0.3, 0.9)
            );
        }
    }
    if d.chance(0.4) {
        w!(
            out,
            "Saving checkpoint to /checkpoints/{}/step-{} ({} shards, {:.1} GB)",
            d.project(),
            start + every * 10,
            d.int(2, 16),
            d.float(2.0, 140.0)
        );
    }
    out
}

fn ci_log(d: &mut Draw) -> String {
    let mut out = String::new();
    let (h, m, s) = d.clock();
    let date = d.date();
    let mut clock = CiClock { date, h, m, s };
    let job = d.s(&[
        "test",
        "lint",
        "build",
        "unit-tests (3.11)",
        "integration",
        "e2e",
        "check (ubuntu-latest)",
    ]);
    ci_setup(d, &mut out, &mut clock);
    let failed = d.chance(0.5);
    ci_tests(d, &mut out, &mut clock);
    ci_outcome(d, &mut out, &mut clock, failed);
    w!(out, "{} Post job cleanup.", clock.stamp(d));
    w!(
        out,
        "{} Job '{job}' {} after {}m {}s",
        clock.stamp(d),
        if failed { "failed" } else { "succeeded" },
        d.int(0, 40),
        d.int(0, 59)
    );
    out
}

/// A CI log's wall clock: each stamp moves it on by 0–20 s.
struct CiClock {
    date: String,
    h: u64,
    m: u64,
    s: u64,
}

impl CiClock {
    fn stamp(&mut self, d: &mut Draw) -> String {
        self.s += d.int(0, 20);
        if self.s >= 60 {
            self.s -= 60;
            self.m += 1;
        }
        if self.m >= 60 {
            self.m -= 60;
            self.h = (self.h + 1) % 24;
        }
        format!(
            "{}T{:02}:{:02}:{:02}.{:07}Z",
            self.date,
            self.h,
            self.m,
            self.s,
            d.int(0, 9_999_999)
        )
    }
}

/// The checkout step and the test command with its environment.
fn ci_setup(d: &mut Draw, out: &mut String, clock: &mut CiClock) {
    w!(
        out,
        "{} ##[group]Run {}",
        clock.stamp(d),
        d.s(&[
            "actions/checkout@v4",
            "actions/setup-python@v5",
            "dtolnay/rust-toolchain@stable",
            "actions/setup-go@v5"
        ])
    );
    w!(out, "{} ##[endgroup]", clock.stamp(d));
    let cmd = d.s(&[
        "pytest -q --maxfail=1",
        "cargo test --all-features",
        "go test -race ./...",
        "npm ci && npm test",
        "ruff check . && mypy src",
        "make test",
    ]);
    w!(out, "{} ##[group]Run {cmd}", clock.stamp(d));
    w!(out, "{} shell: /usr/bin/bash -e {{0}}", clock.stamp(d));
    w!(out, "{} env:", clock.stamp(d));
    w!(out, "{}   CI: true", clock.stamp(d));
    w!(
        out,
        "{}   {}: {}",
        clock.stamp(d),
        d.noun_snake().to_uppercase(),
        d.int(0, 99)
    );
    w!(out, "{} ##[endgroup]", clock.stamp(d));
}

/// Two to five lines of test output.
fn ci_tests(d: &mut Draw, out: &mut String, clock: &mut CiClock) {
    for _ in 0..d.n(2, 5) {
        let t = clock.stamp(d);
        match d.n(0, 2) {
            0 => w!(
                out,
                "{t} {} {} ... ok",
                d.s(&["test", "PASS", "ok"]),
                d.fn_snake()
            ),
            1 => w!(
                out,
                "{t} {}/{} {}",
                d.s(&vocab::SUB_DIRS),
                d.s(&vocab::FILE_STEMS),
                d.s(&["PASSED", "ok", "(cached)"])
            ),
            _ => w!(out, "{t} {}", d.sentence()),
        }
    }
}

/// The failure and exit code, or the pass summary.
fn ci_outcome(d: &mut Draw, out: &mut String, clock: &mut CiClock, failed: bool) {
    if failed {
        let t = clock.stamp(d);
        w!(
            out,
            "{t} FAILED {}::test_{} - {}: {}",
            d.path("py"),
            d.fn_snake(),
            d.s(&vocab::PY_EXCEPTIONS),
            d.s(&vocab::ERROR_PHRASES)
        );
        w!(
            out,
            "{} ##[error]Process completed with exit code {}.",
            clock.stamp(d),
            d.s(&["1", "2", "101"])
        );
    } else {
        w!(
            out,
            "{} {} passed in {:.2}s",
            clock.stamp(d),
            d.int(10, 900),
            d.float(2.0, 600.0)
        );
    }
}

fn pip_install(d: &mut Draw) -> String {
    let mut out = String::new();
    let pkgs = d.sample_n(&vocab::PY_PACKAGES, 1, 4);
    w!(out, "$ pip install {}", pkgs.join(" "));
    let mut installed = Vec::new();
    let pyv = d.s(&["cp310", "cp311", "cp312"]);
    for p in &pkgs {
        let v = d.version();
        w!(out, "Collecting {p}");
        let wheel = format!(
            "{}-{v}-{}-{}-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
            p.replace('-', "_"),
            pyv,
            pyv
        );
        let mb = d.float(0.05, 800.0);
        w!(out, "  Downloading {wheel} ({mb:.1} MB)");
        let speed = d.float(1.0, 120.0);
        w!(
            out,
            "     {} {mb:.1}/{mb:.1} MB {speed:.1} MB/s eta 0:00:00",
            "\u{2501}".repeat(40)
        );
        installed.push(format!("{p}-{v}"));
        for _ in 0..d.n(0, 2) {
            let dep = d.s(&vocab::PY_PACKAGES);
            let dv = d.version();
            w!(out, "Collecting {dep}>={} (from {p})", dv);
            w!(
                out,
                "  Using cached {}-{dv}-py3-none-any.whl ({:.0} kB)",
                dep.replace('-', "_"),
                d.float(10.0, 900.0)
            );
            installed.push(format!("{dep}-{dv}"));
        }
    }
    if d.chance(0.3) {
        w!(
            out,
            "Requirement already satisfied: {} in ./.venv/lib/python3.{}/site-packages ({})",
            d.s(&vocab::PY_PACKAGES),
            d.int(10, 12),
            d.version()
        );
    }
    w!(
        out,
        "Installing collected packages: {}",
        installed
            .iter()
            .map(|s| s.rsplit_once('-').map_or(s.as_str(), |(a, _)| a))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if d.chance(0.25) {
        w!(out, "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed. This behaviour is the source of the following dependency conflicts.");
        w!(
            out,
            "{} {} requires {}<{}, but you have {} {} which is incompatible.",
            d.s(&vocab::PY_PACKAGES),
            d.version(),
            d.s(&vocab::PY_PACKAGES),
            d.version(),
            d.s(&vocab::PY_PACKAGES),
            d.version()
        );
    }
    w!(out, "Successfully installed {}", installed.join(" "));
    out
}
