-- Change a run's state or retention deadline (waits for an open authority: 'locked').
-- KEYS[1] run hash, KEYS[2] authority lock
-- ARGV[1] state ('' keep), ARGV[2] 'keep' | 'none' | 'set', ARGV[3] deadline
local meta = KEYS[1]
if redis.call('EXISTS', meta) == 0 then return {'unknown'} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'locked'} end
if ARGV[1] ~= '' then redis.call('HSET', meta, 'state', ARGV[1]) end
if ARGV[2] == 'none' then
  redis.call('HDEL', meta, 'delete_after')
elseif ARGV[2] == 'set' then
  redis.call('HSET', meta, 'delete_after', ARGV[3])
end
return {'ok'}
