-- wrk: POST the benchmark's 1 KB chat body (read from $BODY_FILE) on every request.
local f = assert(io.open(os.getenv("BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
