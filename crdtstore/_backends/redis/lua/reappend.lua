-- Runs before append.lua when an append is sent again because its connection was lost: the
-- first send may have run with only its reply lost. If the stream's last entries (up to
-- 10,000 back) hold this append's first entry (same client id, wall time, checksum and
-- update), it ran: its answer is given again and nothing is appended twice. Otherwise
-- append.lua runs as for a first send (its checks decide afresh).
do
  local c, w, u, k = ARGV[7], ARGV[8], ARGV[9], ARGV[11]
  if tonumber(ARGV[3]) > 0 then
    local upto, scanned = '+', 0
    while scanned < 10000 do
      local rows = redis.call('XREVRANGE', KEYS[2], upto, '-', 'COUNT', 256)
      if #rows == 0 then break end
      for _, e in ipairs(rows) do
        local f, fc, fw, fu, fk = e[2], nil, nil, nil, nil
        for j = 1, #f, 2 do
          local name = f[j]
          if name == 'c' then fc = f[j + 1]
          elseif name == 'w' then fw = f[j + 1]
          elseif name == 'u' then fu = f[j + 1]
          elseif name == 'k' then fk = f[j + 1] end
        end
        if fc == c and fw == w and fk == k and fu == u then
          return {'ok', string.match(e[1], '^(%d+)-')}
        end
      end
      scanned = scanned + #rows
      upto = '(' .. rows[#rows][1]
    end
  end
end
