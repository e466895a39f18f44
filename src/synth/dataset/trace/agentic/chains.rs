//! Flattened-agent chain detection (AIPerf 0.13.0's `weka_agent_chains`): splits a list of
//! requests into per-agent chains by hash-id longest-common-prefix evidence, splices
//! compaction seams back onto their chain, and classifies extra chains (sidecar `aux`,
//! worker group `wg`, agent `fa`). Pure functions over requests; never reads or builds text.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet};

use super::schema::Request;

const EPSILON: f64 = 1e-6;

/// One request with its index in the list it came from.
pub type Indexed<'a> = (usize, &'a Request);

/// Interval end: `t + api_time`, a missing, negative or non-finite `api_time` counting 0.
pub fn req_end(r: &Request) -> f64 {
    r.t + r.api_time.filter(|a| a.is_finite()).unwrap_or(0.0).max(0.0)
}

/// Python's `sorted` key `(t, index)`.
pub fn by_time(a: &Indexed, b: &Indexed) -> Ordering {
    a.1.t
        .partial_cmp(&b.1.t)
        .unwrap_or(Ordering::Equal)
        .then(a.0.cmp(&b.0))
}

/// Length of the longest common prefix of two hash lists.
pub fn lcp(a: &[i64], b: &[i64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Where a chain split off another.
#[derive(Debug, Clone)]
pub struct Fork {
    pub parent_chain: Option<usize>,
    pub fork_outer_idx: Option<usize>,
    pub depth: usize,
    pub fork_time: f64,
}

/// One detected agent.
#[derive(Debug, Clone, Default)]
pub struct Chain<'a> {
    pub requests: Vec<Indexed<'a>>,
    pub fork: Option<Fork>,
    pub spliced_into: Option<usize>,
    tail_outer_idx: usize,
    tail_hash: &'a [i64],
    tail_end: f64,
    tail_model: &'a str,
}

/// What detection found.
#[derive(Debug, Clone)]
pub struct Detection<'a> {
    pub chains: Vec<Chain<'a>>,
    pub main_index: usize,
    /// Live non-main chains by first request `(t, index)`.
    pub worker_indices: Vec<usize>,
}

/// The `WEKA_*` knobs detection and classification read (AIPerf's defaults).
#[derive(Debug, Clone, Copy)]
pub struct ChainSettings {
    pub seam_max_gap_seconds: f64,
    pub seam_min_overlap_ratio: f64,
    pub aux_max_requests: usize,
    pub aux_isl_ratio: f64,
    pub aux_isl_floor: i64,
    pub aux_cross_model: bool,
    pub aux_reduction_osl_max: i64,
    pub aux_reduction_ratio: f64,
    pub worker_group_min: usize,
}

impl Default for ChainSettings {
    fn default() -> Self {
        ChainSettings {
            seam_max_gap_seconds: 3600.0,
            seam_min_overlap_ratio: 0.5,
            aux_max_requests: 1,
            aux_isl_ratio: 0.10,
            aux_isl_floor: 16384,
            aux_cross_model: true,
            aux_reduction_osl_max: 4000,
            aux_reduction_ratio: 20.0,
            worker_group_min: 3,
        }
    }
}

/// A short chain that starts from a small fresh context or on another model: a sidecar.
pub fn is_aux_chain(
    requests: &[&Request],
    main_peak_isl: i64,
    main_model: Option<&str>,
    s: &ChainSettings,
) -> bool {
    let Some(first) = requests.first() else {
        return false;
    };
    if requests.len() > s.aux_max_requests {
        return false;
    }
    if s.aux_cross_model && main_model.is_some_and(|m| first.model != m) {
        return true;
    }
    // Python's int() truncates toward zero.
    let threshold = s
        .aux_isl_floor
        .max((s.aux_isl_ratio * main_peak_isl as f64) as i64);
    first.input_length < threshold
}

/// A single large-input, short-output call: a reduction sidecar.
pub fn is_reduction_chain(requests: &[&Request], s: &ChainSettings) -> bool {
    if s.aux_reduction_osl_max <= 0 || requests.len() != 1 {
        return false;
    }
    let first = requests[0];
    let osl = first.output_length;
    if osl <= 0 || osl >= s.aux_reduction_osl_max || first.input_length < s.aux_isl_floor {
        return false;
    }
    first.input_length as f64 > s.aux_reduction_ratio * osl as f64
}

struct Phase1<'a> {
    chains: Vec<Chain<'a>>,
    chain_of_request: HashMap<usize, usize>,
    forks_by_tail: HashMap<usize, Vec<usize>>,
    req_by_outer: HashMap<usize, &'a Request>,
}

impl<'a> Phase1<'a> {
    fn append(&mut self, ci: usize, outer: usize, r: &'a Request) {
        let c = &mut self.chains[ci];
        c.requests.push((outer, r));
        self.chain_of_request.insert(outer, ci);
        if !r.hash_ids.is_empty() {
            c.tail_outer_idx = outer;
            c.tail_hash = &r.hash_ids;
            c.tail_end = req_end(r);
            c.tail_model = &r.model;
        }
    }

    fn classify(&mut self, outer: usize, r: &'a Request) {
        self.req_by_outer.insert(outer, r);
        if r.hash_ids.is_empty() {
            // No LCP evidence: rides the main chain, invisible to tails and forks.
            if self.chains.is_empty() {
                self.chains.push(Chain::default());
            }
            self.chains[0].requests.push((outer, r));
            self.chain_of_request.insert(outer, 0);
            return;
        }
        let h = &r.hash_ids[..];
        if self.chains.is_empty() {
            self.chains.push(Chain::default());
            self.append(0, outer, r);
            return;
        }
        if let Some(target) = extension_target(&self.chains, h, r.t, &r.model) {
            self.append(target, outer, r);
            return;
        }
        let (parent, depth) = max_lcp_chain(&self.chains, h);
        if parent.is_none() && self.chains.iter().all(|c| c.tail_hash.is_empty()) {
            // The first hash-bearing request after leading empty rows is the main agent.
            self.append(0, outer, r);
            return;
        }
        let fork = Fork {
            parent_chain: parent,
            fork_outer_idx: parent.map(|p| self.chains[p].tail_outer_idx),
            depth,
            fork_time: r.t,
        };
        let new = self.chains.len();
        let tail = fork.fork_outer_idx.filter(|_| depth > 0);
        self.chains.push(Chain {
            fork: Some(fork),
            ..Chain::default()
        });
        self.append(new, outer, r);
        if let Some(t) = tail {
            self.forks_by_tail.entry(t).or_default().push(new);
        }
    }
}

/// The chain whose tail is a whole prefix of `h`, ended by `t`, on the same model; the
/// deepest wins, ties to the lowest index.
fn extension_target(chains: &[Chain], h: &[i64], t: f64, model: &str) -> Option<usize> {
    let mut best = None;
    let mut best_len: i64 = -1;
    for (i, c) in chains.iter().enumerate() {
        let tl = c.tail_hash.len();
        if tl == 0 || tl > h.len() || tl as i64 <= best_len {
            continue;
        }
        if c.tail_model != model || c.tail_end > t + EPSILON {
            continue;
        }
        if h[..tl] == *c.tail_hash {
            best = Some(i);
            best_len = tl as i64;
        }
    }
    best
}

/// The chain tail with the deepest LCP against `h` (ties: deeper tail, then lower index).
fn max_lcp_chain(chains: &[Chain], h: &[i64]) -> (Option<usize>, usize) {
    let mut best = None;
    let mut key = (0usize, 0usize);
    for (i, c) in chains.iter().enumerate() {
        if c.tail_hash.is_empty() {
            continue;
        }
        let d = lcp(c.tail_hash, h);
        if d == 0 {
            continue;
        }
        let k = (d, c.tail_hash.len());
        if k > key {
            best = Some(i);
            key = k;
        }
    }
    (best, key.0)
}

/// Partitions requests into per-agent chains (AIPerf's `detect_agent_chains`).
pub fn detect<'a>(normals: &[Indexed<'a>], s: &ChainSettings) -> Detection<'a> {
    if normals.is_empty() {
        return Detection {
            chains: Vec::new(),
            main_index: 0,
            worker_indices: Vec::new(),
        };
    }
    let mut ordered = normals.to_vec();
    ordered.sort_by(by_time);
    let mut st = Phase1 {
        chains: Vec::new(),
        chain_of_request: HashMap::new(),
        forks_by_tail: HashMap::new(),
        req_by_outer: HashMap::new(),
    };
    for &(outer, r) in &ordered {
        st.classify(outer, r);
    }
    resolve_seams(&mut st, s);
    let Phase1 {
        mut chains,
        chain_of_request,
        ..
    } = st;
    let alias: HashMap<usize, usize> = chains
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.spliced_into.map(|to| (i, to)))
        .collect();
    let resolve = |mut i: usize| {
        while let Some(&to) = alias.get(&i) {
            i = to;
        }
        i
    };
    for c in &mut chains {
        if c.spliced_into.is_none() {
            if let Some(f) = c.fork.as_mut() {
                f.parent_chain = f.parent_chain.map(resolve);
            }
        }
    }
    let main_index = resolve(chain_of_request[&ordered[0].0]);
    let mut workers: Vec<usize> = (0..chains.len())
        .filter(|&i| chains[i].spliced_into.is_none() && i != main_index)
        .collect();
    workers.sort_by(|&a, &b| by_time(&chains[a].requests[0], &chains[b].requests[0]));
    Detection {
        chains,
        main_index,
        worker_indices: workers,
    }
}

fn last_hash_outer_idx(c: &Chain) -> Option<usize> {
    c.requests
        .iter()
        .rev()
        .find(|(_, r)| !r.hash_ids.is_empty())
        .map(|(o, _)| *o)
}

/// Among forks registered on a dead tail: positive depth, starting after the tail ended, same
/// model, not a long-gap low-overlap restart; deepest, then earliest, then lowest index.
fn elect(
    chains: &[Chain],
    registered: &[usize],
    tail: &Request,
    s: &ChainSettings,
) -> Option<usize> {
    let t_end = req_end(tail);
    let tail_blocks = tail.hash_ids.len();
    let first = |ci: usize| chains[ci].requests[0].1;
    let blocked = |ci: usize, depth: usize| {
        if tail_blocks == 0 {
            return false;
        }
        let gap = first(ci).t - t_end;
        let overlap = depth as f64 / tail_blocks as f64;
        gap > s.seam_max_gap_seconds && overlap < s.seam_min_overlap_ratio
    };
    registered
        .iter()
        .copied()
        .filter_map(|ci| chains[ci].fork.as_ref().map(|f| (ci, f)))
        .filter(|(ci, f)| {
            f.depth > 0
                && t_end <= first(*ci).t + EPSILON
                && first(*ci).model == tail.model
                && !blocked(*ci, f.depth)
        })
        .max_by(|(a, fa), (b, fb)| {
            fa.depth
                .cmp(&fb.depth)
                .then(
                    fb.fork_time
                        .partial_cmp(&fa.fork_time)
                        .unwrap_or(Ordering::Equal),
                )
                .then(b.cmp(a))
        })
        .map(|(ci, _)| ci)
}

/// Phase 2: splices elected continuations onto dead tails, re-keying the other forks.
fn resolve_seams(st: &mut Phase1, s: &ChainSettings) {
    let mut alias: HashMap<usize, usize> = HashMap::new();
    let resolve = |alias: &HashMap<usize, usize>, mut i: usize| {
        while let Some(&to) = alias.get(&i) {
            i = to;
        }
        i
    };
    let mut keys: BinaryHeap<std::cmp::Reverse<usize>> = st
        .forks_by_tail
        .keys()
        .map(|&k| std::cmp::Reverse(k))
        .collect();
    let mut processed: HashSet<usize> = HashSet::new();
    while let Some(std::cmp::Reverse(fork_outer)) = keys.pop() {
        if !processed.insert(fork_outer) {
            continue;
        }
        let owner = resolve(&alias, st.chain_of_request[&fork_outer]);
        if last_hash_outer_idx(&st.chains[owner]) != Some(fork_outer) {
            continue;
        }
        let registered: Vec<usize> = st.forks_by_tail[&fork_outer]
            .iter()
            .copied()
            .filter(|&ci| st.chains[ci].spliced_into.is_none())
            .collect();
        let tail = st.req_by_outer[&fork_outer];
        let Some(elected) = elect(&st.chains, &registered, tail, s) else {
            continue;
        };
        let moved = std::mem::take(&mut st.chains[elected].requests);
        for (oi, _) in &moved {
            st.chain_of_request.insert(*oi, owner);
        }
        st.chains[owner].requests.extend(moved.iter().copied());
        st.chains[elected].requests = moved;
        st.chains[elected].spliced_into = Some(owner);
        alias.insert(elected, owner);
        let Some(new_tail) = last_hash_outer_idx(&st.chains[owner]) else {
            continue;
        };
        if rekey(st, &registered, elected, owner, new_tail) {
            processed.remove(&new_tail);
            keys.push(std::cmp::Reverse(new_tail));
        }
    }
}

/// Re-evaluates the non-elected forks against the merged chain's new tail.
fn rekey(
    st: &mut Phase1,
    registered: &[usize],
    elected: usize,
    owner: usize,
    new_tail: usize,
) -> bool {
    let tail_hash = &st.req_by_outer[&new_tail].hash_ids;
    let mut rekeyed = false;
    for &ci in registered {
        let c = &mut st.chains[ci];
        if ci == elected || c.spliced_into.is_some() {
            continue;
        }
        let d = lcp(tail_hash, &c.requests[0].1.hash_ids);
        let Some(f) = c.fork.as_mut() else { continue };
        if d == 0 {
            continue;
        }
        f.fork_outer_idx = Some(new_tail);
        f.depth = d;
        f.parent_chain = Some(owner);
        st.forks_by_tail.entry(new_tail).or_default().push(ci);
        rekeyed = true;
    }
    rekeyed
}

/// `(group, member)` for workers forked from the same request that overlap in time, in groups
/// of at least `worker_group_min`.
pub fn worker_groups(d: &Detection, s: &ChainSettings) -> HashMap<usize, (usize, usize)> {
    if s.worker_group_min == 0 {
        return HashMap::new();
    }
    // (t0, t1, first outer index, chain index), bucketed by fork point in first-seen order.
    type Cand = (f64, f64, usize, usize);
    let mut order: Vec<(usize, usize)> = Vec::new();
    let mut buckets: HashMap<(usize, usize), Vec<Cand>> = HashMap::new();
    for &ci in &d.worker_indices {
        let c = &d.chains[ci];
        let Some(f) = &c.fork else { continue };
        let (Some(pc), Some(fo)) = (f.parent_chain, f.fork_outer_idx) else {
            continue;
        };
        if f.depth == 0 || c.requests.is_empty() {
            continue;
        }
        let t0 = c.requests[0].1.t;
        let t1 = c
            .requests
            .iter()
            .map(|(_, r)| req_end(r))
            .fold(f64::NEG_INFINITY, f64::max);
        let key = (pc, fo);
        if !buckets.contains_key(&key) {
            order.push(key);
        }
        buckets
            .entry(key)
            .or_default()
            .push((t0, t1, c.requests[0].0, ci));
    }
    let cmp_start = |a: &Cand, b: &Cand| {
        a.0.partial_cmp(&b.0)
            .unwrap_or(Ordering::Equal)
            .then(a.2.cmp(&b.2))
    };
    let mut groups: Vec<Vec<Cand>> = order
        .iter()
        .flat_map(|k| overlap_components(&buckets[k], cmp_start))
        .filter(|c| c.len() >= s.worker_group_min)
        .collect();
    // A group holds at least worker_group_min (> 0, checked above) members.
    #[allow(clippy::expect_used)] // the invariant is named at the expect
    let start = |comp: &Vec<Cand>| {
        comp.iter()
            .copied()
            .min_by(|a, b| cmp_start(a, b))
            .expect("groups are not empty")
    };
    groups.sort_by(|a, b| cmp_start(&start(a), &start(b)));
    let mut out = HashMap::new();
    for (g, mut comp) in groups.into_iter().enumerate() {
        comp.sort_by(cmp_start);
        for (m, c) in comp.iter().enumerate() {
            out.insert(c.3, (g, m));
        }
    }
    out
}

/// Connected components of `[t0, t1)` overlap (touching intervals do not overlap), each in
/// index order, components in order of their first member.
fn overlap_components<C: Copy>(
    cands: &[(f64, f64, usize, C)],
    cmp_start: impl Fn(&(f64, f64, usize, C), &(f64, f64, usize, C)) -> Ordering,
) -> Vec<Vec<(f64, f64, usize, C)>> {
    let n = cands.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| cmp_start(&cands[a], &cands[b]));
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    // Min-heap of (t1, index) for the intervals still open.
    let mut active: Vec<(f64, usize)> = Vec::new();
    let min_active = |active: &Vec<(f64, usize)>| {
        active.iter().copied().min_by(|a, b| {
            a.0.partial_cmp(&b.0)
                .unwrap_or(Ordering::Equal)
                .then(a.1.cmp(&b.1))
        })
    };
    for &i in &order {
        let t0 = cands[i].0;
        while let Some(m) = min_active(&active).filter(|m| m.0 <= t0) {
            // `m` was just read from `active`.
            #[allow(clippy::expect_used)] // the invariant is named at the expect
            let pos = active.iter().position(|x| *x == m).expect("present");
            active.swap_remove(pos);
        }
        if let Some(m) = min_active(&active) {
            let a = find(&mut parent, i);
            let b = find(&mut parent, m.1);
            parent[a] = b;
        }
        active.push((cands[i].1, i));
    }
    type Component<C> = (usize, Vec<(f64, f64, usize, C)>);
    let mut comps: Vec<Component<C>> = Vec::new();
    for (i, cand) in cands.iter().enumerate() {
        let r = find(&mut parent, i);
        match comps.iter_mut().find(|(root, _)| *root == r) {
            Some((_, v)) => v.push(*cand),
            None => comps.push((r, vec![*cand])),
        }
    }
    comps.into_iter().map(|(_, v)| v).collect()
}

/// Pulls a leading throwaway call (title generation, a disjoint one-shot) off the front:
/// `(preamble, rest)`, the rest in index order.
pub fn split_off_preamble<'a>(normals: &[Indexed<'a>]) -> (Vec<Indexed<'a>>, Vec<Indexed<'a>>) {
    const TITLE_GEN_MAX_OUTPUT_TOKENS: i64 = 64;
    if normals.len() < 2 {
        return (Vec::new(), normals.to_vec());
    }
    let mut ordered = normals.to_vec();
    ordered.sort_by(by_time);
    let (outer, req) = ordered[0];
    if req.hash_ids.is_empty() {
        return (Vec::new(), normals.to_vec());
    }
    let rest = &ordered[1..];
    if rest
        .iter()
        .any(|(_, o)| !o.hash_ids.is_empty() && lcp(&req.hash_ids, &o.hash_ids) > 0)
    {
        return (Vec::new(), normals.to_vec());
    }
    if req.output_length > TITLE_GEN_MAX_OUTPUT_TOKENS {
        let others: HashSet<i64> = rest
            .iter()
            .flat_map(|(_, o)| o.hash_ids.iter().copied())
            .collect();
        if req.hash_ids.iter().any(|h| others.contains(h)) {
            return (Vec::new(), normals.to_vec());
        }
    }
    let mut rest = rest.to_vec();
    rest.sort_by_key(|(o, _)| *o);
    (vec![(outer, req)], rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(t: f64, hash: &[i64], model: &str) -> Request {
        Request {
            t,
            model: model.into(),
            input_length: 64 * hash.len() as i64,
            output_length: 100,
            hash_ids: hash.to_vec(),
            input_types: vec![],
            stop: String::new(),
            api_time: Some(0.5),
            think_time: None,
        }
    }

    #[test]
    fn growth_stays_one_chain_and_a_side_branch_is_a_worker() {
        let rs = [
            req(0.0, &[1, 2], "m"),
            req(1.0, &[1, 2, 3], "m"),
            req(1.2, &[1, 9], "m"),
            req(2.0, &[1, 2, 3, 4], "m"),
        ];
        let ix: Vec<Indexed> = rs.iter().enumerate().collect();
        let d = detect(&ix, &ChainSettings::default());
        assert_eq!(d.main_index, 0);
        let outer = |ci: usize| {
            d.chains[ci]
                .requests
                .iter()
                .map(|(o, _)| *o)
                .collect::<Vec<_>>()
        };
        assert_eq!(outer(0), [0, 1, 3]);
        assert_eq!(d.worker_indices, [1]);
        assert_eq!(outer(1), [2]);
    }

    #[test]
    fn a_compaction_seam_splices_back() {
        // [1,2,3] then a shrink to [1,7] that nobody pulls back from: the same agent.
        let rs = [
            req(0.0, &[1, 2, 3], "m"),
            req(2.0, &[1, 7], "m"),
            req(3.0, &[1, 7, 8], "m"),
        ];
        let ix: Vec<Indexed> = rs.iter().enumerate().collect();
        let d = detect(&ix, &ChainSettings::default());
        assert!(d.worker_indices.is_empty());
        assert_eq!(d.chains[d.main_index].requests.len(), 3);
        // Another model never continues a chain.
        let rs = [req(0.0, &[1, 2], "m"), req(2.0, &[1, 2, 3], "h")];
        let ix: Vec<Indexed> = rs.iter().enumerate().collect();
        assert_eq!(detect(&ix, &ChainSettings::default()).worker_indices, [1]);
    }

    #[test]
    fn aux_and_reduction_rules() {
        let s = ChainSettings::default();
        let small = req(0.0, &[5], "m");
        assert!(is_aux_chain(&[&small], 1000, Some("m"), &s));
        let mut big = req(0.0, &[5], "m");
        big.input_length = 20000;
        assert!(!is_aux_chain(&[&big], 1000, Some("m"), &s));
        assert!(is_aux_chain(&[&big], 1000, Some("other"), &s));
        big.output_length = 500;
        assert!(is_reduction_chain(&[&big], &s));
        big.output_length = 5000;
        assert!(!is_reduction_chain(&[&big], &s));
    }

    #[test]
    fn a_disjoint_small_leader_is_a_preamble() {
        let mut title = req(0.0, &[99], "h");
        title.output_length = 20;
        let rs = [req(1.0, &[1, 2], "m"), title, req(2.0, &[1, 2, 3], "m")];
        let ix: Vec<Indexed> = rs.iter().enumerate().collect();
        let (pre, rest) = split_off_preamble(&ix);
        assert_eq!(pre.iter().map(|p| p.0).collect::<Vec<_>>(), [1]);
        assert_eq!(rest.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 2]);
    }
}
