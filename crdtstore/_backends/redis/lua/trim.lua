-- Remove up to ARGV[2] of the oldest journal entries at or below position ARGV[1], and their
-- key index members; return how many. The stream itself stays (its last ID with it): a
-- DEL would let positions start again at 1 under readers that still hold later ones.
-- KEYS[1] journal stream, KEYS[2] key index
local rows = redis.call('XRANGE', KEYS[1], '-', ARGV[1] .. '-0', 'COUNT', ARGV[2])
if #rows == 0 then return 0 end
local ids, members = {}, {}
for i, e in ipairs(rows) do
  ids[i] = e[1]
  local f = e[2]
  for j = 1, #f, 2 do
    if f[j] == 'x' and f[j + 1] ~= '' then
      local s, at = f[j + 1], 1
      while true do
        local a = string.find(s, '\0\0', at, true)
        if not a then
          members[#members + 1] = string.sub(s, at)
          break
        end
        members[#members + 1] = string.sub(s, at, a - 1)
        at = a + 2
      end
    end
  end
end
redis.call('XDEL', KEYS[1], unpack(ids))
for i = 1, #members, 500 do
  redis.call('ZREM', KEYS[2], unpack(members, i, math.min(i + 499, #members)))
end
return #rows
