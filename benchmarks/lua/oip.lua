-- wrk script for Open Inference Protocol requests (JSON or binary tensor extension).
--
-- Configured through environment variables so that the optional hooks (response, delay) are
-- only defined when a run needs them: wrk switches to its slower per-response parsing path
-- as soon as a `response` function exists, and the plain runs should not pay for that.
--
--   OIPB_BODY          path of the request body file (read once, sent verbatim)
--   OIPB_CTYPE         Content-Type header
--   OIPB_HLEN          Inference-Header-Content-Length value, or empty for JSON bodies
--   OIPB_COUNT_STATUS  "1": count responses by HTTP status (and enforce OIPB_MAX_REQUESTS)
--   OIPB_MAX_REQUESTS  stop a thread after this many responses (needs OIPB_COUNT_STATUS=1)
--   OIPB_RATE          pace the thread to this many requests/s on a fixed schedule (0: as fast
--                      as the connections allow). Sends follow the schedule whatever the
--                      latency, as long as a connection is free, so the offered rate does not
--                      sag when the server slows down (up to -c requests in flight).
--
-- done() prints one line "OIPB_RESULT {json}" that the harness parses; latencies are in µs.

local function read_file(path)
  local f = assert(io.open(path, "rb"), "cannot open body file " .. tostring(path))
  local data = f:read("*a")
  f:close()
  return data
end

wrk.method = "POST"
wrk.body = read_file(os.getenv("OIPB_BODY"))
wrk.headers["Content-Type"] = os.getenv("OIPB_CTYPE") or "application/json"
local hlen = os.getenv("OIPB_HLEN") or ""
if hlen ~= "" then
  wrk.headers["Inference-Header-Content-Length"] = hlen
end

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

if os.getenv("OIPB_COUNT_STATUS") == "1" then
  status_counts = {}
  responses_seen = 0
  local max_requests = tonumber(os.getenv("OIPB_MAX_REQUESTS") or "0") or 0

  function response(status, headers, body)
    local key = tostring(status)
    status_counts[key] = (status_counts[key] or 0) + 1
    responses_seen = responses_seen + 1
    if max_requests > 0 and responses_seen >= max_requests then
      wrk.thread:stop()
    end
  end
end

local rate = tonumber(os.getenv("OIPB_RATE") or "0") or 0
if rate > 0 then
  local ffi = require("ffi")
  ffi.cdef([[
    typedef struct { long tv_sec; long tv_nsec; } oipb_timespec;
    int clock_gettime(int clk_id, oipb_timespec *tp);
  ]])
  local ts = ffi.new("oipb_timespec")
  local function now_ms()
    ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
    return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
  end
  local interval = 1000 / rate
  local start = nil
  local slots = 0

  function delay()
    local t = now_ms()
    if start == nil then
      start = t
    end
    local due = start + slots * interval
    if t - due > 1000 then
      -- More than a second behind (every connection was busy): drop the missed slots rather
      -- than fire them in one burst.
      slots = math.floor((t - start) / interval)
      due = start + slots * interval
    end
    slots = slots + 1
    if due > t then
      return math.floor(due - t)
    end
    return 0
  end
end

function done(summary, latency, requests)
  local statuses = {}
  for _, thread in ipairs(threads) do
    local counts = thread:get("status_counts")
    if counts ~= nil then
      for code, n in pairs(counts) do
        statuses[code] = (statuses[code] or 0) + n
      end
    end
  end
  local status_parts = {}
  for code, n in pairs(statuses) do
    table.insert(status_parts, string.format('"%s":%d', code, n))
  end
  local pct_parts = {}
  local points = {1, 5, 10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, 95, 97.5, 99, 99.5, 99.9}
  for _, p in ipairs(points) do
    table.insert(pct_parts, string.format("[%g,%d]", p, latency:percentile(p)))
  end
  local e = summary.errors
  io.write(string.format(
    'OIPB_RESULT {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"max":%d,"mean":%.1f,"stdev":%.1f},' ..
    '"percentiles_us":[%s],"status":{%s}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.max, latency.mean, latency.stdev,
    table.concat(pct_parts, ","), table.concat(status_parts, ",")))
end
