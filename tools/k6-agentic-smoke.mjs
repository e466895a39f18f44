// Runs deploy/load/k6-agentic.js under Node (20+) with minimal stand-ins for k6's modules, for a
// machine without k6: each "VU" runs one iteration at once, every exchange is logged, and the
// run fails (exit 1) on a failed check, a conversation not followed to its last turn, a
// joining turn sent before the children of the branches it waits for had finished (or announced
// with a delay: AIPerf sends joins without one), or a spawned child sent before its dispatch
// offset (`offsets_ms`, times DELAY_SCALE) had passed since its spawning turn completed. It prints
// each child's start and each join's send time relative to what they wait for.
//   kvbust serve --config agentic.toml        # [synth.dataset] input_file = "traces/", weka_trace
//   KVBUST=http://127.0.0.1:8080 ROOTS=3 MAX_DELAY_MS=30 node tools/k6-agentic-smoke.mjs
// Not a k6 replacement: no load shaping, metrics or scenarios; it checks the script's logic.
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const script = process.argv[2] || fileURLToPath(new URL('../deploy/load/k6-agentic.js', import.meta.url));
const src = readFileSync(script, 'utf8')
  .replace("import http from 'k6/http';", 'const http = globalThis.__k6.http;')
  .replace("import { check } from 'k6';", 'const check = globalThis.__k6.check;')
  .replace("import { Counter } from 'k6/metrics';", 'const Counter = globalThis.__k6.Counter;');

const log = [];
const failures = [];
// Times are read from the monotonic clock (Date.now() is the wall clock, which may step), and
// the script's timers never fire before their delay has passed on that clock: Node starts a
// timer from the event loop's cached time, which on a loaded machine lags the moment the script
// asked for it, so a bare setTimeout could fire a few ms early (k6's Go timers do not).
const now = () => performance.now();
const loopTimeout = globalThis.setTimeout;
globalThis.setTimeout = (fn, ms, ...args) => {
  const due = now() + (Number(ms) || 0);
  const tick = () => {
    const left = due - now();
    if (left > 0) loopTimeout(tick, Math.ceil(left));
    else fn(...args);
  };
  return loopTimeout(tick, ms);
};
// k6 (Go) hands response header names canonicalized; the script must not care.
const canon = (k) => k.split('-').map((w) => w.charAt(0).toUpperCase() + w.slice(1)).join('-');
globalThis.__ENV = process.env;
globalThis.__k6 = {
  http: {
    async asyncRequest(method, url, body, params) {
      const t0 = now();
      const r = await fetch(url, { method, body, headers: params.headers });
      const text = await r.text();
      const headers = {};
      r.headers.forEach((v, k) => { headers[canon(k)] = v; });
      log.push({
        // The script names sessions RUN-VU-ITER-N: a VU's sessions are one root's tree.
        tree: String(params.headers['x-correlation-id']).split('-')[1],
        t0, t1: now(), status: r.status,
        conv: headers['X-Kvbust-Synth-Conversation'], turn: headers['X-Kvbust-Synth-Turn'],
        spawn: headers['X-Kvbust-Synth-Spawn'], after: headers['X-Kvbust-Synth-Next-After'],
        next: headers['X-Kvbust-Synth-Next-Turn'], delay: headers['X-Kvbust-Synth-Next-Delay-Ms'],
      });
      return { status: r.status, headers, body: text };
    },
  },
  check(res, checks) {
    let ok = true;
    for (const [name, f] of Object.entries(checks)) {
      if (!f(res)) { ok = false; failures.push(name); }
    }
    return ok;
  },
  Counter: class { add() {} },
};

// One module instance per VU, as k6 has: its own __VU and session counter.
globalThis.__ITER = 0;
const vus = parseInt(process.env.ROOTS || '1', 10);
await Promise.all(Array.from({ length: vus }, async (_, i) => {
  const own = src.replaceAll('__VU', String(i + 1));
  const mod = await import(`data:text/javascript;base64,${Buffer.from(own).toString('base64')}`);
  return mod.default();
}));

// A conversation runs once per tree (two VUs may replay the same root).
const byConv = new Map();
for (const e of log) {
  const key = `${e.tree}/${e.conv}`;
  if (!byConv.has(key)) byConv.set(key, []);
  byConv.get(key).push(e);
}
const children = new Map();
const scale = parseFloat(process.env.DELAY_SCALE || '1');
for (const e of log) {
  for (const entry of (e.spawn || '').split(';')) {
    const [head, ...words] = entry.trim().split(' ');
    if (!head) continue;
    const eq = head.indexOf('=');
    const kids = head.slice(eq + 1).split(',').filter(Boolean);
    children.set(`${e.tree}/${head.slice(0, eq)}`, kids.map((c) => `${e.tree}/${c}`));
    const offsets = (words.find((w) => w.startsWith('offsets_ms=')) || 'offsets_ms=')
      .slice('offsets_ms='.length).split(',').filter(Boolean).map(Number);
    kids.forEach((c, i) => {
      const first = (byConv.get(`${e.tree}/${c}`) || [])[0];
      if (!first) return;
      const want = (offsets[i] || 0) * scale;
      const got = first.t0 - e.t1;
      console.log(`${e.tree}/${c}: started ${got} ms after its spawning turn (offset ${want} ms)`);
      // Timers never fire early (see setTimeout above); 1 ms of slack for rounding.
      if (got < want - 1) failures.push(`${e.tree}/${c} started ${got} ms after its spawn, before its ${want} ms offset`);
    });
  }
}
for (const [conv, turns] of byConv) {
  if (turns[turns.length - 1].next !== 'none') failures.push(`${conv} not followed to its last turn`);
  turns.forEach((e, i) => {
    const joins = (e.after || '').split(',').filter(Boolean);
    if (joins.length && e.delay !== '0') failures.push(`${conv} turn ${i + 1} joins with a delay of ${e.delay} ms`);
    let ready = e.t1;
    for (const branch of joins) {
      const kids = children.get(`${e.tree}/${branch}`);
      if (!kids) failures.push(`${conv} waits for ${branch}, which no turn spawned`);
      for (const child of kids || []) {
        const end = Math.max(...(byConv.get(child) || []).map((x) => x.t1));
        ready = Math.max(ready, end);
        if (!(turns[i + 1] && turns[i + 1].t0 >= end)) failures.push(`${conv} turn ${i + 1} sent before ${child} finished`);
      }
    }
    if (joins.length && turns[i + 1]) console.log(`${conv} turn ${i + 1}: joined ${turns[i + 1].t0 - ready} ms after its last prerequisite completed`);
  });
  console.log(`${conv}: turns ${turns.map((e) => e.turn).join(',')}`);
}
// SMOKE_LOG=FILE: every exchange as JSON (tree, conv, turn, t0, t1 in ms, ...), for a test.
if (process.env.SMOKE_LOG) writeFileSync(process.env.SMOKE_LOG, JSON.stringify(log));
console.log(`${log.length} requests, ${byConv.size} conversations, ${failures.length} failures`);
for (const f of failures) console.log(`FAIL ${f}`);
process.exit(failures.length ? 1 : 0);
