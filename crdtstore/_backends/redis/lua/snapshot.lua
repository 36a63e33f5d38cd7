-- Store a snapshot unless a newer one is there; return the position of the one kept.
-- KEYS[1] run hash, KEYS[2] snapshot hash; ARGV[1] seq, ARGV[2] update, ARGV[3] state,
-- ARGV[4] created
if redis.call('EXISTS', KEYS[1]) == 0 then return {'unknown'} end
local cur = tonumber(redis.call('HGET', KEYS[2], 'seq') or '-1')
if cur >= tonumber(ARGV[1]) then return {'kept', string.format('%d', cur)} end
redis.call('HSET', KEYS[2], 'seq', ARGV[1], 'upd', ARGV[2], 'state', ARGV[3], 'created', ARGV[4])
redis.call('HSET', KEYS[1], 'snap', ARGV[1])
return {'saved', ARGV[1]}
