-- wrk: POST the body in $BODY_FILE with its `@SEQ@` replaced by a number distinct per request
-- (thread id and count), so that no two requests carry the same user turn: the cache model then
-- tokenizes every body as it would a new context, instead of finding its messages remembered.
local f = assert(io.open(os.getenv("BODY_FILE"), "rb"))
local body = f:read("*a")
f:close()
local at = assert(body:find("@SEQ@", 1, true), "the body has no @SEQ@")
local head, tail = body:sub(1, at - 1), body:sub(at + 5)
local threads = 0
function setup(thread)
    threads = threads + 1
    thread:set("id", threads)
end
local n = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
function request()
    n = n + 1
    return wrk.format(nil, nil, nil, head .. id .. "-" .. n .. tail)
end
