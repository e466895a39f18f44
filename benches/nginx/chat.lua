-- wrk: POST the benchmark's chat body (read from $BODY_FILE) on every request.
local f = assert(io.open(os.getenv("BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
-- $SESSION: sent as x-correlation-id (one session for every request), as AIPerf sends one.
if os.getenv("SESSION") then
    wrk.headers["x-correlation-id"] = os.getenv("SESSION")
end
