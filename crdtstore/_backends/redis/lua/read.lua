-- Journal entries after a position, oldest first (the entries of one client without their
-- update and effect: a record tailing the journal already holds its own writes).
-- KEYS[1] journal stream, KEYS[2] run hash; ARGV[1] after, ARGV[2] limit, ARGV[3] client id
-- to skip ('' none). 'unknown' when the run does not exist.
if redis.call('EXISTS', KEYS[2]) == 0 then return 'unknown' end
local rows = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1] .. '-0', '+', 'COUNT', ARGV[2])
local skip = ARGV[3]
for _, e in ipairs(rows) do
  local f = e[2]
  local mine = false
  for j = 1, #f, 2 do
    if f[j] == 'c' then mine = f[j + 1] == skip end
  end
  for j = 1, #f, 2 do
    if f[j] == 'x' or (mine and (f[j] == 'u' or f[j] == 'e')) then f[j + 1] = '' end
  end
end
return rows
