-- Take a read slot from the shared budget (budget.lua's budget_take; budget.py states the rules).
-- KEYS[1] budget: the budget hash
-- KEYS[2] lane: the sweeps' lane hash (the budget's cluster slot)
-- ARGV[1] now_ms: the caller's clock, ms
-- ARGV[2] mode: what is asked, a Mode value of budget.py (take, confirm, rconfirm, ahead, list, spare, peek)
-- ARGV[3] max_wait_ms: the farthest slot accepted (-1: any); nothing is reserved past it
-- ARGV[4] early_ms: a slot this close counts as now
-- ARGV[5] per_minute: the configured limits (0: none)...
-- ARGV[6] per_day: ...lowered by what Sume's headers taught
-- ARGV[7] slot_ms: the slot a confirm or rconfirm reserved earlier
-- ARGV[8] count: slots taken at once (a sweep's pages)
-- ARGV[9] every_ms: the day reserve's safety cadence per pending job (0: the floor alone; -1: no reserve)
-- Returns {granted 0|1, wait ms, pending jobs (-1: not counted), 0 granted | 1 not | 2 key paused,
-- what the day has left beyond its reserve (-1: no day limit), the time (ms) the read log counts a read
-- granted now at (-1: none)}.
return budget_take(KEYS[1], KEYS[2], tonumber(now_ms), mode, tonumber(max_wait_ms), tonumber(early_ms), per_minute,
                   per_day, tonumber(slot_ms), tonumber(count), tonumber(every_ms))
