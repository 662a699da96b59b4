-- The shared Sume budget's library (budget.py states the rules): the state, the arithmetic of its
-- windows, and budget_take, which answers a take by the function its mode names in MODES. The
-- scripts that use it (budget_take.lua, budget_feedback.lua, gate.lua) are this file and their own.
-- budget.py defines LANE_BURST, DAY_FLOOR, SLIDE_MS, BUCKET_MS and PACE_MS before it (Python's
-- mirror of the minute shares them).

local MINUTE, DAY, KEEP = 60000, 86400000, 172800000   -- ms; KEEP: the state outlives its last use by two days

-- The budget hash (KEYS[1] of each script), clock ms and counts:
--   minute_tat        the minute's theoretical arrival time: the line's next slot plus the burst (GCRA)
--   day_used          grants counted in the current day window
--   day_next          grants reserved into the next day window
--   day_reset         when the current day window ends (Sume's RateLimit-Reset, else the UTC day's end)
--   pause_until       a 429's Retry-After: no slot before it
--   key_pause_until   Sume refused the key: no slot before it
--   sume_left         what Sume said is left in its window with the least left...
--   sume_reset        ...and when that window resets
--   other_until       another client was seen spending the key until then: one read kept in reserve...
--   other_reads       ...and the reads of Sume's last minute that were not ours, as its last reply showed
--                     (the read log keeps that many fewer)
--   learned_minute    limits Sume's headers taught, when below the configured ones
--   learned_day
--   pending           pending jobs as fan-out counted them (the day reserve's scale; pending.py)
--   oldest_pending    the oldest pending job's submission (clock s), as fan-out's last full round saw it
--   owed              reserved status reads whose place a result read took (they go to the back)
--   ahead_next        the slot of the next result read that takes a place
--   status_taken      status reads granted so far (a counter: sweeps weigh what chains spend)
--   early_tat         the next reserved read that may come before its slot while the day spaces the line
--   read_log          the reads granted now over the last SLIDE_MS, "bucket:count,..." oldest first, a
--                     bucket BUCKET_MS of the clock: no SLIDE_MS span ever holds more than the minute's limit
-- The sweeps' lane (KEYS[2], the same cluster slot):
--   open_until        the sweep function keeps it open (every tick)
--   share             per mille of each minute kept for list reads
--   minute_tat        the lane's own line, a minute's pace...
--   day_tat           ...and the day's: the lane's share of the day, evenly (the line gets the rest)
local FIELDS = {'minute_tat', 'day_used', 'day_next', 'day_reset', 'pause_until', 'key_pause_until', 'sume_left',
                'sume_reset', 'other_until', 'other_reads', 'learned_minute', 'learned_day', 'pending', 'owed',
                'ahead_next', 'early_tat'}  -- and read_log, a string

local function load(key, fields)
  local values, state = redis.call('HMGET', key, unpack(fields)), {}
  for i, name in ipairs(fields) do state[name] = tonumber(values[i]) end
  return state
end

local function limit_of(configured, learned)
  local limit = tonumber(configured)
  if learned and learned > 0 and (limit == 0 or learned < limit) then limit = learned end
  return limit
end

-- reads of a minute kept for list reads while the sweeps' lane is open (share in per mille); never
-- the whole limit (a limit of 1 keeps none)
local function lane_size(limit, share)
  if share <= 0 or limit <= 0 then return 0 end
  return math.min(math.max(1, math.floor(limit * share / 1000)), limit - 1)
end

-- the minute's interval and burst (ms) for chains and results, the lane's reads aside: the limit
-- over PACE_MS, the read log's span with room for a read that comes back late to its slot (Python's
-- granted_per_window)
local function minute_window(limit, share)
  if limit <= 0 then return 0, 0 end
  local t = PACE_MS / math.max(1, limit - lane_size(limit, share))
  return t, math.floor(limit / 50) * t
end

-- The read log, parsed: {bucket, count} pairs, oldest first.
local function log_of(text)
  local log = {}
  for bucket, count in string.gmatch(text or '', '(%d+):(%d+)') do  -- text false (HGET's nil): no log yet
    log[#log + 1] = {tonumber(bucket), tonumber(count)}
  end
  return log
end

-- Reads of the log a window of `span` ending at `now` may hold (every bucket that ends after its start).
local function log_count(log, now, span)
  local counted = 0
  for i = #log, 1, -1 do
    if (log[i][1] + 1) * BUCKET_MS <= now - span then break end
    counted = counted + log[i][2]
  end
  return counted
end

-- The earliest time from `at` at which n more reads keep every SLIDE_MS span at most `limit`: a read
-- at t counts every bucket that ends after t - SLIDE_MS; nil: n is above the limit itself.
local function log_room(log, at, n, limit)
  if n > limit then return nil end
  local counted = 0
  for i = #log, 1, -1 do
    counted = counted + log[i][2]
    if counted + n > limit then return math.max(at, (log[i][1] + 1) * BUCKET_MS + SLIDE_MS) end
  end
  return at
end

-- The log with n reads at `now`, or in its newest bucket where that is later - a take Redis runs
-- after another happens after it, though its caller's clock was a little behind or its command was
-- held up on the way: no read then leaves the log before one Redis granted earlier, and what a
-- later take prunes is never what an earlier-stamped one still had to count. Buckets no read from
-- then on counts are dropped. Returns the text and the time (ms) the reads are counted at.
local function log_text(log, now, n)
  local bucket = math.floor(now / BUCKET_MS)
  if #log > 0 and log[#log][1] > bucket then
    bucket = log[#log][1]
    now = bucket * BUCKET_MS
  end
  local parts = {}
  for _, entry in ipairs(log) do
    if entry[1] == bucket then
      n = n + entry[2]
    elseif (entry[1] + 1) * BUCKET_MS > now - SLIDE_MS then
      parts[#parts + 1] = entry[1] .. ':' .. entry[2]
    end
  end
  parts[#parts + 1] = bucket .. ':' .. n
  return table.concat(parts, ','), now
end

-- the lane's: at most lane_size of a window (a minute, a day), a sweep's pages in a burst
local function lane_window(limit, share, span)
  local k = lane_size(limit, share)
  if k <= 0 then return 0, 0 end
  local b = math.min(LANE_BURST, k - 1)
  local t = span / math.max(1, k - b)
  return t, b * t
end

-- the current day window (rolled forward when it ended): used, next, reset
local function day_window(st, now)
  local used, nxt, reset = st.day_used or 0, st.day_next or 0, st.day_reset or 0
  if reset > now then return used, nxt, reset end
  if reset <= 0 then return 0, 0, (math.floor(now / DAY) + 1) * DAY end
  local windows = math.floor((now - reset) / DAY) + 1
  if windows == 1 then used, nxt = nxt, 0 else used, nxt = 0, 0 end
  return used, nxt, reset + windows * DAY
end

-- the day's reserve, grants per ms: every pending job's safety cadence and the floor for jobs to
-- come, never more than an evenly spent day keeps
local function reserve_rate(limit, pending, every_ms)
  if every_ms < 0 then return 0 end  -- no reserve (the create budget: its queue keeps what waits)
  if pending < 0 and every_ms > 0 then return limit / DAY end  -- not counted yet: an evenly spent day
  local rate = limit * DAY_FLOOR / DAY
  if every_ms > 0 and pending > 0 then rate = rate + pending / every_ms end
  return math.min(rate, limit / DAY)
end

-- the earliest time n more grants fit a day window: used + n <= limit - rate * (reset - t); nil: full
local function day_fits(limit, used, reset, rate, n)
  if used + n > limit then return nil end
  if rate <= 0 then return 0 end
  return reset - (limit - used - n) / rate
end

-- what the day has left to spend now, beyond its reserve (-1: no day limit)
local function day_left(limit, used, reset, rate, now)
  if limit <= 0 then return -1 end
  return math.max(0, math.floor(limit - used - rate * (reset - now)))
end

-- Everything a take decides on, read once: the context every mode's function is handed.
local function budget_state(key, lane_key, now, max_wait, early, cfg_m, cfg_d, slot, count, every_ms)
  local c = {key = key, lane_key = lane_key, now = now, max_wait = max_wait, early = early, slot = slot,
             count = tonumber(count) or 1}
  c.st = load(key, FIELDS)
  c.ln = load(lane_key, {'open_until', 'share', 'minute_tat', 'day_tat'})
  c.share = ((c.ln.open_until or 0) > now) and (c.ln.share or 0) or 0
  c.m_limit, c.d_limit = limit_of(cfg_m, c.st.learned_minute), limit_of(cfg_d, c.st.learned_day)
  c.lane_day = c.d_limit  -- the whole day's limit, for the lane's share of it
  c.d_limit = c.d_limit - lane_size(c.d_limit, c.share)  -- the line's total: the day less the lane's share
  c.used, c.nxt, c.reset = day_window(c.st, now)
  c.pending = c.st.pending or -1
  c.rate = reserve_rate(c.d_limit, c.pending, every_ms)
  c.day_left = day_left(c.d_limit, c.used, c.reset, c.rate, now)
  c.paused = math.max(c.st.pause_until or 0, c.st.key_pause_until or 0)
  c.key_paused = (c.st.key_pause_until or 0) > now
  c.sume_left, c.sume_reset = c.st.sume_left, c.st.sume_reset or 0
  c.exhausted = c.sume_left ~= nil and c.sume_left <= (((c.st.other_until or 0) > now) and 1 or 0)
                and now < c.sume_reset
  c.owed = c.st.owed or 0
  c.log = log_of(redis.call('HGET', key, 'read_log'))
  -- what the log may hold: the minute's limit, less what another client of the key spends of it
  local other = ((c.st.other_until or 0) > now) and (c.st.other_reads or 0) or 0
  c.log_limit = math.max(1, c.m_limit - other)
  return c
end

-- When a read at the slot `at` may happen: a slot within `early` is now, unless the read log's span
-- holds the limit already - then at the log's room, and never within `early` of now, which would
-- read now (early is the line's tolerance: the log has none, a compressed clock's early being clock
-- seconds); nil: never, more reads at once than the limit.
local function settle(c, at)
  if at - c.now > c.early or c.m_limit <= 0 then return at end
  local room = log_room(c.log, c.now, c.count, c.log_limit)
  if room == nil or room <= c.now then return room and math.max(at, room) end
  return math.max(at, room, c.now + c.early + 1)
end

-- The reply: {granted 0|1, wait ms, pending (-1: not counted), 0 granted | 1 not | 2 key paused,
-- what the day has left beyond its reserve (-1: no day limit), the time (ms) the read log counts a
-- read granted now at (-1: none; no minute limit: now)}. A slot within `early` is now.
local function answer(c, granted, wait)
  local logged = -1
  wait = math.ceil(wait)  -- whole ms, as the reply carries it: a wait Redis would cut to 0 is not now
  if granted == 1 and wait <= c.early then
    wait, logged = 0, c.now  -- read now: in the read log, and one read less left in Sume's window
    if c.m_limit > 0 then
      local text
      text, logged = log_text(c.log, c.now, c.count)
      redis.call('HSET', c.key, 'read_log', text)
    end
    if c.sume_left ~= nil and c.now < c.sume_reset then redis.call('HSET', c.key, 'sume_left', c.sume_left - 1) end
  end
  if granted == 1 then redis.call('PEXPIRE', c.key, KEEP) end
  return {granted, wait, c.pending, c.key_paused and 2 or (granted == 1 and 0 or 1), c.day_left, logged}
end

-- The next slot of a line for `count` reads - the chains' and results' (the minute's pace, then the
-- day's reserve at `day_rate`), or the sweeps' lane (its own minute and its share of the day) - one
-- interval early for a read `ahead` of the line. Reserved and counted unless `peek`; a read of
-- `status` counts in status_taken.
local function reserve(c, how)
  local now, count = c.now, c.count
  local tat, t, tau
  if how.lane then
    tat, t, tau = c.ln.minute_tat or 0, lane_window(c.m_limit, c.share, MINUTE)
  else
    tat, t, tau = c.st.minute_tat or 0, minute_window(c.m_limit, c.share)
  end
  local at = math.max(now, c.paused)
  if t > 0 then at = math.max(at, tat - tau - (how.ahead and t or 0) + (count - 1) * t) end
  if c.exhausted and at < c.sume_reset then at = c.sume_reset end
  local in_next, lane_t = false, 0
  if how.lane then  -- the lane's share of the day, at its own even pace
    local lane_tau
    lane_t, lane_tau = lane_window(c.lane_day, c.share, DAY)
    if lane_t > 0 then at = math.max(at, (c.ln.day_tat or 0) - lane_tau + (count - 1) * lane_t) end
  elseif c.d_limit > 0 then
    local rate = how.day_rate or c.rate
    local fits = day_fits(c.d_limit, c.used, c.reset, rate, count)
    if fits == nil or math.max(at, fits) >= c.reset then  -- this window is spent: the next one's
      local next_fits = day_fits(c.d_limit, c.nxt, c.reset + DAY, rate, count)
      if next_fits == nil then return answer(c, 0, c.reset + DAY - now) end  -- both full: never past the total
      at, in_next = math.max(at, c.reset, next_fits), true
    else
      at = math.max(at, fits)
    end
  end
  at = settle(c, at)
  if at == nil then return answer(c, 0, MINUTE) end
  local wait = at - now
  if how.peek then return {0, wait, c.pending, c.key_paused and 2 or 0, c.day_left} end
  if c.max_wait >= 0 and wait > c.max_wait then return answer(c, 0, wait) end
  if t > 0 then
    redis.call('HSET', how.lane and c.lane_key or c.key, 'minute_tat', math.max(tat, at) + count * t)
  end
  if lane_t > 0 then
    redis.call('HSET', c.lane_key, 'day_tat', math.max(c.ln.day_tat or 0, at) + count * lane_t)
  elseif c.d_limit > 0 and not how.lane then
    if in_next then c.nxt = c.nxt + count else c.used = c.used + count end
    redis.call('HSET', c.key, 'day_used', c.used, 'day_next', c.nxt, 'day_reset', c.reset)
  end
  if how.status then redis.call('HINCRBY', c.key, 'status_taken', count) end
  return answer(c, 1, wait)
end

-- How far the line is reserved ahead: an interval of the minute's pace, or of the day's once its
-- reserve binds (0 where it is not reserved that far).
local function line_step(c)
  local t, tau = minute_window(c.m_limit, c.share)
  local tat = c.st.minute_tat or 0
  local day_t = (c.d_limit > 0 and c.rate > 0) and 1 / c.rate or 0
  local minute_full = t > 0 and tat - tau - t > c.now
  local day_full = day_t > 0 and (day_fits(c.d_limit, c.used, c.reset, c.rate, 1) or math.huge) > c.now + day_t
  return math.max(minute_full and t or 0, day_full and day_t or 0)
end

-- A reserved read that came back before its slot (a sweep's hand-over inherits the slot of the step
-- it fenced out): now, where the minute's line has a slot free now (the day counted this read when
-- the slot was reserved; the slot is left unused); where the day spaces the line slower than the
-- minute, in the minute's room between the line's reads (together no faster than the minute's
-- pace); else at its own slot.
local function before_slot(c)
  local room = settle(c, c.now)
  if room > c.now + c.early then return answer(c, 1, math.min(room, c.slot) - c.now) end  -- the log is full now
  local t, tau = minute_window(c.m_limit, c.share)
  local tat = c.st.minute_tat or 0
  if t <= 0 or tat - tau <= c.now then
    if t > 0 then redis.call('HSET', c.key, 'minute_tat', math.max(tat, c.now) + t) end
    return answer(c, 1, 0)
  end
  local day_t = (c.d_limit > 0 and c.rate > 0) and 1 / c.rate or 0
  local at = math.max(c.now, c.st.early_tat or 0)
  if day_t > t and at < c.slot then  -- the earlier of the two slots (the later one is left unused)
    redis.call('HSET', c.key, 'early_tat', at + 1 / (1 / t - 1 / day_t))
    return answer(c, 1, settle(c, at) - c.now)
  end
  return answer(c, 1, c.slot - c.now)
end

local MODES = {}

-- take: a status read, the next slot in the line (counted in status_taken)
function MODES.take(c)
  return reserve(c, {status = true})
end

-- peek: how far the line's next slot is; nothing reserved
function MODES.peek(c)
  return reserve(c, {peek = true})
end

-- spare: a sweep's list read from the line, where the line spends less than an evenly spent day:
-- the day's check is that even day, whatever the reserve (not a status read)
function MODES.spare(c)
  return reserve(c, {day_rate = c.d_limit / DAY})
end

-- ahead: a job known to be finished (its result, or the status read that confirms a list's or a
-- webhook's word). Where the line is reserved further than an interval ahead, it takes the place of
-- the line's next status read (counted in the day already; that read goes to the back when it comes
-- to confirm), spaced like that line, one place at a time (a place nobody gives up costs one read
-- the read log holds back, never one past the limit); else one interval before the line.
function MODES.ahead(c)
  local step = line_step(c)
  if step > 0 and c.owed < 1 then
    local at = math.max(c.now + step, c.st.ahead_next or 0, c.paused)
    if c.exhausted and at < c.sume_reset then at = c.sume_reset end
    at = settle(c, at)
    if at == nil then return answer(c, 0, MINUTE) end
    if c.max_wait >= 0 and at - c.now > c.max_wait then return answer(c, 0, at - c.now) end
    redis.call('HSET', c.key, 'owed', c.owed + 1, 'ahead_next', at + step)
    return answer(c, 1, at - c.now)
  end
  return reserve(c, {ahead = true})
end

-- list: a sweep's list read in its lane while the sweeps keep it open; ahead of the line if not
function MODES.list(c)
  if lane_size(c.m_limit, c.share) <= 0 then return MODES.ahead(c) end
  return reserve(c, {lane = true})
end

-- confirm (a status read) / rconfirm (a result read): the slot reserved earlier, at c.slot, counted
-- when it was reserved. A status read whose place a result read took goes to the back of the line;
-- so does a read while the key is paused or Sume's window is spent.
local function confirm(c, result)
  if c.now < c.paused or c.exhausted then return MODES.take(c) end
  if c.slot <= c.now + c.early then
    if result or c.owed <= 0 then return answer(c, 1, settle(c, c.now) - c.now) end  -- its slot: now, or the log's room
    redis.call('HSET', c.key, 'owed', c.owed - 1)
    c.owed = c.owed - 1
    return MODES.take(c)
  end
  if result or c.owed <= 0 then return before_slot(c) end
  return MODES.take(c)
end

function MODES.confirm(c)
  return confirm(c, false)
end

function MODES.rconfirm(c)
  return confirm(c, true)
end

-- A take: the answer of `mode`'s function (a Mode value of budget.py; the gate answers 'none' itself).
local function budget_take(key, lane_key, now, mode, max_wait, early, cfg_m, cfg_d, slot, count, every_ms)
  local by_mode = MODES[mode]
  if by_mode == nil then error('the budget has no mode ' .. tostring(mode)) end
  return by_mode(budget_state(key, lane_key, now, max_wait, early, cfg_m, cfg_d, slot, count, every_ms))
end
