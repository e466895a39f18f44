//! `kvbust trace merge`: captures of several replicas into one trace — rows ordered by time,
//! rebased to the earliest file's start, keyed ids made dense, sessions renamed. Refuses files
//! captured under different keys or block sizes, naming them. Reads and writes files; never
//! tokenizes.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::file::{meta_path, Meta, FORMAT};

/// A row as a capture wrote it.
#[derive(Deserialize)]
struct In {
    session_id: Option<String>,
    timestamp: Option<u64>,
    delay: Option<u64>,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

#[derive(Serialize)]
struct Out<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay: Option<u64>,
    input_length: u64,
    output_length: u64,
    hash_ids: &'a [u64],
}

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    pub files: usize,
    pub rows: u64,
    pub distinct_ids: u64,
    pub sessions: u64,
    /// The rows' input and output lengths, summed, and the bytes of the merged trace (for the
    /// command's summary line).
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub bytes: u64,
    /// Unkeyed inputs: their ids could not be matched across files.
    pub unkeyed: bool,
}

struct Loaded {
    path: PathBuf,
    meta: Meta,
    rows: Vec<In>,
}

fn load(path: &Path) -> Result<Loaded, String> {
    let mp = meta_path(path);
    let meta: Meta = std::fs::read(&mp)
        .map_err(|e| format!("{}: cannot read its metadata {} ({e}); merge takes the .jsonl files kvbust's capture wrote, each with its .meta.json beside it", path.display(), mp.display()))
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", mp.display())))?;
    if meta.format != FORMAT {
        return Err(format!(
            "{}: not a kvbust capture (format {:?})",
            mp.display(),
            meta.format
        ));
    }
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        rows.push(
            serde_json::from_str(&line)
                .map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))?,
        );
    }
    Ok(Loaded {
        path: path.to_owned(),
        meta,
        rows,
    })
}

/// Refuses inputs whose block size or key differ from the first's, naming both files.
fn check_alike(files: &[Loaded]) -> Result<(), String> {
    let first = &files[0];
    for f in &files[1..] {
        if f.meta.block_size != first.meta.block_size {
            return Err(format!(
                "{} was captured at block_size {} and {} at {}: ids of different block sizes \
                 cannot be merged",
                first.path.display(),
                first.meta.block_size,
                f.path.display(),
                f.meta.block_size
            ));
        }
        if f.meta.key != first.meta.key {
            let name = |k: &Option<String>| match k {
                Some(k) => format!("key {k}"),
                None => "no key".to_string(),
            };
            return Err(format!(
                "{} was captured under {} and {} under {}: replicas must share one \
                 capture.key_file for their ids to agree",
                first.path.display(),
                name(&first.meta.key),
                f.path.display(),
                name(&f.meta.key)
            ));
        }
    }
    Ok(())
}

/// Every row as (ms since `base`, file, line), sorted: a later turn (a `delay` row) sorts right
/// after its session's previous row in its own file.
fn schedule(files: &[Loaded], base: u64) -> Vec<(u64, usize, usize)> {
    let mut order = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        let offset = f.meta.start_unix_ms - base;
        let mut last: HashMap<&str, u64> = HashMap::new();
        for (li, r) in f.rows.iter().enumerate() {
            let t = match (r.timestamp, r.session_id.as_deref()) {
                (Some(ts), _) => offset + ts,
                (None, Some(s)) => last.get(s).copied().unwrap_or(offset),
                (None, None) => offset,
            };
            if let Some(s) = r.session_id.as_deref() {
                last.insert(s, t);
            }
            order.push((t, fi, li));
        }
    }
    order.sort();
    order
}

/// Merges `inputs` into `out` (and `out`'s metadata beside it).
pub fn merge(inputs: &[PathBuf], out: &Path) -> Result<Merged, String> {
    if inputs.is_empty() {
        return Err("name at least one capture file".into());
    }
    let files = inputs
        .iter()
        .map(|p| load(p))
        .collect::<Result<Vec<_>, _>>()?;
    check_alike(&files)?;
    let keyed = files[0].meta.key.is_some();
    let base = files
        .iter()
        .map(|f| f.meta.start_unix_ms)
        .min()
        .unwrap_or(0);
    let order = schedule(&files, base);
    let mut ids: HashMap<(usize, u64), u64> = HashMap::new();
    let mut sessions: HashMap<(usize, String), u64> = HashMap::new();
    let tmp = out.with_file_name(format!(
        ".{}.tmp",
        out.file_name().and_then(|n| n.to_str()).unwrap_or("merged")
    ));
    let io = |e: std::io::Error| format!("{}: {e}", out.display());
    let mut w = BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    let mut hash = Vec::new();
    let (mut input_tokens, mut output_tokens) = (0u64, 0u64);
    for &(t, fi, li) in &order {
        let r = &files[fi].rows[li];
        // Keyed ids mean the same block in every file; unkeyed ones only within theirs.
        let scope = if keyed { 0 } else { fi };
        hash.clear();
        for &h in &r.hash_ids {
            let next = ids.len() as u64;
            hash.push(*ids.entry((scope, h)).or_insert(next));
        }
        let session = r.session_id.as_ref().map(|s| {
            let next = sessions.len() as u64;
            format!("s{}", sessions.entry((scope, s.clone())).or_insert(next))
        });
        input_tokens += r.input_length;
        output_tokens += r.output_length;
        let row = Out {
            session_id: session,
            timestamp: r.timestamp.map(|_| t),
            delay: r.delay,
            input_length: r.input_length,
            output_length: r.output_length,
            hash_ids: &hash,
        };
        serde_json::to_writer(&mut w, &row).map_err(|e| e.to_string())?;
        w.write_all(b"\n").map_err(io)?;
    }
    w.flush().map_err(io)?;
    let bytes = w.get_ref().metadata().map_err(io)?.len();
    drop(w);
    // Dense now: the merged ids are no longer keyed hashes, so the result merges like an
    // unkeyed capture.
    let meta = Meta {
        start_unix_ms: base,
        rows: order.len() as u64,
        key: None,
        ..files[0].meta.clone()
    };
    std::fs::write(
        meta_path(out),
        serde_json::to_vec_pretty(&meta).map_err(|e| e.to_string())?,
    )
    .map_err(io)?;
    std::fs::rename(&tmp, out).map_err(io)?;
    Ok(Merged {
        files: files.len(),
        rows: order.len() as u64,
        distinct_ids: ids.len() as u64,
        sessions: sessions.len() as u64,
        input_tokens,
        output_tokens,
        bytes,
        unkeyed: !keyed,
    })
}
