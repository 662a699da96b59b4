-- Tell the shared budget what Sume's reply said (budget.py's RateInfo): the limits its headers
-- teach, a 429's pause, and what is left of Sume's window. Safe to repeat: what is left only goes
-- down within a window, a pause only grows.
-- KEYS[1] budget: the budget hash
-- KEYS[2] lane: the sweeps' lane hash
-- ARGV[1] now_ms: the caller's clock, ms
-- ARGV[2] window: which window Limit/Remaining/Reset describe: "m" (the minute), "d" (the day) or "" (unknown)
-- ARGV[3] remaining: RateLimit-Remaining (-1: not said)
-- ARGV[4] reset_ms: RateLimit-Reset (-1: not said)
-- ARGV[5] retry_after_ms: a 429's Retry-After (-1: none)
-- ARGV[6] learned_minute: the minute's limit the headers teach (-1: none)
-- ARGV[7] learned_day: the day's (-1: none)
-- ARGV[8] per_minute: the configured limits
-- ARGV[9] per_day: ...
-- Returns 1.
local key, lane_key, now = KEYS[1], KEYS[2], tonumber(now_ms)
remaining, reset_ms, retry_after_ms = tonumber(remaining), tonumber(reset_ms), tonumber(retry_after_ms)
if tonumber(learned_minute) > 0 then redis.call('HSET', key, 'learned_minute', learned_minute) end
if tonumber(learned_day) > 0 then redis.call('HSET', key, 'learned_day', learned_day) end
local st = load(key, FIELDS)
if retry_after_ms >= 0 then
  redis.call('HSET', key, 'pause_until', math.max(st.pause_until or 0, now + retry_after_ms))
end
if window ~= '' and remaining >= 0 then
  local span = (window == 'm') and MINUTE or DAY
  if st.sume_left ~= nil and now < (st.sume_reset or 0) and now + reset_ms < st.sume_reset + span / 2 then
    -- the same Sume window: what is left only goes down (replies of a batch arrive out of order)
    if remaining < st.sume_left then
      -- Sume counts fewer left than our own grants allow: another client spends this key
      redis.call('HSET', key, 'other_until', now + 600000, 'sume_left', remaining)
    end
  else
    redis.call('HSET', key, 'sume_left', remaining, 'sume_reset', now + reset_ms)
  end
  if window == 'm' then  -- what is left must last the minute: the line starts no earlier than that
    local limit = limit_of(per_minute, st.learned_minute)
    local ln = load(lane_key, {'open_until', 'share'})
    local share = ((ln.open_until or 0) > now) and (ln.share or 0) or 0
    local t, tau = minute_window(limit, share)
    if t > 0 then
      redis.call('HSET', key, 'minute_tat', math.max(st.minute_tat or 0, now + reset_ms + tau - remaining * t))
    end
    -- Sume counted limit - remaining in its minute; ours are in the read log (those still on their way
    -- to Sume too: an estimate on the low side). The rest is another client's, kept out of the log.
    local other = limit - remaining - log_count(log_of(redis.call('HGET', key, 'read_log')), now, MINUTE)
    if other > 0 then
      redis.call('HSET', key, 'other_reads', other, 'other_until', math.max(st.other_until or 0, now + 600000))
    elseif (st.other_reads or 0) > 0 then
      redis.call('HSET', key, 'other_reads', 0)
    end
  else  -- Sume's day window: when it ends, and how much of it is spent (by us and anyone else)
    local limit = limit_of(per_day, st.learned_day)
    local used, nxt = day_window(st, now)
    local reset = now + reset_ms
    if limit > 0 then used = math.max(used, limit - remaining) end
    redis.call('HSET', key, 'day_used', used, 'day_next', nxt, 'day_reset', reset)
  end
end
redis.call('PEXPIRE', key, KEEP)
return 1
