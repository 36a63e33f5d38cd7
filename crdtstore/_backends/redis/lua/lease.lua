-- The lease table of one tenant and its transitions: crdtstore/_leases/_engine.py (Table) in
-- Lua, so that a transition is one atomic step on the server. Every transition reaps first,
-- then makes its change, then applies the grant rule (_leases/_rule.py): a waiting request
-- is granted when none of its resources is held or wanted by an earlier waiting request.
--
-- KEYS[1] requests (hash: rank -> JSON list, see decode), KEYS[2] counters (hash: rank,
-- token; they never go back), KEYS[3] wake-up stream (an entry per transition that granted
-- another request than the caller's, for waiters in other processes)
-- ARGV[1] op, ARGV[2] now ('' = this server's TIME, boot 'redis'), ARGV[3] boot, ARGV[4...]
--
-- Reply: {'ok', now, boot, grants to others, result, next token, request JSON...} or
-- {'err', now, boot, grants to others, kind, args...}.
local Q, N, EV = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]
local now, boot
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  boot = 'redis'
else
  now = tonumber(ARGV[2])
  boot = ARGV[3]
end

local function num(x) return string.format('%.17g', x) end

-- a request: [rank, id, owner, step, attempt, resources, state, token, ttl, host, proc boot,
-- pid, proc start, acked, created, clock boot, requested, granted at, expires] ('' for none;
-- numbers as strings: cjson keeps 14 digits only)
local function decode(raw)
  local a = cjson.decode(raw)
  return {
    rank = tonumber(a[1]), id = a[2], owner = a[3], step = a[4], attempt = a[5],
    resources = a[6], state = a[7], token = tonumber(a[8]), ttl = tonumber(a[9]),
    host = a[10], pboot = a[11], pid = a[12], pstart = a[13], acked = a[14] == '1',
    created = a[15], clock_boot = a[16], requested = tonumber(a[17]),
    granted_at = tonumber(a[18]), expires = tonumber(a[19]),
  }
end

local function encode(r)
  return cjson.encode({
    num(r.rank), r.id, r.owner, r.step, r.attempt, r.resources, r.state,
    r.token and num(r.token) or '', num(r.ttl), r.host, r.pboot, r.pid, r.pstart,
    r.acked and '1' or '0', r.created, r.clock_boot, num(r.requested),
    r.granted_at and num(r.granted_at) or '', num(r.expires),
  })
end

local reqs, order = {}, {}
local flat = redis.call('HGETALL', Q)
for i = 1, #flat, 2 do
  local r = decode(flat[i + 1])
  reqs[r.rank] = r
  order[#order + 1] = r.rank
end
table.sort(order)
local counters = redis.call('HMGET', N, 'rank', 'token')
local next_rank, next_token = tonumber(counters[1]) or 1, tonumber(counters[2]) or 1
local dirty, removed, counters_dirty = {}, {}, false
local grants, granted_now = 0, {}

local function sorted()
  local out = {}
  for _, rank in ipairs(order) do
    if reqs[rank] then out[#out + 1] = reqs[rank] end
  end
  return out
end

local function remove(r)
  reqs[r.rank] = nil
  dirty[r.rank] = nil
  removed[r.rank] = true
end

local function find(id)
  for _, r in pairs(reqs) do
    if r.id == id then return r end
  end
  return nil
end

local function reap(dead)
  local out = {}
  for _, r in ipairs(sorted()) do
    if r.clock_boot ~= boot then
      if r.state == 'granted' then
        out[#out + 1] = r
      else
        -- a waiter's place survives a reboot: its deadline restarts on this boot's clock
        r.clock_boot, r.requested, r.expires = boot, now, now + r.ttl
        dirty[r.rank] = true
      end
    elseif r.expires <= now
        or (r.state == 'granted' and r.acked and dead[r.id] ~= nil and dead[r.id] == r.pid) then
      out[#out + 1] = r
    end
  end
  for _, r in ipairs(out) do remove(r) end
  return #out
end

local function grant()
  local held, wanted = {}, {}
  local list = sorted()
  for _, r in ipairs(list) do
    if r.state == 'granted' then
      for _, x in ipairs(r.resources) do held[x] = true end
    end
  end
  for _, r in ipairs(list) do
    if r.state ~= 'granted' then
      local free = true
      for _, x in ipairs(r.resources) do
        if held[x] or wanted[x] then
          free = false
          break
        end
      end
      if free then
        r.state, r.token, r.granted_at = 'granted', next_token, now
        -- the holder has one TTL from the hand-off to notice (it may be restarting)
        r.expires, r.acked = now + r.ttl, false
        next_token = next_token + 1
        counters_dirty = true
        dirty[r.rank] = true
        grants = grants + 1
        granted_now[r.rank] = true
        for _, x in ipairs(r.resources) do held[x] = true end
      else
        for _, x in ipairs(r.resources) do wanted[x] = true end
      end
    end
  end
end

local function conflict(r)
  local mine = {}
  for _, x in ipairs(r.resources) do mine[x] = true end
  local others = sorted()
  table.sort(others, function(a, b)
    local ga, gb = a.state == 'granted', b.state == 'granted'
    if ga ~= gb then return ga end
    return a.rank < b.rank
  end)
  for _, o in ipairs(others) do
    if o ~= r then
      local common = {}
      for _, x in ipairs(o.resources) do
        if mine[x] then common[#common + 1] = x end
      end
      if #common > 0 then
        table.sort(common)
        if o.state == 'granted' then return {'held', common[1], o.owner, num(o.token)} end
        return {'held', common[1], o.owner .. ' (queued earlier, rank ' .. num(o.rank) .. ')', ''}
      end
    end
  end
  return {'held', r.resources[1], 'unknown', ''}
end

-- the request ``id`` of ``owner``, or nil and the error
local function mine(id, owner)
  local r = find(id)
  if not r then return nil, {'not_found', id} end
  if r.owner ~= owner then return nil, {'not_owner', id} end
  return r, nil
end

local function attach(r, at)
  r.host, r.pboot, r.pid, r.pstart = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
end

local result, err, target = '', nil, nil
if op == 'request' then
  reap({})
  local owner, step, attempt = ARGV[4], ARGV[5], ARGV[6]
  local resources, ttl, wait = cjson.decode(ARGV[7]), tonumber(ARGV[8]), ARGV[13] == '1'
  local r = nil
  if step ~= '' then
    for _, o in pairs(reqs) do
      if o.owner == owner and o.step == step and o.attempt == attempt then
        r = o
        break
      end
    end
  end
  if r then
    if cjson.encode(r.resources) ~= cjson.encode(resources) then
      err = {'invalid_resource', cjson.encode(r.resources)}
    else
      attach(r, 9)
      r.ttl, r.expires = ttl, now + ttl
      dirty[r.rank] = true
    end
  else
    r = {
      rank = next_rank, id = ARGV[14], owner = owner, step = step, attempt = attempt,
      resources = resources, state = 'waiting', token = nil, ttl = ttl, acked = false,
      created = ARGV[15], clock_boot = boot, requested = now, granted_at = nil,
      expires = now + ttl,
    }
    attach(r, 9)
    next_rank = next_rank + 1
    counters_dirty = true
    reqs[r.rank] = r
    order[#order + 1] = r.rank
    dirty[r.rank] = true
  end
  if not err then
    grant()
    if r.state == 'granted' then
      r.acked = true
    elseif not wait then
      err = conflict(r)
      remove(r)
    end
    if not err then
      target = r
      result = num(r.rank)
    end
  end
elseif op == 'heartbeat' then
  reap({})
  local r
  r, err = mine(ARGV[4], ARGV[5])
  if r then
    attach(r, 6)
    r.expires = now + r.ttl
    if r.state == 'granted' then r.acked = true end
    dirty[r.rank] = true
    grant()
    if r.state == 'granted' then r.acked = true end
    target = r
    result = num(r.rank)
  end
elseif op == 'release' then
  reap({})
  local r
  r, err = mine(ARGV[4], ARGV[5])
  if r then
    local token = ARGV[6]
    if r.state ~= 'granted' then
      err = {'lost', r.resources[1], 'not granted (still waiting); cancel it instead', ''}
    elseif token ~= '' and tonumber(token) ~= r.token then
      err = {'lost', r.resources[1], 'token ' .. token .. " is not this grant's token", token}
    else
      remove(r)
    end
  end
elseif op == 'cancel' then
  reap({})
  local r
  r, err = mine(ARGV[4], ARGV[5])
  result = '0'
  if err and err[1] == 'not_found' then err = nil end
  if r then
    remove(r)
    result = '1'
  end
elseif op == 'reap' then
  local dead = {}
  for i = 4, #ARGV, 2 do dead[ARGV[i]] = ARGV[i + 1] end
  result = num(reap(dead))
else
  return redis.error_reply('unknown lease op ' .. tostring(op))
end

grant()
for rank in pairs(removed) do redis.call('HDEL', Q, num(rank)) end
for rank in pairs(dirty) do
  if reqs[rank] then redis.call('HSET', Q, num(rank), encode(reqs[rank])) end
end
if counters_dirty then
  redis.call('HSET', N, 'rank', num(next_rank), 'token', num(next_token))
end
local others = grants
if target and granted_now[target.rank] then others = others - 1 end
if others > 0 then redis.call('XADD', EV, 'MAXLEN', '32', '*', 'g', num(others)) end
if err then
  local out = {'err', num(now), boot, num(others)}
  for _, x in ipairs(err) do out[#out + 1] = x end
  return out
end
local out = {'ok', num(now), boot, num(others), result, num(next_token)}
for _, rank in ipairs(order) do
  if reqs[rank] then out[#out + 1] = encode(reqs[rank]) end
end
return out
