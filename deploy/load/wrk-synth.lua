-- wrk script: every request's messages come from kvbust's synthetic dataset (x-kvbust-synth),
-- marked per session by the configured cache-bust target.
--   wrk -t2 -c16 -d30s -s deploy/load/wrk-synth.lua http://127.0.0.1:8080
wrk.method = "POST"
wrk.path = "/v1/chat/completions"
wrk.headers["content-type"] = "application/json"
wrk.headers["x-kvbust-synth"] = "1"
wrk.body = '{"model":"kvbust-mock","max_tokens":32,"messages":[]}'
