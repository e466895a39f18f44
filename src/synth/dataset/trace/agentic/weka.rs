//! AIPerf 0.13.0's `WekaTraceLoader` (serial path): plans per trace (main agent, subagent
//! chains, detected flat chains), timing (end-to-start delays, optional idle-gap warp), the
//! model map, SPAWN / SPAWN_JOIN topology and each turn's reconstructed delta messages.
//! Pure over parsed traces and a corpus; never reads files.

use std::collections::{BTreeMap, HashMap, HashSet};

use rayon::prelude::*;

use super::chains::{self, by_time, ChainSettings, Indexed};
use super::recon::{asst_block_caps, Blocks, Reconstructor};
use super::schema::{Entry, Request, Subagent, WekaTrace};
use super::{AgenticError, Branch, Topology, TurnInfo};
use crate::synth::dataset::trace_kind::TraceKind;
use crate::synth::dataset::{row_too_large, Conversation, Turn};
use crate::synth::error::SynthError;
use crate::synth::tokenizer::Tokenizer;

const JOIN_EPSILON: f64 = 1e-6;

/// AIPerf's `aiperf profile` block size for weka traces: the plugin's `default_block_size`,
/// which it passes as an override, so a trace's own `block_size` is not used.
pub const DEFAULT_BLOCK_SIZE: usize = TraceKind::WekaTrace.default_block_size();

/// The reconstruction knobs (AIPerf's flags and `WEKA_*` settings, at its defaults).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--isl-block-size` (None: [`DEFAULT_BLOCK_SIZE`]).
    pub block_size: Option<usize>,
    /// `--synthesis-max-isl`: top-level requests with more input are dropped.
    pub max_isl: Option<i64>,
    /// `--synthesis-max-osl`: caps top-level requests' `max_tokens`.
    pub max_osl: Option<i64>,
    /// `--max-context-length`: traces whose peak input + output exceeds it are dropped.
    pub max_context_length: Option<i64>,
    /// `--num-dataset-entries` when given: the first N traces that fit are kept.
    pub max_traces: Option<usize>,
    /// `--inter-turn-delay-cap-seconds`.
    pub inter_turn_delay_cap_seconds: Option<f64>,
    /// `--trace-idle-gap-cap-seconds`: compress long gaps per trace (wins over the delay cap).
    pub trace_idle_gap_cap_seconds: Option<f64>,
    /// `--use-think-time-only`.
    pub use_think_time_only: bool,
    /// `--ignore-trace-delays`: no timestamps or delays.
    pub ignore_trace_delays: bool,
    /// `WEKA_TOOL_SHAPED_MESSAGES`: tool results as `role: tool` with synthetic tool calls.
    pub tool_shaped_messages: bool,
    /// `WEKA_SPLIT_FLATTENED_AGENTS`.
    pub split_flattened_agents: bool,
    pub chains: ChainSettings,
    /// `--model`: trace models map onto these (empty: trace models kept).
    pub model_names: Vec<String>,
    /// `kvbust synth --max-row-bytes`: the prompt text one conversation may hold (a kvbust
    /// bound, not AIPerf's: see [`crate::synth::dataset::DEFAULT_MAX_ROW_BYTES`]).
    pub max_row_bytes: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            block_size: None,
            max_isl: None,
            max_osl: None,
            max_context_length: None,
            max_traces: None,
            inter_turn_delay_cap_seconds: None,
            trace_idle_gap_cap_seconds: None,
            use_think_time_only: false,
            ignore_trace_delays: false,
            tool_shaped_messages: false,
            split_flattened_agents: true,
            chains: ChainSettings::default(),
            model_names: Vec::new(),
            max_row_bytes: u64::MAX,
        }
    }
}

/// Where block content comes from: the corpus tokens and the hash-id generator's base seed.
#[derive(Clone, Copy)]
pub struct Corpus<'a> {
    pub tokens: &'a [u32],
    pub seed: u64,
}

/// A parsed trace and where it came from (for messages).
pub struct Source {
    pub origin: String,
    pub trace: WekaTrace,
}

fn py_max(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

fn end_seconds(start: f64, api_time: Option<f64>) -> f64 {
    start + py_max(0.0, api_time.filter(|a| a.is_finite()).unwrap_or(0.0))
}

/// Start-to-start gap minus the previous request's server time, at least 0.
fn end_to_start(start_to_start_ms: Option<f64>, prev_api: Option<f64>) -> Option<f64> {
    let s = start_to_start_ms?;
    let api_ms = prev_api
        .filter(|a| a.is_finite())
        .map_or(0.0, |a| a * 1000.0);
    Some(py_max(0.0, s - api_ms))
}

fn absolute_t(entry: &Subagent, r: &Request) -> f64 {
    if r.t + JOIN_EPSILON < entry.t {
        entry.t + r.t
    } else {
        r.t
    }
}

fn subagent_end(entry: &Subagent) -> f64 {
    if let Some(ms) = entry.duration_ms {
        let d = ms as f64 / 1000.0;
        let d = if !d.is_finite() || d < 0.0 { 0.0 } else { d };
        return entry.t + d;
    }
    entry
        .requests
        .iter()
        .map(|r| end_seconds(absolute_t(entry, r), r.api_time))
        .reduce(py_max)
        .unwrap_or(entry.t)
}

fn peak_output(out: i64, max_osl: Option<i64>) -> i64 {
    let c = match max_osl {
        Some(m) if out > m => m,
        _ => out,
    };
    c.max(1)
}

fn peak_context(trace: &WekaTrace, max_osl: Option<i64>) -> i64 {
    let mut peak = 0;
    for e in &trace.requests {
        match e {
            Entry::Request(r) => {
                peak = peak.max(r.input_length + peak_output(r.output_length, max_osl))
            }
            Entry::Subagent(s) => {
                for r in &s.requests {
                    peak = peak.max(r.input_length + peak_output(r.output_length, None));
                }
            }
        }
    }
    peak
}

/// Inter-turn delay clamp: non-finite → none, above the cap → the cap.
fn clamp(delay_ms: Option<f64>, cap_seconds: Option<f64>) -> Option<f64> {
    let d = delay_ms?;
    if !d.is_finite() {
        return None;
    }
    match cap_seconds {
        Some(cap) if d >= 0.0 && d > cap * 1000.0 => Some(cap * 1000.0),
        _ => Some(d),
    }
}

/// Per-trace idle-gap compression of request starts.
struct Warp {
    /// (raw start, raw end, shift before, excess).
    gaps: Vec<(f64, f64, f64, f64)>,
    cap: f64,
}

impl Warp {
    fn new(mut starts: Vec<f64>, cap: f64) -> Self {
        starts.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        let mut gaps = Vec::new();
        let mut shift = 0.0;
        for w in starts.windows(2) {
            let gap = w[1] - w[0];
            if gap > cap {
                let excess = gap - cap;
                gaps.push((w[0], w[1], shift, excess));
                shift += excess;
            }
        }
        Warp { gaps, cap }
    }

    fn map(&self, t: f64) -> f64 {
        let mut shift = 0.0;
        for &(a, b, before, excess) in &self.gaps {
            if t < a {
                return t - before;
            }
            if t < b {
                if t - a <= self.cap {
                    return t - before;
                }
                return a - before + self.cap;
            }
            shift = before + excess;
        }
        t - shift
    }
}

/// What produced a turn's new input: its own `input_types`, else the previous `stop`.
fn input_kind(r: &Request, prev: Option<&Request>) -> Option<&'static str> {
    if !r.input_types.is_empty() {
        return Some(if r.input_types.iter().any(|t| t == "tool_result") {
            "tool_result"
        } else {
            "user_input"
        });
    }
    match prev {
        Some(p) if !p.stop.is_empty() => Some(if p.stop == "tool_use" {
            "tool_result"
        } else {
            "user_input"
        }),
        _ => None,
    }
}

fn chain_init_tokens(
    tool: i64,
    system: i64,
    bs: usize,
    base_first: &[i64],
    first: &[i64],
) -> (i64, i64) {
    let declared = ((tool + system) as usize).div_ceil(bs);
    let covered = declared > 0
        && first.len() >= declared
        && base_first.len() >= declared
        && first[..declared] == base_first[..declared];
    if covered {
        (tool, system)
    } else {
        (0, 0)
    }
}

fn worker_suffix(n: usize, aux: bool, wg: Option<(usize, usize)>) -> String {
    match (aux, wg) {
        (true, _) => format!("aux:{n:03}"),
        (false, Some((g, m))) => format!("wg:{g:03}_{m:03}"),
        (false, None) => format!("fa:{n:03}"),
    }
}

/// One child conversation to emit: a subagent chain or a detected flat chain.
struct ChildPlan {
    session_id: String,
    /// Subagent index (None: a flat chain).
    subagent: Option<usize>,
    /// Flat chains: their index among the trace's workers (names the branch).
    chain_index: usize,
    requests: Vec<(usize, Request)>,
    init_tool: i64,
    init_system: i64,
}

struct Plan<'t> {
    block_size: usize,
    /// Retained top-level requests (the main agent) with their index in `trace.requests`.
    normals: Vec<(usize, &'t Request)>,
    subagents: Vec<(usize, &'t Subagent)>,
    children: Vec<ChildPlan>,
    flats: Vec<ChildPlan>,
}

/// Classifies a detected worker chain; `(suffix, is_aux)`.
fn classify(
    reqs: &[&Request],
    n: usize,
    main_peak_isl: i64,
    main_model: Option<&str>,
    wg: Option<(usize, usize)>,
    s: &ChainSettings,
) -> String {
    let aux = chains::is_aux_chain(reqs, main_peak_isl, main_model, s);
    let reduction = !aux && chains::is_reduction_chain(reqs, s);
    let wg = if aux || reduction { None } else { wg };
    worker_suffix(n, aux || reduction, wg)
}

/// A subagent's requests as chains (the main one first), each worker's group coordinate, and
/// the detected main chain (without a preamble) that classifies the others.
type SubagentChains<'a> = (
    Vec<Vec<Indexed<'a>>>,
    Vec<Option<(usize, usize)>>,
    Vec<&'a Request>,
);

fn subagent_chains<'a>(indexed: &[Indexed<'a>], settings: &Settings) -> SubagentChains<'a> {
    if !settings.split_flattened_agents || indexed.is_empty() {
        let mut ordered = indexed.to_vec();
        ordered.sort_by(by_time);
        let main = ordered.iter().map(|(_, r)| *r).collect();
        return (vec![ordered], vec![None], main);
    }
    let s = &settings.chains;
    let (preamble, detect_inner) = chains::split_off_preamble(indexed);
    let d = chains::detect(&detect_inner, s);
    let detected_main = d.chains[d.main_index].requests.clone();
    let classify_main = detected_main.iter().map(|(_, r)| *r).collect();
    let mut main = detected_main;
    if !preamble.is_empty() {
        main.extend(preamble);
        main.sort_by(by_time);
    }
    let groups = chains::worker_groups(&d, s);
    let mut items = vec![main];
    let mut wg_of = vec![None];
    for &ci in &d.worker_indices {
        items.push(d.chains[ci].requests.clone());
        wg_of.push(groups.get(&ci).copied());
    }
    (items, wg_of, classify_main)
}

fn expand_subagent(
    trace_id: &str,
    sa_index: usize,
    entry: &Subagent,
    bs: usize,
    settings: &Settings,
) -> Vec<ChildPlan> {
    let normalized: Vec<Request> = entry
        .requests
        .iter()
        .map(|r| Request {
            t: absolute_t(entry, r),
            ..r.clone()
        })
        .collect();
    let indexed: Vec<Indexed> = normalized.iter().enumerate().collect();
    let s = &settings.chains;
    let (items, wg_of, classify_main) = subagent_chains(&indexed, settings);
    let main_first_hash: &[i64] = classify_main
        .iter()
        .find(|r| !r.hash_ids.is_empty())
        .map_or(&[], |r| &r.hash_ids);
    let main_peak = classify_main
        .iter()
        .map(|r| r.input_length)
        .max()
        .unwrap_or(0);
    let main_model = classify_main.first().map(|r| r.model.as_str());
    let mut plans = Vec::new();
    for (ci, chain) in items.iter().enumerate() {
        let reqs: Vec<&Request> = chain.iter().map(|(_, r)| *r).collect();
        let (session_id, init_tool, init_system) = if ci == 0 {
            (
                format!("{trace_id}::sa:{}", entry.agent_id),
                entry.tool_tokens,
                entry.system_tokens,
            )
        } else {
            let first: &[i64] = reqs
                .iter()
                .find(|r| !r.hash_ids.is_empty())
                .map_or(&[], |r| &r.hash_ids);
            let (tool, system) = chain_init_tokens(
                entry.tool_tokens,
                entry.system_tokens,
                bs,
                main_first_hash,
                first,
            );
            let suffix = classify(&reqs, ci - 1, main_peak, main_model, wg_of[ci], s);
            (
                format!("{trace_id}::sa:{}:{suffix}", entry.agent_id),
                tool,
                system,
            )
        };
        plans.push(ChildPlan {
            session_id,
            subagent: Some(sa_index),
            chain_index: ci,
            requests: chain.iter().map(|(i, r)| (*i, (*r).clone())).collect(),
            init_tool,
            init_system,
        });
    }
    plans
}

fn passes_filters(r: &Request, settings: &Settings) -> bool {
    settings.max_isl.is_none_or(|m| r.input_length <= m)
}

/// Splits the main agent's requests into chains; returns the main chain's requests and the
/// flat chain plans.
fn split_flat<'t>(
    trace: &'t WekaTrace,
    normals: Vec<(usize, &'t Request)>,
    bs: usize,
    s: &ChainSettings,
) -> (Vec<(usize, &'t Request)>, Vec<ChildPlan>) {
    let (preamble, detect_normals) = chains::split_off_preamble(&normals);
    let d = chains::detect(&detect_normals, s);
    if d.worker_indices.is_empty() {
        return (normals, Vec::new());
    }
    let main = &d.chains[d.main_index];
    let main_first: &[i64] = main
        .requests
        .iter()
        .find(|(_, r)| !r.hash_ids.is_empty())
        .map_or(&[], |(_, r)| &r.hash_ids);
    let main_peak = main
        .requests
        .iter()
        .map(|(_, r)| r.input_length)
        .max()
        .unwrap_or(0);
    let main_model = main.requests.first().map(|(_, r)| r.model.as_str());
    let groups = chains::worker_groups(&d, s);
    let mut flats = Vec::new();
    for (n, &ci) in d.worker_indices.iter().enumerate() {
        let chain = &d.chains[ci];
        let reqs: Vec<&Request> = chain.requests.iter().map(|(_, r)| *r).collect();
        let (tool, system) = chain_init_tokens(
            trace.tool_tokens,
            trace.system_tokens,
            bs,
            main_first,
            &chain.requests[0].1.hash_ids,
        );
        let suffix = classify(&reqs, n, main_peak, main_model, groups.get(&ci).copied(), s);
        flats.push(ChildPlan {
            session_id: format!("{}::{suffix}", trace.id),
            subagent: None,
            chain_index: n,
            requests: chain
                .requests
                .iter()
                .map(|(i, r)| (*i, (*r).clone()))
                .collect(),
            init_tool: tool,
            init_system: system,
        });
    }
    let mut main_normals = d.chains[d.main_index].requests.clone();
    if !preamble.is_empty() {
        main_normals.extend(preamble);
        main_normals.sort_by(by_time);
    }
    (main_normals, flats)
}

/// The subagents no main turn precedes: AIPerf drops them (used by [`link_branches`], and by
/// the children's pass, which builds no parent turns to link).
fn dropped_subagents(plan: &Plan) -> HashSet<usize> {
    plan.subagents
        .iter()
        .enumerate()
        .filter(|(_, (sa_outer, _))| !plan.normals.iter().any(|(o, _)| o < sa_outer))
        .map(|(i, _)| i)
        .collect()
}

fn plan_trace<'t>(trace: &'t WekaTrace, settings: &Settings) -> Result<Plan<'t>, String> {
    let bs = settings.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
    let mut normals = Vec::new();
    let mut subagents = Vec::new();
    let mut children = Vec::new();
    for (idx, e) in trace.requests.iter().enumerate() {
        match e {
            Entry::Request(r) => {
                if passes_filters(r, settings) {
                    normals.push((idx, r));
                }
            }
            Entry::Subagent(s) => {
                let sa_index = subagents.len();
                subagents.push((idx, s));
                children.extend(expand_subagent(&trace.id, sa_index, s, bs, settings));
            }
        }
    }
    let mut flats = Vec::new();
    if settings.split_flattened_agents && normals.len() > 1 {
        let (main, f) = split_flat(trace, normals, bs, &settings.chains);
        normals = main;
        flats = f;
    }
    let plan = Plan {
        block_size: bs,
        normals,
        subagents,
        children,
        flats,
    };
    let dropped = dropped_subagents(&plan);
    let mut seen = HashSet::new();
    for (i, (_, e)) in plan.subagents.iter().enumerate() {
        if dropped.contains(&i) {
            continue;
        }
        if !seen.insert(e.agent_id.as_str()) {
            return Err(format!(
                "duplicate subagent agent_id {:?} among retained subagents; each emitted \
                 subagent in a trace must have a unique agent_id",
                e.agent_id
            ));
        }
    }
    Ok(plan)
}

/// `(timestamp seconds, delay ms)` per request on the warped timeline.
struct IdleTiming {
    parent: HashMap<usize, (f64, Option<f64>)>,
    child: HashMap<(String, usize), (f64, Option<f64>)>,
    sa_end: HashMap<usize, f64>,
    sa_start: HashMap<usize, f64>,
    flat_start: HashMap<String, f64>,
    flat_end: HashMap<String, f64>,
}

fn chain_timing<'r>(
    warp: &Warp,
    reqs: impl Iterator<Item = &'r Request>,
    mut put: impl FnMut(usize, f64, Option<f64>),
) {
    let mut prev: Option<(f64, Option<f64>)> = None;
    for (k, r) in reqs.enumerate() {
        let t = warp.map(r.t);
        let delay = end_to_start(
            prev.map(|(pt, _)| (t - pt) * 1000.0),
            prev.and_then(|p| p.1),
        );
        put(k, t, delay);
        prev = Some((t, r.api_time));
    }
}

fn idle_timing(plan: &Plan, cap: f64) -> IdleTiming {
    let dropped = dropped_subagents(plan);
    let active: Vec<&ChildPlan> = plan
        .children
        .iter()
        .filter(|c| c.subagent.is_some_and(|i| !dropped.contains(&i)))
        .collect();
    let mut starts: Vec<f64> = plan.normals.iter().map(|(_, r)| r.t).collect();
    starts.extend(
        plan.flats
            .iter()
            .flat_map(|f| f.requests.iter().map(|(_, r)| r.t)),
    );
    starts.extend(
        active
            .iter()
            .flat_map(|c| c.requests.iter().map(|(_, r)| r.t)),
    );
    let warp = Warp::new(starts, cap);
    let mut parent = HashMap::new();
    let outers: Vec<usize> = plan.normals.iter().map(|(o, _)| *o).collect();
    chain_timing(&warp, plan.normals.iter().map(|(_, r)| *r), |k, t, d| {
        parent.insert(outers[k], (t, d));
    });
    let mut child = HashMap::new();
    for c in &active {
        chain_timing(&warp, c.requests.iter().map(|(_, r)| r), |k, t, d| {
            child.insert((c.session_id.clone(), k), (t, d));
        });
    }
    let mut flat_start = HashMap::new();
    let mut flat_end = HashMap::new();
    for f in &plan.flats {
        chain_timing(&warp, f.requests.iter().map(|(_, r)| r), |k, t, d| {
            child.insert((f.session_id.clone(), k), (t, d));
            if k == 0 {
                flat_start.insert(f.session_id.clone(), t);
            }
        });
        flat_end.insert(f.session_id.clone(), warp.map(flat_end_seconds(f)));
    }
    IdleTiming {
        parent,
        child,
        sa_end: plan
            .subagents
            .iter()
            .map(|(o, e)| (*o, warp.map(subagent_end(e))))
            .collect(),
        sa_start: plan
            .subagents
            .iter()
            .map(|(o, e)| (*o, warp.map(e.t)))
            .collect(),
        flat_start,
        flat_end,
    }
}

fn flat_end_seconds(f: &ChildPlan) -> f64 {
    f.requests
        .iter()
        .map(|(_, r)| end_seconds(r.t, r.api_time))
        .reduce(py_max)
        .unwrap_or(f64::NEG_INFINITY)
}

/// Trace models onto `--model` names: the main model first, then by first appearance.
fn model_map(trace: &WekaTrace, configured: &[String]) -> HashMap<String, String> {
    if configured.is_empty() {
        return HashMap::new();
    }
    let all = trace.requests.iter().flat_map(|e| match e {
        Entry::Request(r) => std::slice::from_ref(r).iter(),
        Entry::Subagent(s) => s.requests.iter(),
    });
    let main = trace
        .requests
        .iter()
        .find_map(|e| match e {
            Entry::Request(r) => Some(&r.model),
            Entry::Subagent(_) => None,
        })
        .or_else(|| {
            trace.requests.iter().find_map(|e| match e {
                Entry::Subagent(s) => s.requests.first().map(|r| &r.model),
                Entry::Request(_) => None,
            })
        });
    let Some(main) = main else {
        return HashMap::new();
    };
    let mut ordered: Vec<&String> = vec![main];
    for r in all {
        if !ordered.contains(&&r.model) {
            ordered.push(&r.model);
        }
    }
    ordered
        .iter()
        .enumerate()
        .map(|(i, m)| ((*m).clone(), configured[i % configured.len()].clone()))
        .collect()
}

/// Which kind of conversation a chain becomes (they differ in `max_tokens` and delays).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Main,
    Subagent,
    Flat,
}

struct ChainEmit<'a> {
    session_id: &'a str,
    kind: Kind,
    /// `(request, its JSON path in the trace file)`.
    requests: Vec<(&'a Request, String)>,
    init_tool: i64,
    init_system: i64,
    /// `(timestamp ms, delay ms)` per request, before the cap.
    timing: Vec<(f64, Option<f64>)>,
}

fn raw_timing(reqs: &[(&Request, String)], think_time_only: bool) -> Vec<(f64, Option<f64>)> {
    reqs.iter()
        .enumerate()
        .map(|(k, (r, _))| {
            let t_ms = r.t * 1000.0;
            let delay = if k == 0 {
                None
            } else if think_time_only && r.think_time.is_some() {
                r.think_time.map(|x| x * 1000.0)
            } else {
                let prev = reqs[k - 1].0;
                end_to_start(Some(t_ms - prev.t * 1000.0), prev.api_time)
            };
            (t_ms, delay)
        })
        .collect()
}

/// Turn `k`'s segments: turn 0 from the declared prefix, later turns by LCP from the last.
#[allow(
    clippy::too_many_arguments,
    reason = "AIPerf's per-turn reconstruction inputs one for one, so the port reads against it line by line"
)]
fn reconstruct(
    c: &ChainEmit,
    ctx: &TraceCtx,
    blocks: &mut Blocks,
    recon: &mut Reconstructor,
    k: usize,
    seed: &str,
    tool_result: bool,
    cap: Option<usize>,
    path: &str,
) -> Result<(), AgenticError> {
    let r = c.requests[k].0;
    if let Some(p) = k.checked_sub(1).map(|p| c.requests[p].0) {
        let (prev_out, in_len) = (p.output_length as usize, r.input_length as usize);
        recon.advance_turn(
            blocks,
            &p.hash_ids,
            prev_out,
            &r.hash_ids,
            in_len,
            seed,
            tool_result,
            cap,
        )?;
        return Ok(());
    }
    let (tool, system) = (c.init_tool as usize, c.init_system as usize);
    if let Err(short) = recon.init_turn_0(
        blocks,
        &r.hash_ids,
        r.input_length as usize,
        tool,
        system,
        seed,
    )? {
        let bs = ctx.block_size;
        return Err(ctx.error(
            &format!("{path}.hash_ids"),
            format!(
                "turn 0 of {} needs {} hash blocks for its tool + system prefix ({tool} + \
                 {system} tokens at block size {bs}) but only {} were recorded; the prefix \
                 cannot be reconstructed without faking the cache structure",
                c.session_id, short.prefix_blocks, short.recorded
            ),
        ));
    }
    Ok(())
}

fn emit_chain(
    c: &ChainEmit,
    ctx: &TraceCtx,
    blocks: &mut Blocks,
) -> Result<Vec<Turn>, AgenticError> {
    let bs = ctx.block_size;
    let settings = ctx.settings;
    let mut recon = Reconstructor::new(bs, settings.tool_shaped_messages);
    let geometry: Vec<(&[i64], usize)> = c
        .requests
        .iter()
        .map(|(r, _)| (&r.hash_ids[..], r.input_length as usize))
        .collect();
    let caps = asst_block_caps(&geometry, bs);
    let cap_seconds = if settings.trace_idle_gap_cap_seconds.is_some() {
        None
    } else {
        settings.inter_turn_delay_cap_seconds
    };
    let mut turns = Vec::with_capacity(c.requests.len());
    let mut bytes = 0u64;
    for (k, (r, path)) in c.requests.iter().enumerate() {
        let seed = format!("{}:turn_{k}:partial_tail", c.session_id);
        let prev = k.checked_sub(1).map(|p| c.requests[p].0);
        let kind = input_kind(r, prev);
        let tool_result = kind == Some("tool_result");
        reconstruct(
            c,
            ctx,
            blocks,
            &mut recon,
            k,
            &seed,
            tool_result,
            caps[k],
            path,
        )?;
        let (t_ms, delay) = c.timing[k];
        let mut delay = clamp(delay, cap_seconds);
        if c.kind == Kind::Main {
            // Never dispatch in the past.
            delay = delay.map(|d| if 0.0 > d { 0.0 } else { d });
        }
        let max_tokens = match c.kind {
            Kind::Subagent => r.output_length.max(1),
            Kind::Main | Kind::Flat => peak_output(r.output_length, settings.max_osl),
        };
        let delta = recon.turn_delta();
        // Checked turn by turn, so a conversation too large to hold stops here, not after.
        bytes += delta
            .messages
            .iter()
            .map(|m| m.content().len() as u64)
            .sum::<u64>();
        if bytes > settings.max_row_bytes {
            return Err(ctx.error(
                path,
                row_too_large(c.session_id, bytes, k + 1, settings.max_row_bytes),
            ));
        }
        let number = |x: f64| serde_json::Number::from_f64(x);
        turns.push(Turn {
            max_tokens: Some(max_tokens as u64),
            timestamp: if settings.ignore_trace_delays {
                None
            } else {
                number(t_ms)
            },
            delay: if settings.ignore_trace_delays {
                None
            } else {
                delay.and_then(number)
            },
            agentic: Some(Box::new(TurnInfo {
                messages: delta.messages,
                reset_context: delta.reset_context,
                model: Some(ctx.models.get(&r.model).unwrap_or(&r.model).clone()),
                input_kind: kind,
                branch_ids: Vec::new(),
                prerequisites: Vec::new(),
            })),
            ..Turn::default()
        });
    }
    Ok(turns)
}

struct TraceCtx<'a> {
    origin: &'a str,
    trace_id: &'a str,
    block_size: usize,
    settings: &'a Settings,
    models: HashMap<String, String>,
}

impl TraceCtx<'_> {
    fn error(&self, path: &str, message: String) -> AgenticError {
        AgenticError::Input {
            origin: self.origin.to_owned(),
            trace_id: Some(self.trace_id.to_owned()),
            path: path.to_owned(),
            message,
        }
    }
}

fn conversation(session_id: &str, topology: Topology, turns: Vec<Turn>) -> Conversation {
    Conversation {
        session_id: session_id.to_owned(),
        system_message: None,
        user_context_message: None,
        turns,
        agentic: Some(Box::new(topology)),
    }
}

#[allow(clippy::expect_used)] // the invariant is named at the expect
fn info(turn: &mut Turn) -> &mut TurnInfo {
    // Every turn emit_chain makes carries its TurnInfo.
    turn.agentic.as_mut().expect("agentic turn")
}

/// Groups spawns by `(spawning turn, joining turn)` in first-seen order.
type Groups<T> = Vec<((usize, Option<usize>), Vec<T>)>;

fn group_push<T>(groups: &mut Groups<T>, key: (usize, Option<usize>), item: T) {
    match groups.iter_mut().find(|(k, _)| *k == key) {
        Some((_, v)) => v.push(item),
        None => groups.push((key, vec![item])),
    }
}

/// Which conversations of a trace [`emit_trace`] builds: AIPerf writes every trace's parent
/// before any trace's children, and a streamed build makes them in that order, one pass each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Parent,
    Children,
}

/// The parent conversation or the trace's children, in AIPerf's order. Block content is a pure
/// function of the trace and the hash id, so the children come out the same without the parent
/// built first.
fn emit_trace(
    source: &Source,
    settings: &Settings,
    corpus: Corpus,
    tokenizer: &Tokenizer,
    part: Part,
    emit: &mut Emit<'_>,
) -> Result<(), AgenticError> {
    let trace = &source.trace;
    let plan = plan_trace(trace, settings).map_err(|m| AgenticError::Input {
        origin: source.origin.clone(),
        trace_id: Some(trace.id.clone()),
        path: "requests".into(),
        message: m,
    })?;
    let ctx = TraceCtx {
        origin: &source.origin,
        trace_id: &trace.id,
        block_size: plan.block_size,
        settings,
        models: model_map(trace, &settings.model_names),
    };
    let idle = settings
        .trace_idle_gap_cap_seconds
        .map(|cap| idle_timing(&plan, cap));
    let mut blocks = Blocks::new(
        corpus.tokens,
        corpus.seed,
        &trace.id,
        plan.block_size,
        tokenizer,
    );
    if part == Part::Children {
        let dropped = dropped_subagents(&plan);
        return emit_children(
            &plan,
            &trace.id,
            &dropped,
            idle.as_ref(),
            &ctx,
            &mut blocks,
            emit,
        );
    }
    let main_reqs: Vec<(&Request, String)> = plan
        .normals
        .iter()
        .map(|(o, r)| (*r, format!("requests[{o}]")))
        .collect();
    let timing = match &idle {
        Some(it) => plan
            .normals
            .iter()
            .map(|(o, _)| (it.parent[o].0 * 1000.0, it.parent[o].1))
            .collect(),
        None => raw_timing(&main_reqs, settings.use_think_time_only),
    };
    let main = ChainEmit {
        session_id: &trace.id,
        kind: Kind::Main,
        requests: main_reqs,
        init_tool: trace.tool_tokens,
        init_system: trace.system_tokens,
        timing,
    };
    let mut turns = emit_chain(&main, &ctx, &mut blocks)?;
    let mut topology = Topology::root();
    link_branches(&plan, &trace.id, idle.as_ref(), &mut topology, &mut turns);
    emit(conversation(&trace.id, topology, turns))
}

/// Spawn and join: each subagent (grouped with those that share its spawning and joining
/// turns) starts after the last main turn before it and is joined by the first later main
/// turn at or after its end; detected flat chains the same way. Returns the subagents that
/// no main turn precedes (AIPerf drops them).
fn link_branches(
    plan: &Plan,
    trace_id: &str,
    idle: Option<&IdleTiming>,
    topology: &mut Topology,
    turns: &mut [Turn],
) -> HashSet<usize> {
    let turn_pos: BTreeMap<usize, usize> = plan
        .normals
        .iter()
        .enumerate()
        .map(|(pos, (o, _))| (*o, pos))
        .collect();
    let outer_t: HashMap<usize, f64> = plan
        .normals
        .iter()
        .map(|(o, r)| (*o, idle.map_or(r.t, |it| it.parent[o].0)))
        .collect();
    let preceding = |before: usize| turn_pos.range(..before).map(|(_, p)| *p).max();
    let join = |after: usize, end: f64| {
        turn_pos
            .range(after + 1..)
            .find(|(o, _)| outer_t[o] + JOIN_EPSILON >= end)
            .map(|(_, p)| *p)
    };
    let earliest = |a: f64, b: f64| if b < a { b } else { a };
    let mut dropped = HashSet::new();
    let mut groups: Groups<(usize, f64)> = Vec::new();
    for (i, (sa_outer, e)) in plan.subagents.iter().enumerate() {
        let Some(pre) = preceding(*sa_outer) else {
            tracing::info!(trace = %trace_id, agent_id = %e.agent_id,
                "dropping a subagent with no preceding parent turn (as AIPerf does)");
            dropped.insert(i);
            continue;
        };
        let (end, start) = match idle {
            Some(it) => (it.sa_end[sa_outer], it.sa_start[sa_outer]),
            None => (subagent_end(e), e.t),
        };
        group_push(&mut groups, (pre, join(*sa_outer, end)), (i, start));
    }
    for ((pre, joined), entries) in &groups {
        let children = entries
            .iter()
            .flat_map(|(i, _)| plan.children.iter().filter(move |c| c.subagent == Some(*i)))
            .map(|c| c.session_id.clone())
            .collect();
        let agent = &plan.subagents[entries[0].0].1.agent_id;
        let start = entries.iter().map(|(_, s)| *s).reduce(earliest);
        let branch = format!("{trace_id}:spawn:{agent}");
        let at = (*pre, *joined, start.unwrap_or(0.0));
        link(topology, turns, branch, children, at);
    }
    let mut flat_groups: Groups<&ChildPlan> = Vec::new();
    for f in &plan.flats {
        let first_outer = f.requests[0].0;
        let pre = preceding(first_outer).unwrap_or(0);
        let end = idle.map_or_else(|| flat_end_seconds(f), |it| it.flat_end[&f.session_id]);
        group_push(&mut flat_groups, (pre, join(first_outer, end)), f);
    }
    for ((pre, joined), fps) in &flat_groups {
        let start = fps
            .iter()
            .map(|f| idle.map_or(f.requests[0].1.t, |it| it.flat_start[&f.session_id]))
            .reduce(earliest);
        let children = fps.iter().map(|f| f.session_id.clone()).collect();
        let branch = format!("{trace_id}:flatspawn:{}", fps[0].chain_index);
        link(
            topology,
            turns,
            branch,
            children,
            (*pre, *joined, start.unwrap_or(0.0)),
        );
    }
    dropped
}

/// The children: the subagents' chains (but the dropped ones), then the detected flat chains.
fn emit_children(
    plan: &Plan,
    trace_id: &str,
    dropped: &HashSet<usize>,
    idle: Option<&IdleTiming>,
    ctx: &TraceCtx,
    blocks: &mut Blocks,
    emit: &mut Emit<'_>,
) -> Result<(), AgenticError> {
    for c in plan.children.iter().chain(&plan.flats) {
        let (kind, requests): (Kind, Vec<(&Request, String)>) = match c.subagent {
            Some(i) if dropped.contains(&i) => continue,
            Some(i) => {
                let sa_outer = plan.subagents[i].0;
                let path = |inner: &usize| format!("requests[{sa_outer}].requests[{inner}]");
                let reqs = c.requests.iter().map(|(inner, r)| (r, path(inner)));
                (Kind::Subagent, reqs.collect())
            }
            None => {
                let reqs = c
                    .requests
                    .iter()
                    .map(|(o, r)| (r, format!("requests[{o}]")));
                (Kind::Flat, reqs.collect())
            }
        };
        let timing = match idle {
            Some(it) => (0..requests.len())
                .map(|k| {
                    let (t, d) = it.child[&(c.session_id.clone(), k)];
                    (t * 1000.0, d)
                })
                .collect(),
            None => raw_timing(&requests, ctx.settings.use_think_time_only),
        };
        let emit_chain_of = ChainEmit {
            session_id: &c.session_id,
            kind,
            requests,
            init_tool: c.init_tool,
            init_system: c.init_system,
            timing,
        };
        let turns = emit_chain(&emit_chain_of, ctx, blocks)?;
        emit(conversation(
            &c.session_id,
            Topology::child(trace_id),
            turns,
        ))?;
    }
    Ok(())
}

/// Where [`emit_trace`] hands each conversation it builds.
type Emit<'a> = dyn FnMut(Conversation) -> Result<(), AgenticError> + 'a;

/// Adds a branch started after turn `pre` (at `start_seconds`), joined by turn `joined`.
fn link(
    topology: &mut Topology,
    turns: &mut [Turn],
    branch_id: String,
    children: Vec<String>,
    (pre, joined, start_seconds): (usize, Option<usize>, f64),
) {
    info(&mut turns[pre]).branch_ids.push(branch_id.clone());
    if let Some(j) = joined {
        info(&mut turns[j]).prerequisites.push(branch_id.clone());
    }
    topology.branches.push(Branch {
        branch_id,
        child_conversation_ids: children,
        is_background: joined.is_none(),
        start_timestamp_ms: start_seconds * 1000.0,
    });
}

/// AIPerf's filter-then-cap: traces whose peak context exceeds `--max-context-length` are
/// skipped, then the first `--num-dataset-entries` of the rest are kept.
fn select<'s>(sources: &'s [Source], settings: &Settings) -> Result<Vec<&'s Source>, AgenticError> {
    if settings.max_context_length.is_none() && settings.max_traces.is_none() {
        return Ok(sources.iter().collect());
    }
    let mut kept = Vec::new();
    let mut smallest: Option<i64> = None;
    for s in sources {
        let peak = peak_context(&s.trace, settings.max_osl);
        smallest = Some(smallest.map_or(peak, |m| m.min(peak)));
        if settings.max_context_length.is_some_and(|max| peak > max) {
            continue;
        }
        kept.push(s);
        if settings.max_traces.is_some_and(|n| kept.len() >= n) {
            break;
        }
    }
    if kept.is_empty() {
        let smallest = smallest.unwrap_or(0);
        return Err(AgenticError::Selection(format!(
            "no trace fits --max-context-length {} (scanned {}); the smallest needs {smallest} \
             tokens: raise --max-context-length to at least {smallest}",
            settings.max_context_length.unwrap_or(0),
            sources.len()
        )));
    }
    Ok(kept)
}

/// AIPerf's `convert_to_conversations` for parsed traces: the max-context filter, then every
/// trace's parent conversation in order, then every trace's children.
pub fn build(
    sources: Vec<Source>,
    settings: &Settings,
    corpus: Corpus,
    tokenizer: &Tokenizer,
) -> Result<Vec<Conversation>, AgenticError> {
    let mut conversations = Vec::new();
    let mut sink = |c: Conversation, _| {
        conversations.push(c);
        Ok(())
    };
    let mut out = crate::synth::dataset::Out {
        sink: &mut sink,
        max_row_bytes: settings.max_row_bytes,
        max_blocks: u64::MAX,
        unscheduled: false,
    };
    build_into(sources, settings, corpus, tokenizer, &mut out).map_err(AgenticError::from)?;
    Ok(conversations)
}

/// [`build`], each conversation handed to `out` as soon as it is built: the parents in one pass
/// over the traces, a few traces at a time in parallel (each owns its hash-id scope; the output
/// order is AIPerf's), then the children in a second pass, one after the other (one trace may
/// have hundreds; building them in parallel would hold them all), so at most those few parents
/// or one child are ever held.
pub fn build_into(
    sources: Vec<Source>,
    settings: &Settings,
    corpus: Corpus,
    tokenizer: &Tokenizer,
    out: &mut crate::synth::dataset::Out<'_>,
) -> Result<(), SynthError> {
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for s in &sources {
        if let Some(prior) = seen.insert(&s.trace.id, &s.origin) {
            return Err(AgenticError::Input {
                origin: s.origin.clone(),
                trace_id: Some(s.trace.id.clone()),
                path: "id".into(),
                message: format!("duplicate trace id: {prior} has the same id"),
            }
            .into());
        }
    }
    let sources = select(&sources, settings)?;
    // Every turn has its timestamp unless delays are ignored.
    out.unscheduled = settings.ignore_trace_delays;
    let at_once = rayon::current_num_threads().max(1);
    for chunk in sources.chunks(at_once) {
        let parents: Vec<Conversation> = chunk
            .par_iter()
            .map(|s| {
                let mut parent = None;
                emit_trace(s, settings, corpus, tokenizer, Part::Parent, &mut |c| {
                    parent = Some(c);
                    Ok(())
                })?;
                Ok(parent)
            })
            .collect::<Result<Vec<_>, AgenticError>>()?
            .into_iter()
            .flatten()
            .collect();
        for conv in parents {
            out.emit(conv)?;
        }
    }
    for s in sources {
        let mut emit = |c: Conversation| out.emit(c).map_err(AgenticError::from);
        emit_trace(s, settings, corpus, tokenizer, Part::Children, &mut emit)?;
    }
    Ok(())
}
