// k6 load script: one fixed body, yet every request carries a fresh, token-exact 1024-token
// prompt, because kvbust expands the placeholder in flight. Run kvbust first, then:
//   k6 run -e KVBUST=http://127.0.0.1:8080 deploy/load/k6-placeholders.js
import http from 'k6/http';
import { check } from 'k6';

export const options = { vus: 8, duration: '30s' };

const body = JSON.stringify({
  model: 'kvbust-mock',
  max_tokens: 64,
  messages: [
    { role: 'system', content: 'You are a careful reviewer.' },
    { role: 'user', content: 'Summarise this:\n{{kvbust:prompt:1024}}' },
  ],
});

export default function () {
  const res = http.post(`${__ENV.KVBUST || 'http://127.0.0.1:8080'}/v1/chat/completions`, body, {
    headers: { 'content-type': 'application/json', 'x-kvbust-phase': 'profiling' },
  });
  check(res, { 'status 200': (r) => r.status === 200 });
}
