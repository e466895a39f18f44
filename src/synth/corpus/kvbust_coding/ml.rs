//! ML code and configs for the coding corpus: PyTorch training loops, inference servers,
//! dataset/tokenizer/collate code, and YAML/JSON training and model configs. Owns these
//! templates; must never emit text that was not composed here from the vocabularies.

use super::draw::Draw;
use super::json::J;
use super::vocab;

/// One ML-code or ML-config block.
pub fn block(d: &mut Draw) -> String {
    match d.weighted(&[30, 20, 15, 20, 15]) {
        0 => training_loop(d),
        1 => inference_server(d),
        2 => data_code(d),
        3 => yaml_config(d),
        _ => json_config(d),
    }
}

fn lr(d: &mut Draw) -> String {
    format!("{}e-{}", d.int(1, 9), d.int(4, 6))
}

/// Interchangeable names, so two training scripts rarely share a line.
struct Names {
    cfg: &'static str,
    model: &'static str,
    loader: &'static str,
    batch: &'static str,
    opt: &'static str,
    sched: &'static str,
    step: &'static str,
    device: &'static str,
}

fn names(d: &mut Draw) -> Names {
    Names {
        cfg: d.s(&["cfg", "args", "config", "hparams", "opts", "tc"]),
        model: d.s(&["model", "net", "policy", "student", "lm", "module"]),
        loader: d.s(&[
            "train_loader",
            "train_dl",
            "loader",
            "dataloader",
            "train_iter",
            "batches",
        ]),
        batch: d.s(&["batch", "inputs", "mb", "micro_batch", "sample", "features"]),
        opt: d.s(&["optimizer", "opt", "optim"]),
        sched: d.s(&["scheduler", "sched", "lr_scheduler", "lr_sched"]),
        step: d.s(&["step", "global_step", "it", "update_step", "n_updates"]),
        device: d.s(&["device", "dev", "torch_device"]),
    }
}

fn training_loop(d: &mut Draw) -> String {
    let mut out = String::new();
    let n = names(d);
    let optim = d.s(&["AdamW", "Adam", "SGD", "Adafactor", "Lion", "RMSprop"]);
    let accum = d.s(&[
        "grad_accum",
        "accum_steps",
        "gradient_accumulation_steps",
        "accumulate",
    ]);
    tl_imports(d, &mut out);
    w!(out);
    w!(out);
    tl_setup(d, &mut out, &n, optim, accum);
    let amp = d.chance(0.6);
    let dtype = d.s(&["bfloat16", "float16"]);
    if amp {
        w!(
            out,
            "    scaler = torch.cuda.amp.GradScaler(enabled={})",
            if dtype == "float16" { "True" } else { "False" }
        );
    }
    tl_loop(d, &mut out, &n, accum, amp, dtype);
    if d.chance(0.4) {
        tl_evaluate(d, &mut out, &n);
    }
    out
}

/// The shuffled `import` lines of a training script.
fn tl_imports(d: &mut Draw, out: &mut String) {
    let mut imports = vec![
        "import math",
        "import os",
        "import time",
        "import torch",
        "import torch.nn.functional as F",
        "import torch.distributed as dist",
    ];
    d.shuffle(&mut imports);
    imports.truncate(d.n(2, 6));
    imports.sort_unstable();
    for i in imports {
        w!(out, "{i}");
    }
    for extra in d.sample_n(
        &[
            "from torch.utils.data import DataLoader",
            "from torch.nn.parallel import DistributedDataParallel as DDP",
            "from transformers import get_cosine_schedule_with_warmup",
            "from tqdm import tqdm",
            "import wandb",
            "from accelerate import Accelerator",
        ],
        1,
        3,
    ) {
        w!(out, "{extra}");
    }
}

/// The `def` line, device, optimizer and LR schedule of a training function.
fn tl_setup(d: &mut Draw, out: &mut String, n: &Names, optim: &str, accum: &str) {
    let &Names {
        cfg,
        model,
        loader,
        opt,
        sched,
        device,
        ..
    } = n;
    let fname = d.s(&[
        "train",
        "train_one_epoch",
        "fit",
        "run_training",
        "finetune",
        "train_loop",
        "pretrain",
    ]);
    w!(
        out,
        "def {fname}({cfg}, {model}, {loader}{}):",
        d.s(&[
            "",
            ", eval_loader=None",
            ", val_loader: DataLoader | None = None",
            ", callbacks=()"
        ])
    );
    if d.chance(0.5) {
        w!(out, "    \"\"\"{}.\"\"\"", d.sentence());
    }
    w!(
        out,
        "    {device} = torch.device({})",
        d.s(&[
            "f\"cuda:{int(os.environ.get('LOCAL_RANK', 0))}\"",
            "\"cuda\" if torch.cuda.is_available() else \"cpu\"",
            &format!("{cfg}.device")
        ])
    );
    w!(out, "    {model} = {model}.to({device})");
    let params = if d.chance(0.5) {
        w!(
            out,
            "    decay = [p for n, p in {model}.named_parameters() if p.ndim >= 2]"
        );
        w!(
            out,
            "    no_decay = [p for n, p in {model}.named_parameters() if p.ndim < 2]"
        );
        format!("[{{\"params\": decay, \"weight_decay\": {cfg}.{}}}, {{\"params\": no_decay, \"weight_decay\": 0.0}}]", d.s(&["weight_decay", "wd"]))
    } else {
        format!("{model}.parameters()")
    };
    w!(
        out,
        "    {opt} = torch.optim.{optim}({params}, lr={cfg}.{}{})",
        d.s(&["lr", "learning_rate", "peak_lr"]),
        d.s(&["", ", betas=(0.9, 0.95)", ", eps=1e-8", ", fused=True"])
    );
    w!(
        out,
        "    total = {cfg}.{} * len({loader}) // {cfg}.{accum}",
        d.s(&["epochs", "num_epochs", "n_epochs"])
    );
    match d.n(0, 2) {
        0 => w!(out, "    {sched} = get_cosine_schedule_with_warmup({opt}, {}, total)", d.s(&["500", "100", "int(0.03 * total)", &format!("{cfg}.warmup_steps")])),
        1 => w!(out, "    {sched} = torch.optim.lr_scheduler.OneCycleLR({opt}, max_lr={cfg}.lr, total_steps=total, pct_start={:.2})", d.float(0.01, 0.3)),
        _ => {
            w!(out, "    warmup = {}", d.int(50, 4000));
            w!(out, "    {sched} = torch.optim.lr_scheduler.LambdaLR({opt}, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))");
        }
    }
}

/// The epoch and batch loops (`amp`: autocast to `dtype` with a grad scaler).
fn tl_loop(d: &mut Draw, out: &mut String, n: &Names, accum: &str, amp: bool, dtype: &str) {
    let &Names {
        cfg,
        model,
        loader,
        batch,
        step,
        device,
        ..
    } = n;
    w!(out, "    {step} = 0");
    if d.chance(0.4) {
        w!(out, "    t0 = time.perf_counter()");
    }
    w!(out, "    for epoch in range({cfg}.epochs):");
    w!(out, "        {model}.train()");
    w!(out, "        for i, {batch} in enumerate({loader}):");
    match d.n(0, 2) {
        0 => w!(out, "            {batch} = {{k: v.to({device}, non_blocking=True) for k, v in {batch}.items()}}"),
        1 => w!(out, "            input_ids, labels = ({batch}[0].to({device}), {batch}[1].to({device}))"),
        _ => w!(out, "            {batch} = to_device({batch}, {device})"),
    }
    tl_backward(d, out, n, accum, amp, dtype);
    tl_optimizer_step(d, out, n, amp);
    tl_log_and_save(d, out, n);
    if d.chance(0.5) {
        w!(out, "        if eval_loader is not None:");
        w!(
            out,
            "            val = evaluate({model}, eval_loader, {device})"
        );
        w!(out, "            print(f\"epoch {{epoch}}: val_loss={{val:.4f}} ppl={{math.exp(val):.2f}}\")");
    }
    w!(out, "    return {model}");
}

/// The forward pass and the (scaled) backward pass of one micro-batch.
fn tl_backward(d: &mut Draw, out: &mut String, n: &Names, accum: &str, amp: bool, dtype: &str) {
    let &Names {
        cfg, model, batch, ..
    } = n;
    let loss_line = match d.n(0, 2) {
        0 => format!("loss = {model}(**{batch}).loss"),
        1 => format!("logits = {model}({batch}[\"input_ids\"]).logits\n{{IND}}loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), {batch}[\"labels\"][:, 1:].flatten(), ignore_index=-100)"),
        _ => format!("out = {model}(input_ids=input_ids, labels=labels)\n{{IND}}loss = out.loss{}", d.s(&["", ".mean()", " * {cfg}.loss_scale"])),
    };
    if amp {
        w!(
            out,
            "            with torch.autocast(\"cuda\", dtype=torch.{dtype}):"
        );
        w!(
            out,
            "                {}",
            loss_line.replace("{IND}", "                ")
        );
        w!(
            out,
            "            scaler.scale(loss / {cfg}.{accum}).backward()"
        );
    } else {
        w!(
            out,
            "            {}",
            loss_line.replace("{IND}", "            ")
        );
        w!(out, "            (loss / {cfg}.{accum}).backward()");
    }
    w!(out, "            if (i + 1) % {cfg}.{accum}:");
    w!(out, "                continue");
}

/// Gradient clipping, the optimizer and scheduler steps.
fn tl_optimizer_step(d: &mut Draw, out: &mut String, n: &Names, amp: bool) {
    let &Names {
        cfg,
        model,
        opt,
        sched,
        step,
        ..
    } = n;
    if amp {
        w!(out, "            scaler.unscale_({opt})");
    }
    w!(
        out,
        "            gnorm = torch.nn.utils.clip_grad_norm_({model}.parameters(), {})",
        d.s(&["1.0", "0.5", "2.0", &format!("{cfg}.clip")])
    );
    if amp {
        w!(out, "            scaler.step({opt})");
        w!(out, "            scaler.update()");
    } else {
        w!(out, "            {opt}.step()");
    }
    w!(out, "            {sched}.step()");
    w!(
        out,
        "            {opt}.zero_grad({})",
        d.s(&["set_to_none=True", ""])
    );
    w!(out, "            {step} += 1");
}

/// Periodic logging and checkpointing inside the batch loop.
fn tl_log_and_save(d: &mut Draw, out: &mut String, n: &Names) {
    let &Names {
        cfg,
        model,
        opt,
        sched,
        step,
        ..
    } = n;
    w!(
        out,
        "            if {step} % {cfg}.{} == 0:",
        d.s(&["log_every", "log_interval", "print_freq"])
    );
    match d.n(0, 2) {
        0 => w!(out, "                print(f\"ep {{epoch}} {step} {{{step}}} loss {{loss.item():.4f}} lr {{{sched}.get_last_lr()[0]:.2e}} gnorm {{gnorm:.2f}}\")"),
        1 => w!(out, "                wandb.log({{\"train/loss\": loss.item(), \"train/lr\": {sched}.get_last_lr()[0], \"train/grad_norm\": gnorm.item()}}, step={step})"),
        _ => w!(out, "                logger.info(\"step=%d loss=%.4f lr=%.3e\", {step}, loss.item(), {opt}.param_groups[0][\"lr\"])"),
    }
    if d.chance(0.5) {
        w!(
            out,
            "            if {step} % {cfg}.{} == 0{}:",
            d.s(&["save_every", "ckpt_interval", "save_steps"]),
            d.s(&[" and dist.get_rank() == 0", "", " and is_main_process()"])
        );
        w!(out, "                torch.save({{\"{model}\": {model}.state_dict(), \"{opt}\": {opt}.state_dict(), \"{step}\": {step}}}, os.path.join({cfg}.{}, f\"step_{{{step}:07d}}.pt\"))", d.s(&["out_dir", "output_dir", "ckpt_dir"]));
    }
}

/// An `evaluate` function after the training function.
fn tl_evaluate(d: &mut Draw, out: &mut String, n: &Names) {
    let &Names {
        model,
        batch,
        device,
        ..
    } = n;
    w!(out);
    w!(out);
    w!(out, "@torch.no_grad()");
    w!(
        out,
        "def evaluate({model}, loader, {device}, max_batches: int = {}):",
        d.int(20, 400)
    );
    w!(out, "    {model}.eval()");
    w!(out, "    total, n = 0.0, 0");
    w!(out, "    for j, {batch} in enumerate(loader):");
    w!(out, "        if j >= max_batches:");
    w!(out, "            break");
    w!(
        out,
        "        total += {model}(**{{k: v.to({device}) for k, v in {batch}.items()}}).loss.item()"
    );
    w!(out, "        n += 1");
    w!(out, "    {model}.train()");
    w!(out, "    return total / max(n, 1)");
}

fn inference_server(d: &mut Draw) -> String {
    match d.n(0, 2) {
        0 => fastapi_server(d),
        1 => vllm_engine(d),
        _ => batcher(d),
    }
}

fn fastapi_server(d: &mut Draw) -> String {
    let mut out = String::new();
    let model = d.s(&vocab::MODELS);
    let req = format!(
        "{}Request",
        d.s(&["Generate", "Completion", "Infer", "Chat", "Predict"])
    );
    let resp = req.replace("Request", "Response");
    let tok = d.s(&["tokenizer", "tok", "processor"]);
    let lm = d.s(&["model", "lm", "llm", "generator"]);
    fa_setup(d, &mut out, model, tok, lm);
    fa_schemas(d, &mut out, &req, &resp);
    fa_route(d, &mut out, &req, &resp, tok, lm);
    if d.chance(0.5) {
        w!(out);
        w!(out);
        w!(
            out,
            "@app.get(\"/{}\")",
            d.s(&["healthz", "health", "ready"])
        );
        w!(out, "def health():");
        w!(out, "    return {{\"ok\": True, \"cuda_mem_gib\": round(torch.cuda.memory_allocated() / 2**30, 2)}}");
    }
    out
}

/// Imports, constants, the app and the loaded model.
fn fa_setup(d: &mut Draw, out: &mut String, model: &str, tok: &str, lm: &str) {
    w!(out, "import time");
    w!(out, "import uuid");
    w!(out);
    w!(out, "import torch");
    w!(out, "from fastapi import FastAPI, HTTPException");
    w!(
        out,
        "from pydantic import BaseModel{}",
        d.s(&["", ", Field"])
    );
    w!(
        out,
        "from transformers import AutoModelForCausalLM, AutoTokenizer"
    );
    w!(out);
    w!(
        out,
        "{} = \"{model}\"",
        d.s(&["MODEL_ID", "MODEL_NAME", "CHECKPOINT"])
    );
    w!(
        out,
        "MAX_INPUT_TOKENS = {}",
        d.s(&["4096", "8192", "16384", "32768"])
    );
    w!(out);
    w!(out, "app = FastAPI(title=\"{}\")", d.project());
    w!(out, "{tok} = AutoTokenizer.from_pretrained(\"{model}\")");
    w!(out, "{lm} = AutoModelForCausalLM.from_pretrained(\"{model}\", torch_dtype=torch.{}, device_map=\"{}\").eval()", d.s(&["bfloat16", "float16"]), d.s(&["auto", "cuda:0", "balanced"]));
    w!(out);
    w!(out);
}

/// The request and response models.
fn fa_schemas(d: &mut Draw, out: &mut String, req: &str, resp: &str) {
    w!(out, "class {req}(BaseModel):");
    w!(out, "    {}: str", d.s(&["prompt", "text", "input"]));
    w!(
        out,
        "    max_new_tokens: int = {}",
        d.s(&["128", "256", "512", "1024"])
    );
    w!(out, "    temperature: float = {:.1}", d.float(0.0, 1.2));
    if d.chance(0.5) {
        w!(out, "    top_p: float = {:.2}", d.float(0.8, 1.0));
    }
    if d.chance(0.4) {
        w!(out, "    stop: list[str] = []");
    }
    w!(out);
    w!(out);
    w!(out, "class {resp}(BaseModel):");
    for f in d.sample_n(
        &[
            "id: str",
            "text: str",
            "prompt_tokens: int",
            "completion_tokens: int",
            "latency_ms: float",
            "finish_reason: str",
            "model: str",
        ],
        3,
        6,
    ) {
        w!(out, "    {f}");
    }
    w!(out);
    w!(out);
}

/// The generation endpoint.
fn fa_route(d: &mut Draw, out: &mut String, req: &str, resp: &str, tok: &str, lm: &str) {
    let route = d.s(&[
        "/generate",
        "/v1/generate",
        "/infer",
        "/completions",
        "/predict",
    ]);
    w!(out, "@app.post(\"{route}\")");
    w!(
        out,
        "{}def {}(req: {req}) -> {resp}:",
        d.s(&["async ", ""]),
        d.s(&["generate", "infer", "complete", "handle_generate"])
    );
    w!(out, "    t0 = time.perf_counter()");
    w!(
        out,
        "    ids = {tok}(req.{}, return_tensors=\"pt\").input_ids.to({lm}.device)",
        d.s(&["prompt", "text", "input"])
    );
    w!(out, "    if ids.shape[-1] > MAX_INPUT_TOKENS:");
    w!(out, "        raise HTTPException({}, f\"input has {{ids.shape[-1]}} tokens, limit is {{MAX_INPUT_TOKENS}}\")", d.s(&["413", "400", "422"]));
    w!(
        out,
        "    with torch.{}():",
        d.s(&["inference_mode", "no_grad"])
    );
    w!(out, "        out = {lm}.generate(ids, max_new_tokens=req.max_new_tokens, do_sample=req.temperature > 0, temperature=max(req.temperature, 1e-5))");
    w!(out, "    new = out[0, ids.shape[-1]:]");
    w!(out, "    return {resp}(");
    w!(
        out,
        "        id=\"{}-\" + uuid.uuid4().hex[:{}],",
        d.s(&["gen", "cmpl", "req"]),
        d.int(8, 24)
    );
    w!(
        out,
        "        text={tok}.decode(new, skip_special_tokens=True),"
    );
    w!(out, "        completion_tokens=int(new.numel()),");
    w!(out, "        latency_ms=(time.perf_counter() - t0) * 1e3,");
    w!(out, "    )");
}

fn vllm_engine(d: &mut Draw) -> String {
    let mut out = String::new();
    let model = d.s(&vocab::MODELS);
    vllm_setup(d, &mut out, model);
    let f = d.s(&["complete", "run_prompt", "generate_one", "stream_text"]);
    vllm_complete(d, &mut out, f);
    vllm_main(d, &mut out, f);
    out
}

/// Imports and the engine with its arguments.
fn vllm_setup(d: &mut Draw, out: &mut String, model: &str) {
    w!(out, "import asyncio");
    w!(out, "import uuid");
    w!(out);
    w!(
        out,
        "from vllm import AsyncEngineArgs, AsyncLLMEngine, SamplingParams"
    );
    w!(out);
    w!(out, "engine_args = AsyncEngineArgs(");
    w!(out, "    model=\"{model}\",");
    w!(
        out,
        "    tensor_parallel_size={},",
        d.s(&["1", "2", "4", "8"])
    );
    w!(out, "    gpu_memory_utilization={:.2},", d.float(0.7, 0.95));
    w!(
        out,
        "    max_model_len={},",
        d.s(&["4096", "8192", "16384", "32768"])
    );
    w!(
        out,
        "    enable_prefix_caching={},",
        d.s(&["True", "False"])
    );
    if d.chance(0.5) {
        w!(
            out,
            "    max_num_seqs={},",
            d.s(&["64", "128", "256", "512"])
        );
    }
    if d.chance(0.4) {
        w!(
            out,
            "    quantization=\"{}\",",
            d.s(&["fp8", "awq", "gptq"])
        );
    }
    w!(out, ")");
    w!(out, "engine = AsyncLLMEngine.from_engine_args(engine_args)");
    w!(out);
    w!(out);
}

/// The one-prompt coroutine `f`.
fn vllm_complete(d: &mut Draw, out: &mut String, f: &str) {
    w!(
        out,
        "async def {f}(prompt: str, max_tokens: int = {}) -> str:",
        d.s(&["128", "256", "512"])
    );
    w!(
        out,
        "    params = SamplingParams(temperature={:.1}, top_p={:.2}, max_tokens=max_tokens{})",
        d.float(0.0, 1.0),
        d.float(0.8, 1.0),
        d.s(&["", ", stop=[\"\\n\\n\"]", ", seed=0"])
    );
    w!(out, "    final = None");
    w!(
        out,
        "    async for output in engine.generate(prompt, params, request_id=str(uuid.uuid4())):"
    );
    w!(out, "        final = output");
    w!(out, "    return final.outputs[0].text");
    w!(out);
    w!(out);
}

/// `main()`, gathering `f` over a few prompts, and the entry point.
fn vllm_main(d: &mut Draw, out: &mut String, f: &str) {
    w!(out, "async def main():");
    w!(out, "    prompts = [");
    for _ in 0..d.n(2, 4) {
        w!(out, "        \"{}\",", d.sentence());
    }
    w!(out, "    ]");
    w!(
        out,
        "    results = await asyncio.gather(*({f}(p) for p in prompts))"
    );
    w!(out, "    for p, r in zip(prompts, results):");
    w!(
        out,
        "        print(f\"{{p[:{}]!r}} -> {{r[:{}]!r}}\")",
        d.int(20, 60),
        d.int(40, 120)
    );
    w!(out);
    w!(out);
    w!(out, "if __name__ == \"__main__\":");
    w!(out, "    asyncio.run(main())");
}

fn batcher(d: &mut Draw) -> String {
    let mut out = String::new();
    let cls = format!(
        "{}Batcher",
        d.s(&["Dynamic", "Micro", "Continuous", "Request", "Token"])
    );
    let q = d.s(&["queue", "pending", "inbox", "requests"]);
    w!(out, "import asyncio");
    w!(out, "import time");
    w!(out);
    w!(out);
    w!(out, "class {cls}:");
    w!(out, "    \"\"\"{}.\"\"\"", d.sentence());
    w!(out);
    w!(
        out,
        "    def __init__(self, run_batch, max_batch: int = {}, max_wait_ms: float = {:.1}):",
        d.s(&["8", "16", "32", "64"]),
        d.float(1.0, 50.0)
    );
    w!(out, "        self.run_batch = run_batch");
    w!(out, "        self.max_batch = max_batch");
    w!(out, "        self.max_wait = max_wait_ms / 1000");
    w!(out, "        self.{q}: asyncio.Queue = asyncio.Queue()");
    w!(out);
    w!(out, "    async def submit(self, item):");
    w!(
        out,
        "        fut = asyncio.get_running_loop().create_future()"
    );
    w!(out, "        await self.{q}.put((item, fut))");
    w!(out, "        return await fut");
    w!(out);
    w!(out, "    async def run(self):");
    w!(out, "        while True:");
    w!(out, "            items = [await self.{q}.get()]");
    w!(
        out,
        "            deadline = time.monotonic() + self.max_wait"
    );
    w!(out, "            while len(items) < self.max_batch:");
    w!(out, "                timeout = deadline - time.monotonic()");
    w!(out, "                if timeout <= 0:");
    w!(out, "                    break");
    w!(out, "                try:");
    w!(
        out,
        "                    items.append(await asyncio.wait_for(self.{q}.get(), timeout))"
    );
    w!(out, "                except asyncio.TimeoutError:");
    w!(out, "                    break");
    w!(out, "            try:");
    w!(
        out,
        "                results = await self.run_batch([x for x, _ in items])"
    );
    w!(out, "            except Exception as exc:  # noqa: BLE001");
    w!(out, "                for _, fut in items:");
    w!(out, "                    fut.set_exception(exc)");
    w!(out, "                continue");
    w!(out, "            for (_, fut), res in zip(items, results):");
    w!(out, "                fut.set_result(res)");
    out
}

fn data_code(d: &mut Draw) -> String {
    let mut out = String::new();
    dc_dataset(d, &mut out);
    dc_collate(d, &mut out);
    if d.chance(0.5) {
        w!(out);
        w!(out);
        w!(out, "def make_loader(ds, batch_size: int = {}, shuffle: bool = True, num_workers: int = {}):", d.s(&["4", "8", "16", "32"]), d.int(0, 8));
        w!(out, "    sampler = torch.utils.data.distributed.DistributedSampler(ds, shuffle=shuffle) if torch.distributed.is_initialized() else None");
        w!(out, "    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=shuffle and sampler is None, sampler=sampler, collate_fn=collate, num_workers=num_workers, pin_memory=True)");
    }
    out
}

/// The dataset class.
fn dc_dataset(d: &mut Draw, out: &mut String) {
    let cls = format!("{}Dataset", d.pascal());
    w!(out, "import json");
    w!(out, "from pathlib import Path");
    w!(out);
    w!(out, "import torch");
    w!(out, "from torch.utils.data import Dataset");
    w!(out, "from transformers import PreTrainedTokenizerBase");
    w!(out);
    w!(out);
    w!(out, "class {cls}(Dataset):");
    w!(out, "    \"\"\"{}.\"\"\"", d.sentence());
    w!(out);
    w!(out, "    def __init__(self, path: Path, tokenizer: PreTrainedTokenizerBase, max_len: int = {}):", d.s(&["512", "1024", "2048", "4096"]));
    w!(out, "        self.tokenizer = tokenizer");
    w!(out, "        self.max_len = max_len");
    w!(out, "        with open(path) as f:");
    w!(
        out,
        "            self.rows = [json.loads(line) for line in f if line.strip()]"
    );
    let field = d.s(&["text", "prompt", "instruction", "content", "question"]);
    let target = d.s(&["response", "completion", "output", "answer", "label"]);
    w!(
        out,
        "        self.rows = [r for r in self.rows if r.get(\"{field}\") and r.get(\"{target}\")]"
    );
    w!(out);
    w!(out, "    def __len__(self) -> int:");
    w!(out, "        return len(self.rows)");
    w!(out);
    w!(
        out,
        "    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:"
    );
    w!(out, "        row = self.rows[idx]");
    w!(
        out,
        "        prompt_ids = self.tokenizer(row[\"{field}\"], add_special_tokens=False).input_ids"
    );
    w!(out, "        target_ids = self.tokenizer(row[\"{target}\"], add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id]");
    w!(
        out,
        "        input_ids = (prompt_ids + target_ids)[: self.max_len]"
    );
    w!(
        out,
        "        labels = ([-100] * len(prompt_ids) + target_ids)[: self.max_len]"
    );
    w!(out, "        return {{\"input_ids\": torch.tensor(input_ids), \"labels\": torch.tensor(labels)}}");
}

/// The padding collate function.
fn dc_collate(d: &mut Draw, out: &mut String) {
    w!(out);
    w!(out);
    w!(out, "def collate(batch: list[dict[str, torch.Tensor]], pad_id: int = {}) -> dict[str, torch.Tensor]:", d.s(&["0", "151643", "128001", "2"]));
    w!(
        out,
        "    width = max(x[\"input_ids\"].numel() for x in batch)"
    );
    if d.chance(0.5) {
        w!(
            out,
            "    width = (width + {m} - 1) // {m} * {m}  # pad to a multiple for tensor cores",
            m = d.s(&["8", "16", "64"])
        );
    }
    w!(
        out,
        "    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)"
    );
    w!(
        out,
        "    labels = torch.full((len(batch), width), -100, dtype=torch.long)"
    );
    w!(
        out,
        "    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)"
    );
    w!(out, "    for i, x in enumerate(batch):");
    w!(out, "        n = x[\"input_ids\"].numel()");
    w!(out, "        input_ids[i, :n] = x[\"input_ids\"]");
    w!(out, "        labels[i, :n] = x[\"labels\"]");
    w!(out, "        attention_mask[i, :n] = 1");
    w!(out, "    return {{\"input_ids\": input_ids, \"labels\": labels, \"attention_mask\": attention_mask}}");
}

fn yaml_config(d: &mut Draw) -> String {
    let mut out = String::new();
    let model = d.s(&vocab::MODELS);
    yaml_model(d, &mut out, model);
    if d.chance(0.5) {
        yaml_lora(d, &mut out);
    }
    yaml_data(d, &mut out);
    yaml_optim(d, &mut out);
    yaml_trainer(d, &mut out);
    if d.chance(0.5) {
        yaml_logging(d, &mut out);
    }
    out
}

/// The file comment, the run's name and seed, and the `model:` section.
fn yaml_model(d: &mut Draw, out: &mut String, model: &str) {
    w!(
        out,
        "# {}",
        d.s(&[
            "configs/sft.yaml",
            "configs/pretrain.yaml",
            "recipes/lora.yaml",
            "train_config.yaml",
            "experiments/dpo.yaml"
        ])
    );
    w!(
        out,
        "run_name: {}-{}-{}",
        d.s(&["sft", "dpo", "lora", "pretrain", "distill"]),
        model
            .split('/')
            .next_back()
            .unwrap_or("model")
            .to_lowercase(),
        d.alnum(4)
    );
    w!(out, "seed: {}", d.int(0, 9999));
    w!(out, "model:");
    w!(out, "  name_or_path: {model}");
    w!(out, "  dtype: {}", d.s(&["bfloat16", "float16", "float32"]));
    w!(
        out,
        "  attn_implementation: {}",
        d.s(&["flash_attention_2", "sdpa", "eager"])
    );
    w!(out, "  gradient_checkpointing: {}", d.s(&["true", "false"]));
}

fn yaml_lora(d: &mut Draw, out: &mut String) {
    w!(out, "lora:");
    w!(out, "  r: {}", d.s(&["8", "16", "32", "64"]));
    w!(out, "  alpha: {}", d.s(&["16", "32", "64", "128"]));
    w!(out, "  dropout: {:.2}", d.float(0.0, 0.1));
    w!(
        out,
        "  target_modules: [{}]",
        d.sample_n(
            &[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj"
            ],
            2,
            7
        )
        .join(", ")
    );
}

fn yaml_data(d: &mut Draw, out: &mut String) {
    w!(out, "data:");
    w!(out, "  train_files:");
    for _ in 0..d.n(1, 3) {
        w!(
            out,
            "    - s3://{}-datasets/{}/{}.jsonl",
            d.project(),
            d.noun_snake(),
            d.s(&["train", "part-0000", "shard-00", "mix-v2"])
        );
    }
    w!(out, "  eval_split: {:.2}", d.float(0.005, 0.05));
    w!(
        out,
        "  max_seq_len: {}",
        d.s(&["1024", "2048", "4096", "8192"])
    );
    w!(out, "  packing: {}", d.s(&["true", "false"]));
    w!(out, "  num_workers: {}", d.int(2, 16));
}

fn yaml_optim(d: &mut Draw, out: &mut String) {
    w!(out, "optim:");
    w!(
        out,
        "  name: {}",
        d.s(&["adamw_torch_fused", "adamw", "lion", "adafactor"])
    );
    w!(out, "  lr: {}", lr(d));
    w!(out, "  weight_decay: {}", d.s(&["0.0", "0.01", "0.1"]));
    w!(out, "  betas: [0.9, {}]", d.s(&["0.95", "0.98", "0.999"]));
    w!(out, "  warmup_ratio: {:.2}", d.float(0.0, 0.1));
    w!(
        out,
        "  scheduler: {}",
        d.s(&["cosine", "linear", "constant_with_warmup", "wsd"])
    );
    w!(out, "  max_grad_norm: {}", d.s(&["1.0", "0.5", "2.0"]));
}

/// The `trainer:` and `distributed:` sections.
fn yaml_trainer(d: &mut Draw, out: &mut String) {
    w!(out, "trainer:");
    w!(
        out,
        "  per_device_batch_size: {}",
        d.s(&["1", "2", "4", "8", "16"])
    );
    w!(out, "  grad_accum: {}", d.s(&["1", "2", "4", "8", "16"]));
    w!(out, "  epochs: {}", d.int(1, 5));
    w!(out, "  log_every: {}", d.s(&["1", "10", "20", "50"]));
    w!(out, "  eval_every: {}", d.s(&["200", "500", "1000"]));
    w!(out, "  save_every: {}", d.s(&["500", "1000", "2000"]));
    w!(out, "  output_dir: /checkpoints/{}", d.project());
    w!(out, "distributed:");
    w!(
        out,
        "  strategy: {}",
        d.s(&["fsdp", "deepspeed_zero3", "ddp", "deepspeed_zero2"])
    );
    w!(out, "  nodes: {}", d.s(&["1", "2", "4", "8"]));
    w!(out, "  gpus_per_node: {}", d.s(&["4", "8"]));
}

fn yaml_logging(d: &mut Draw, out: &mut String) {
    w!(out, "logging:");
    w!(out, "  wandb_project: {}", d.project());
    w!(
        out,
        "  tags: [{}]",
        d.sample(
            &[
                "baseline",
                "ablation",
                "long-context",
                "code",
                "math",
                "v2",
                "nightly"
            ],
            2
        )
        .join(", ")
    );
}

fn json_config(d: &mut Draw) -> String {
    if d.chance(0.5) {
        hf_model_config(d)
    } else {
        deepspeed_config(d)
    }
}

/// A Hugging Face model `config.json`.
fn hf_model_config(d: &mut Draw) -> String {
    let hidden = *d.pick(&[2048u64, 3072, 4096, 5120, 8192]);
    let heads = hidden / 128;
    let cfg = J::obj(vec![
        (
            "architectures",
            J::arr(vec![J::s(d.s(&[
                "Qwen3ForCausalLM",
                "LlamaForCausalLM",
                "MistralForCausalLM",
                "Gemma2ForCausalLM",
            ]))]),
        ),
        ("attention_dropout", J::n("0.0")),
        ("bos_token_id", J::int(d.int(0, 151_643))),
        ("eos_token_id", J::int(d.int(0, 151_645))),
        ("head_dim", J::int(128)),
        ("hidden_act", J::s("silu")),
        ("hidden_size", J::int(hidden)),
        ("initializer_range", J::n("0.02")),
        (
            "intermediate_size",
            J::int(hidden * d.int(3, 4) + d.int(0, 4) * 256),
        ),
        (
            "max_position_embeddings",
            J::int(*d.pick(&[8192u64, 32768, 40960, 131_072])),
        ),
        (
            "model_type",
            J::s(d.s(&["qwen3", "llama", "mistral", "gemma2"])),
        ),
        ("num_attention_heads", J::int(heads)),
        ("num_hidden_layers", J::int(d.int(24, 80))),
        ("num_key_value_heads", J::int(*d.pick(&[4u64, 8, 16]))),
        ("rms_norm_eps", J::n(d.s(&["1e-06", "1e-05"]))),
        (
            "rope_theta",
            J::n(d.s(&["10000.0", "500000.0", "1000000.0"])),
        ),
        ("tie_word_embeddings", J::Bool(d.chance(0.3))),
        ("torch_dtype", J::s("bfloat16")),
        ("use_cache", J::Bool(true)),
        (
            "vocab_size",
            J::int(*d.pick(&[151_936u64, 128_256, 32_768, 256_000])),
        ),
    ]);
    cfg.pretty()
}

/// A DeepSpeed config with its file name.
fn deepspeed_config(d: &mut Draw) -> String {
    let ds = J::obj(vec![
        ("train_micro_batch_size_per_gpu", J::int(d.int(1, 16))),
        ("gradient_accumulation_steps", J::int(d.int(1, 32))),
        ("gradient_clipping", J::n("1.0")),
        ("bf16", J::obj(vec![("enabled", J::Bool(true))])),
        (
            "zero_optimization",
            J::obj(vec![
                ("stage", J::int(d.int(1, 3))),
                ("overlap_comm", J::Bool(true)),
                ("contiguous_gradients", J::Bool(true)),
                ("reduce_bucket_size", J::int(d.int(1, 9) * 50_000_000)),
                (
                    "stage3_prefetch_bucket_size",
                    J::int(d.int(1, 9) * 10_000_000),
                ),
                (
                    "offload_optimizer",
                    J::obj(vec![
                        ("device", J::s(d.s(&["cpu", "none", "nvme"]))),
                        ("pin_memory", J::Bool(true)),
                    ]),
                ),
            ]),
        ),
        (
            "optimizer",
            J::obj(vec![
                ("type", J::s("AdamW")),
                (
                    "params",
                    J::obj(vec![
                        ("lr", J::n(&lr(d))),
                        ("betas", J::arr(vec![J::n("0.9"), J::n("0.95")])),
                        ("eps", J::n("1e-8")),
                        ("weight_decay", J::n("0.1")),
                    ]),
                ),
            ]),
        ),
        (
            "scheduler",
            J::obj(vec![
                ("type", J::s("WarmupDecayLR")),
                (
                    "params",
                    J::obj(vec![
                        ("warmup_num_steps", J::int(d.int(10, 2000))),
                        ("total_num_steps", J::int(d.int(5000, 200_000))),
                    ]),
                ),
            ]),
        ),
        ("steps_per_print", J::int(*d.pick(&[10u64, 50, 100]))),
        ("wall_clock_breakdown", J::Bool(false)),
    ]);
    format!(
        "// {}\n{}",
        d.s(&[
            "ds_config.json",
            "configs/deepspeed_zero3.json",
            "zero2.json"
        ]),
        ds.pretty()
    )
}
