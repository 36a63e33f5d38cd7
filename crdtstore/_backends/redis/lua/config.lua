-- Replace a run's config if it is still the one the caller read (compare and set).
-- KEYS[1] run hash; ARGV[1] the config read, ARGV[2] the new one
local cur = redis.call('HGET', KEYS[1], 'config')
if not cur then return 'unknown' end
-- (already the new one: a resend after the first send's reply was lost, or the same change)
if cur == ARGV[2] then return 'ok' end
if cur ~= ARGV[1] then return 'changed' end
redis.call('HSET', KEYS[1], 'config', ARGV[2])
return 'ok'
