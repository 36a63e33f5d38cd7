-- Runs before append.lua when an append may have run already: sent again because its
-- connection was lost (the first send may have run, its reply lost), or after an append of
-- the same entries failed without telling whether it ran. If the stream's last entries (up
-- to 10,000 back) hold this append's first entry (same client id, wall time, checksum and
-- update), that append ran: the answer is {'ok', its position} when all n entries follow
-- it in order, or {'part', its position, how many do} (the rest was not appended: the
-- caller appends it). Nothing is appended twice. Otherwise append.lua runs, as for a first
-- send.
do
  local n = tonumber(ARGV[3])
  local function fields(e)
    local f, got = e[2], {}
    for j = 1, #f, 2 do got[f[j]] = f[j + 1] end
    return got
  end
  local function same(got, at)
    return got.c == ARGV[at + 2] and got.w == ARGV[at + 3] and got.k == ARGV[at + 6]
      and got.u == ARGV[at + 4]
  end
  if n > 0 then
    local upto, scanned, found = '+', 0, nil
    while scanned < 10000 and not found do
      local rows = redis.call('XREVRANGE', KEYS[2], upto, '-', 'COUNT', 256)
      if #rows == 0 then break end
      for _, e in ipairs(rows) do
        if same(fields(e), 5) then
          found = e[1]
          break
        end
      end
      scanned = scanned + #rows
      upto = '(' .. rows[#rows][1]
    end
    if found then
      local first = string.match(found, '^(%d+)-')
      local matched, at = 1, 5 + 10 + tonumber(ARGV[5 + 9])
      if n > 1 then
        local later = redis.call('XRANGE', KEYS[2], '(' .. found, '+', 'COUNT', n - 1)
        for _, e in ipairs(later) do
          if not same(fields(e), at) then break end
          matched = matched + 1
          at = at + 10 + tonumber(ARGV[at + 9])
        end
      end
      if matched == n then return {'ok', first} end
      return {'part', first, string.format('%d', matched)}
    end
  end
end
