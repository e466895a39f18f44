// k6 load script: replays an agentic dataset (AIPerf weka_trace: a root conversation per trace,
// child conversations for its subagents, spawn/join topology) through kvbust, using nothing but
// the x-kvbust-synth-* response headers. kvbust fills every request body (messages = the turn's
// whole accumulated context, model = the turn's model, max_tokens = its output length); this
// script only decides WHEN to send WHAT conversation's next turn.
//
// Run kvbust with the traces as its synthetic dataset, e.g. (a folder of Weka trace *.json):
//   cat > agentic.toml <<'TOML'
//   [upstream]
//   url = "http://127.0.0.1:8000"          # leave out for the built-in mock
//   [synth.dataset]
//   input_file = "traces/"
//   custom_dataset_type = "weka_trace"
//   TOML
//   kvbust serve --config agentic.toml
// then (k6 v0.43 or newer: async requests and timers):
//   k6 run -e KVBUST=http://127.0.0.1:8080 -e ROOTS=4 -e ITERATIONS=1 -e MAX_DELAY_MS=2000 \
//     deploy/load/k6-agentic.js
//
// What it does, per VU iteration (ROOTS VUs run at once, ITERATIONS each):
//   - starts a new session (its own x-correlation-id) without naming a conversation: kvbust
//     hands a new session the next ROOT conversation, round-robin, never a child;
//   - sends the conversation's turns in order; after each response it reads
//       x-kvbust-synth-spawn        branches this turn starts: `branch=child,child start_ms=T
//                                   offsets_ms=o,o [background]`, `; `-separated. Child i starts
//                                   o_i ms after this response ends (AIPerf's dispatch offset:
//                                   its first request's time minus the branch start; scaled by
//                                   DELAY_SCALE, never capped by MAX_DELAY_MS, as AIPerf's delay
//                                   cap does not shorten it), each as its own session naming its
//                                   conversation with x-kvbust-synth-conversation (and following
//                                   its own turns the same way);
//       x-kvbust-synth-next-turn    the next turn's index, or `none`: the conversation is done;
//       x-kvbust-synth-next-after   branch ids whose children must all finish before the next
//                                   turn (SPAWN_JOIN); background branches are never listed, so
//                                   they are not waited for;
//       x-kvbust-synth-next-delay-ms  the trace's end-to-start delay before the next turn,
//                                   counted from this response's end, scaled by DELAY_SCALE and
//                                   capped at MAX_DELAY_MS; 0 for a joining turn, which goes out
//                                   as soon as its branches' children complete (AIPerf's join
//                                   rule: the recorded delay is not waited);
//   - ends the iteration when the root and every child it started (background ones too) are done.
//
// Environment: KVBUST (base URL, default http://127.0.0.1:8080), ROOTS (VUs, 1), ITERATIONS
// (per VU, 1), MAX_DELAY_MS (cap on each delay, 5000; 0 sends at once), DELAY_SCALE (1),
// STREAM (1: stream the responses), PHASE (x-kvbust-phase, default profiling), MODEL (the body's
// model before kvbust replaces it with the turn's), RUN_ID (session id prefix, default the start
// time), MAX_DURATION ('30m'). Header names are the defaults of `[headers]`; change H below if
// the proxy renames them.
import http from 'k6/http';
import { check } from 'k6';
import { Counter } from 'k6/metrics';

const BASE = __ENV.KVBUST || 'http://127.0.0.1:8080';
const ROOTS = parseInt(__ENV.ROOTS || '1', 10);
const ITERATIONS = parseInt(__ENV.ITERATIONS || '1', 10);
const MAX_DELAY_MS = parseFloat(__ENV.MAX_DELAY_MS || '5000');
const DELAY_SCALE = parseFloat(__ENV.DELAY_SCALE || '1');
const RUN_ID = __ENV.RUN_ID || Date.now().toString(36);

const H = {
  synth: 'x-kvbust-synth',
  conversation: 'x-kvbust-synth-conversation',
  phase: 'x-kvbust-phase',
  session: 'x-correlation-id',
  turn: 'x-kvbust-synth-turn',
  spawn: 'x-kvbust-synth-spawn',
  nextTurn: 'x-kvbust-synth-next-turn',
  nextAfter: 'x-kvbust-synth-next-after',
  nextDelay: 'x-kvbust-synth-next-delay-ms',
};

export const options = {
  scenarios: {
    agentic: {
      executor: 'per-vu-iterations',
      vus: ROOTS,
      iterations: ITERATIONS,
      maxDuration: __ENV.MAX_DURATION || '30m',
    },
  },
};

const turns = new Counter('kvbust_agentic_turns');
const children = new Counter('kvbust_agentic_children');

// kvbust replaces messages, model and max_tokens; the rest goes upstream as written here.
const BODY = JSON.stringify({
  model: __ENV.MODEL || 'kvbust-agentic',
  messages: [],
  max_tokens: 1,
  stream: __ENV.STREAM === '1',
});

let sessions = 0;

/** A response header, whatever case the client library gave its name. */
function header(res, name) {
  for (const k of Object.keys(res.headers)) {
    if (k.toLowerCase() === name) return res.headers[k];
  }
  return undefined;
}

/** `a,b,c` (ids percent-encoded by kvbust, so a comma always separates). */
function list(v) {
  return (v || '').split(',').map((s) => s.trim()).filter((s) => s.length > 0);
}

/** x-kvbust-synth-spawn: `branch=c1,c2 start_ms=T offsets_ms=o1,o2 [background]; ...`. */
function parseSpawn(v) {
  const out = [];
  for (const entry of (v || '').split(';')) {
    const words = entry.trim().split(' ').filter((w) => w.length > 0);
    if (words.length === 0) continue;
    const eq = words[0].indexOf('=');
    if (eq < 0) continue;
    const branch = { id: words[0].slice(0, eq), children: list(words[0].slice(eq + 1)), startMs: 0, offsetsMs: [], background: false };
    for (const w of words.slice(1)) {
      if (w === 'background') branch.background = true;
      else if (w.startsWith('start_ms=')) branch.startMs = parseFloat(w.slice('start_ms='.length)) || 0;
      else if (w.startsWith('offsets_ms=')) branch.offsetsMs = list(w.slice('offsets_ms='.length)).map((o) => parseFloat(o) || 0);
    }
    out.push(branch);
  }
  return out.sort((a, b) => a.startMs - b.startMs);
}

/** A child's dispatch offset: scaled, not capped (AIPerf's delay cap does not shorten it). */
function offsetMs(ms) {
  return Math.max(0, (ms || 0) * DELAY_SCALE);
}

function sleepMs(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function delayMs(v) {
  const ms = (parseFloat(v || '0') || 0) * DELAY_SCALE;
  return Math.max(0, Math.min(ms, MAX_DELAY_MS));
}

/**
 * One session following one conversation to its end: the next root (conversation null) or a
 * named child. `tree` is shared by a root and everything it spawns: branch id -> the promise of
 * all its children, and every started child's promise.
 */
async function session(tree, conversation) {
  sessions += 1;
  const id = `${RUN_ID}-${__VU}-${__ITER}-${sessions}`;
  const headers = {
    'content-type': 'application/json',
    [H.synth]: '1',
    [H.session]: id,
    [H.phase]: __ENV.PHASE || 'profiling',
  };
  if (conversation) headers[H.conversation] = conversation;
  const kind = conversation ? 'child' : 'root';
  let expect = 0;
  for (;;) {
    const res = await http.asyncRequest('POST', `${BASE}/v1/chat/completions`, BODY, {
      headers,
      tags: { kind },
      timeout: __ENV.TIMEOUT || '600s',
    });
    const turn = header(res, H.turn);
    const ok = check(res, {
      'status 200': (r) => r.status === 200,
      'turns in order': () => turn === String(expect),
    });
    if (!ok) {
      console.error(`${kind} ${conversation || id} turn ${expect}: ${res.status} ${String(res.body).slice(0, 300)}`);
      return;
    }
    turns.add(1, { kind });
    // Children start their offsets after the spawning turn has completed.
    for (const branch of parseSpawn(header(res, H.spawn))) {
      const started = branch.children.map((child, i) => {
        children.add(1);
        return sleepMs(offsetMs(branch.offsetsMs[i])).then(() => session(tree, child));
      });
      const all = Promise.all(started);
      tree.branches[branch.id] = all;
      tree.started.push(all);
    }
    const next = header(res, H.nextTurn);
    if (next === undefined || next === 'none') return;
    expect = parseInt(next, 10);
    // The delay runs from this response's end, alongside the wait for the joined branches
    // (kvbust sends 0 for a joining turn: it goes out when they complete).
    const joins = list(header(res, H.nextAfter)).map((b) => tree.branches[b] || Promise.resolve());
    await Promise.all([sleepMs(delayMs(header(res, H.nextDelay))), ...joins]);
  }
}

export default async function () {
  const tree = { branches: {}, started: [] };
  await session(tree, null);
  // Background branches are not joined by any turn: wait for them before the iteration ends.
  // (A child started while waiting here is pushed before its parent's promise settles.)
  for (let i = 0; i < tree.started.length; i += 1) {
    await tree.started[i];
  }
}
