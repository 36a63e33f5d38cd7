-- Delete a run and every run nested in it, however deep: every key of theirs.
-- KEYS[1] the tenant's runs; ARGV[1] the tenant's key base, ARGV[2] run, ARGV[3] (optional)
-- a time: delete only if the run's retention deadline is set and <= it ('live' otherwise),
-- checked in this script, so nothing lands between the check and the delete.
-- Waits for open authorities ('locked'). Key names as crdtstore/_backends/redis/_keys.py.
local runs, base = KEYS[1], ARGV[1]
local escapes = {['%'] = '%25', [':'] = '%3A', ['{'] = '%7B', ['}'] = '%7D'}
local function key(run) return base .. ':r:' .. string.gsub(run, '[%%:{}]', escapes) end
if redis.call('EXISTS', key(ARGV[2])) == 0 then
  -- (a resend after a lost reply: the first send may have deleted it)
  if ARGV[4] == '1' then return {'ok'} end
  return {'missing'}
end
if ARGV[3] ~= '' then
  local due = redis.call('HGET', key(ARGV[2]), 'delete_after')
  if not due or tonumber(due) > tonumber(ARGV[3]) then return {'live'} end
end
local doomed = {[ARGV[2]] = true}
local all = redis.call('ZRANGE', runs, 0, -1)
local grew = true
while grew do
  grew = false
  for _, r in ipairs(all) do
    if not doomed[r] then
      local p = redis.call('HGET', key(r), 'parent')
      if p and doomed[p] then
        doomed[r] = true
        grew = true
      end
    end
  end
end
for r in pairs(doomed) do
  if redis.call('EXISTS', key(r) .. ':lock') == 1 then return {'locked', r} end
end
for r in pairs(doomed) do
  local k = key(r)
  redis.call('DEL', k, k .. ':j', k .. ':k', k .. ':s')
  redis.call('ZREM', runs, r)
end
return {'ok'}
