-- Rewrite journal entries in place (redaction that keeps the audit trail), atomically.
-- KEYS[1] run hash, KEYS[2] journal stream
-- ARGV[1] n, then per entry: seq, update, effect, crc (entries no longer in the stream are
-- ignored).
-- A stream entry cannot be changed in place: the stream is built again, every entry with
-- its id and fields as they were but the rewritten ones, and its last id restored (XSETID).
-- Returns the number rewritten (-1: no such run).
local meta, stream = KEYS[1], KEYS[2]
if redis.call('EXISTS', meta) == 0 then return -1 end
local n = tonumber(ARGV[1])
if n == 0 then return 0 end
local new = {}
for i = 0, n - 1 do
  local seq = tonumber(ARGV[2 + 4 * i])
  new[seq] = {ARGV[3 + 4 * i], ARGV[4 + 4 * i], ARGV[5 + 4 * i]}
end
local rows = redis.call('XRANGE', stream, '-', '+')
if #rows == 0 then return 0 end
local info = redis.call('XINFO', 'STREAM', stream)
local last
for j = 1, #info, 2 do
  if info[j] == 'last-generated-id' then last = info[j + 1] end
end
-- XDEL only flags an entry in its listpack (an RDB dump, hence the AOF's preamble, still
-- holds its bytes): the whole stream is built again instead
redis.call('DEL', stream)
local done = 0
for _, e in ipairs(rows) do
  local seq = tonumber(string.match(e[1], '^(%d+)-'))
  local f = e[2]
  local r = new[seq]
  if r then
    for j = 1, #f, 2 do
      if f[j] == 'u' then f[j + 1] = r[1]
      elseif f[j] == 'e' then f[j + 1] = r[2]
      elseif f[j] == 'k' then f[j + 1] = r[3] end
    end
    done = done + 1
  end
  redis.call('XADD', stream, e[1], unpack(f))
end
redis.call('XSETID', stream, last)
return done
