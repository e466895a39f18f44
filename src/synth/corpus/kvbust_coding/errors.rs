//! Error output for the coding corpus: Python tracebacks, CUDA out-of-memory and NCCL failures,
//! Rust compiler errors and Go panics. Owns these templates; must never emit text that was not
//! composed here from the vocabularies.

use super::draw::{capitalize, Draw};
use super::vocab;

/// One error-output block.
pub fn block(d: &mut Draw) -> String {
    match d.weighted(&[35, 15, 10, 20, 20]) {
        0 => python_traceback(d),
        1 => cuda_oom(d),
        2 => nccl(d),
        3 => rustc_error(d),
        _ => go_panic(d),
    }
}

fn py_frame(d: &mut Draw, out: &mut String) {
    let (file, code) = match d.n(0, 3) {
        0 => (
            format!("/home/{}/{}/{}", d.user(), d.project(), d.path("py")),
            format!("{} = {}({})", d.noun_snake(), d.fn_snake(), d.noun_snake()),
        ),
        1 => (
            format!(
                "/usr/lib/python3.{}/site-packages/{}/{}.py",
                d.int(10, 12),
                d.s(&[
                    "torch/nn/modules",
                    "transformers/models/qwen2",
                    "httpx/_transports",
                    "sqlalchemy/engine",
                    "fastapi/routing",
                    "starlette/middleware"
                ]),
                d.s(&[
                    "module",
                    "modeling_qwen2",
                    "default",
                    "base",
                    "routing",
                    "errors"
                ])
            ),
            d.s(&[
                "return forward_call(*args, **kwargs)",
                "raw_response = await func(**values)",
                "resp = self._pool.handle_request(req)",
                "return self._execute_context(dialect, statement)",
                "attn_output = self.o_proj(attn_output)",
            ])
            .to_string(),
        ),
        2 => (
            d.path("py"),
            format!(
                "return await self.{}({}, timeout={})",
                d.fn_snake(),
                d.noun_snake(),
                d.int(1, 60)
            ),
        ),
        _ => (
            format!("/app/{}", d.path("py")),
            format!(
                "assert {}.shape == {}.shape",
                d.noun_snake(),
                d.noun_snake()
            ),
        ),
    };
    w!(
        out,
        "  File \"{file}\", line {}, in {}",
        d.int(1, 2400),
        d.fn_snake()
    );
    w!(out, "    {code}");
    if d.chance(0.25) {
        w!(out, "    {}", "^".repeat(d.n(6, 30)));
    }
}

fn python_traceback(d: &mut Draw) -> String {
    let mut out = String::new();
    if d.chance(0.3) {
        let (h, m, s) = d.clock();
        w!(
            out,
            "{} {h:02}:{m:02}:{s:02} ERROR [{}] Unhandled exception in {}",
            d.date(),
            d.s(&vocab::SUB_DIRS),
            d.fn_snake()
        );
    }
    let chained = d.chance(0.3);
    if chained {
        w!(out, "Traceback (most recent call last):");
        for _ in 0..d.n(1, 3) {
            py_frame(d, &mut out);
        }
        w!(
            out,
            "{}: {}",
            d.s(&vocab::PY_EXCEPTIONS),
            d.s(&vocab::ERROR_PHRASES)
        );
        w!(out);
        w!(
            out,
            "{}",
            d.s(&[
                "During handling of the above exception, another exception occurred:",
                "The above exception was the direct cause of the following exception:"
            ])
        );
        w!(out);
    }
    w!(out, "Traceback (most recent call last):");
    for _ in 0..d.n(2, 7) {
        py_frame(d, &mut out);
    }
    let exc = d.s(&vocab::PY_EXCEPTIONS);
    let msg = match exc {
        "KeyError" => format!("'{}'", d.noun_snake()),
        "TypeError" => format!("{}() got an unexpected keyword argument '{}'", d.fn_snake(), d.noun_snake()),
        "AttributeError" => format!("'{}' object has no attribute '{}'", d.pascal(), d.noun_snake()),
        "IndexError" => "list index out of range".to_string(),
        "ValueError" => format!("invalid literal for int() with base 10: '{}'", d.noun_snake()),
        "FileNotFoundError" => format!("[Errno 2] No such file or directory: '{}'", d.path_of(&["json", "yaml", "pt", "safetensors"])),
        "ImportError" => format!("cannot import name '{}' from '{}'", d.pascal(), d.s(&vocab::PY_STDLIB)),
        "AssertionError" => format!("expected {} == {}", d.int(0, 4096), d.int(0, 4096)),
        "RuntimeError" => format!("Expected all tensors to be on the same device, but found at least two devices, cuda:{} and cpu!", d.int(0, 7)),
        _ => d.s(&vocab::ERROR_PHRASES).to_string(),
    };
    w!(out, "{exc}: {msg}");
    out
}

fn cuda_oom(d: &mut Draw) -> String {
    let mut out = String::new();
    let (gpu_name, cap) = *d.pick(&vocab::GPUS);
    let cap = cap as f64 - d.float(0.2, 1.5);
    let alloc = d.float(0.1, 12.0);
    let free = d.float(0.0, alloc);
    let torch_alloc = d.float(cap * 0.5, cap - free);
    let reserved = d.float(0.01, 2.0);
    let dev = d.int(0, 7);
    w!(out, "[rank{dev}]: Traceback (most recent call last):");
    for _ in 0..d.n(1, 3) {
        w!(
            out,
            "[rank{dev}]:   File \"{}\", line {}, in {}",
            d.path("py"),
            d.int(10, 900),
            d.fn_snake()
        );
        w!(
            out,
            "[rank{dev}]:     {}",
            d.s(&[
                "loss.backward()",
                "outputs = model(**batch)",
                "logits = self.lm_head(hidden_states)",
                "attn_weights = torch.matmul(query, key.transpose(2, 3))"
            ])
        );
    }
    w!(out, "[rank{dev}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {alloc:.2} GiB. GPU {dev} has a total capacity of {cap:.2} GiB of which {free:.2} GiB is free. Including non-PyTorch memory, this process has {:.2} GiB memory in use. Of the allocated memory {torch_alloc:.2} GiB is allocated by PyTorch, and {reserved:.2} GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.", cap - free);
    if d.chance(0.5) {
        w!(out);
        w!(
            out,
            "$ nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader"
        );
        w!(
            out,
            "{gpu_name}, {} MiB, {} MiB",
            (cap * 1024.0) as u64 - d.int(0, 300),
            (cap * 1024.0) as u64
        );
    }
    if d.chance(0.4) {
        w!(out, "E{} {:02}:{:02}:{:02} {} torch/distributed/elastic/multiprocessing/api.py:{}] failed (exitcode: 1) local_rank: {dev} (pid: {}) of binary: /usr/bin/python3", d.int(1000, 1231), d.int(0, 23), d.int(0, 59), d.int(0, 59), d.int(1000, 99_999), d.int(700, 900), d.int(1000, 99_999));
    }
    out
}

fn nccl(d: &mut Draw) -> String {
    let mut out = String::new();
    let host = d.host();
    let pid = d.int(1000, 99_999);
    let rank = d.int(0, 63);
    let seq = d.int(100, 900_000);
    let op = d.s(&[
        "ALLREDUCE",
        "ALLGATHER",
        "_ALLGATHER_BASE",
        "REDUCE_SCATTER",
        "BROADCAST",
    ]);
    w!(out, "{host}:{pid}:{} [{}] NCCL INFO NET/IB : Using [0]mlx5_{}:1/IB [1]mlx5_{}:1/IB ; OOB {}:10.{}.{}.{}<0>", pid + 7, d.int(0, 7), d.int(0, 3), d.int(4, 7), d.s(&["eth0", "ens5", "bond0"]), d.int(0, 255), d.int(0, 255), d.int(1, 254));
    if d.chance(0.5) {
        w!(out, "{host}:{pid}:{} [{}] NCCL WARN NET/IB : Got completion from peer 10.{}.{}.{}<{}> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.{}.{}.{} remoteGids ::ffff:10.{}.{}.{} hca mlx5_{}", pid + 9, d.int(0, 7), d.int(0, 255), d.int(0, 255), d.int(1, 254), d.int(40_000, 60_000), d.int(0, 255), d.int(0, 255), d.int(1, 254), d.int(0, 255), d.int(0, 255), d.int(1, 254), d.int(0, 7));
    }
    w!(out, "[rank{rank}]:[E{} {:02}:{:02}:{:02}.{} ProcessGroupNCCL.cpp:{}] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={}, NumelOut={}, Timeout(ms)={}) ran for {} milliseconds before timing out.", d.int(1000, 1231), d.int(0, 23), d.int(0, 59), d.int(0, 59), d.int(100_000, 999_999), d.int(600, 1700), d.int(1, 300_000_000), d.int(1, 300_000_000), *d.pick(&[600_000u64, 1_800_000]), d.int(600_001, 1_900_000));
    if d.chance(0.6) {
        w!(out, "[rank{rank}]:[E ProcessGroupNCCL.cpp:{}] [Rank {rank}] Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {}, last completed NCCL work: {}.", d.int(600, 1700), seq + d.int(0, 3), seq - 1);
        w!(out, "[rank{rank}]:[E ProcessGroupNCCL.cpp:{}] [Rank {rank}] To avoid data inconsistency, we are taking the entire process down.", d.int(600, 1700));
    }
    if d.chance(0.5) {
        w!(out, "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:{}, {}, NCCL version 2.{}.{}", d.int(100, 400), d.s(&["unhandled system error (run with NCCL_DEBUG=INFO for details)", "remote process exited or there was a network error", "internal error - please report this issue to the NCCL developers", "unhandled cuda error (run with NCCL_DEBUG=INFO for details)"]), d.int(18, 27), d.int(1, 7));
        w!(out, "Last error:");
        w!(
            out,
            "{}",
            d.s(&[
                "socketProgress: Connection closed by remote peer",
                "Cuda failure 'an illegal memory access was encountered'",
                "NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129",
                "Call to ibv_modify_qp failed with error Connection timed out"
            ])
        );
    }
    out
}

fn rustc_error(d: &mut Draw) -> String {
    let mut out = String::new();
    let file = d.path("rs");
    let line = d.int(5, 800);
    let col = d.int(5, 40);
    let var = d.noun_snake();
    let pad = " ".repeat(line.to_string().len());
    let site = Site {
        file,
        line,
        col,
        var,
        pad,
    };
    let (code, error) = RUSTC_ERRORS[d.n(0, RUSTC_ERRORS.len() - 1)];
    error(d, &mut out, &site);
    w!(out);
    if d.chance(0.6) {
        w!(
            out,
            "warning: unused import: `{}`",
            d.s(&[
                "std::fmt::Write",
                "std::sync::Arc",
                "tracing::debug",
                "super::*"
            ])
        );
        w!(out, " --> {}:{}:5", d.path("rs"), d.int(1, 20));
        w!(out);
    }
    w!(
        out,
        "For more information about this error, try `rustc --explain E0{code}`."
    );
    w!(
        out,
        "error: could not compile `{}` (lib{}) due to {} previous error{}",
        d.project(),
        d.s(&["", " test", ""]),
        d.int(1, 4),
        d.s(&["", "s"])
    );
    out
}

/// Where a compiler error points: the file, line and column, the variable it is about, and the
/// gutter padding for the line-number width.
struct Site {
    file: String,
    line: u64,
    col: u64,
    var: String,
    pad: String,
}

/// One compiler diagnostic at a site.
type Diagnostic = fn(&mut Draw, &mut String, &Site);

/// The diagnostics, drawn uniformly with their error code (the order is part of the corpus).
const RUSTC_ERRORS: [(&str, Diagnostic); 5] = [
    ("382", e0382_moved),
    ("308", e0308_mismatched),
    ("599", e0599_no_method),
    ("502", e0502_borrow),
    ("277", e0277_not_send),
];

/// E0382: borrow of a moved value.
fn e0382_moved(d: &mut Draw, out: &mut String, site: &Site) {
    let Site {
        file,
        line,
        col,
        var,
        pad,
    } = site;
    w!(out, "error[E0382]: borrow of moved value: `{var}`");
    w!(out, "{pad}--> {file}:{line}:{col}");
    w!(out, "{pad} |");
    w!(out, "{} |     let {var} = {}::new();", line - 3, d.pascal());
    w!(out, "{pad} |         {} move occurs because `{var}` has type `{}`, which does not implement the `Copy` trait", "-".repeat(var.len()), d.s(&["Vec<String>", "String", "HashMap<u64, Entry>", "Box<dyn Handler>"]));
    w!(out, "{} |     {}({var});", line - 1, d.fn_snake());
    w!(
        out,
        "{pad} |     {}  value moved here",
        " ".repeat(d.n(4, 12))
    );
    w!(out, "{line} |     println!(\"{{:?}}\", {var});");
    w!(
        out,
        "{pad} |                       {} value borrowed here after move",
        "^".repeat(var.len())
    );
}

/// E0308: mismatched types, sometimes with a conversion hint.
fn e0308_mismatched(d: &mut Draw, out: &mut String, site: &Site) {
    let Site {
        file,
        line,
        col,
        var,
        pad,
    } = site;
    let want = d.s(&[
        "usize",
        "u64",
        "String",
        "&str",
        "Option<u32>",
        "Result<(), Error>",
    ]);
    let got = d.s(&["u32", "i64", "&String", "String", "u32", "()"]);
    w!(out, "error[E0308]: mismatched types");
    w!(out, "{pad}--> {file}:{line}:{col}");
    w!(out, "{pad} |");
    w!(
        out,
        "{line} |         let {var}: {want} = self.{}();",
        d.fn_snake()
    );
    w!(
        out,
        "{pad} |                {}   {} expected `{want}`, found `{got}`",
        "-".repeat(want.len()),
        "^".repeat(10)
    );
    w!(out, "{pad} |                |");
    w!(out, "{pad} |                expected due to this");
    if d.chance(0.5) {
        w!(out, "{pad} |");
        w!(
            out,
            "help: you can convert {} `{got}` to {} `{want}`{}",
            d.s(&["a", "an"]),
            d.s(&["a", "an"]),
            d.s(&[
                ", matching the type of the field",
                "",
                " and panic if the converted value doesn't fit"
            ])
        );
    }
}

/// E0599: no such method, with the trait-import hint.
fn e0599_no_method(d: &mut Draw, out: &mut String, site: &Site) {
    let Site {
        file,
        line,
        col,
        var,
        pad,
    } = site;
    w!(
        out,
        "error[E0599]: no method named `{}` found for {} `{}` in the current scope",
        d.fn_snake(),
        d.s(&["struct", "enum", "reference"]),
        d.pascal()
    );
    w!(out, "{pad}--> {file}:{line}:{col}");
    w!(out, "{pad} |");
    w!(out, "{line} |         self.{var}.{}()", d.fn_snake());
    w!(
        out,
        "{pad} |                   {} method not found in `{}`",
        "^".repeat(d.n(4, 14)),
        d.pascal()
    );
    w!(out, "{pad} |");
    w!(
        out,
        "  = help: items from traits can only be used if the trait is in scope"
    );
    w!(out, "help: trait `{}` which provides `{}` is implemented but not in scope; perhaps you want to import it", d.pascal(), d.fn_snake());
    w!(out, "{pad} |");
    w!(
        out,
        "1  + use {}::{};",
        d.s(&vocab::RUST_CRATES),
        d.pascal()
    );
}

/// E0502: mutable borrow while borrowed immutably.
fn e0502_borrow(d: &mut Draw, out: &mut String, site: &Site) {
    let Site {
        file,
        line,
        col,
        var,
        pad,
    } = site;
    w!(out, "error[E0502]: cannot borrow `self.{var}` as mutable because it is also borrowed as immutable");
    w!(out, "{pad}--> {file}:{line}:{col}");
    w!(out, "{pad} |");
    w!(
        out,
        "{} |         let {} = self.{var}.get(&key);",
        line - 1,
        d.noun_snake()
    );
    w!(
        out,
        "{pad} |                     {} immutable borrow occurs here",
        "-".repeat(var.len() + 5)
    );
    w!(
        out,
        "{line} |         self.{var}.insert(key, {});",
        d.noun_snake()
    );
    w!(
        out,
        "{pad} |         {} mutable borrow occurs here",
        "^".repeat(var.len() + 12)
    );
}

/// E0277: a future that is not `Send` passed to `tokio::spawn`.
fn e0277_not_send(d: &mut Draw, out: &mut String, site: &Site) {
    let Site {
        file,
        line,
        col,
        pad,
        ..
    } = site;
    w!(
        out,
        "error[E0277]: `{}` cannot be sent between threads safely",
        d.s(&[
            "Rc<RefCell<State>>",
            "*mut u8",
            "RefCell<Vec<u32>>",
            "MutexGuard<'_, Cache>"
        ])
    );
    w!(out, "{pad}--> {file}:{line}:{col}");
    w!(out, "{pad} |");
    w!(out, "{line} |     tokio::spawn(async move {{");
    w!(
        out,
        "{pad} |     ^^^^^^^^^^^^ future created by async block is not `Send`"
    );
    w!(out, "{pad} |");
    w!(out, "note: required by a bound in `tokio::spawn`");
}

fn go_panic(d: &mut Draw) -> String {
    let mut out = String::new();
    let module = format!("github.com/{}/{}", d.user(), d.project());
    match d.n(0, 3) {
        0 => {
            let n = d.int(0, 8);
            w!(
                out,
                "panic: runtime error: index out of range [{}] with length {n}",
                n + d.int(0, 3)
            );
        }
        1 => {
            w!(
                out,
                "panic: runtime error: invalid memory address or nil pointer dereference"
            );
            w!(
                out,
                "[signal SIGSEGV: segmentation violation code=0x1 addr=0x{} pc=0x{}]",
                d.hex(2),
                d.hex(6)
            );
        }
        2 => w!(
            out,
            "fatal error: concurrent map {}",
            d.s(&["writes", "read and map write", "iteration and map write"])
        ),
        _ => w!(
            out,
            "panic: {}: {}",
            d.fn_snake().replace('_', " "),
            d.s(&vocab::ERROR_PHRASES)
        ),
    }
    w!(out);
    w!(out, "goroutine {} [running]:", d.int(1, 900));
    for _ in 0..d.n(2, 6) {
        let pkg = d.s(&vocab::SUB_DIRS);
        w!(
            out,
            "{module}/internal/{pkg}.(*{}).{}(0x{}, {{0x{}, 0x{}}})",
            d.pascal(),
            capitalize(&d.camel_fn()),
            d.hex(10),
            d.hex(8),
            d.hex(2)
        );
        w!(
            out,
            "\t/src/{module}/internal/{pkg}/{}.go:{} +0x{}",
            d.s(&vocab::FILE_STEMS),
            d.int(10, 900),
            d.hex(3)
        );
    }
    w!(out, "main.main()");
    w!(
        out,
        "\t/src/{module}/cmd/{}/main.go:{} +0x{}",
        d.project(),
        d.int(10, 200),
        d.hex(3)
    );
    if d.chance(0.4) {
        w!(out, "exit status 2");
    }
    out
}
