-- Claim a job's lease and, if its own chain's step was claimed, take a read slot: one script on a
-- standalone Redis (gate.py), lease.py's lease_claim then budget.lua's budget_take.
-- KEYS[1] lease: the job's lease key
-- KEYS[2] budget: the budget hash
-- KEYS[3] lane: the sweeps' lane hash
-- ARGV[1] resting: the step's resting value (lease.py's grammar: "T:n")
-- ARGV[2] claimed: its claimed value ("T:n!c")
-- ARGV[3] token: the chain's token
-- ARGV[4] seq: the step's number
-- ARGV[5] fresh: the claimed value of a fresh chain, taken if the lease is free
-- ARGV[6] ttl_ms: the claim's TTL
-- ARGV[7] now_ms: the budget take's arguments, as budget_take.lua's (mode "none": no slot)
-- ARGV[8] mode: a Mode value of budget.py
-- ARGV[9] max_wait_ms: the farthest slot accepted (-1: any)
-- ARGV[10] early_ms: a slot this close counts as now
-- ARGV[11] per_minute: the configured limits
-- ARGV[12] per_day: ...
-- ARGV[13] slot_ms: the slot a confirm reserved earlier
-- ARGV[14] count: slots taken at once
-- ARGV[15] every_ms: the day reserve's safety cadence per pending job
-- Returns {claim} (0 held, 1 own chain, 2 fresh chain, 3 busy: an older step of the chain holds its
-- claim) where the claim failed or no slot was asked for, else the claim and budget_take's six answers.
local c = lease_claim(KEYS[1], resting, claimed, token, tonumber(seq), fresh, tonumber(ttl_ms))
if c ~= 1 or mode == 'none' then return {c} end
local g = budget_take(KEYS[2], KEYS[3], tonumber(now_ms), mode, tonumber(max_wait_ms), tonumber(early_ms),
                      per_minute, per_day, tonumber(slot_ms), tonumber(count), tonumber(every_ms))
return {c, g[1], g[2], g[3], g[4], g[5], g[6]}
