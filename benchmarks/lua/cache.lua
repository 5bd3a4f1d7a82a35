-- wrk script for benchmarks/response_cache.py: one binary-extension body, sent as it is
-- (OIPC_UNIQUE=0: every request the same, all hits once stored) or with a counter written
-- over the first 8 bytes of its tensor data (OIPC_UNIQUE=1: no two requests alike, 0 % hits).
--
--   OIPC_BODY    path of the request body file
--   OIPC_HLEN    Inference-Header-Content-Length (the tensor data follows the header)
--   OIPC_UNIQUE  "1": a new counter value in each request
--   OIPC_SEED    first counter value (a run's requests differ from an earlier run's)
--
-- done() prints "OIPC_RESULT {json}": requests, duration (µs), non-2xx and socket errors.

local f = assert(io.open(os.getenv("OIPC_BODY"), "rb"))
local body = f:read("*a")
f:close()
local hlen = tonumber(os.getenv("OIPC_HLEN"))
local unique = os.getenv("OIPC_UNIQUE") == "1"
local counter = tonumber(os.getenv("OIPC_SEED") or "0") or 0

wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = tostring(hlen)

if unique then
  -- The whole HTTP request built once in a C buffer; each request writes its counter there
  -- and hands wrk one copy (building it from Lua strings cost three 1 MiB copies a request).
  local ffi = require("ffi")
  local text = wrk.format(nil, nil, nil, body)
  local size = #text
  local buf = ffi.new("uint8_t[?]", size)
  ffi.copy(buf, text, size)
  local at = size - #body + hlen -- the first byte of the tensor data
  function request()
    counter = counter + 1
    local n = counter
    for i = 0, 7 do
      buf[at + i] = n % 256
      n = math.floor(n / 256)
    end
    return ffi.string(buf, size)
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'OIPC_RESULT {"requests":%d,"duration_us":%d,"errors":%d,"p99_us":%d}\n',
    summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout, latency:percentile(99)))
end
