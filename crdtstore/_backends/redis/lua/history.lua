-- The entries that set or deleted one key of a map, oldest first, through the key index.
-- KEYS[1] key index, KEYS[2] journal stream; ARGV[1] "collection NUL key NUL"
local prefix = ARGV[1]
local upper = string.sub(prefix, 1, -2) .. '\1'
local members = redis.call('ZRANGEBYLEX', KEYS[1], '[' .. prefix, '(' .. upper)
local out = {}
for _, m in ipairs(members) do
  local id = string.format('%d', tonumber(string.sub(m, -20))) .. '-0'
  local got = redis.call('XRANGE', KEYS[2], id, id)
  if got[1] then
    local f = got[1][2]
    for j = 1, #f, 2 do
      if f[j] == 'x' then f[j + 1] = '' end
    end
    out[#out + 1] = got[1]
  end
end
return out
